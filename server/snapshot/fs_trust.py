"""What a file's stat data can vouch for, decided by the file system the file lives on.

Runs in the process that reads a dataset and names or re-attaches its snapshot (the daemon
at start-up, ``pixpool prepare``): ``fingerprint.py`` asks it which images must be hashed,
``label_index.py`` which paths a restart may check by ``stat`` alone. Pure decisions on
numbers (``stat_vouches``, ``frozen_times``, ``label_vouched``) are kept apart from the
calls that touch files (``identify``, ``file_digest``, ``listing_digest``).

Why stat is not enough everywhere:

- A stat ``(size, mtime, inode, ctime)`` tells two versions of a file apart only where the
  kernel keeps the times: it sets the ctime on every write and no user-space call can set
  it. That holds on a short allow-list of local file systems (``VOUCHING_TYPES``: ext2/3/4, xfs,
  btrfs, f2fs, tmpfs, and an overlay whose every layer is one of them), mounted read-write,
  and only for the file system that *holds the bytes*, which is not always the one a path
  shows (``mounts.holder_distrust``): an overlay whose lower layer is a squashfs image shows
  that image's stored times and inodes, so v2 of the image swapped in shows every stat of v1;
  an ext4 image on a loop device swapped underneath keeps every stat and its ``f_fsid``. So an
  overlay vouches only where all its layers do, and a file system on a loop device never.
  Everything else is hashed: file-system images store their times and inodes (squashfs
  ``-all-time``, ``SOURCE_DATE_EPOCH``, erofs, iso9660, cramfs, udf, romfs), FUSE servers make
  them up, FAT's ctime is no change time, a network file system answers from an attribute
  cache or from a server whose own file system is not known here, a read-only mount can be
  the same path over another image, and a type not known here is not trusted. It is an
  allow-list, not a list of what is known to be versionless: a type nobody thought of is
  hashed, never trusted. Also hashed: a file system whose recorded times look frozen (every
  file the same ``mtime == ctime``, or the epoch).
- A write through a shared mapping moves mtime and ctime only on the first write to a clean
  page (the ``page_mkwrite`` fault); later writes to the still-dirty page move nothing until
  writeback has cleaned it. On tmpfs pages are never cleaned, so after the first write
  nothing moves at all (measured: ``bench/scale.py --what mmap``). So a label's stat vouches
  for its bytes only on a file system with writeback that keeps its times in the kernel
  (``WRITEBACK_TIMES``), mounted read-write, and only once the label has been quiet for longer
  than the kernel takes to write a dirty page back (``writeback_window_ns``): any mapped write
  after that faults again and moves the ctime. Every other label is hashed.
- The stat of a path is only ever compared on the file system it was taken on: the key holds
  ``st_dev`` and the file system's type, ``f_fsid``, read-only flag and why what holds it does
  not vouch (``identify``); a remount of another image at the same place, another file system
  mounted over a folder, or a layer or loop device that vouched and no longer does, is a change.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import stat as stat_mod
from dataclasses import dataclass

from . import mounts

# statfs(2) f_type values (linux/magic.h, fs/fuse, fs/exfat, fs/ntfs3).
SQUASHFS, EROFS, ISO9660, CRAMFS, CRAMFS_WEND = 0x73717368, 0xE0F5E1E2, 0x9660, 0x28CD3D45, 0x453DCD28
UDF, ROMFS, FUSE, MSDOS, EXFAT, NTFS3 = 0x15013346, 0x7275, 0x65735546, 0x4D44, 0x2011BAB0, 0x7366746E
EXT4, XFS, BTRFS, F2FS, TMPFS, OVERLAYFS = 0xEF53, 0x58465342, 0x9123683E, 0xF2F52010, 0x01021994, 0x794C7630
# The only types whose stat can vouch for content (module docstring), and then only where what
# holds the bytes vouches too (``FileSystem.distrust``: an overlay's layers, a loop device).
VOUCHING_TYPES = frozenset({EXT4, XFS, BTRFS, F2FS, TMPFS, OVERLAYFS})
# Local file systems with writeback whose kernel moves the ctime on every write, mapped
# writes included once per writeback (ext2/3/4 share one magic).
WRITEBACK_TIMES = frozenset({EXT4, XFS, BTRFS, F2FS})
TYPE_NAMES = {
    SQUASHFS: "squashfs", EROFS: "erofs", ISO9660: "iso9660", CRAMFS: "cramfs", CRAMFS_WEND: "cramfs", UDF: "udf",
    ROMFS: "romfs", FUSE: "fuse", MSDOS: "vfat", EXFAT: "exfat", NTFS3: "ntfs3", EXT4: "ext4", XFS: "xfs",
    BTRFS: "btrfs", F2FS: "f2fs", TMPFS: "tmpfs", OVERLAYFS: "overlay",
}  # fmt: skip
_EPOCH_FLOOR_NS = 1_000_000_000  # a time within a second of 1970: written by a tool, not a clock
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileSystem:
    """The identity of the file system a path lives on, as a restart compares it."""

    dev: int  # st_dev
    type: int  # statfs f_type
    fsid: int  # statvfs f_fsid
    readonly: bool  # ST_RDONLY in statvfs f_flag
    # Why what holds the bytes cannot vouch ("" where it can): an overlay's layer, a loop device
    # (``mounts.holder_distrust``; ``identify`` fills it in, an overlay's always from its layers).
    distrust: str = ""

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, hex(self.type))

    def as_row(self) -> list:
        return [self.dev, self.type, self.fsid, int(self.readonly), self.distrust]


# -- decisions (numbers in, answers out) ---------------------------------------------------------
def stat_vouches(fs: FileSystem) -> bool:
    """Whether stat data on ``fs`` tells two versions of a file apart (module docstring): a type
    on the allow-list, mounted read-write, its bytes held by nothing that cannot vouch."""
    return not fs.readonly and not fs.distrust and fs.type in VOUCHING_TYPES


def why_not(fs: FileSystem) -> str:
    """Why stat on ``fs`` does not vouch, for a log line ("" where it does)."""
    if fs.readonly:
        return f"a read-only {fs.type_name} mount"
    if fs.type not in VOUCHING_TYPES:
        return f"{fs.type_name}, whose stat does not move with content"
    return fs.distrust


def frozen_times(times: list[tuple[int, int]]) -> bool:
    """Whether the ``(mtime_ns, ctime_ns)`` of the distinct files of one file system look
    written by a tool rather than kept by a clock: two or more files all with one time and
    ``mtime == ctime`` (an image built with ``-all-time`` or ``SOURCE_DATE_EPOCH``: one stored
    time for every file), or any ctime within a second of the epoch. A fast copy of a handful
    of files onto ext4 can look frozen too (one clock tick): that costs hashing a handful of
    files, never a wrong answer. The process's own ``SOURCE_DATE_EPOCH`` is not consulted: the
    answer names snapshots, so it must be the same in every process, whatever its environment."""
    if any(c < _EPOCH_FLOOR_NS for _, c in times):
        return True
    return len(times) >= 2 and len(set(times)) == 1 and times[0][0] == times[0][1]


def writeback_window_ns(vm: str = "/proc/sys/vm") -> int | None:
    """How long a page dirtied through a mapping may stay dirty: twice the kernel's dirty expiry
    plus its flusher interval, and at least 5 minutes; None where periodic writeback is off
    (``dirty_writeback_centisecs`` 0) or unknown, so no label's stat vouches for it."""
    try:
        with open(os.path.join(vm, "dirty_expire_centisecs")) as f:
            expire = int(f.read())
        with open(os.path.join(vm, "dirty_writeback_centisecs")) as f:
            interval = int(f.read())
    except (OSError, ValueError):
        return None
    if interval <= 0 or expire < 0:
        return None
    return max(300 * 10**9, 2 * (expire + interval) * 10**7)


def times_vouch(fs: FileSystem, window_ns: int | None) -> bool:
    """Whether a label's stat on ``fs`` can vouch for its bytes once the label has been quiet
    for longer than the writeback window: a read-write file system that moves times on mapped
    writes, and a window this kernel states."""
    return window_ns is not None and stat_vouches(fs) and fs.type in WRITEBACK_TIMES


def label_vouched(fs: FileSystem, ctime_ns: int, *, read_started_ns: int, window_ns: int | None) -> bool:
    """Whether a label's stat vouches for its bytes (module docstring): ``times_vouch``, and the
    label quiet for longer than the writeback window before the dataset was read."""
    return times_vouch(fs, window_ns) and ctime_ns < read_started_ns - window_ns


# -- calls that touch files ----------------------------------------------------------------------
class _StatFs(ctypes.Structure):
    # Only f_type, the first field, is read; the buffer is sized for every layout of struct statfs.
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 256)]


_libc = None


def _statfs_type(path: str) -> int:
    """statfs(2) f_type of ``path``'s file system (``os.statvfs`` does not expose it)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)  # this process's own symbols: the C library's statfs
    buf = _StatFs()
    if _libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return buf.f_type & 0xFFFFFFFF


def identify(path: str, dev: int, *, mount_table: list | None = None) -> FileSystem:
    """The identity of the file system ``path`` (on device ``dev``, from its stat) lives on, with
    why what holds its bytes cannot vouch where the type alone would (``mounts.holder_distrust``,
    on ``mount_table`` or ``/proc/self/mountinfo`` read now)."""
    vfs = os.statvfs(path)
    kind, readonly = _statfs_type(path), bool(vfs.f_flag & os.ST_RDONLY)
    distrust = ""
    if kind in VOUCHING_TYPES and not readonly:  # elsewhere the type already says: hashed
        try:
            table = mounts.read_mounts() if mount_table is None else mount_table
        except OSError as exc:
            distrust = f"cannot read the mount table ({exc})"
        else:
            distrust = mounts.holder_distrust(path, mounts=table, shown_type=TYPE_NAMES[kind])
    return FileSystem(dev=dev, type=kind, fsid=vfs.f_fsid, readonly=readonly, distrust=distrust)


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """(descriptor, its fstat) of ``path`` opened read-only without blocking (a FIFO planted in
    a dataset never stalls a restart); OSError where it is no regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise OSError(f"{path} is no regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def digest_fd(fd: int, size_hint: int) -> bytes:
    """sha256 of the bytes from ``fd``'s current offset to its end.

    A small file (a label) is one ``read`` of one byte more than its size: a shorter read of a
    regular file is its end, so the second ``read`` that would return nothing is saved (a read
    cut short by a signal only gives another digest: a full read, never a wrong answer)."""
    if size_hint < _READ_CHUNK:
        first = os.read(fd, size_hint + 1)
        if len(first) <= size_hint:
            return hashlib.sha256(first).digest()
    else:
        first = b""
    h = hashlib.sha256(first)
    chunk = os.read(fd, _READ_CHUNK)
    while chunk:
        h.update(chunk)
        chunk = os.read(fd, _READ_CHUNK)
    return h.digest()


def file_digest(path: str) -> tuple[bytes, os.stat_result]:
    """(sha256 of the file's bytes, the stat of the descriptor they were read from)."""
    fd, st = open_regular(path)
    try:
        return digest_fd(fd, st.st_size), st
    finally:
        os.close(fd)


def listing_digest(path: str) -> bytes:
    """sha256 of a folder's listing (each entry's name and whether it is a folder, sorted): what
    a folder's mtime stands for where stat data cannot be trusted."""
    with os.scandir(path) as it:
        entries = sorted(f"{e.name}\0{int(e.is_dir(follow_symlinks=False))}" for e in it)
    return hashlib.sha256("\n".join(entries).encode("utf-8", "surrogateescape")).digest()


# Digests of image files already read by this process, keyed by their full stat: a restart on a
# file system where stat does not vouch hashes each image once although the fingerprint, the content
# fingerprint and the index all ask (``label_index.write_index`` empties it).
_digests: dict[tuple, bytes] = {}
_DIGESTS_MAX = 1_000_000


def image_digest(path: str, key: tuple) -> bytes:
    """``file_digest`` of an image whose stat is ``key``, read at most once per process run."""
    digest = _digests.get((path, *key))
    if digest is None:
        digest, _ = file_digest(path)
        if len(_digests) >= _DIGESTS_MAX:
            _digests.clear()
        _digests[(path, *key)] = digest
    return digest


def forget_digests() -> None:
    _digests.clear()
