"""shared/transport/store.py: which directories may be a store, what kind it is, and residency by mincore."""

from __future__ import annotations

import os

import pytest

from pixpool.shared.errors import ConfigError
from pixpool.shared.transport import store

_MOUNTINFO = """\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:21 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw,size=24683652k
31 22 0:40 / /mnt/data rw,relatime shared:9 - nfs4 server:/export rw,vers=4.2
40 22 0:21 / /other rw - tmpfs tmpfs rw
"""


def test_fs_type_of_reads_the_type_after_the_separator():
    assert store.fs_type_of(_MOUNTINFO, 252, 0) == "ext4"
    assert store.fs_type_of(_MOUNTINFO, 0, 21) == "tmpfs"
    assert store.fs_type_of(_MOUNTINFO, 0, 40) == "nfs4"
    assert store.fs_type_of(_MOUNTINFO, 9, 9) == ""


def test_dev_shm_is_a_memory_store_and_passes_the_checks():
    assert store.Store.of(None).checked() == os.path.realpath("/dev/shm")
    assert store.is_memory("/dev/shm")
    d = store.describe("/dev/shm")
    assert d["memory"] and d["fs_type"] == "tmpfs" and 0 <= d["free_bytes"] <= d["size_bytes"]


def test_a_store_must_be_an_existing_directory_nobody_else_can_rewrite(tmp_path):
    with pytest.raises(ConfigError, match="does not exist") as err:
        store.Store.of(tmp_path / "nope").checked()
    assert err.value.field == "store"
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="is not a directory"):
        store.Store.of(f).checked()
    d = tmp_path / "d"
    d.mkdir()
    os.chmod(d, 0o770)
    with pytest.raises(ConfigError, match=r"mode 0770: group or others may write it without the sticky bit"):
        store.Store.of(d).checked()
    os.chmod(d, 0o1770)
    assert store.Store.of(d).checked() == os.path.realpath(d)
    link = tmp_path / "link"
    link.symlink_to(d)
    assert store.Store.of(link).checked() == os.path.realpath(d), (
        "a store is known by its real path (the one /proc/PID/maps shows)"
    )


def test_a_network_file_system_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "fs_type", lambda path: "nfs4")
    with pytest.raises(ConfigError, match=r"network file system \(nfs4\).*not kept coherent"):
        store.Store.of(tmp_path).checked()


def test_resident_bytes_follow_the_page_cache(tmp_path):
    """A file just written is resident; after POSIX_FADV_DONTNEED (clean, unmapped pages)
    it is not; reading it makes it resident again. mincore itself reads nothing in."""
    if store.is_memory(str(tmp_path)):
        pytest.skip(f"{tmp_path} is a tmpfs: its pages cannot be dropped")
    page = os.sysconf("SC_PAGE_SIZE")
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(64 * page))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # clean pages only are dropped
        assert store.resident_nbytes(str(path)) == 64 * page
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert store.resident_nbytes(str(path)) == 0
        assert store.resident_nbytes(str(path)) == 0, "looking must not fault pages in"
        os.pread(fd, 8 * page, 0)
        assert 8 * page <= store.resident_nbytes(str(path)) <= 64 * page
    finally:
        os.close(fd)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert store.resident_nbytes(str(empty)) == 0
