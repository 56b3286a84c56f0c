"""Worker supervision: start the augmentation workers, hand them jobs (batch parts), replace the dead.

Runs in the daemon process, inside its single-threaded loop (``service.py``). It owns the
worker processes and the daemon's end of their pipes; the workers run ``worker.py``.

- Workers are spawned one by one (``spawn`` context) and appended as they start, so a
  failure half-way still leaves every started one to ``stop``.
- A free, ready worker takes the scheduler's next job: a part of a batch (sample positions
  ``start .. stop``, see ``scheduler.py``); its result comes back over the pipe
  (``done`` with each sample's target-row count, or ``failed``; ``shared/wire/worker_pipe.py``)
  and goes to the daemon's callbacks. Every timing below is per part.
- Stragglers: a part that has run longer than ``straggler_factor`` times the median of
  the recently measured part times (and at least ``straggler_min_s``) is given to an idle
  worker as well, into the same positions of the same slot (bytes depend only on the
  samples, so both write the same bytes). The first result wins; the other worker is
  killed and replaced at once, before the slot can be announced, because a late write of
  its into a slot that has been released and reused since would land under the trainer.
  One stalled worker (SIGSTOP, swapping) so costs one part time past the deadline, not
  ``job_timeout_s``.
- A worker stuck in one part past ``job_timeout_s`` is killed; a dead worker's part (only
  its samples, not the batch) is re-queued first (unless another worker still runs it)
  and a new worker takes its place.
- Start failures are counted per worker slot (``index``), and only for a worker that
  dies on its own before it is ready: one killed from outside (SIGKILL, SIGTERM, SIGINT:
  an operator, a test, the OOM killer) or one that was ready says nothing about whether
  the next start works. A slot whose worker keeps dying before it is ready is restarted
  after a back-off that doubles each time (``_BACKOFF_FIRST_S`` up to ``_BACKOFF_MAX_S``),
  so nothing loops hot; ``_START_FAILURES_FATAL`` failures of its own in a row on one
  slot would fail again: that is fatal (``fatal`` says why).
- ``stop``: stop -> join (one shared deadline) -> terminate -> kill, always reaping.
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable

import zmq

from ...shared.errors import ProtocolError
from ...shared.transport.store import DEFAULT, Store
from ...shared.wire.status import WorkerStatus
from ...shared.wire.worker_pipe import PipeOp, decode_pipe, pipe_frame
from .scheduler import Job, Scheduler
from .worker import worker_main

log = logging.getLogger(__name__)

_START_FAILURES_FATAL = 3
_BACKOFF_FIRST_S = 0.5
_BACKOFF_MAX_S = 30.0
# Job times a straggler deadline is derived from: the last this many, and at least this few.
_DURATIONS_KEPT, _DURATIONS_NEEDED = 64, 4
# Deaths by these signals come from outside the worker: not a failure of its start.
_EXTERNAL_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT}


@dataclass
class WorkerHandle:
    """The daemon's view of one worker: process, pipe end, current job, counters."""

    index: int
    process: Any
    conn: Connection
    pid: int = 0
    ready: bool = False
    job: Job | None = None
    parts_done: int = 0  # jobs done: batch parts
    samples_done: int = 0
    busy_s: float = 0.0
    job_started: float = 0.0
    spawned_at: float = 0.0
    ready_s: float = 0.0  # spawn -> hello: how long a new worker takes to be usable
    dead: bool = False  # gone; its slot waits for a back-off before a new worker starts

    @property
    def state(self) -> str:
        if self.dead:
            return "restarting"
        return "starting" if not self.ready else ("busy" if self.job else "idle")

    def send(self, op: PipeOp, **fields: Any) -> bool:
        """Send one pipe message; False when the worker's end is gone (the liveness check
        deals with it). A message its table refuses raises: that is a bug, not a dead worker."""
        frame = pipe_frame(op, **fields)
        try:
            self.conn.send_bytes(frame)
        except (OSError, ValueError):
            return False
        return True


def spawn_worker(ctx, index: int, sources: dict[str, Any], renderer_name: str, store: Store = DEFAULT) -> WorkerHandle:
    """Start one worker with the spawn context; it says hello when ready. ``store``: where
    the daemon's rings are (``shared.transport.store``)."""
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    proc = ctx.Process(
        target=worker_main,
        args=(index, child_conn, sources, renderer_name, os.getpid(), store),
        name=f"pixpool-worker-{index}",
        daemon=True,
    )
    proc.start()
    child_conn.close()
    return WorkerHandle(index=index, process=proc, conn=parent_conn, spawned_at=time.monotonic())


def stop_workers(handles: list[WorkerHandle], *, timeout_s: float = 5.0) -> None:
    """Stop all workers at once: stop -> join (one shared deadline) -> terminate -> kill.

    Bounded by about three times ``timeout_s`` whatever the number of workers, so a daemon
    with many workers still stops inside a service manager's stop timeout.
    """
    for h in handles:
        h.send(PipeOp.STOP)
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

    ``on_done(job, counts)`` (target rows per sample of the part) and
    ``on_failed(job, worker_pid, error)`` are the daemon's; ``describe(job)`` gives a job's
    ring, settings and batch size for the pipe.
    """

    def __init__(
        self,
        mp_ctx,
        sources: dict[str, Any],
        renderer_name: str,
        scheduler: Scheduler,
        *,
        job_timeout_s: float,
        describe: Callable[[Job], dict],
        on_done: Callable[[Job, list], None],
        on_failed: Callable[[Job, int, str], None],
        straggler_factor: float = 8.0,
        straggler_min_s: float = 5.0,
        store: Store = DEFAULT,
    ):
        self._mp = mp_ctx
        self.store = store
        self.sources = sources
        self.renderer_name = renderer_name
        self.scheduler = scheduler
        self.job_timeout_s = job_timeout_s
        self.straggler_factor, self.straggler_min_s = straggler_factor, straggler_min_s
        self._durations: deque[float] = deque(maxlen=_DURATIONS_KEPT)
        self.redispatched = 0
        self._describe, self._on_done_cb, self._on_failed_cb = describe, on_done, on_failed
        self.workers: list[WorkerHandle] = []
        self.restarts = 0
        self.fatal: str | None = None
        self.stopping = False  # set by the daemon once it stops: dead workers are not replaced
        self._start_failures: dict[int, int] = {}  # slot -> its workers' own deaths before ready, in a row
        self._early_deaths: dict[int, int] = {}  # slot -> deaths before ready of any cause, in a row (back-off)
        self._respawn_at: dict[int, float] = {}  # slot -> when its next worker starts
        self._by_fd: dict[int, WorkerHandle] = {}

    # -- lifetime -------------------------------------------------------------------------
    def start(self, count: int, poller) -> None:
        for i in range(count):  # appended one by one: stop() reaps those started if a spawn fails
            self._add(spawn_worker(self._mp, i, self.sources, self.renderer_name, self.store), poller)

    def _add(self, handle: WorkerHandle, poller) -> None:
        if handle.index < len(self.workers):
            self.workers[handle.index] = handle
        else:
            self.workers.append(handle)
        self._by_fd[handle.conn.fileno()] = handle
        poller.register(handle.conn.fileno(), zmq.POLLIN)

    def stop(self, *, timeout_s: float = 5.0) -> None:
        stop_workers(self.workers, timeout_s=timeout_s)

    # -- what the status reply says of the workers -----------------------------------------
    def describe(self) -> tuple[WorkerStatus, ...]:
        return tuple(
            WorkerStatus(
                index=w.index,
                pid=w.pid,
                state=w.state,
                parts_done=w.parts_done,
                samples_done=w.samples_done,
                busy_s=round(w.busy_s, 3),
                ready_s=round(w.ready_s, 3),
            )
            for w in self.workers
        )

    @property
    def workers_ready(self) -> int:
        return sum(w.state in ("idle", "busy") for w in self.workers)

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
                    reply = decode_pipe(w.conn.recv_bytes())
                except ProtocolError:
                    log.exception("worker %d sent an unreadable message", w.index)
                    continue
                handler = _FROM_WORKER.get(reply["op"])
                if handler is None:
                    log.error("worker %d sent %r, which only the daemon sends; ignored", w.index, reply["op"])
                    continue
                handler(self, w, reply, poller)
        except (EOFError, OSError):
            self._died(w, poller)

    def _on_hello(self, w: WorkerHandle, reply: dict, poller) -> None:
        w.pid, w.ready = reply["pid"], True
        w.ready_s = time.monotonic() - w.spawned_at

    def _finished(self, w: WorkerHandle, reply: dict, poller) -> Job | None:
        """The job a ``done``/``failed`` reply ends, now off the worker; None when it is not
        the job this worker holds (keep waiting for that one)."""
        job = w.job
        if job is None or reply["job"] != job.job_id:
            return None
        w.job = None
        w.busy_s += time.monotonic() - w.job_started
        self._cancel_others(job, w, poller)
        return job

    def _on_done(self, w: WorkerHandle, reply: dict, poller) -> None:
        job = self._finished(w, reply, poller)
        if job is None:
            return
        w.parts_done += 1
        w.samples_done += job.stop - job.start
        self._durations.append(float(reply["seconds"]))
        self._on_done_cb(job, reply["counts"])

    def _on_failed(self, w: WorkerHandle, reply: dict, poller) -> None:
        job = self._finished(w, reply, poller)
        if job is None:
            return
        self.scheduler.fail(job)
        self._on_failed_cb(job, w.pid, reply["error"])

    def straggler_after_s(self) -> float | None:
        """How long a job may run before an idle worker runs it too; None before enough
        jobs were measured to know what is slow."""
        if len(self._durations) < _DURATIONS_NEEDED:
            return None
        return max(self.straggler_min_s, self.straggler_factor * statistics.median(self._durations))

    def _cancel_others(self, job: Job, winner: WorkerHandle, poller) -> None:
        """The job's result is in: kill every other worker still running it (see module docstring)."""
        for other in list(self._by_fd.values()):
            if other is not winner and other.job is not None and other.job.job_id == job.job_id:
                log.warning(
                    "worker %d (pid %s) lost the race for samples %d..%d of batch %d of trainer %d to worker %d; replacing it",
                    other.index,
                    other.pid,
                    job.start,
                    job.stop,
                    job.batch,
                    job.trainer_id,
                    winner.index,
                )
                other.job = None  # not to be re-run: its result is in
                other.process.kill()
                other.process.join(5.0)
                self._died(other, poller)

    def _redispatch_stragglers(self, now: float) -> None:
        after = self.straggler_after_s()
        if after is None:
            return
        running: dict[int, list[WorkerHandle]] = {}
        for w in self._by_fd.values():
            if w.job is not None:
                running.setdefault(w.job.job_id, []).append(w)
        idle = [w for w in self._by_fd.values() if w.ready and not w.dead and w.job is None]
        for holders in running.values():
            if not idle:
                return
            w = holders[0]
            if not self.scheduler.still_wanted(w.job):
                continue  # abandoned work: its result is dropped anyway
            if len(holders) == 1 and now - w.job_started > after:
                spare = idle.pop(0)
                log.warning(
                    "samples %d..%d of batch %d of trainer %d have run %.1f s in worker %d (pid %s), over %.1f s (%.0fx the median part); "
                    "giving them to worker %d too",
                    w.job.start,
                    w.job.stop,
                    w.job.batch,
                    w.job.trainer_id,
                    now - w.job_started,
                    w.index,
                    w.pid,
                    after,
                    self.straggler_factor,
                    spare.index,
                )
                self._send_job(spare, w.job)
                self.redispatched += 1

    def check(self, now: float, poller) -> None:
        """Re-dispatch stragglers; kill workers stuck past the job timeout; replace dead ones."""
        self._redispatch_stragglers(now)
        for w in list(self._by_fd.values()):
            if w.process.exitcode is None and w.job is not None and now - w.job_started > self.job_timeout_s:
                # A worker stuck in one part holds its slot forever: kill it; the dead-worker
                # path below re-runs the part in a fresh one.
                log.warning(
                    "worker %d (pid %s) spent over %.0f s on samples %d..%d of batch %d; killing it",
                    w.index,
                    w.pid,
                    self.job_timeout_s,
                    w.job.start,
                    w.job.stop,
                    w.job.batch,
                )
                w.process.kill()
                w.process.join(5.0)
            if w.process.exitcode is not None:
                self._died(w, poller)
        for index, due in list(self._respawn_at.items()):
            if now >= due and not self.stopping and self.fatal is None:
                del self._respawn_at[index]
                self._respawn(self.workers[index], poller)

    def _died(self, w: WorkerHandle, poller) -> None:
        fd = w.conn.fileno()
        if self._by_fd.pop(fd, None) is None:
            return
        poller.unregister(fd)
        w.process.join(1.0)
        code = w.process.exitcode
        job = w.job
        stop_workers([w], timeout_s=1.0)
        w.dead = True
        if job is not None:
            w.job = None
            if not any(o.job is not None and o.job.job_id == job.job_id for o in self._by_fd.values()):
                self.scheduler.retry(job)  # unless another worker runs it still
        if self.stopping or self.fatal is not None:
            return
        i = w.index
        if w.ready:
            self._start_failures[i] = self._early_deaths[i] = 0
        else:
            self._early_deaths[i] = self._early_deaths.get(i, 0) + 1
            external = code is not None and code < 0 and -code in _EXTERNAL_SIGNALS
            if not external:
                self._start_failures[i] = self._start_failures.get(i, 0) + 1
            if self._start_failures.get(i, 0) >= _START_FAILURES_FATAL:
                self.fatal = (
                    f"augmentation worker {i} died before it was ready {self._start_failures[i]} times in a row (last exit code {code}); "
                    "run `pixpool serve -v` and check the worker's error above"
                )
                return
        delay = 0.0 if w.ready else min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** (self._early_deaths[i] - 1))
        if code == -signal.SIGBUS:  # the kernel's answer to a read past the end of a mapped file
            log.warning(
                "worker %d (pid %s) died of SIGBUS: a segment it maps was truncated (the daemon checks its snapshot)",
                i,
                w.pid,
            )
        log.warning(
            "worker %d (pid %s) died with exit code %s%s; starting a new one%s",
            i,
            w.pid,
            code,
            f", re-running samples {job.start}..{job.stop} of batch {job.batch} of trainer {job.trainer_id}"
            if job
            else "",
            f" in {delay:.1f} s" if delay else "",
        )
        if delay:
            self._respawn_at[i] = time.monotonic() + delay
        else:
            self._respawn(w, poller)

    def _respawn(self, old: WorkerHandle, poller) -> None:
        try:
            new = spawn_worker(self._mp, old.index, self.sources, self.renderer_name, self.store)
        except OSError as exc:
            # Out of descriptors or memory for a moment (a flood of idle connections):
            # the slot is tried again later, never left without a worker.
            log.warning("could not start worker %d (%s); trying again in %.1f s", old.index, exc, _BACKOFF_FIRST_S)
            self._respawn_at[old.index] = time.monotonic() + _BACKOFF_FIRST_S
            return
        new.parts_done, new.samples_done, new.busy_s = old.parts_done, old.samples_done, old.busy_s
        self._add(new, poller)
        self.restarts += 1

    # -- work -----------------------------------------------------------------------------
    def dispatch(self) -> None:
        """Give every free, ready worker the scheduler's next job."""
        for w in self.workers:
            if not w.ready or w.dead or w.job is not None:
                continue
            job = self.scheduler.next_job()
            if job is None:
                return
            self._send_job(w, job)

    def _send_job(self, w: WorkerHandle, job: Job) -> None:
        w.job, w.job_started = job, time.monotonic()
        # A worker that died meanwhile is found by the liveness check, which re-queues its job.
        w.send(
            PipeOp.JOB,
            job=job.job_id,
            slot=job.slot,
            epoch=job.epoch,
            batch=job.batch,
            start=job.start,
            stop=job.stop,
            **self._describe(job),
        )

    def forget_ring(self, ring_name: str) -> None:
        """Tell every worker to close a ring whose trainer left."""
        for w in self.workers:
            w.send(PipeOp.FORGET, ring=ring_name)


# What a worker sends -> the supervisor's handler (``worker_pipe.PIPE``; the other ops go the other way).
_FROM_WORKER: dict[PipeOp, Callable[[Supervisor, WorkerHandle, dict, Any], None]] = {
    PipeOp.HELLO: Supervisor._on_hello,
    PipeOp.DONE: Supervisor._on_done,
    PipeOp.FAILED: Supervisor._on_failed,
}
