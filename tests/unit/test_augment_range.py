"""``render_range``: any split of a batch into sample ranges is, concatenated, ``render_batch``.

This is what lets every worker render a part of one ring slot: the bytes a trainer gets
must not depend on how many workers there were (invariant 2, ``docs/invariants.md``).
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.sources import ArraySource
from pixpool.server.augment import render_batch, render_range
from pixpool.server.daemon.scheduler import split
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.sampler import num_batches

S = 64
SHAPES = [(64, 48), (40, 64), (64, 64), (1, 64), (64, 3), (20, 64), (64, 1), (33, 64), (50, 50), (64, 20), (12, 64)]

ROUTES = {
    "default": {},
    "everything": {"degrees": 10.0, "shear": 5.0, "copy_paste": 1.0, "mixup": 1.0, "flipud": 0.5},
    "validation": {"train_route": False},
}


@pytest.fixture(scope="module")
def source() -> ArraySource:
    return ArraySource(SHAPES, S, seed=3, instances=4)


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("hsv_on_device", [False, True])
def test_concatenated_ranges_equal_the_batch_byte_for_byte(source, route, hsv_on_device):
    st = StreamSettings(
        seed=5, batch_size=5, hsv_on_device=hsv_on_device, augment=AugmentConfig(imgsz=S, **ROUTES[route])
    )
    n = num_batches(len(source), st, 1)
    assert n == 3  # 11 records: the last batch is short (1 sample)
    for b in range(n):
        whole = render_batch(source, st, 1, b)
        for parts in (1, 2, 3, 4):
            out = np.full_like(whole.images, 77)  # stale bytes: each range must overwrite its positions
            pieces = [
                render_range(source, st, 1, b, start, stop, images_out=out[start:stop])
                for start, stop in split(len(whole.samples), parts)
            ]
            assert all(np.shares_memory(p.images, out) for p in pieces)
            assert out.tobytes() == whole.images.tobytes()
            assert np.concatenate([p.targets for p in pieces]).tobytes() == whole.targets.tobytes()
            assert np.concatenate([p.samples for p in pieces]).tolist() == whole.samples.tolist()
            counts = np.concatenate([p.counts for p in pieces])
            assert (
                counts.tolist() == np.bincount(whole.targets[:, 0].astype(int), minlength=len(whole.samples)).tolist()
            )


def test_empty_and_bad_ranges(source):
    st = StreamSettings(seed=1, batch_size=4, augment=AugmentConfig(imgsz=S))
    empty = render_range(source, st, 0, 0, 2, 2)
    assert empty.images.shape == (0, 3, S, S) and empty.targets.shape == (0, 6) and len(empty.counts) == 0
    with pytest.raises(ConfigError, match="samples 3..5 of batch 0, which has 4"):
        render_range(source, st, 0, 0, 3, 5)
