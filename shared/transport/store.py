"""A store: the directory whose files are pixpool's segments (snapshots and rings).

Code both sides import. Every segment is a file in one directory, mapped with ``mmap``:
``/dev/shm`` (the default, a tmpfs: the pages are memory) or any other directory, such as a
folder on a local disk for a dataset larger than memory (the page cache then holds what is
read, one copy shared by every process that maps it, and the kernel may drop clean pages
and read them again). Everything that opens a segment takes the store it lives in; a
store travels between processes as its path (a string).

Trust: a store is a directory pixpool creates files in and maps files from, so the
directory itself must not let anyone else swap them: ``check_store`` refuses a store that
is not a directory, or that a user other than us and root owns, or that group or others
may write without the sticky bit (the sticky bit, as on /dev/shm and /tmp, keeps others
from removing or renaming our files). The files in it are checked one by one as before
(``shared.transport.shm``). A store on a network file system (NFS, SMB, ...) is refused: machines
mapping one file there do not see each other's writes in order.

Figures: free and total bytes of the store's file system (``statvfs``), whether it is
memory (tmpfs, ramfs: its pages are RAM, so a preparation must also fit in memory), and how
many of a file's pages are in memory (``resident_nbytes``: ``mincore`` over a read-only
mapping, as ``fincore`` does; it touches no page).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import stat

import numpy as np

from ..errors import ConfigError
from .names import DEFAULT_STORE

# File systems whose pages are memory: a snapshot there must fit in RAM (and swap).
MEMORY_FS_TYPES = frozenset({"tmpfs", "ramfs", "hugetlbfs"})
# File systems shared between machines: a mapping there is not kept coherent across them,
# so a trainer elsewhere could read a slot before the worker's bytes reach it.
NETWORK_FS_TYPES = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "fuse.glusterfs", "fuse.sshfs", "lustre", "gpfs"}
)


def store_dir(store: str | os.PathLike | None) -> str:
    """The canonical path of ``store`` (default /dev/shm): symlinks resolved, because the
    kernel names mapped files by their real path in /proc/PID/maps."""
    return os.path.realpath(os.fspath(store) if store is not None else DEFAULT_STORE)


def check_store(store: str | os.PathLike | None) -> str:
    """The canonical path of a store pixpool may use, or ConfigError saying what to change
    (see module docstring)."""
    given = os.fspath(store) if store is not None else DEFAULT_STORE
    path = store_dir(given)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(
            f"store {given} does not exist; create the directory (mode 0700, or 1777 for a shared one) or choose another --store",
            field="store",
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(
            f"store {given} is not a directory; --store names a directory (a tmpfs such as /dev/shm, or a folder on a local disk)",
            field="store",
        )
    mode = stat.S_IMODE(st.st_mode)
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise ConfigError(
            f"store {given} belongs to uid {st.st_uid}, not to you (uid {me}) or root: its owner could replace the files pixpool maps; use a directory of your own",
            field="store",
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        raise ConfigError(
            f"store {given} has mode {mode:04o}: group or others may write it without the sticky bit, so they could remove or "
            f"replace pixpool's files; `chmod o-w,g-w {given}` (or `chmod +t` for a shared directory)",
            field="store",
        )
    kind = fs_type(path)
    if kind in NETWORK_FS_TYPES:
        raise ConfigError(
            f"store {given} is on a network file system ({kind}): mapped files are not kept coherent between machines; use a local disk or a tmpfs on each node (one daemon per node)",
            field="store",
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(
            f"store {given} is not writable by you (uid {me}); choose a directory you may create files in",
            field="store",
        )
    return path


def free_nbytes(store: str) -> int:
    st = os.statvfs(store)
    return st.f_bavail * st.f_frsize


def size_nbytes(store: str) -> int:
    st = os.statvfs(store)
    return st.f_blocks * st.f_frsize


def fs_type(store: str) -> str:
    """The file system type of the mount holding ``store`` (``tmpfs``, ``ext4``, ...), from
    /proc/self/mountinfo by device number; "" where it cannot be told."""
    try:
        dev = os.stat(store).st_dev
        with open("/proc/self/mountinfo") as f:
            text = f.read()
    except OSError:
        return ""
    return fs_type_of(text, os.major(dev), os.minor(dev))


def fs_type_of(mountinfo: str, major: int, minor: int) -> str:
    """The type of the last mount of device ``major:minor`` in ``mountinfo`` text (pure)."""
    found = ""
    want = f"{major}:{minor}"
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[2] != want or "-" not in fields:
            continue
        rest = fields[fields.index("-") + 1 :]
        if rest:
            found = rest[0]
    return found


def is_memory(store: str) -> bool:
    """True where the store's pages are memory (tmpfs and kin)."""
    return fs_type(store) in MEMORY_FS_TYPES


def describe(store: str) -> dict:
    """What status and memory reports say of a store."""
    kind = fs_type(store)
    return {
        "path": store,
        "fs_type": kind,
        "memory": kind in MEMORY_FS_TYPES,
        "size_bytes": size_nbytes(store),
        "free_bytes": free_nbytes(store),
    }


# -- residency (mincore) -------------------------------------------------------------------
_libc = None


def _c():
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        _libc = libc
    return _libc


def resident_nbytes(path: str) -> int:
    """Bytes of the file at ``path`` that are in memory now (page cache or tmpfs pages),
    by ``mincore`` over a short-lived read-only mapping that touches no page; 0 for what is
    no regular file. Opened non-blocking and no-follow like every file in a store
    (``trusted.open_trusted``): a FIFO under a pixpool name would block a plain open. No owner
    check: this maps no byte in, it only asks which pages are present."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symlink, a socket: no pages of a segment
            return 0
        raise
    try:
        st = os.fstat(fd)
        size = st.st_size
        if size == 0 or not stat.S_ISREG(st.st_mode):
            return 0
        libc = _c()
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} for mincore failed")
        try:
            page = mmap.PAGESIZE
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            resident = int((np.frombuffer(vec, dtype=np.uint8) & 1).sum())
        finally:
            libc.munmap(addr, size)
        return min(size, resident * page)
    finally:
        os.close(fd)
