"""Unit tests of the shared-memory segment and the snapshot byte layout (no processes)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pixpool.server.snapshot import layout
from pixpool.shared.stream.config import FILL_VALUE
from pixpool.shared.stream.records import Record
from pixpool.shared.transport.shm import SharedSegment
from pixpool.shared.transport.store import DEFAULT


@pytest.fixture
def seg_name(shm_name):
    return shm_name()


def test_create_attach_read_only_and_owner_unlink(seg_name):
    seg = SharedSegment.create(seg_name, 4096)
    assert oct(os.stat(DEFAULT.path(seg_name)).st_mode & 0o777) == oct(0o600)
    data = np.frombuffer(seg.buf, dtype=np.uint8)
    data[:4] = (1, 2, 3, 4)
    reader = SharedSegment.attach(seg_name)
    view = np.frombuffer(reader.buf, dtype=np.uint8)
    assert list(view[:4]) == [1, 2, 3, 4]
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 9
    with pytest.raises(PermissionError):
        reader.unlink()  # only the owner unlinks
    # close() while a numpy view is alive neither raises nor invalidates the view
    reader.close()
    assert reader.closed and list(view[:4]) == [1, 2, 3, 4]
    del view, data
    seg.close()
    seg.unlink()
    assert not os.path.exists(DEFAULT.path(seg_name))


def test_create_is_exclusive(seg_name):
    with SharedSegment.create(seg_name, 64) as seg:
        with pytest.raises(FileExistsError):
            SharedSegment.create(seg_name, 64)
        seg.unlink()


def test_failed_create_leaves_nothing(seg_name):
    # posix_fallocate of more than /dev/shm holds fails (ENOSPC); the name must be gone.
    st = os.statvfs("/dev/shm")
    too_big = st.f_blocks * st.f_frsize + (1 << 30)
    with pytest.raises(OSError):
        SharedSegment.create(seg_name, too_big)
    assert not os.path.exists(DEFAULT.path(seg_name))


def test_header_round_trip():
    h = layout.Header(
        magic=layout.MAGIC, layout_version=layout.LAYOUT_VERSION, complete=layout.COMPLETE_MARK, records=3, instances=5,
        points=7, max_instances=4, imgsz=640, dtype_code=layout.FLOAT32_CODE, fill=FILL_VALUE, meta_nbytes=layout.meta_nbytes(3),
        image_nbytes=12, target_nbytes=256, creator_pid=42, created_unix=1.5, fingerprint="ab" * 32,
    )  # fmt: skip
    raw = layout.pack_header(h)
    assert len(raw) == layout.HEADER_NBYTES
    back = layout.unpack_header(raw)
    assert back == h and back.is_complete
    # the completeness word sits where COMPLETE_OFFSET says: zeroing it un-completes
    raw2 = bytearray(raw)
    raw2[layout.COMPLETE_OFFSET : layout.COMPLETE_OFFSET + 4] = b"\0\0\0\0"
    assert not layout.unpack_header(bytes(raw2)).is_complete
    with pytest.raises(ValueError):
        layout.unpack_header(raw[:10])


def test_target_packing_round_trip():
    r1 = Record("a.jpg", None, np.array([2, 0], np.int32), np.array([[0, 0, 0.5, 0.5], [0.1, 0.2, 0.3, 0.4]], np.float32),
                (np.array([[0, 0], [0.5, 0], [0.5, 0.5]], np.float32), np.zeros((0, 2), np.float32)))  # fmt: skip
    r2 = Record("b.jpg", None, np.zeros(0, np.int32), np.zeros((0, 4), np.float32))
    r3 = Record("c.jpg", None, np.array([7], np.int32), np.array([[0.2, 0.2, 0.9, 0.9]], np.float32),
                (np.array([[0.2, 0.2], [0.9, 0.2], [0.9, 0.9], [0.2, 0.9]], np.float32),))  # fmt: skip
    sections = layout.target_sections(3, 7)
    assert sections.nbytes % layout.SECTION_ALIGN == 0
    buf = bytearray(sections.nbytes)
    classes, boxes, offsets, points = layout.target_views(buf, sections)
    layout.pack_targets([r1, r2, r3], classes, boxes, offsets, points)
    assert classes.tolist() == [2, 0, 7]
    assert offsets.tolist() == [0, 3, 3, 7]
    np.testing.assert_array_equal(boxes[2], r3.boxes[0])
    np.testing.assert_array_equal(points[3:7], r3.polygons[0])
    with pytest.raises(ValueError):
        layout.pack_targets([r1], classes, boxes, offsets, points)  # counts disagree with sections
