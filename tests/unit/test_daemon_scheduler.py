"""Unit tests of the scheduler: fairness, credits, in-order announcement, re-runs."""

from __future__ import annotations

import pytest

from pixpool.server.daemon.scheduler import Scheduler
from pixpool.shared.config import StreamSettings
from pixpool.shared.errors import ProtocolError


def _sched(*trainers, slots=2, batches=6):
    s = Scheduler()
    for tid in trainers:
        s.add(tid, StreamSettings(seed=tid), slots)
        s.start(tid, epoch=0, batch=0, num_batches=batches)
    return s


def test_round_robin_over_trainers_with_credits():
    s = _sched(1, 2, slots=2)
    jobs = [s.next_job() for _ in range(5)]
    assert [(j.trainer_id, j.batch) for j in jobs[:4]] == [(1, 0), (2, 0), (1, 1), (2, 1)]
    assert jobs[4] is None  # both rings full: no credit, no work


def test_out_of_order_completion_is_announced_in_order():
    s = _sched(1, slots=3)
    j0, j1, j2 = (s.next_job() for _ in range(3))
    assert s.complete(j2, size=16, n_targets=1) == []
    assert s.complete(j1, size=16, n_targets=1) == []
    out = s.complete(j0, size=16, n_targets=5)
    assert [(a.batch, a.slot) for a in out] == [(0, j0.slot), (1, j1.slot), (2, j2.slot)]
    assert s.streams[1].batches_delivered == 3


def test_release_returns_credit_and_rejects_unheld_slots():
    s = _sched(1, slots=2)
    j0, j1 = s.next_job(), s.next_job()
    with pytest.raises(ProtocolError, match="does not hold"):
        s.release(1, j0.slot, epoch=0, batch=0, generation=1)  # not announced yet
    (a0,) = s.complete(j0, size=1, n_targets=0)
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
    s.complete(j0, size=1, n_targets=0)
    s.release(1, j0.slot, epoch=0, batch=0, generation=1)
    j2 = s.next_job()
    s.complete(j1, size=1, n_targets=0)
    s.complete(j2, size=1, n_targets=0)  # batch 2 announced in batch 0's slot
    with pytest.raises(ProtocolError, match=r"names epoch 0 batch 0 generation 1, but the slot now holds epoch 0 batch 2 generation 1"):
        s.release(1, j0.slot, epoch=0, batch=0, generation=1)
    assert s.streams[1].held[j0.slot] == (0, 2, 1) and j0.slot not in s.streams[1].free
    assert s.next_job() is None, "the stale release gave a worker a slot the trainer still reads"
    with pytest.raises(ProtocolError, match="generation 2, but the slot now holds epoch 0 batch 2 generation 1"):
        s.release(1, j0.slot, epoch=0, batch=2, generation=2)
    s.release(1, j0.slot, epoch=0, batch=2, generation=1)
    assert s.next_job().slot == j0.slot


def test_retry_runs_first_into_the_same_slot():
    s = _sched(1, 2, slots=2)
    lost = s.next_job()
    s.retry(lost)
    again = s.next_job()
    assert again == lost


def test_new_start_drops_stale_jobs_and_frees_slots():
    s = _sched(1, slots=2, batches=4)
    j0, j1 = s.next_job(), s.next_job()
    s.complete(j1, size=1, n_targets=0)  # waits for j0
    s.start(1, epoch=1, batch=0, num_batches=4)
    assert s.complete(j0, size=1, n_targets=0) == []  # stale generation: dropped
    j = s.next_job()
    assert (j.epoch, j.batch) == (1, 0)
    assert s.next_job().batch == 1  # both slots free again


def test_last_batch_then_nothing_and_remove():
    s = _sched(1, slots=4, batches=2)
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
    assert sorted(st.free) == [0, 1] and not st.busy
    assert sorted(s.next_job().slot for _ in range(2)) == [0, 1]  # both credits usable again


def test_stale_retry_popped_by_next_job_frees_its_slot():
    s = _sched(1, slots=1)
    job = s.next_job()
    s.retry(job)
    s.streams[1].generation += 1  # the stream moved on without start() seeing the retry
    assert s.next_job() is not None  # the stale retry is skipped and its slot reused
