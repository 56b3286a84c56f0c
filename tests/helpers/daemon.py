"""Helpers for the daemon tests: start/stop a daemon in a spawned process, reference streams.

Runs in the pytest process. Every wait has a timeout; processes are reaped and rings of a
daemon that could not clean up are unlinked in ``finally``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager

import numpy as np

from pixpool.server.daemon.run import run_daemon, stop_process
from pixpool.shared.stream.config import DaemonConfig
from pixpool.shared.transport.control import request_status
from pixpool.shared.transport.names import DEFAULT_STORE, ring_prefix
from pixpool.shared.transport.store import Store

WAIT_S = 60.0


# -- daemon process -----------------------------------------------------------------------
def short_socket_dir() -> str:
    # ipc paths are limited to ~107 bytes: keep the directory short.
    return tempfile.mkdtemp(prefix="pxd-", dir="/tmp")


def small_serve_args(data, socket_dir: str, imgsz: int) -> list[str]:
    """``pixpool serve``'s arguments for a small daemon: DATA at ``imgsz``, one worker, one
    decoder, its sockets in ``socket_dir``."""
    return [str(data), "--imgsz", str(imgsz), "--workers", "1", "--processes", "1", "--socket-dir", socket_dir]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask_status(socket_dir: str, timeout_s: float = 2.0) -> dict | None:
    return request_status(f"ipc://{socket_dir}/daemon.sock", timeout_s=timeout_s)


def wait_ready(proc, socket_dir: str, timeout_s: float = WAIT_S, workers: int | None = None) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.is_alive():
            raise RuntimeError(f"daemon process exited with code {proc.exitcode}")
        if os.path.exists(f"{socket_dir}/daemon.sock"):
            st = ask_status(socket_dir, 1.0)
            if st is not None and (workers is None or sum(w["state"] != "starting" for w in st["workers"]) >= workers):
                return st
        time.sleep(0.05)  # polling interval of a bounded wait
    raise TimeoutError(f"daemon in {socket_dir} not ready within {timeout_s} s")


def wait_for(predicate, timeout_s: float = WAIT_S, what: str = "condition", *, poll_s: float = 0.05):
    """``predicate()``'s first true value, asked every ``poll_s`` until ``timeout_s`` has passed
    (then TimeoutError naming ``what``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)  # polling interval of a bounded wait, not synchronisation: the predicate decides
    raise TimeoutError(f"{what} not reached within {timeout_s} s")


def kill_children_of(pid: int) -> None:
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for c in children:
        c.kill()
    psutil.wait_procs(children, timeout=10)


def remove_rings_of(pid: int, store: str = DEFAULT_STORE) -> list[str]:
    store = Store.of(store)
    left = [n for n in store.segments() if n.startswith(ring_prefix(pid))]
    for n in left:
        try:
            os.unlink(store.path(n))
        except FileNotFoundError:
            pass
    return left


@contextmanager
def daemon_process(
    config: DaemonConfig,
    *,
    socket_dir: str | None = None,
    wait: bool = True,
    renderer: str | None = None,
    target=run_daemon,
    target_kwargs: dict | None = None,
):
    """Start ``run_daemon(config, renderer=renderer)`` in a spawned process; always reaped.
    ``renderer``: a stand-in route module (``helpers.stuck_renderer``); None is the real one.
    ``target``: another function of ``run_daemon``'s signature (``helpers.task_daemon``), with
    ``target_kwargs`` besides ``renderer``."""
    own_dir = socket_dir is None
    socket_dir = socket_dir or short_socket_dir()
    ctx = mp.get_context("spawn")
    proc = ctx.Process(
        target=target,
        args=(dataclasses.replace(config, socket_dir=socket_dir),),
        kwargs={"renderer": renderer, **(target_kwargs or {})},
        daemon=False,
    )
    proc.start()
    try:
        if wait:
            wait_ready(proc, socket_dir, workers=config.workers)
        yield proc, socket_dir
    finally:
        if proc.pid is not None and proc.is_alive():
            import psutil

            kids = psutil.Process(proc.pid).children(recursive=True)
            stop_process(proc)
            psutil.wait_procs(kids, timeout=10)
            for k in kids:
                if k.is_running():
                    k.kill()
        if proc.pid is not None:
            remove_rings_of(proc.pid, config.store)
        if own_dir:
            shutil.rmtree(socket_dir, ignore_errors=True)


# -- the real route -------------------------------------------------------------------------
@contextmanager
def real_daemon(
    data,
    *,
    imgsz: int = 160,
    workers: int = 2,
    heartbeat_timeout_s: float = 10.0,
    socket_dir: str | None = None,
    wait: bool = True,
    renderer: str | None = None,
    **extra,
):
    config = DaemonConfig(
        data=str(data), imgsz=imgsz, workers=workers, heartbeat_timeout_s=heartbeat_timeout_s, processes=1, **extra
    )
    with daemon_process(config, socket_dir=socket_dir, wait=wait, renderer=renderer) as (proc, d):
        yield proc, d


def reference_stream(dataset, settings, epoch: int) -> tuple[list[str], list[list[int]]]:
    """Digests and sample indices of one epoch from the in-process reference pipeline."""
    from pixpool.server.augment.batch import render_batch
    from pixpool.server.snapshot.reference import ReferenceSource
    from pixpool.shared.stream import sampler
    from pixpool.shared.stream.digest import batch_digest

    source = ReferenceSource(dataset, settings.augment.imgsz)
    digests, samples = [], []
    for b in range(sampler.num_batches(len(dataset), settings, epoch)):
        out = render_batch(source, settings, epoch, b)
        digests.append(batch_digest(out.images, out.targets, getattr(out, "masks", None)))
        samples.append(out.samples.tolist())
    return digests, samples


def digest_of(batch) -> str:
    from pixpool.shared.stream.digest import batch_digest

    return batch_digest(np.asarray(batch.images), np.asarray(batch.targets), getattr(batch, "masks", None))


def segments_of(pid: int, store: str | None = None) -> list[str]:
    return [n for n in Store.of(store).segments() if n.startswith(ring_prefix(pid))]


def prove(sock, attached: dict, *, store: str | None = None, nonce: str | None = None) -> str:
    """The locality handshake of a raw-protocol trainer: read the nonce of the ring the
    ``attached`` reply names (or send ``nonce``), send ``prove``; the delivery granted."""
    from pixpool.shared.transport.ring import Ring
    from pixpool.shared.wire.trainer import decode, encode

    if nonce is None:
        ring = Ring.attach(attached["ring"], store=Store.of(store or attached["store"]))
        nonce = ring.nonce()
        ring.close()
    sock.send(encode("prove", trainer_id=attached["trainer_id"], token=attached["token"], nonce=nonce))
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if sock.poll(100):
            msg = decode(sock.recv(), reply=True)
            if msg["op"] == "proved":
                return msg["delivery"]
    raise TimeoutError("no reply to prove")
