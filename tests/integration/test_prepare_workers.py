"""Preparation with decode workers: records shared between the preparing process and the
workers, a worker's failure rolled back, a late worker not waited for, ENOSPC at the write,
and the arena written through its mapping (a huge-page store) holding the same bytes."""

from __future__ import annotations

import errno
import hashlib
import os

import numpy as np
import psutil
import pytest

from helpers import failing_decoder
from helpers.daemon import wait_for
from helpers.snapshot import created_by_me, remove_snapshot
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot import arena_pages, prepare
from pixpool.server.snapshot import decode_worker as prepare_worker
from pixpool.server.snapshot.arena_pages import MAPPING
from pixpool.server.snapshot.decode_worker import WorkShare
from pixpool.server.snapshot.fingerprint import base_name, fingerprint
from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
from pixpool.shared.errors import CapacityError, ImageDecodeError
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 160


def _prepare_and_remove(dataset, processes: int, dtype: str = "float32") -> tuple[str, np.ndarray]:
    """(sha256 of every record's image bytes, a copy of image 3); the snapshot is removed.

    Not ``Snapshot.checksum``: the header holds the creation time, which differs."""
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=processes, dtype=dtype))
    try:
        assert not result.reused
        snap = result.snapshot
        h = hashlib.sha256()
        for i in range(len(snap)):
            h.update(snap.image(i).tobytes())
        return h.hexdigest(), np.array(snap.image(3))
    finally:
        result.snapshot.close()
        remove_snapshot(result.snapshot.name)


def _hold_parent_until_workers_claimed(monkeypatch, claimed_more_than: int) -> dict:
    """The preparing process starts decoding only once the workers have claimed more than
    ``claimed_more_than`` records, so the worker path runs whatever the machine's speed."""
    real = prepare.decode_shared
    seen = {}

    def held(share, *args, **kwargs):
        wait_for(lambda: share.claimed > claimed_more_than, 120, "a decode worker to claim records", poll_s=0.002)
        seen["parent_wrote"] = real(share, *args, **kwargs)
        return seen["parent_wrote"]

    monkeypatch.setattr(prepare, "decode_shared", held)
    return seen


def _live_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not any("resource_tracker" in part for part in p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_records_written_by_a_worker_are_byte_identical(synthetic_data, monkeypatch):
    dataset = load_dataset(synthetic_data.coco_json)
    one_checksum, one_image = _prepare_and_remove(dataset, 1)
    seen = _hold_parent_until_workers_claimed(monkeypatch, 0)
    two_checksum, two_image = _prepare_and_remove(dataset, 2)
    assert seen["parent_wrote"] < len(dataset)  # the worker wrote the others
    np.testing.assert_array_equal(two_image, one_image)
    assert two_checksum == one_checksum


def test_failure_in_a_worker_at_record_k_leaves_no_segment(synthetic_data, monkeypatch):
    dataset = load_dataset(synthetic_data.coco_json)
    before = set(DEFAULT.segments())
    _hold_parent_until_workers_claimed(monkeypatch, 7)  # record 7 is a worker's
    assert failing_decoder.FAIL_AT == 7  # the decoder that claims record 7 fails
    with pytest.raises(ImageDecodeError, match="injected failure at record 7") as info:
        prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=2), decoder=failing_decoder.__name__)
    assert dataset.records[7].image_path in str(info.value)
    assert created_by_me(before) == []
    assert not any(s.startswith(base_name(fingerprint(dataset, imgsz=IMGSZ))) for s in DEFAULT.segments())
    wait_for(lambda: not _live_children(), 30, "the decode workers to exit", poll_s=0.002)


def test_worker_still_starting_at_the_end_is_stopped_cleanly(synthetic_data):
    # 24 small images: the preparing process decodes them all long before a spawned
    # interpreter has imported numpy and cv2; the worker is stopped, not waited for.
    dataset = load_dataset(synthetic_data.coco_json)
    one_checksum, _ = _prepare_and_remove(dataset, 1)
    two_checksum, _ = _prepare_and_remove(dataset, 2)
    assert two_checksum == one_checksum
    wait_for(lambda: not _live_children(), 30, "the decode workers to exit", poll_s=0.002)


def test_decode_workers_are_spawned():
    # Decoders start with spawn: a fork would inherit OpenCV's and OpenBLAS's thread pools.
    assert prepare.decode_context().get_start_method() == "spawn"


def test_full_shm_at_the_write_is_a_capacity_error_and_rolls_back(synthetic_data, monkeypatch):
    # /dev/shm filled by someone else after the capacity check: the arena write gets
    # ENOSPC (never SIGBUS: the arena is written with pwrite, not through a mapping).
    dataset = load_dataset(synthetic_data.coco_json)
    before = set(DEFAULT.segments())
    real = os.pwrite
    calls = {"n": 0}

    def full_after_two(fd, data, offset):
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, offset)

    monkeypatch.setattr(prepare_worker.os, "pwrite", full_after_two)
    with pytest.raises(CapacityError, match="/dev/shm ran out of space") as info:
        prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1))
    assert any(r.image_path in str(info.value) for r in dataset.records[:3])
    assert created_by_me(before) == []


def test_work_share_hands_out_each_record_once_and_stops_on_abort():
    share = WorkShare(3)
    assert [share.claim() for _ in range(4)] == [0, 1, 2, None]
    share.written()
    assert share.done == 1 and share.claimed == 3
    aborted = WorkShare(5)
    assert aborted.claim() == 0
    aborted.abort()
    assert aborted.claim() is None and aborted.claimed == 5


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_an_arena_written_through_its_mapping_holds_the_pwrite_bytes(synthetic_data, monkeypatch, dtype):
    # On a huge-page store every decoder writes through the mapping (arena_pages): the
    # snapshot's bytes must be those of the pwrite path, in one process and with a worker.
    dataset = load_dataset(synthetic_data.coco_json)
    pwrite_checksum, pwrite_image = _prepare_and_remove(dataset, 1, dtype)
    monkeypatch.setattr(prepare, "write_mode", lambda store: MAPPING)
    mapped = {"n": 0}
    real_write = prepare_worker.ArenaWriter._write_mapped

    def counted(self, *args):
        mapped["n"] += 1
        return real_write(self, *args)

    monkeypatch.setattr(prepare_worker.ArenaWriter, "_write_mapped", counted)
    one_checksum, one_image = _prepare_and_remove(dataset, 1, dtype)
    assert mapped["n"] == len(dataset)
    np.testing.assert_array_equal(one_image, pwrite_image)
    assert one_checksum == pwrite_checksum
    seen = _hold_parent_until_workers_claimed(monkeypatch, 0)
    two_checksum, _ = _prepare_and_remove(dataset, 2, dtype)
    assert seen["parent_wrote"] < len(dataset)  # the worker wrote the others, through its own mapping
    assert two_checksum == pwrite_checksum


def test_a_full_store_at_the_populate_is_a_capacity_error_and_rolls_back(synthetic_data, monkeypatch):
    # Through the mapping, a store filled by someone else shows up when the record's pages are
    # populated (EFAULT: the store would SIGBUS), before a byte is stored: the same error and
    # rollback as ENOSPC from pwrite.
    dataset = load_dataset(synthetic_data.coco_json)
    before = set(DEFAULT.segments())
    monkeypatch.setattr(prepare, "write_mode", lambda store: MAPPING)
    real = arena_pages.populate
    calls = {"n": 0}

    def full_after_two(mm, start, nbytes):
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))
        real(mm, start, nbytes)

    monkeypatch.setattr(arena_pages, "populate", full_after_two)
    with pytest.raises(CapacityError, match="/dev/shm ran out of space") as info:
        prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1))
    assert dataset.records[2].image_path in str(info.value)
    assert created_by_me(before) == []
