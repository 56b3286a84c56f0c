"""A ring the daemon's budget refuses: which ring, where the budget came from, what helps.

Unit tests of ``server/daemon/admission.py``: no process, no segment. A trainer's validation
ring (batch 16 at the rect side) is larger than its training ring and is asked for at the first
validation pass, so on a near-full store it is the one refused, with the user's batch of 8 fine.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pixpool.server.daemon.admission import ring_budget, ring_for
from pixpool.shared.errors import CapacityError
from pixpool.shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings
from pixpool.shared.task import DETECT

SOURCE = SimpleNamespace(max_instances=3, imgsz=64, spec=DETECT)


def _refusal(settings: StreamSettings, config: DaemonConfig, budget: tuple[int, str]) -> str:
    with pytest.raises(CapacityError) as info:
        ring_for(
            {"slots": 3, "delivery": "shm"},
            settings,
            source=SOURCE,
            renderer=SimpleNamespace(max_targets=lambda n, s: n * s.batch_size),
            config=config,
            rings_nbytes=1000,
            ring_budget_nbytes=budget[0],
            ring_budget_from=budget[1],
            trainers=1,
            snapshot_nbytes=0,
        )
    return str(info.value)


def test_a_refused_validation_ring_says_so_where_the_budget_came_from_and_the_flags(tmp_path):
    config = DaemonConfig(data="x.json", dtype="float32")
    nbytes, source = ring_budget(config, str(tmp_path))
    assert source.startswith("half of the ") and str(tmp_path) in source and "when the daemon started" in source
    val = StreamSettings(split="val", batch_size=16, augment=AugmentConfig(imgsz=64))
    text = _refusal(val, config, (1001, source))
    assert "the validation ring (3 slots of batch 16 at 64 px)" in text, text
    assert f"budget of 1001 bytes ({source})" in text, text
    for flag in ("--val-batch-size", "--val 0", "--store DIR", "--dtype uint8", "--max-total-ring-nbytes"):
        assert flag in text, (flag, text)


def test_a_refused_training_ring_names_the_batch_and_the_flag_given_budget():
    config = DaemonConfig(data="x.json", dtype="uint8", max_total_ring_nbytes=1001)
    budget = ring_budget(config, "/nonexistent-store-not-read")
    assert budget == (1001, "set by --max-total-ring-nbytes")
    text = _refusal(StreamSettings(batch_size=8, augment=AugmentConfig(imgsz=64)), config, budget)
    assert "the training ring (3 slots of batch 8 at 64 px)" in text and "(set by --max-total-ring-nbytes)" in text
    assert "--batch-size" in text and "--val-batch-size" not in text
    assert "--dtype" not in text  # already the cheaper dtype
