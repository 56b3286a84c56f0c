"""Unit tests of the batch ring layout and its segment (no processes)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pixpool.shared.errors import ConfigError, SnapshotError
from pixpool.shared.transport.names import ring_segment, shm_path
from pixpool.shared.transport.ring import RING_HEADER_NBYTES, Ring, RingLayout


@pytest.fixture
def ring():
    layout = RingLayout(slots=3, batch_size=2, imgsz=32, max_targets=7)
    r = Ring.create(ring_segment(os.getpid(), "900001"), layout)
    try:
        yield r
    finally:
        r.close()
        r.unlink()


def test_layout_alignment_and_size():
    lay = RingLayout(slots=3, batch_size=16, imgsz=640, max_targets=1000)
    assert lay.images_nbytes == 16 * 3 * 640 * 640
    assert lay.targets_offset % 64 == 0 and lay.samples_offset % 64 == 0
    assert lay.per_sample == 63 and lay.target_rows == 16 * 63 >= 1000  # a region per sample position
    assert lay.samples_offset >= lay.targets_offset + lay.target_rows * 24
    assert lay.slot_nbytes % 4096 == 0
    assert lay.slot_nbytes >= lay.samples_offset + 16 * 8
    assert lay.nbytes == RING_HEADER_NBYTES + 3 * lay.slot_nbytes
    assert RingLayout.from_dict(lay.to_dict()) == lay


@pytest.mark.parametrize("bad", [dict(slots=0), dict(slots=1), dict(slots=4), dict(batch_size=True), dict(imgsz=-1)])
def test_layout_rejects_bad_sizes(bad):
    with pytest.raises(ConfigError):
        RingLayout(**{**dict(slots=2, batch_size=2, imgsz=32, max_targets=1), **bad})


def test_segment_has_exact_size_and_attach_sees_writes(ring):
    assert os.stat(shm_path(ring.name)).st_size == ring.layout.nbytes
    other = Ring.attach(ring.name)
    try:
        assert other.layout == ring.layout
        other.images(2)[...] = 7
        other.targets(2, 3)[...] = np.arange(18, dtype=np.float32).reshape(3, 6)
        other.samples(2)[...] = [5, 9]
        other.write_header(2, epoch=1, batch=4, size=2, n_targets=3, generation=11)
        assert (ring.images(2) == 7).all() and (ring.images(1) == 0).all()
        assert ring.targets(2, 3)[2, 5] == 17.0
        assert ring.samples(2).tolist() == [5, 9]
        assert ring.read_header(2) == (1, 4, 2, 3, 11)
        assert ring.images(0, 1).shape == (1, 3, 32, 32)
        with pytest.raises(IndexError):
            ring.images(3)
    finally:
        other.close()


def test_only_the_creator_unlinks(ring):
    other = Ring.attach(ring.name)
    try:
        with pytest.raises(SnapshotError, match="only the daemon"):
            other.unlink()
    finally:
        other.close()
    assert os.path.exists(shm_path(ring.name))


def test_close_with_live_views_does_not_raise(ring):
    other = Ring.attach(ring.name)
    view = other.images(0)
    other.close()
    assert view.shape == (2, 3, 32, 32) and other.closed
    del view


def test_attach_missing_or_foreign_segment(shm_name):
    with pytest.raises(SnapshotError, match="does not exist"):
        Ring.attach(ring_segment(os.getpid(), "900002"))
    name = ring_segment(os.getpid(), "900003")
    shm_name.own(name)
    with open(shm_path(name), "wb") as f:
        f.write(b"x" * 8192)
    with pytest.raises(SnapshotError, match="not a pixpool batch ring"):
        Ring.attach(name)


def test_pack_targets_moves_each_samples_rows_after_the_previous_ones(ring):
    """Workers write each sample's rows at its own region; packing yields the rows in sample
    order, contiguous, exactly as one process would have written them."""
    lay = ring.layout  # batch 2, max_targets 7: 4 rows per sample position
    assert lay.per_sample == 4
    rows = {p: np.arange(c * 6, dtype=np.float32).reshape(c, 6) + 100 * p for p, c in ((0, 1), (1, 3))}
    for p, r in rows.items():
        ring.sample_targets(1, p, len(r))[...] = r
    assert ring.pack_targets(1, [1, 3]) == 4
    np.testing.assert_array_equal(ring.targets(1, 4), np.concatenate([rows[0], rows[1]]))
    ring.sample_targets(0, 1, 2)[...] = 5.0  # only the second sample has rows
    assert ring.pack_targets(0, [0, 2]) == 2 and (ring.targets(0, 2) == 5.0).all()


def test_pack_targets_refuses_counts_over_a_region(ring):
    with pytest.raises(ValueError, match="at most 4 rows"):
        ring.pack_targets(0, [5, 0])
    with pytest.raises(IndexError, match="holds 4 rows for each of 2 samples"):
        ring.sample_targets(0, 1, 5)
