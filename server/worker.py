"""Augmentation workers: spawned processes that render batches straight into ring slots.

Runs in a worker process started by the daemon with the spawn method. A worker imports
numpy, OpenCV and pixpool's own modules, never torch (a test checks ``sys.modules``).

- It receives the image source (the snapshot handle pickles as its name and re-attaches
  read-only) and talks to the daemon over one duplex ``multiprocessing`` pipe, using
  ``send_bytes``/``recv_bytes`` with msgpack: nothing is unpickled after start-up.
- Messages from the daemon: ``job`` {job, ring, slot, settings, epoch, batch, size},
  ``forget`` {ring} (close that ring: its trainer left), ``stop``. Replies: {job, ok, size,
  n_targets, seconds} or {job, ok: false, error}.
- It attaches a trainer's ring on first use and writes the slot in place: images by the
  route, then targets and samples, and the slot header last.
- It ignores SIGINT (Ctrl-C in the daemon's terminal reaches the whole process group; the
  daemon decides when workers stop) and exits when the daemon goes: the pipe reports EOF,
  and the parent pid is polled as a backstop.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import msgpack

log = logging.getLogger(__name__)

_POLL_S = 1.0


def worker_main(index: int, conn: Connection, source: Any, route_name: str | None, parent_pid: int) -> None:
    """Entry point of a spawned worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # cv2 threads would fight the other workers for the same cores: one thread each.
    import cv2

    cv2.setNumThreads(1)
    from ..shared.config import StreamSettings
    from ..shared.ring import Ring
    from . import route as _route

    route = _route.load(route_name)
    rings: dict[str, Ring] = {}
    settings_cache: dict[bytes, StreamSettings] = {}
    try:
        conn.send_bytes(msgpack.packb({"op": "hello", "pid": os.getpid(), "index": index}))
        while True:
            if not conn.poll(_POLL_S):
                if os.getppid() != parent_pid:
                    return
                continue
            try:
                msg = msgpack.unpackb(conn.recv_bytes(), raw=False)
            except (EOFError, OSError):
                return
            op = msg.get("op")
            if op == "stop":
                return
            if op == "forget":
                ring = rings.pop(msg["ring"], None)
                if ring is not None:
                    ring.close()
                continue
            if op != "job":
                continue
            t0 = time.perf_counter()
            try:
                key = msgpack.packb(msg["settings"])
                settings = settings_cache.get(key)
                if settings is None:
                    settings = settings_cache[key] = StreamSettings.from_dict(msg["settings"])
                ring = rings.get(msg["ring"])
                if ring is None:
                    ring = rings[msg["ring"]] = Ring.attach(msg["ring"])
                reply = _render_into(ring, route, source, settings, msg)
                reply["seconds"] = time.perf_counter() - t0
            except Exception as exc:  # report any failure of one job; the worker stays up
                log.exception("worker %d: job %s failed", index, msg.get("job"))
                reply = {"job": msg.get("job"), "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            conn.send_bytes(msgpack.packb(reply))
    except (BrokenPipeError, EOFError):
        return
    finally:
        for ring in rings.values():
            ring.close()


def _render_into(ring, route, source, settings, msg: dict) -> dict:
    from ..shared.errors import CapacityError

    slot, size = msg["slot"], msg["size"]
    images = ring.images(slot, size)
    targets, samples = route.render(source, settings, msg["epoch"], msg["batch"], images)
    n = len(targets)
    if n > ring.layout.max_targets:
        raise CapacityError(f"batch {msg['batch']} has {n} target rows but the ring slot holds {ring.layout.max_targets}; max_targets underestimates")
    if len(samples) != size:
        raise ValueError(f"route returned {len(samples)} samples for a batch of {size}")
    ring.targets(slot, n)[...] = targets
    ring.samples(slot, size)[...] = samples
    ring.write_header(slot, epoch=msg["epoch"], batch=msg["batch"], size=size, n_targets=n, job=msg["job"])
    return {"job": msg["job"], "ok": True, "size": size, "n_targets": n}


@dataclass
class WorkerHandle:
    """The daemon's view of one worker: process, pipe end, current job, counters."""

    index: int
    process: Any
    conn: Connection
    pid: int = 0
    ready: bool = False
    job: Any = None
    batches_done: int = 0
    busy_s: float = 0.0
    job_started: float = 0.0
    spawned_at: float = 0.0
    ready_s: float = 0.0  # spawn -> hello: how long a new worker takes to be usable

    def send(self, msg: dict) -> None:
        self.conn.send_bytes(msgpack.packb(msg))

    def recv(self) -> dict:
        return msgpack.unpackb(self.conn.recv_bytes(), raw=False)


def spawn_worker(ctx, index: int, source: Any, route_name: str | None) -> WorkerHandle:
    """Start one worker with the spawn context; it says hello when ready."""
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=worker_main, args=(index, child_conn, source, route_name, os.getpid()), name=f"pixpool-worker-{index}", daemon=True)
    proc.start()
    child_conn.close()
    return WorkerHandle(index=index, process=proc, conn=parent_conn, spawned_at=time.monotonic())


def stop_worker(handle: WorkerHandle, *, timeout_s: float = 5.0) -> None:
    """stop -> join -> terminate -> kill; always reaps and closes the pipe."""
    stop_workers([handle], timeout_s=timeout_s)


def stop_workers(handles: list[WorkerHandle], *, timeout_s: float = 5.0) -> None:
    """Stop all workers at once: stop -> join (one shared deadline) -> terminate -> kill.

    Bounded by about three times ``timeout_s`` whatever the number of workers, so a daemon
    with many workers still stops inside a service manager's stop timeout.
    """
    for h in handles:
        try:
            h.send({"op": "stop"})
        except (OSError, ValueError):
            pass
    for escalate in (None, "terminate", "kill"):
        alive = [h for h in handles if h.process.is_alive()]
        if not alive:
            break
        if escalate is not None:
            for h in alive:
                getattr(h.process, escalate)()
        deadline = time.monotonic() + timeout_s
        for h in alive:
            h.process.join(max(0.0, deadline - time.monotonic()))
    for h in handles:
        h.conn.close()
