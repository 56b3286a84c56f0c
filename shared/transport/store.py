"""A store: the directory whose files are pixpool's segments (snapshots and rings).

Code both sides import. Every segment is a file in one directory, mapped with ``mmap``:
``/dev/shm`` (the default, a tmpfs: the pages are memory) or any other directory, such as a
folder on a local disk for a dataset larger than memory (the page cache then holds what is
read, one copy shared by every process that maps it, and the kernel may drop clean pages
and read them again). A store is a ``Store`` value, made once from its path (``Store.of``:
None is /dev/shm) where a command line, a setting or a message names it; everything that
opens a segment takes the ``Store`` it lives in, which builds the segment's path.

Trust: a store is a directory pixpool creates files in and maps files from, so the
directory itself must not let anyone else swap them: ``Store.checked`` refuses a store that
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
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .names import DEFAULT_STORE, PREFIX

# File systems whose pages are memory: a snapshot there must fit in RAM (and swap).
MEMORY_FS_TYPES = frozenset({"tmpfs", "ramfs", "hugetlbfs"})
# File systems shared between machines: a mapping there is not kept coherent across them,
# so a trainer elsewhere could read a slot before the worker's bytes reach it.
NETWORK_FS_TYPES = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "fuse.glusterfs", "fuse.sshfs", "lustre", "gpfs"}
)


@dataclass(frozen=True, eq=False)
class Store:
    """One store: the directory its segments live in, resolved once (``Store.of``).

    Every segment's file is ``path(name)``, and every lister of a store's segments asks
    ``segments()``: no other code joins a store and a name. A store travels between processes
    (pickled, or as its path in a message or a setting) and prints as its path; it equals
    another store of the same directory, and that directory's path as a string, so a path a
    reply or a setting carries compares as the store it names."""

    directory: str

    @classmethod
    def of(cls, value: str | os.PathLike | Store | None) -> Store:
        """The store ``value`` names: itself if it is one, else the directory of that path;
        None or "" is the default store (/dev/shm)."""
        if isinstance(value, Store):
            return value
        return cls(os.fspath(value) if value else DEFAULT_STORE)

    @property
    def is_default(self) -> bool:
        return self.directory == DEFAULT_STORE

    def path(self, name: str) -> str:
        """The file of segment ``name`` in this store; ValueError for a name that is no single
        path component."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"invalid shared-memory name {name!r}: one path component, no '/'")
        return os.path.join(self.directory, name)

    def segments(self) -> list[str]:
        """Names of every file in this store that carries the project's prefix (none where the
        directory does not exist)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.startswith(PREFIX))

    def checked(self) -> Store:
        """This store at its canonical path (symlinks resolved, because the kernel names
        mapped files by their real path in /proc/PID/maps), where pixpool may use it; else
        ConfigError saying what to change (module docstring)."""
        given = self.directory
        path = os.path.realpath(given)
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
        return Store(path)

    def __str__(self) -> str:
        return self.directory

    def __fspath__(self) -> str:
        return self.directory

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Store):
            return self.directory == other.directory
        if isinstance(other, (str, os.PathLike)):
            return self.directory == os.fspath(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.directory)


# The default store (/dev/shm), for every function whose ``store`` may be left out.
DEFAULT = Store(DEFAULT_STORE)


def free_nbytes(store: Store) -> int:
    st = os.statvfs(store)
    return st.f_bavail * st.f_frsize


def size_nbytes(store: Store) -> int:
    st = os.statvfs(store)
    return st.f_blocks * st.f_frsize


def fs_type(path: Store | str) -> str:
    """The file system type of the mount holding ``path`` (a store, or a directory on the way
    to one: ``tmpfs``, ``ext4``, ...), from /proc/self/mountinfo by device number; "" where it
    cannot be told."""
    try:
        dev = os.stat(path).st_dev
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


def is_memory(store: Store) -> bool:
    """True where the store's pages are memory (tmpfs and kin)."""
    return fs_type(store) in MEMORY_FS_TYPES


def describe(store: Store) -> dict:
    """What status and memory reports say of a store."""
    kind = fs_type(store)
    return {
        "path": str(store),
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
