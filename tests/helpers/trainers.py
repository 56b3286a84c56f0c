"""Trainer processes for the memory tests: attach, take a few batches, hold the ring until told.

Runs in spawned children (the spawn target must be importable by name); the test owns the
processes and ``holding_trainers`` always stops and reaps them.
"""

from __future__ import annotations

import multiprocessing as mp
from contextlib import contextmanager

WAIT_S = 60.0


def hold_trainer(settings_dict: dict, socket_dir: str, conn) -> None:
    from pixpool.client import Client
    from pixpool.client.options import ClientOptions
    from pixpool.shared.stream.config import StreamSettings

    try:
        with Client.connect(
            StreamSettings.from_dict(settings_dict), ClientOptions(socket_dir=socket_dir, timeout_s=WAIT_S)
        ) as client:
            it = client.epoch(0)
            next(it)  # the workers have rendered into this trainer's ring
            conn.send(client._ident[0])
            conn.poll(WAIT_S)  # hold the ring until the test says stop (or gives up)
            it.close()
    except Exception as exc:  # reported to the test, which fails with it
        conn.send(f"{type(exc).__name__}: {exc}")


@contextmanager
def holding_trainers(settings_list, socket_dir: str):
    """Start one trainer process per settings; yield their trainer ids once all have batches."""
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    try:
        for s in settings_list:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=hold_trainer, args=(s.to_dict(), socket_dir, child))
            p.start()
            procs.append(p)
            conns.append(parent)
        ids = []
        for c in conns:
            if not c.poll(WAIT_S):
                raise TimeoutError("a trainer process did not get its batches in time")
            got = c.recv()
            if isinstance(got, str):
                raise RuntimeError(f"a trainer process failed: {got}")
            ids.append(got)
        yield ids
    finally:
        for c in conns:
            try:
                c.send("stop")
            except OSError:
                pass
        for p in procs:
            p.join(WAIT_S)
            if p.is_alive():
                p.kill()
                p.join(10)
