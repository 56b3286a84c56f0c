"""Worker supervision: start the augmentation workers, hand them jobs, replace the dead.

Runs in the daemon process, inside its single-threaded loop (``service.py``). It owns the
worker processes and the daemon's end of their pipes; the workers run ``worker.py``.

- Workers are spawned one by one (``spawn`` context) and appended as they start, so a
  failure half-way still leaves every started one to ``stop``.
- A free, ready worker takes the scheduler's next job; its result comes back over the pipe
  (``done``/``failed``, see ``shared/protocol.py``) and goes to the daemon's callbacks.
- A worker stuck in one batch past ``job_timeout_s`` is killed; a dead worker's job is
  re-queued first (bytes depend only on the job, so the re-run is identical) and a new
  worker takes its place. Workers that die before they are ready three times in a row
  would die again: that is fatal (``fatal`` says why), not a respawn loop.
- ``stop``: stop -> join (one shared deadline) -> terminate -> kill, always reaping.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable

import zmq

from ...shared import protocol as proto
from ...shared.errors import ProtocolError
from .scheduler import Job, Scheduler
from .worker import worker_main

log = logging.getLogger(__name__)

_START_FAILURES_FATAL = 3


@dataclass
class WorkerHandle:
    """The daemon's view of one worker: process, pipe end, current job, counters."""

    index: int
    process: Any
    conn: Connection
    pid: int = 0
    ready: bool = False
    job: Job | None = None
    batches_done: int = 0
    busy_s: float = 0.0
    job_started: float = 0.0
    spawned_at: float = 0.0
    ready_s: float = 0.0  # spawn -> hello: how long a new worker takes to be usable

    @property
    def state(self) -> str:
        return "starting" if not self.ready else ("busy" if self.job else "idle")

    def send(self, op: str, **fields: Any) -> None:
        self.conn.send_bytes(proto.pipe_frame(op, **fields))


def spawn_worker(ctx, index: int, sources: dict[str, Any], renderer_name: str) -> WorkerHandle:
    """Start one worker with the spawn context; it says hello when ready."""
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=worker_main, args=(index, child_conn, sources, renderer_name, os.getpid()), name=f"pixpool-worker-{index}", daemon=True)
    proc.start()
    child_conn.close()
    return WorkerHandle(index=index, process=proc, conn=parent_conn, spawned_at=time.monotonic())


def stop_workers(handles: list[WorkerHandle], *, timeout_s: float = 5.0) -> None:
    """Stop all workers at once: stop -> join (one shared deadline) -> terminate -> kill.

    Bounded by about three times ``timeout_s`` whatever the number of workers, so a daemon
    with many workers still stops inside a service manager's stop timeout.
    """
    for h in handles:
        try:
            h.send("stop")
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


class Supervisor:
    """The workers of one daemon (see module docstring).

    ``on_done(job, size, n_targets)`` and ``on_failed(job, worker_pid, error)`` are the
    daemon's; ``describe(job)`` gives a job's ring, settings and batch size for the pipe.
    """

    def __init__(self, mp_ctx, sources: dict[str, Any], renderer_name: str, scheduler: Scheduler, *, job_timeout_s: float,
                 describe: Callable[[Job], dict], on_done: Callable[[Job, int, int], None], on_failed: Callable[[Job, int, str], None]):
        self._mp = mp_ctx
        self.sources = sources
        self.renderer_name = renderer_name
        self.scheduler = scheduler
        self.job_timeout_s = job_timeout_s
        self._describe, self._on_done, self._on_failed = describe, on_done, on_failed
        self.workers: list[WorkerHandle] = []
        self.restarts = 0
        self.fatal: str | None = None
        self.stopping = False  # set by the daemon once it stops: dead workers are not replaced
        self._start_failures = 0
        self._by_fd: dict[int, WorkerHandle] = {}

    # -- lifetime -------------------------------------------------------------------------
    def start(self, count: int, poller) -> None:
        for i in range(count):  # appended one by one: stop() reaps those started if a spawn fails
            self._add(spawn_worker(self._mp, i, self.sources, self.renderer_name), poller)

    def _add(self, handle: WorkerHandle, poller) -> None:
        if handle.index < len(self.workers):
            self.workers[handle.index] = handle
        else:
            self.workers.append(handle)
        self._by_fd[handle.conn.fileno()] = handle
        poller.register(handle.conn.fileno(), zmq.POLLIN)

    def stop(self, *, timeout_s: float = 5.0) -> None:
        stop_workers(self.workers, timeout_s=timeout_s)

    # -- events ---------------------------------------------------------------------------
    def on_events(self, events: dict, poller) -> None:
        """Read every worker pipe that ``poller`` reported readable."""
        for fd, w in list(self._by_fd.items()):
            if fd in events:
                self._collect(w, poller)

    def _collect(self, w: WorkerHandle, poller) -> None:
        try:
            while w.conn.poll(0):
                try:
                    reply = proto.decode_pipe(w.conn.recv_bytes())
                except ProtocolError:
                    log.exception("worker %d sent an unreadable message", w.index)
                    continue
                if reply["op"] == "hello":
                    w.pid, w.ready = reply["pid"], True
                    w.ready_s = time.monotonic() - w.spawned_at
                    continue
                job = w.job
                if job is None or reply.get("job") != job.job_id:
                    continue  # not the job this worker holds: keep waiting for that one
                w.job = None
                w.busy_s += time.monotonic() - w.job_started
                if reply["op"] == "done":
                    w.batches_done += 1
                    self._on_done(job, reply["size"], reply["n_targets"])
                else:
                    self.scheduler.fail(job)
                    self._on_failed(job, w.pid, reply["error"])
        except (EOFError, OSError):
            self._died(w, poller)

    def check(self, now: float, poller) -> None:
        """Kill workers stuck past the job timeout; replace dead ones."""
        for w in list(self._by_fd.values()):
            if w.process.exitcode is None and w.job is not None and now - w.job_started > self.job_timeout_s:
                # A worker stuck in one batch holds its slot forever: kill it; the dead-worker
                # path below re-runs the job in a fresh one.
                log.warning("worker %d (pid %s) spent over %.0f s on batch %d; killing it", w.index, w.pid, self.job_timeout_s, w.job.batch)
                w.process.kill()
                w.process.join(5.0)
            if w.process.exitcode is not None:
                self._died(w, poller)

    def _died(self, w: WorkerHandle, poller) -> None:
        fd = w.conn.fileno()
        if self._by_fd.pop(fd, None) is None:
            return
        poller.unregister(fd)
        w.process.join(1.0)
        code = w.process.exitcode
        job = w.job
        stop_workers([w], timeout_s=1.0)
        if self.stopping or self.fatal is not None:
            return
        self._start_failures = 0 if w.ready else self._start_failures + 1
        if self._start_failures >= _START_FAILURES_FATAL:
            self.fatal = f"augmentation workers die before they are ready (last exit code {code}); run `pixpool serve -v` and check the worker's error above"
            return
        log.warning("worker %d (pid %s) died with exit code %s%s; starting a new one", w.index, w.pid, code,
                    f", re-running batch {job.batch} of trainer {job.trainer_id}" if job else "")
        if job is not None:
            self.scheduler.retry(job)
        new = spawn_worker(self._mp, w.index, self.sources, self.renderer_name)
        new.batches_done, new.busy_s = w.batches_done, w.busy_s
        self._add(new, poller)
        self.restarts += 1

    # -- work -----------------------------------------------------------------------------
    def dispatch(self) -> None:
        """Give every free, ready worker the scheduler's next job."""
        for w in self.workers:
            if not w.ready or w.job is not None:
                continue
            job = self.scheduler.next_job()
            if job is None:
                return
            w.job, w.job_started = job, time.monotonic()
            try:
                w.send("job", job=job.job_id, slot=job.slot, epoch=job.epoch, batch=job.batch, **self._describe(job))
            except (OSError, ValueError):
                pass  # the worker died; the liveness check re-queues its job

    def forget_ring(self, ring_name: str) -> None:
        """Tell every worker to close a ring whose trainer left."""
        for w in self.workers:
            try:
                w.send("forget", ring=ring_name)
            except (OSError, ValueError):
                pass
