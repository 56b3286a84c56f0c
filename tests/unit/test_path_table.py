"""PathTable: paths in one buffer, read back exactly, served in pages that join into the same table."""

from __future__ import annotations

import pytest

from pixpool.shared.stream.path_table import PathTable

PATHS = ["/data/images/train/a.jpg", "/data/images/train/bb.jpg", "/d/é.png", "/d/raw\udcff.jpg", "/x"]


def test_paths_come_back_as_given():
    table = PathTable.from_paths(PATHS)
    assert len(table) == len(PATHS)
    assert [table[i] for i in range(len(PATHS))] == PATHS
    assert table.tolist() == PATHS and list(table) == PATHS
    assert table[-1] == PATHS[-1]
    with pytest.raises(IndexError):
        table[len(PATHS)]


def test_pages_join_into_the_same_table():
    table = PathTable.from_paths(PATHS * 50)
    for max_bytes in (1, 30, 64, 1000, 1 << 20):
        chunks, start = [], 0
        while start < len(table):
            data, count = table.page(start, max_bytes)
            assert count >= 1 and (len(data) <= max_bytes or count == 1)
            chunks.append(data)
            start += count
        assert PathTable.from_packed(b"".join(chunks)) == table
    assert table.page(len(table), 100) == (b"", 0)


def test_empty_table_and_bad_input():
    empty = PathTable.from_paths([])
    assert len(empty) == 0 and empty.tolist() == [] and not empty
    with pytest.raises(ValueError, match="NUL"):
        PathTable.from_paths(["/a\0b"])
    with pytest.raises(ValueError, match="end with a NUL"):
        PathTable.from_packed(b"/a\0/b")
