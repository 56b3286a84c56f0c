"""Which batch a free worker renders next, into which slot; in-order announcement.

Runs inside the daemon's main loop only (single-threaded; no locks). Pure bookkeeping: it
starts no process and touches no socket, so it is tested on its own.

- Each attached trainer has a stream: the epoch it asked for, the next batch to hand out,
  the next batch to announce, and its ring's slots. A slot is *free*, *busy* (a worker
  renders into it, or it holds a finished batch that waits for an earlier one), or *held*
  (announced; the trainer reads it until it sends ``release``). Credits = free slots: a
  trainer that does not release gets no more work, so the daemon never buffers more than
  K batches for it.
- Fairness: free workers take jobs round robin over the trainers that have a free slot
  and a batch left; re-runs of jobs a dead worker lost go first.
- Order: workers may finish out of order; finished batches wait in their slot until every
  earlier batch of the stream is announced.
- A job carries the stream's ``generation``; a ``start`` (new epoch or resume position)
  bumps it, so results of abandoned jobs are dropped and their slots freed.
- A release names the batch it gives back (epoch, batch, generation, as announced), not
  only the slot: a duplicate or late release of a slot number that has been re-announced
  with a newer batch since is refused, so a worker never overwrites a slot the trainer
  still reads.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

from ...shared.config import StreamSettings
from ...shared.errors import ProtocolError


@dataclass(frozen=True)
class Job:
    job_id: int
    trainer_id: int
    generation: int
    epoch: int
    batch: int
    slot: int


@dataclass(frozen=True)
class Announcement:
    trainer_id: int
    slot: int
    epoch: int
    batch: int
    size: int
    n_targets: int
    generation: int


@dataclass
class Stream:
    trainer_id: int
    settings: StreamSettings
    slots: int
    epoch: int = -1
    num_batches: int = 0
    next_dispatch: int = 0
    next_announce: int = 0
    generation: int = 0
    free: deque = field(default_factory=deque)
    busy: set = field(default_factory=set)
    held: dict = field(default_factory=dict)  # slot -> (epoch, batch, generation) announced in it
    finished: dict = field(default_factory=dict)  # batch -> (slot, size, n_targets)
    batches_delivered: int = 0
    images_delivered: int = 0
    first_delivery_s: float | None = None
    last_delivery_s: float | None = None

    def __post_init__(self) -> None:
        self.free.extend(range(self.slots))

    @property
    def wants_work(self) -> bool:
        return self.epoch >= 0 and bool(self.free) and self.next_dispatch < self.num_batches

    def images_per_s(self) -> float:
        if self.first_delivery_s is None or self.last_delivery_s is None or self.last_delivery_s <= self.first_delivery_s:
            return 0.0
        return self.images_delivered / (self.last_delivery_s - self.first_delivery_s)


class Scheduler:
    def __init__(self) -> None:
        self.streams: dict[int, Stream] = {}
        self._order: list[int] = []
        self._rr = 0
        self._retry: deque[Job] = deque()
        self._job_ids = itertools.count(1)

    # -- trainers -----------------------------------------------------------------------
    def add(self, trainer_id: int, settings: StreamSettings, slots: int) -> Stream:
        stream = Stream(trainer_id=trainer_id, settings=settings, slots=slots)
        self.streams[trainer_id] = stream
        self._order.append(trainer_id)
        return stream

    def remove(self, trainer_id: int) -> None:
        """Forget a trainer; its in-flight jobs finish into a ring nobody reads and are dropped."""
        self.streams.pop(trainer_id, None)
        if trainer_id in self._order:
            self._order.remove(trainer_id)
        self._retry = deque(j for j in self._retry if j.trainer_id != trainer_id)

    def start(self, trainer_id: int, *, epoch: int, batch: int, num_batches: int) -> None:
        """Produce ``epoch`` of this trainer from ``batch`` on; abandons unannounced work."""
        s = self.streams[trainer_id]
        if not 0 <= batch <= num_batches:
            raise ProtocolError(f"start at batch {batch} of epoch {epoch}, which has {num_batches} batches")
        s.generation += 1
        for slot, _, _ in s.finished.values():
            s.busy.discard(slot)
            s.free.append(slot)
        s.finished.clear()
        # Busy slots of abandoned jobs still running are freed when those jobs report back;
        # queued retries of this trainer will never run, so their slots are freed now.
        for job in [j for j in self._retry if j.trainer_id == trainer_id]:
            self._drop(s, job)
        self._retry = deque(j for j in self._retry if j.trainer_id != trainer_id)
        s.epoch, s.num_batches, s.next_dispatch, s.next_announce = epoch, num_batches, batch, batch

    def release(self, trainer_id: int, slot: int, *, epoch: int, batch: int, generation: int) -> None:
        """The trainer is done with the batch announced as (epoch, batch, generation) in ``slot``."""
        s = self.streams[trainer_id]
        held = s.held.get(slot)
        if held is None:
            raise ProtocolError(f"release of slot {slot} (epoch {epoch} batch {batch} generation {generation}), which trainer {trainer_id} does not hold "
                                f"(held: {sorted(s.held)}); release each announced batch once")
        if held != (epoch, batch, generation):
            raise ProtocolError(f"release of slot {slot} names epoch {epoch} batch {batch} generation {generation}, but the slot now holds "
                                f"epoch {held[0]} batch {held[1]} generation {held[2]}; a stale or duplicate release is refused")
        del s.held[slot]
        s.free.append(slot)

    # -- jobs ---------------------------------------------------------------------------
    def next_job(self) -> Job | None:
        while self._retry:
            job = self._retry.popleft()
            s = self.streams.get(job.trainer_id)
            if s is not None and job.generation == s.generation:
                return job
            if s is not None:  # a retry from an abandoned generation: give its slot back
                self._drop(s, job)
        n = len(self._order)
        for k in range(n):
            tid = self._order[(self._rr + k) % n]
            s = self.streams[tid]
            if s.wants_work:
                self._rr = (self._rr + k + 1) % n
                slot = s.free.popleft()
                s.busy.add(slot)
                job = Job(next(self._job_ids), tid, s.generation, s.epoch, s.next_dispatch, slot)
                s.next_dispatch += 1
                return job
        return None

    def retry(self, job: Job) -> None:
        """A worker died with ``job``: run it again before anything else (same slot)."""
        s = self.streams.get(job.trainer_id)
        if s is not None and job.generation == s.generation:
            self._retry.appendleft(job)
        elif s is not None:
            self._drop(s, job)

    def _drop(self, s: Stream, job: Job) -> None:
        if job.slot in s.busy:
            s.busy.discard(job.slot)
            s.free.append(job.slot)

    def complete(self, job: Job, *, size: int, n_targets: int) -> list[Announcement]:
        """Record a finished job; return the announcements now due, in batch order."""
        s = self.streams.get(job.trainer_id)
        if s is None:
            return []
        if job.generation != s.generation:
            self._drop(s, job)
            return []
        s.finished[job.batch] = (job.slot, size, n_targets)
        out = []
        now = time.monotonic()
        while s.next_announce in s.finished:
            slot, size_, n_t = s.finished.pop(s.next_announce)
            s.busy.discard(slot)
            s.held[slot] = (s.epoch, s.next_announce, s.generation)
            out.append(Announcement(job.trainer_id, slot, s.epoch, s.next_announce, size_, n_t, s.generation))
            s.next_announce += 1
            s.batches_delivered += 1
            s.images_delivered += size_
            if s.first_delivery_s is None:
                s.first_delivery_s = now
            s.last_delivery_s = now
        return out

    def fail(self, job: Job) -> None:
        """The job raised in the worker: free its slot; the daemon reports the error."""
        s = self.streams.get(job.trainer_id)
        if s is not None:
            self._drop(s, job)
