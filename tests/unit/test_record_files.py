"""``RecordFiles``: a split's file names, fetched once when first read (no process, no socket)."""

from __future__ import annotations

import threading

import pytest

from pixpool.client.record_files import RecordFiles
from pixpool.shared.errors import SnapshotError
from pixpool.shared.stream.path_table import PathTable

NAMES = [f"/data/images/img_{i:03d}.jpg" for i in range(7)] + ["/data/images/caf\udce9.jpg"]  # not UTF-8: kept


def _counted(names: list[str]):
    calls = []

    def fetch() -> PathTable:
        calls.append(1)
        return PathTable.from_paths(names)

    return fetch, calls


def test_len_needs_no_fetch_and_the_first_read_fetches_once():
    fetch, calls = _counted(NAMES)
    files = RecordFiles(len(NAMES), fetch)
    assert not files.fetched and "not fetched yet" in repr(files) and calls == []
    assert files[0] == NAMES[0] and files[-1] == NAMES[-1] and calls == [1]
    assert len(files) == len(NAMES) and bool(files)
    assert list(files) == NAMES and files.tolist() == NAMES and files[2:5] == NAMES[2:5]
    assert files[::3] == NAMES[::3] and files[5:2] == [] and NAMES[3] in files
    assert files.fetched and calls == [1]
    with pytest.raises(IndexError):
        files[len(NAMES)]


def test_threads_reading_at_once_fetch_once():
    fetch, calls = _counted(NAMES)
    files = RecordFiles(len(NAMES), fetch)
    threads = [threading.Thread(target=files.tolist) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert calls == [1]


def test_another_count_than_the_attach_said_is_refused_and_not_kept():
    fetch, calls = _counted(NAMES[:3])
    files = RecordFiles(len(NAMES), fetch)
    with pytest.raises(SnapshotError, match=f"3 file names for the {len(NAMES)} records"):
        files[0]
    assert not files.fetched


def test_a_daemon_that_names_no_files_gives_an_empty_sequence():
    # A daemon handed its source in memory (no files read) answers ``records`` with none.
    files = RecordFiles(24, lambda: PathTable.from_paths([]))
    assert len(files) == 0 and list(files) == [] and files.fetched


def test_a_page_holds_at_most_max_count_names():
    """A ``records`` page with sizes (8 bytes a record) is capped in records as well as bytes."""
    table = PathTable.from_paths(["a", "b", "c", "d", "e"])
    assert table.page(1, 1 << 20) == (b"b\0c\0d\0e\0", 4)
    assert table.page(1, 1 << 20, 2) == (b"b\0c\0", 2)
    assert table.page(4, 1 << 20, 2) == (b"e\0", 1)


def test_the_largest_records_page_with_sizes_fits_the_reply_limit():
    """The worst page the daemon can send with sizes: a full page of the shortest names (capped
    at RECORDS_PAGE_BYTES // 8 records), their sizes, and class names at their limit."""
    import numpy as np

    from pixpool.shared.wire.trainer import MAX_NAMES_BYTES, MAX_REPLY_BYTES, RECORDS_PAGE_BYTES, Op, encode_reply

    table = PathTable.from_paths(["a"] * (RECORDS_PAGE_BYTES // 2))
    packed, count = table.page(0, RECORDS_PAGE_BYTES, RECORDS_PAGE_BYTES // 8)
    assert count == RECORDS_PAGE_BYTES // 8
    sizes = np.full((count, 2), 2**31 - 1, "<i4").tobytes()
    names = ["n" * 1000] * (MAX_NAMES_BYTES // 1000)
    reply = encode_reply(
        Op.RECORDS, start=0, total=len(table), files=[], names=names, packed=packed, count=count, sizes=sizes
    )
    assert len(reply) < MAX_REPLY_BYTES
