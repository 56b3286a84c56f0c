"""Unit tests of the scheduler: fairness, credits, parts of one slot, in-order announcement, re-runs."""

from __future__ import annotations

import pytest

from pixpool.server.daemon.scheduler import Scheduler, split
from pixpool.shared.errors import ProtocolError
from pixpool.shared.stream.config import StreamSettings


def _sched(*trainers, slots=2, batches=6, parts=1, batch_size=16, last=None):
    s = Scheduler(parts=parts)
    for tid in trainers:
        s.add(tid, StreamSettings(seed=tid, batch_size=batch_size), slots)
        s.start(
            tid,
            epoch=0,
            batch=0,
            num_batches=batches,
            size_of=lambda b: last if last is not None and b == batches - 1 else batch_size,
        )
    return s


def _done(s, job, rows=1):
    return s.complete(job, counts=[rows] * (job.stop - job.start))


def test_split_covers_every_position_once_in_near_equal_runs():
    assert split(16, 1) == [(0, 16)]
    assert split(16, 3) == [(0, 5), (5, 10), (10, 16)]
    assert split(2, 3) == [(0, 1), (1, 2)]  # a short batch: no empty part
    for size in range(1, 20):
        for parts in range(1, 5):
            runs = split(size, parts)
            assert [i for a, b in runs for i in range(a, b)] == list(range(size))
            assert max(b - a for a, b in runs) - min(b - a for a, b in runs) <= 1


def test_round_robin_over_trainers_with_credits():
    s = _sched(1, 2, slots=2)
    jobs = [s.next_job() for _ in range(5)]
    assert [(j.trainer_id, j.batch) for j in jobs[:4]] == [(1, 0), (2, 0), (1, 1), (2, 1)]
    assert jobs[4] is None  # both rings full: no credit, no work


def test_all_parts_of_the_first_batch_go_out_before_the_next_batch_opens():
    s = _sched(1, slots=3, parts=3)
    jobs = [s.next_job() for _ in range(4)]
    assert [(j.batch, j.start, j.stop) for j in jobs] == [(0, 0, 5), (0, 5, 10), (0, 10, 16), (1, 0, 5)]
    assert len({j.slot for j in jobs[:3]}) == 1 and jobs[3].slot != jobs[0].slot  # three workers, one slot


def test_a_batch_is_announced_once_every_part_is_in_with_each_samples_count():
    s = _sched(1, slots=2, parts=2, batch_size=5)
    a, b = s.next_job(), s.next_job()
    assert (a.start, a.stop, b.start, b.stop) == (0, 2, 2, 5)
    assert s.complete(b, counts=[1, 0, 4]) == []  # half a slot is never announced
    (ann,) = s.complete(a, counts=[2, 3])
    assert (ann.batch, ann.slot, ann.size, ann.n_targets, ann.counts) == (0, a.slot, 5, 10, (2, 3, 1, 0, 4))


def test_a_part_reported_twice_counts_once():
    s = _sched(1, slots=2, parts=2)
    a, b = s.next_job(), s.next_job()
    assert _done(s, a) == [] and _done(s, a) == []  # a straggler's duplicate result
    assert [x.batch for x in _done(s, b)] == [0]


def test_short_last_batch_is_split_by_its_own_size():
    s = _sched(1, slots=3, batches=2, parts=3, batch_size=8, last=2)
    jobs = [s.next_job() for _ in range(6)]
    assert [(j.batch, j.start, j.stop) for j in jobs[:5]] == [(0, 0, 2), (0, 2, 5), (0, 5, 8), (1, 0, 1), (1, 1, 2)]
    assert jobs[5] is None
    out = [a for j in jobs[:5] for a in _done(s, j)]
    assert [(x.batch, x.size) for x in out] == [(0, 8), (1, 2)]


def test_out_of_order_completion_is_announced_in_order():
    s = _sched(1, slots=3)
    j0, j1, j2 = (s.next_job() for _ in range(3))
    assert _done(s, j2) == []
    assert _done(s, j1) == []
    out = s.complete(j0, counts=[0] * 15 + [5])
    assert [(a.batch, a.slot) for a in out] == [(0, j0.slot), (1, j1.slot), (2, j2.slot)]
    assert out[0].n_targets == 5
    assert s.streams[1].batches_delivered == 3


def test_release_returns_credit_and_rejects_unheld_slots():
    s = _sched(1, slots=2)
    j0, _ = s.next_job(), s.next_job()
    with pytest.raises(ProtocolError, match="does not hold"):
        s.release(1, j0.slot, epoch=0, batch=0, generation=1)  # not announced yet
    (a0,) = _done(s, j0, 0)
    assert a0.generation == 1
    assert s.next_job() is None
    s.release(1, j0.slot, epoch=0, batch=0, generation=1)
    with pytest.raises(ProtocolError):
        s.release(1, j0.slot, epoch=0, batch=0, generation=1)  # twice
    j2 = s.next_job()
    assert (j2.batch, j2.slot) == (2, j0.slot)


def test_a_duplicate_release_never_frees_a_reannounced_slot():
    """Batch 0 is released, its slot carries batch 2 next; a second release of batch 0
    must not free the slot under the trainer (a worker would overwrite batch 2)."""
    s = _sched(1, slots=2)
    j0, j1 = s.next_job(), s.next_job()
    _done(s, j0)
    s.release(1, j0.slot, epoch=0, batch=0, generation=1)
    j2 = s.next_job()
    _done(s, j1)
    _done(s, j2)  # batch 2 announced in batch 0's slot
    with pytest.raises(
        ProtocolError, match=r"names epoch 0 batch 0 generation 1, but the slot now holds epoch 0 batch 2 generation 1"
    ):
        s.release(1, j0.slot, epoch=0, batch=0, generation=1)
    assert s.streams[1].held[j0.slot] == (0, 2, 1) and j0.slot not in s.streams[1].free
    assert s.next_job() is None, "the stale release gave a worker a slot the trainer still reads"
    with pytest.raises(ProtocolError, match="generation 2, but the slot now holds epoch 0 batch 2 generation 1"):
        s.release(1, j0.slot, epoch=0, batch=2, generation=2)
    s.release(1, j0.slot, epoch=0, batch=2, generation=1)
    assert s.next_job().slot == j0.slot


def test_retry_reruns_only_the_lost_part_first_into_the_same_positions():
    s = _sched(1, 2, slots=2, parts=2)
    lost, kept = s.next_job(), s.next_job()
    assert (lost.trainer_id, kept.trainer_id) == (1, 2)
    s.retry(lost)
    again = s.next_job()
    assert again == lost  # same slot, same samples; the other parts are not re-run
    other = s.next_job()
    assert (other.trainer_id, other.batch, other.start) == (1, 0, 8)
    assert _done(s, again) == [] and [a.batch for a in _done(s, other)] == [0]


def test_new_start_drops_stale_jobs_and_frees_slots():
    s = _sched(1, slots=2, batches=4)
    j0, j1 = s.next_job(), s.next_job()
    _done(s, j1)  # waits for j0
    s.start(1, epoch=1, batch=0, num_batches=4)
    assert _done(s, j0) == []  # stale generation: dropped
    j = s.next_job()
    assert (j.epoch, j.batch) == (1, 0)
    assert s.next_job().batch == 1  # both slots free again


def test_a_slot_of_abandoned_work_is_reused_only_once_all_its_parts_are_back():
    """A part still running after a new start would write into the slot: it stays taken."""
    s = _sched(1, slots=2, batches=4, parts=2)
    a, b = s.next_job(), s.next_job()  # both parts of batch 0, slot a.slot
    _done(s, a)
    s.start(1, epoch=1, batch=0, num_batches=4)
    n = s.next_job()
    assert n.slot != a.slot
    assert s.next_job().slot == n.slot  # the second part of epoch 1's batch 0
    assert s.next_job() is None, "the abandoned slot was reused while a part still writes it"
    assert _done(s, b) == []
    assert s.next_job().slot == a.slot


def test_failed_part_gives_up_its_batch_and_frees_the_slot_when_the_rest_is_back():
    s = _sched(1, slots=2, parts=2)
    a, b = s.next_job(), s.next_job()
    s.fail(a)
    c = s.next_job()
    assert c.batch == 1 and c.slot != a.slot
    s.next_job()
    assert s.next_job() is None  # b still writes batch 0's slot
    assert _done(s, b) == []
    assert s.next_job().slot == a.slot


def test_last_batch_then_nothing_and_remove():
    s = _sched(1, slots=3, batches=2)
    assert [s.next_job().batch for _ in range(2)] == [0, 1]
    assert s.next_job() is None
    s.remove(1)
    assert s.next_job() is None and 1 not in s.streams


def test_new_start_frees_the_slots_of_queued_retries():
    """A worker died with a job, then the trainer started over before the re-run: no slot may leak."""
    s = _sched(1, slots=2)
    job = s.next_job()
    s.retry(job)  # the worker died; the re-run waits for a new worker
    s.start(1, epoch=1, batch=0, num_batches=6)
    st = s.streams[1]
    assert sorted(st.free) == [0, 1] and not st.filling and not st.abandoned
    assert sorted(s.next_job().slot for _ in range(2)) == [0, 1]  # both credits usable again


def test_stale_retry_popped_by_next_job_frees_its_slot():
    s = _sched(1, slots=2, parts=1)
    job, other = s.next_job(), s.next_job()
    s.retry(job)
    s.start(1, epoch=1, batch=0, num_batches=6)  # start() settles the queued retry
    s.retry(other)  # a retry arriving after the start: dropped, its slot comes back
    assert sorted(s.streams[1].free) == [0, 1]


def test_still_wanted_answers_for_the_supervisor_until_a_start_or_detach():
    s = _sched(1, 2, slots=2)
    j1, j2 = s.next_job(), s.next_job()
    assert s.still_wanted(j1) and s.still_wanted(j2)
    s.start(1, epoch=1, batch=0, num_batches=6)  # a new epoch: trainer 1's open parts are abandoned
    assert not s.still_wanted(j1) and s.still_wanted(j2)
    s.remove(2)
    assert not s.still_wanted(j2)


def test_progress_reports_where_a_stream_stands():
    s = _sched(1, slots=3, batches=4, batch_size=8)
    assert s.progress(1) == s.progress(1)  # a value, not a view of the stream
    j0, _ = s.next_job(), s.next_job()
    _done(s, j0)
    p = s.progress(1)
    assert (p.epoch, p.next_batch, p.num_batches, p.slots) == (0, 1, 4, 3)
    assert (p.batches_delivered, p.images_delivered, p.slots_in_use) == (1, 8, 2)  # one held, one filling
    with pytest.raises(AttributeError):
        p.epoch = 5  # frozen: the status reply cannot change the scheduler
    s.release(1, j0.slot, epoch=0, batch=0, generation=1)
    assert s.progress(1).slots_in_use == 1 and s.progress(1).next_batch == 1


def test_a_stream_back_from_a_pause_is_served_first_but_only_its_bounded_credit():
    """Fair share counts samples: a trainer that could take no work while the others got
    parts (slots full, validating, attached late) goes first when it wants work again, for
    at most CREDIT_BATCHES of its batches; then the turns are even again."""
    from pixpool.server.daemon.scheduler import CREDIT_BATCHES

    s = Scheduler(parts=1)
    for tid in (1, 2, 3):
        s.add(tid, StreamSettings(seed=tid, batch_size=16), 8)
    for tid in (2, 3):
        s.start(tid, epoch=0, batch=0, num_batches=100)
    assert [s.next_job().trainer_id for _ in range(10)] == [2, 3] * 5
    s.start(1, epoch=0, batch=0, num_batches=100)  # 5 batches behind the others
    order = [s.next_job().trainer_id for _ in range(CREDIT_BATCHES + 3)]
    assert order == [1] * CREDIT_BATCHES + [2, 3, 1]


def test_equal_samples_per_trainer_whatever_the_batch_size():
    s = Scheduler(parts=1)
    s.add(1, StreamSettings(seed=1, batch_size=4), 8)
    s.add(2, StreamSettings(seed=2, batch_size=16), 8)
    for tid in (1, 2):
        s.start(tid, epoch=0, batch=0, num_batches=100)
    jobs = [s.next_job() for _ in range(10)]
    samples = {tid: sum(j.stop - j.start for j in jobs if j.trainer_id == tid) for tid in (1, 2)}
    assert samples == {1: 32, 2: 32}
