"""Unit tests of the batch ring layout and its segment (no processes)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pixpool.shared.errors import ConfigError, SnapshotError
from pixpool.shared.transport.names import ring_segment
from pixpool.shared.transport.ring import RING_HEADER_NBYTES, Ring, RingLayout
from pixpool.shared.transport.store import DEFAULT


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
    assert os.stat(DEFAULT.path(ring.name)).st_size == ring.layout.nbytes
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
    assert os.path.exists(DEFAULT.path(ring.name))


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
    with open(DEFAULT.path(name), "wb") as f:
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


# -- per task: row width and mask planes ------------------------------------------
def test_a_detect_layout_keeps_its_bytes_and_offsets():
    """The defaults are a detect ring as it always was: 6 columns, no mask plane, the samples
    right after the target rows (these numbers are the layout before tasks existed)."""
    lay = RingLayout(slots=3, batch_size=16, imgsz=640, max_targets=1000)
    assert (lay.target_width, lay.mask_side, lay.has_masks, lay.masks_nbytes) == (6, 0, False, 0)
    assert lay.targets_offset == 19660864 and lay.samples_offset == 19685056
    assert lay.slot_nbytes == 19685376 and lay.nbytes == 59060224


@pytest.mark.parametrize(
    "width, side, dtype, itemsize", [(7, 0, "uint8", 1), (57, 0, "uint8", 1), (6, 40, "uint8", 1), (6, 40, "int32", 4)]
)
def test_task_layouts_size_rows_and_planes(width, side, dtype, itemsize):
    lay = RingLayout(
        slots=2, batch_size=4, imgsz=160, max_targets=10, target_width=width, mask_side=side, mask_dtype=dtype
    )
    assert lay.row_nbytes == width * 4
    assert lay.masks_offset == -(-(lay.targets_offset + lay.target_rows * width * 4) // 64) * 64
    assert lay.masks_nbytes == 4 * side * side * itemsize
    assert lay.samples_offset >= lay.masks_offset + lay.masks_nbytes and lay.samples_offset % 64 == 0
    assert lay.nbytes == RING_HEADER_NBYTES + 2 * lay.slot_nbytes
    assert RingLayout.from_dict(lay.to_dict()) == lay
    # The mask plane is counted in every byte figure: the same ring without it is smaller by it.
    bare = RingLayout(slots=2, batch_size=4, imgsz=160, max_targets=10, target_width=width)
    assert lay.samples_offset - bare.samples_offset >= lay.masks_nbytes - 63


def test_layout_refuses_bad_task_fields():
    base = {"slots": 2, "batch_size": 2, "imgsz": 32, "max_targets": 4}
    with pytest.raises(ConfigError, match="'target_width' is 5: a target row has at least the 6 columns"):
        RingLayout(**base, target_width=5)
    with pytest.raises(ConfigError, match="'mask_side' must be an integer >= 0"):
        RingLayout(**base, mask_side=-1)
    with pytest.raises(ConfigError, match=r"'mask_dtype' is 'float32'; use one of \['uint8', 'int32'\]"):
        RingLayout(**base, mask_side=8, mask_dtype="float32")
    # 600 rows over 2 samples: a sample may number 300 instances, which uint8 cannot.
    with pytest.raises(ConfigError, match="at most 255 instances, but a sample of this ring may have 300"):
        RingLayout(**{**base, "max_targets": 600}, mask_side=8)
    assert RingLayout(**{**base, "max_targets": 600}, mask_side=8, mask_dtype="int32").mask_itemsize == 4
    with pytest.raises(ConfigError, match="optionally target_width, mask_side, mask_dtype"):
        RingLayout.from_dict({**base, "colour": 1})
    assert RingLayout.from_dict(base) == RingLayout(**base)  # a detect layout may leave them out


def test_mask_dtype_for_follows_the_instances_a_sample_may_have():
    from pixpool.shared.transport.ring import mask_dtype_for

    assert [mask_dtype_for(n) for n in (1, 255, 256, 4000)] == ["uint8", "uint8", "int32", "int32"]


@pytest.mark.parametrize("dtype", ["uint8", "int32"])
def test_a_task_ring_carries_wide_rows_and_mask_planes_through_attach(shm_name, dtype):
    """What a worker writes through its mapping (a pose-wide row region per sample, a mask
    plane per position) is what the trainer's mapping reads, after packing; the header
    carries the task fields, so the attaching side rebuilds the same layout."""
    lay = RingLayout(slots=2, batch_size=3, imgsz=16, max_targets=9, target_width=12, mask_side=4, mask_dtype=dtype)
    name = ring_segment(os.getpid(), "900010")
    shm_name.own(name)
    daemon_side = Ring.create(name, lay)
    worker = Ring.attach(name)
    try:
        assert worker.layout == lay
        planes = worker.masks(1, 2)
        assert planes.shape == (2, 4, 4) and planes.dtype == np.dtype(dtype)
        planes[...] = np.arange(32).reshape(2, 4, 4) * (100 if dtype == "int32" else 1)
        rows = {0: np.full((2, 12), 1.5, np.float32), 1: np.arange(12, dtype=np.float32).reshape(1, 12)}
        for p, r in rows.items():
            worker.sample_targets(1, p, len(r))[...] = r
        worker.samples(1, 2)[...] = [4, 8]
        assert daemon_side.pack_targets(1, [2, 1]) == 3
        np.testing.assert_array_equal(daemon_side.targets(1, 3), np.concatenate([rows[0], rows[1]]))
        np.testing.assert_array_equal(daemon_side.masks(1, 2), planes)
        assert int(daemon_side.masks(1).max()) == 31 * (100 if dtype == "int32" else 1)
        assert (daemon_side.masks(0) == 0).all()  # the other slot's planes are untouched
        assert daemon_side.images(1).sum() == 0  # planes do not overlap the images ...
        assert daemon_side.samples(1, 2).tolist() == [4, 8]  # ... nor the samples
        with pytest.raises(IndexError, match="4 mask planes asked"):
            daemon_side.masks(0, 4)
    finally:
        worker.close()
        daemon_side.close()
        daemon_side.unlink()


def test_a_detect_ring_has_no_mask_planes(ring):
    assert ring.masks(0) is None and ring.targets(0, 2).shape == (2, 6)


def test_attach_refuses_a_ring_of_the_previous_format(shm_name):
    """A ring header written before the task fields (magic PXRING01) is not read as this one."""
    import struct

    name = ring_segment(os.getpid(), "900011")
    shm_name.own(name)
    with open(DEFAULT.path(name), "wb") as f:
        f.write(struct.pack("<8s5q", b"PXRING01", 2, 8192, 1, 32, 1) + b"\0" * (4096 + 2 * 8192))
    with pytest.raises(SnapshotError, match="PXRING01.*another pixpool release"):
        Ring.attach(name)
