"""Which part of which batch a free worker renders next, into which slot; in-order announcement.

Runs inside the daemon's main loop only (single-threaded; no locks). Pure bookkeeping: it
starts no process and touches no socket, so it is tested on its own.

- A job is a *part*: a run of sample positions ``start .. stop`` of one batch, rendered
  into that batch's slot at those positions. A batch is split into ``parts`` runs of
  near-equal length (``parts`` = the daemon's worker count, fewer for a short batch), so
  all workers fill one slot together and a batch arrives in about 1/W of one worker's
  time. The bytes of a sample depend on (seed, epoch, sample index) only, never on the
  split, so the split is free to follow the worker count.
- Each attached trainer has a stream: the epoch it asked for, the next batch to open, the
  next batch to announce, and its ring's slots. A slot is *free*, *filling* (its batch's
  parts are being rendered), *finished* (every part in; it waits for an earlier batch), or
  *held* (announced; the trainer reads it until it sends ``release``). A slot is opened
  for the next batch only when it is free: a trainer that does not release gets no more
  work, so the daemon never buffers more than its K slots for it.
- Order of work: a free worker takes a part of the trainer that has been handed the fewest
  samples (ties round robin), among the trainers that have one; within a stream, the
  earliest filling batch's parts first, then a new batch in a free slot. Re-runs of parts a
  dead worker lost go before anything else. Counting samples, not turns, keeps trainers of
  one batch size but different routes (tuning trials: mosaic on or off) waiting alike: a
  stream's batches in flight are bounded by its slots, so under plain round robin the one
  whose parts render faster (or whose pipeline refills faster at an epoch start) asked for
  work more often and got more of it (``tests/integration/test_fair_share.py``); counted in
  samples, the one that was not asking goes first when it asks again. The lead a stream
  can take back is bounded (``CREDIT_BATCHES`` of the largest batches among the trainers
  that want work, behind the most served one): a trainer that paused (validation, a
  checkpoint) or attached late catches up briefly, never starving the others for long.
- Order of delivery: finished batches wait in their slot until every earlier batch of the
  stream is announced. An ``Announcement`` carries every sample's target-row count, for
  the daemon to pack the slot's targets before it writes the header.
- A job carries the stream's ``generation``; a ``start`` (new epoch or resume position)
  bumps it, so results of abandoned parts are dropped. A slot of an abandoned batch is
  freed only once none of its parts is out any more (done, failed or dead): a part still
  running would otherwise write into the slot after it was given to a newer batch.
- A release names the batch it gives back (epoch, batch, generation, as announced), not
  only the slot: a duplicate or late release of a slot number that has been re-announced
  with a newer batch since is refused, so a worker never overwrites a slot the trainer
  still reads.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ...shared.errors import ProtocolError
from ...shared.stream.config import StreamSettings

# How far (in batches of the largest batch size wanting work) a stream may fall behind the most
# served one and still be owed the difference: short pauses are made up, long ones are forgiven.
CREDIT_BATCHES = 2


@dataclass(frozen=True)
class Job:
    """One part: sample positions ``start`` .. ``stop`` of ``batch`` (of ``size`` samples) into ``slot``."""

    job_id: int
    trainer_id: int
    generation: int
    epoch: int
    batch: int
    slot: int
    start: int
    stop: int
    size: int


@dataclass(frozen=True)
class Announcement:
    trainer_id: int
    slot: int
    epoch: int
    batch: int
    size: int
    n_targets: int
    generation: int
    counts: tuple[int, ...]  # target rows of each sample position, for packing the slot


@dataclass
class _Fill:
    """One batch being rendered into one slot: its parts still to hand out, out, and done."""

    batch: int
    slot: int
    size: int
    todo: deque  # (start, stop) not handed out yet
    out: int = 0  # parts handed out (running, or queued for a re-run) and not back yet
    left: int = 0  # parts not done yet
    counts: list = field(default_factory=list)
    done: set = field(default_factory=set)  # (start, stop) of the parts in


@dataclass(frozen=True)
class Progress:
    """Where one trainer's stream stands, as ``status`` reports it (``Scheduler.progress``)."""

    epoch: int
    next_batch: int  # the next batch to announce
    num_batches: int
    batches_delivered: int
    images_delivered: int
    img_per_s: float
    slots: int
    slots_in_use: int  # filling, finished or held


def split(size: int, parts: int) -> list[tuple[int, int]]:
    """``size`` sample positions as ``min(size, parts)`` runs whose lengths differ by at most one."""
    n = max(1, min(size, parts))
    bounds = [k * size // n for k in range(n + 1)]
    return list(itertools.pairwise(bounds))


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
    size_of: Callable[[int], int] | None = None  # batch -> its sample count, for this epoch
    free: deque = field(default_factory=deque)
    filling: dict = field(default_factory=dict)  # batch -> _Fill, in batch order
    finished: dict = field(default_factory=dict)  # batch -> _Fill with every part in
    abandoned: dict = field(default_factory=dict)  # slot -> parts of an abandoned batch still out
    held: dict = field(default_factory=dict)  # slot -> (epoch, batch, generation) announced in it
    batches_delivered: int = 0
    images_delivered: int = 0
    served: int = 0  # samples handed out to workers (the fair-share count; may be raised, never lowered)
    first_delivery_s: float | None = None
    last_delivery_s: float | None = None

    def __post_init__(self) -> None:
        self.free.extend(range(self.slots))

    @property
    def wants_work(self) -> bool:
        if self.epoch < 0:
            return False
        return any(f.todo for f in self.filling.values()) or (bool(self.free) and self.next_dispatch < self.num_batches)

    def images_per_s(self) -> float:
        if (
            self.first_delivery_s is None
            or self.last_delivery_s is None
            or self.last_delivery_s <= self.first_delivery_s
        ):
            return 0.0
        return self.images_delivered / (self.last_delivery_s - self.first_delivery_s)


class Scheduler:
    """``parts``: how many runs a batch is split into (the daemon passes its worker count)."""

    def __init__(self, parts: int = 1) -> None:
        self.parts = max(1, int(parts))
        self.streams: dict[int, Stream] = {}
        self._order: list[int] = []
        self._rr = 0
        self._retry: deque[Job] = deque()
        self._job_ids = itertools.count(1)

    # -- queries (what the supervisor and the status reply read) ------------------------------
    def still_wanted(self, job: Job) -> bool:
        """``job``'s trainer is attached and has not sent a ``start`` since the job was made;
        otherwise its result is dropped whenever it comes back."""
        s = self.streams.get(job.trainer_id)
        return s is not None and s.generation == job.generation

    def progress(self, trainer_id: int) -> Progress:
        """Where the stream of ``trainer_id`` (attached) stands."""
        s = self.streams[trainer_id]
        return Progress(
            epoch=s.epoch,
            next_batch=s.next_announce,
            num_batches=s.num_batches,
            batches_delivered=s.batches_delivered,
            images_delivered=s.images_delivered,
            img_per_s=s.images_per_s(),
            slots=s.slots,
            slots_in_use=s.slots - len(s.free),
        )

    # -- trainers -----------------------------------------------------------------------
    def add(self, trainer_id: int, settings: StreamSettings, slots: int) -> Stream:
        stream = Stream(trainer_id=trainer_id, settings=settings, slots=slots)
        self.streams[trainer_id] = stream
        self._order.append(trainer_id)
        return stream

    def remove(self, trainer_id: int) -> None:
        """Forget a trainer; its parts still running finish into a ring nobody reads and are dropped."""
        self.streams.pop(trainer_id, None)
        if trainer_id in self._order:
            self._order.remove(trainer_id)
        self._retry = deque(j for j in self._retry if j.trainer_id != trainer_id)

    def start(
        self, trainer_id: int, *, epoch: int, batch: int, num_batches: int, size_of: Callable[[int], int] | None = None
    ) -> None:
        """Produce ``epoch`` of this trainer from ``batch`` on; abandons unannounced work.

        ``size_of(b)``: the sample count of batch b of this epoch (default: the stream's
        batch size; the daemon passes the renderer's, which knows the short last batch)."""
        s = self.streams[trainer_id]
        if not 0 <= batch <= num_batches:
            raise ProtocolError(f"start at batch {batch} of epoch {epoch}, which has {num_batches} batches")
        s.generation += 1
        # Queued re-runs of this trainer will never run: they are back, not out.
        for job in [j for j in self._retry if j.trainer_id == trainer_id]:
            fill = s.filling.get(job.batch)
            if fill is not None and fill.slot == job.slot:
                fill.out -= 1
            else:
                self._settle(s, job.slot)
        self._retry = deque(j for j in self._retry if j.trainer_id != trainer_id)
        for fill in s.finished.values():
            s.free.append(fill.slot)
        s.finished.clear()
        for fill in s.filling.values():
            self._abandon(s, fill)
        s.filling.clear()
        s.epoch, s.num_batches, s.next_dispatch, s.next_announce = epoch, num_batches, batch, batch
        s.size_of = size_of

    def release(self, trainer_id: int, slot: int, *, epoch: int, batch: int, generation: int) -> None:
        """The trainer is done with the batch announced as (epoch, batch, generation) in ``slot``."""
        s = self.streams[trainer_id]
        held = s.held.get(slot)
        if held is None:
            raise ProtocolError(
                f"release of slot {slot} (epoch {epoch} batch {batch} generation {generation}), which trainer {trainer_id} does not hold "
                f"(held: {sorted(s.held)}); release each announced batch once"
            )
        if held != (epoch, batch, generation):
            raise ProtocolError(
                f"release of slot {slot} names epoch {epoch} batch {batch} generation {generation}, but the slot now holds "
                f"epoch {held[0]} batch {held[1]} generation {held[2]}; a stale or duplicate release is refused"
            )
        del s.held[slot]
        s.free.append(slot)

    # -- slots of abandoned work ------------------------------------------------------------
    def _abandon(self, s: Stream, fill: _Fill) -> None:
        """``fill`` will never be announced: its slot is free once none of its parts is out."""
        if fill.out > 0:
            s.abandoned[fill.slot] = s.abandoned.get(fill.slot, 0) + fill.out
        else:
            s.free.append(fill.slot)

    def _settle(self, s: Stream, slot: int) -> None:
        """A part of an abandoned batch in ``slot`` is back (done, failed, dead or dropped)."""
        left = s.abandoned.get(slot, 0) - 1
        if left > 0:
            s.abandoned[slot] = left
        elif slot in s.abandoned:
            del s.abandoned[slot]
            s.free.append(slot)

    def _current(self, s: Stream | None, job: Job) -> _Fill | None:
        """The fill ``job`` belongs to, if it is still wanted."""
        if s is None or job.generation != s.generation:
            return None
        fill = s.filling.get(job.batch)
        return fill if fill is not None and fill.slot == job.slot else None

    # -- jobs ---------------------------------------------------------------------------
    def next_job(self) -> Job | None:
        while self._retry:
            job = self._retry.popleft()
            s = self.streams.get(job.trainer_id)
            if self._current(s, job) is not None:
                return job
            if s is not None:  # a re-run of abandoned work: it is back, not out
                self._settle(s, job.slot)
        n = len(self._order)
        wanting = [(k, s) for k in range(n) if (s := self.streams[self._order[(self._rr + k) % n]]).wants_work]
        if not wanting:
            return None
        top = max(s.served for _, s in wanting)
        credit = CREDIT_BATCHES * max(s.settings.batch_size for _, s in wanting)
        for _, s in wanting:  # no credit past CREDIT_BATCHES of the largest batches (module docstring)
            s.served = max(s.served, top - credit)
        k, s = min(wanting, key=lambda ks: ks[1].served)  # the first in round-robin order among equals
        self._rr = (self._rr + k + 1) % n
        return self._next_part(s)

    def _next_part(self, s: Stream) -> Job:
        fill = next((f for f in s.filling.values() if f.todo), None)
        if fill is None:
            b = s.next_dispatch
            size = s.size_of(b) if s.size_of is not None else s.settings.batch_size
            runs = split(size, self.parts)
            fill = _Fill(batch=b, slot=s.free.popleft(), size=size, todo=deque(runs), left=len(runs), counts=[0] * size)
            s.filling[b] = fill
            s.next_dispatch += 1
        start, stop = fill.todo.popleft()
        fill.out += 1
        s.served += stop - start
        return Job(
            next(self._job_ids), s.trainer_id, s.generation, s.epoch, fill.batch, fill.slot, start, stop, fill.size
        )

    def retry(self, job: Job) -> None:
        """A worker died with ``job``: run it again before anything else (same slot, same samples)."""
        s = self.streams.get(job.trainer_id)
        if self._current(s, job) is not None:
            self._retry.appendleft(job)
        elif s is not None:
            self._settle(s, job.slot)

    def complete(self, job: Job, *, counts: list[int]) -> list[Announcement]:
        """Record a finished part (``counts``: target rows of each of its samples); return
        the announcements now due, in batch order."""
        s = self.streams.get(job.trainer_id)
        if s is None:
            return []
        fill = self._current(s, job)
        if fill is None:
            self._settle(s, job.slot)
            return []
        if len(counts) != job.stop - job.start:
            raise ProtocolError(
                f"part {job.start}..{job.stop} of batch {job.batch} reported {len(counts)} target counts"
            )
        fill.out -= 1
        if (job.start, job.stop) in fill.done:
            return []
        fill.done.add((job.start, job.stop))
        fill.counts[job.start : job.stop] = counts
        fill.left -= 1
        if fill.left > 0:
            return []
        del s.filling[job.batch]
        s.finished[job.batch] = fill
        out = []
        now = time.monotonic()
        while s.next_announce in s.finished:
            f = s.finished.pop(s.next_announce)
            s.held[f.slot] = (s.epoch, f.batch, s.generation)
            out.append(
                Announcement(
                    job.trainer_id, f.slot, s.epoch, f.batch, f.size, sum(f.counts), s.generation, tuple(f.counts)
                )
            )
            s.next_announce += 1
            s.batches_delivered += 1
            s.images_delivered += f.size
            if s.first_delivery_s is None:
                s.first_delivery_s = now
            s.last_delivery_s = now
        return out

    def fail(self, job: Job) -> None:
        """The part raised in the worker: its batch is given up (the daemon reports the
        error); the slot is free once the batch's other parts are back."""
        s = self.streams.get(job.trainer_id)
        if s is None:
            return
        fill = self._current(s, job)
        if fill is None:
            self._settle(s, job.slot)
            return
        same = [
            j for j in self._retry if self._current(s, j) is fill
        ]  # queued re-runs of its other parts never run now
        self._retry = deque(j for j in self._retry if self._current(s, j) is not fill)
        del s.filling[job.batch]
        fill.out -= 1 + len(same)
        self._abandon(s, fill)
