"""fs_trust's decisions: which file systems' stat data can tell versions of a file apart, and
when a label's stat vouches for its bytes. Pure functions, no files but a fake
``/proc/sys/vm`` and this process's own folders."""

from __future__ import annotations

import os

from pixpool.server.snapshot import fs_trust
from pixpool.server.snapshot.fs_trust import FileSystem

S = 1_000_000_000
NOW = 1_800_000_000 * S
WINDOW = 300 * S


def fs(kind: int, *, readonly: bool = False) -> FileSystem:
    return FileSystem(dev=42, type=kind, fsid=7, readonly=readonly)


def test_stat_vouches_only_on_the_allow_list_read_write_and_where_what_holds_the_bytes_does():
    for kind in (fs_trust.SQUASHFS, fs_trust.EROFS, fs_trust.ISO9660, fs_trust.CRAMFS, fs_trust.UDF, fs_trust.FUSE,
                 fs_trust.MSDOS, fs_trust.EXFAT):  # fmt: skip
        assert not fs_trust.stat_vouches(fs(kind))
    # An allow-list: a type not on it is hashed, a network file system (NFS, 0x6969) and a type
    # never heard of included.
    for kind in (0x6969, 0x12345678):
        assert not fs_trust.stat_vouches(fs(kind))
    assert not fs_trust.stat_vouches(fs(fs_trust.EXT4, readonly=True))
    for kind in (fs_trust.EXT4, fs_trust.XFS, fs_trust.BTRFS, fs_trust.F2FS, fs_trust.TMPFS, fs_trust.OVERLAYFS):
        assert fs_trust.stat_vouches(fs(kind))
        # What holds the bytes decides: an overlay's squashfs layer, an ext4 on a loop device.
        held = FileSystem(dev=42, type=kind, fsid=7, readonly=False, distrust="overlay layer /l: squashfs")
        assert not fs_trust.stat_vouches(held) and fs_trust.why_not(held) == held.distrust
    assert "squashfs" in fs_trust.why_not(fs(fs_trust.SQUASHFS))


def test_frozen_times():
    fixed = (1_700_000_000 * S, 1_700_000_000 * S)
    assert fs_trust.frozen_times([fixed, fixed, fixed])  # -all-time / SOURCE_DATE_EPOCH: one stored time
    assert not fs_trust.frozen_times([fixed])  # one file proves nothing
    # cp -p / rsync -t onto ext4: mtimes kept, ctimes the copy's: the clock moved.
    assert not fs_trust.frozen_times([(fixed[0], NOW), (fixed[0], NOW + 5)])
    assert not fs_trust.frozen_times([(NOW, NOW), (NOW + 1, NOW + 1)])
    assert fs_trust.frozen_times([(0, 0), (NOW, NOW + 1)])  # the epoch


def test_a_label_is_vouched_by_stat_only_where_mapped_writes_move_times_and_it_has_been_quiet():
    old, young = NOW - 2 * WINDOW, NOW - WINDOW // 2
    for kind in (fs_trust.EXT4, fs_trust.XFS, fs_trust.BTRFS, fs_trust.F2FS):
        assert fs_trust.label_vouched(fs(kind), old, read_started_ns=NOW, window_ns=WINDOW)
        assert not fs_trust.label_vouched(fs(kind), young, read_started_ns=NOW, window_ns=WINDOW)
        assert not fs_trust.label_vouched(fs(kind, readonly=True), old, read_started_ns=NOW, window_ns=WINDOW)
        assert not fs_trust.label_vouched(fs(kind), old, read_started_ns=NOW, window_ns=None)  # writeback off
    # tmpfs never cleans a page: a mapped write moves no time after the first; image file systems
    # and FUSE store their times; NFS serves cached attributes.
    for kind in (fs_trust.TMPFS, fs_trust.SQUASHFS, fs_trust.FUSE, 0x6969):
        assert not fs_trust.label_vouched(fs(kind), old, read_started_ns=NOW, window_ns=WINDOW)
    # ext4 whose bytes sit in an image on a loop device: the image can be swapped underneath.
    looped = FileSystem(dev=42, type=fs_trust.EXT4, fsid=7, readonly=False, distrust="on loop device loop3")
    assert not fs_trust.label_vouched(looped, old, read_started_ns=NOW, window_ns=WINDOW)


def test_writeback_window(tmp_path):
    (tmp_path / "dirty_expire_centisecs").write_text("3000\n")
    (tmp_path / "dirty_writeback_centisecs").write_text("500\n")
    assert fs_trust.writeback_window_ns(str(tmp_path)) == 300 * S  # 2 x 35 s, at least 5 minutes
    (tmp_path / "dirty_expire_centisecs").write_text("30000\n")
    assert fs_trust.writeback_window_ns(str(tmp_path)) == 2 * 305 * S
    (tmp_path / "dirty_writeback_centisecs").write_text("0\n")  # periodic writeback off: no bound
    assert fs_trust.writeback_window_ns(str(tmp_path)) is None
    assert fs_trust.writeback_window_ns(str(tmp_path / "absent")) is None


def test_identify_this_processes_folders(tmp_path):
    here = fs_trust.identify(str(tmp_path), os.stat(tmp_path).st_dev)
    assert here.dev == os.stat(tmp_path).st_dev and here.type and not here.readonly
    assert fs_trust.identify("/proc", os.stat("/proc").st_dev).type == 0x9FA0  # PROC_SUPER_MAGIC


def test_digests(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"0 0.5 0.5 0.2 0.2\n")
    (tmp_path / "sub").mkdir()
    digest, st = fs_trust.file_digest(str(tmp_path / "a.txt"))
    assert len(digest) == 32 and st.st_size == 18
    listing = fs_trust.listing_digest(str(tmp_path))
    (tmp_path / "b.txt").write_bytes(b"")
    assert fs_trust.listing_digest(str(tmp_path)) != listing
    os.mkfifo(tmp_path / "fifo")
    try:
        fs_trust.file_digest(str(tmp_path / "fifo"))  # opened without blocking, refused as no regular file
    except OSError as exc:
        assert "no regular file" in str(exc)
    else:
        raise AssertionError("a FIFO was hashed")
