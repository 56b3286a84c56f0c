"""Every segment pixpool maps passes one check on the opened file: owner, mode, kind, size."""

from __future__ import annotations

import os

import pytest

from pixpool.shared.errors import SnapshotError, UntrustedSegmentError
from pixpool.shared.transport.ring import Ring, RingLayout
from pixpool.shared.transport.shm import SharedSegment
from pixpool.shared.transport.store import DEFAULT


def test_a_segment_others_may_write_is_refused(shm_name):
    name = shm_name("ww")
    SharedSegment.create(name, 4096).close()
    os.chmod(DEFAULT.path(name), 0o622)
    with pytest.raises(UntrustedSegmentError, match=r"mode 0622: group or others may write it") as err:
        SharedSegment.attach(name)
    assert (
        err.value.path == DEFAULT.path(name)
        and isinstance(err.value, PermissionError)
        and isinstance(err.value, SnapshotError)
    )


def test_a_symlink_under_a_segment_name_is_refused(shm_name, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x" * 4096)
    name = shm_name("link")
    os.symlink(target, DEFAULT.path(name))
    with pytest.raises(UntrustedSegmentError, match="symbolic link"):
        SharedSegment.attach(name)


def test_a_segment_of_the_wrong_size_is_refused(shm_name):
    name = shm_name("size")
    SharedSegment.create(name, 8192).close()
    with pytest.raises(UntrustedSegmentError, match="has 8192 bytes, expected 4096"):
        SharedSegment.attach(name, expected_nbytes=4096)
    SharedSegment.attach(name, expected_nbytes=8192).close()


def test_created_segments_are_private_and_never_adopt_a_file(shm_name):
    name = shm_name("excl")
    seg = SharedSegment.create(name, 4096)
    try:
        assert os.stat(DEFAULT.path(name)).st_mode & 0o777 == 0o600
        with pytest.raises(FileExistsError):
            SharedSegment.create(name, 4096)
        assert seg.present()
        os.unlink(DEFAULT.path(name))
        assert not seg.present()
        SharedSegment.create(name, 4096).close()  # another file under the same name
        assert not seg.present(), "a replaced file must not count as the same segment"
    finally:
        seg.close()


def test_a_trainer_refuses_a_ring_others_may_write(shm_name):
    from pixpool.shared.transport.names import ring_segment

    name = ring_segment(os.getpid(), "00aa")
    shm_name.own(name)
    Ring.create(name, RingLayout(slots=2, batch_size=1, imgsz=32, max_targets=1)).close()
    os.chmod(DEFAULT.path(name), 0o666)
    with pytest.raises(UntrustedSegmentError, match="mode 0666"):
        Ring.attach(name)
