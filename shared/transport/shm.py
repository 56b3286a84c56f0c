"""One segment: a file in a store (``shared.transport.store``; /dev/shm by default) mapped with ``mmap``.

Runs in every process that touches shared memory. The process that ``create``s a
segment owns it and is the only one that may ``unlink`` it; every other process
``attach``es (read-only unless asked) and ``close``s.

Why not ``multiprocessing.shared_memory``: its resource tracker, in a process that merely
attaches, unlinks the segment when that process exits (bpo-39959; ``track=False`` only
exists from Python 3.13). Here nothing is registered anywhere; a segment lives until its
owner (or ``pixpool clean``) unlinks it.

The contract:
- ``close()`` when this process is done with the mapping. numpy arrays made over
  ``buf`` keep the mapping alive: ``mmap.close`` would raise ``BufferError`` while they
  exist, so ``close`` then only drops this object's reference and the kernel mapping goes
  away when the last array is garbage collected. Nothing dangles and nothing raises.
- ``unlink()`` once, by the owner, when no process needs the name any more. Processes
  already mapping it keep their mapping.
- A ``weakref.finalize`` closes a forgotten segment at garbage collection; it never
  unlinks (a prepared snapshot outlives the process that made it on purpose).

Every function takes ``store``, the ``Store`` the segment lives in (default /dev/shm); a
segment object remembers its store, so ``present`` and ``unlink`` look in the same place.

Trust: every open of a file in a store goes through ``trusted.open_trusted`` (type, owner and
mode checked on the opened descriptor); ``create`` is ``O_EXCL`` with mode 0600: it never adopts
an existing file.

Holds (``shared.transport.holds``): every mapping made here holds an open-file-description read lock
on its file for as long as the mapping lives (the creator's also on ``CREATOR``; a
consumer's, e.g. a ring's trainer, on ``CONSUMER``), so any process that shares the store,
in any PID namespace, can tell that the segment is in use. ``attach`` takes the lock, then
checks that the name still is the file it opened (a remover may have unlinked it in
between) and says FileNotFoundError otherwise. The segment keeps its descriptor open until
``close``; the mapping keeps the lock beyond that while numpy views keep it alive.
"""

from __future__ import annotations

import errno
import mmap
import os
import weakref

from . import holds
from .store import DEFAULT, Store
from .trusted import open_trusted

_MODE = 0o600


def open_held(name: str, *, writable: bool = False, store: Store = DEFAULT) -> int:
    """``open_trusted``, holding the file as a mapping would (``shared.transport.holds``): for a process
    that writes a segment through a descriptor (``pwrite``) rather than a mapping. The hold
    lasts until the caller closes the descriptor. FileNotFoundError where it is being removed."""
    fd = open_trusted(name, writable=writable, store=store)
    _held_or_gone(fd, name, store.path(name), ())
    return fd


def _close_mapping(mm: mmap.mmap, fd: int) -> None:
    try:
        mm.close()
    except BufferError:
        # numpy views still export the buffer; the mapping (and with it the hold on the
        # file, which belongs to the open file the mapping keeps) goes when they die.
        pass
    finally:
        os.close(fd)


def _held_or_gone(fd: int, name: str, path: str, roles: tuple[int, ...], st: os.stat_result | None = None) -> None:
    """Take the holds on a just-opened ``fd`` of ``path`` (``st``: its fstat, if known);
    FileNotFoundError (``fd`` closed) where a remover has it, or the name no longer is this file."""
    if holds.hold_waiting(fd, roles) and holds.same_file(fd, path, st):
        return
    os.close(fd)
    raise FileNotFoundError(errno.ENOENT, f"shared-memory segment {name!r} was removed while being attached", path)


class SharedSegment:
    """A named shared-memory segment mapped into this process (see module docstring)."""

    def __init__(
        self,
        name: str,
        mm: mmap.mmap,
        nbytes: int,
        fd: int,
        *,
        owner: bool,
        writable: bool,
        inode: int = 0,
        store: Store = DEFAULT,
    ):
        self.name = name
        self.store = store
        self.nbytes = nbytes
        self.owner = owner
        self.writable = writable
        self.inode = inode  # which file this mapping is: ``present`` compares it
        self._mm: mmap.mmap | None = mm
        self._fd = fd  # holds this mapping's locks (shared.transport.holds); open until close()
        self._finalizer = weakref.finalize(self, _close_mapping, mm, fd)

    # -- construction ---------------------------------------------------------------
    @classmethod
    def create(cls, name: str, nbytes: int, *, reserve: bool = True, store: Store = DEFAULT) -> "SharedSegment":
        """Create a new segment of ``nbytes`` (fails if the name exists); this process owns it.

        ``reserve`` allocates the pages now (``posix_fallocate``) so that a full /dev/shm
        shows up here as ``OSError(ENOSPC)`` instead of a SIGBUS on first write later.
        Any failure after the name exists unlinks it before re-raising.
        """
        if nbytes <= 0:
            raise ValueError(f"shared-memory segment {name!r} needs a positive size, got {nbytes}")
        path = store.path(name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, _MODE)
        # Held at once: a sweep that opened the new, empty file before this lock (it looks
        # unused) removes it, and then this creation lost the name, as if it had existed.
        if not (holds.hold(fd, (holds.CREATOR,)) and holds.same_file(fd, path)):
            os.close(fd)
            raise FileExistsError(
                errno.EEXIST,
                f"shared-memory segment {name!r} was taken by a concurrent removal while being created",
                path,
            )
        try:
            os.ftruncate(fd, nbytes)
            if reserve:
                os.posix_fallocate(fd, 0, nbytes)
            mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            inode = os.fstat(fd).st_ino
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        return cls(name, mm, nbytes, fd, owner=True, writable=True, inode=inode, store=store)

    @classmethod
    def attach(
        cls,
        name: str,
        *,
        writable: bool = False,
        expected_nbytes: int | None = None,
        store: Store = DEFAULT,
        consumer: bool = False,
    ) -> "SharedSegment":
        """Map an existing, trusted segment (module docstring); read-only (``PROT_READ``)
        unless ``writable``. ``consumer``: this process is the one the segment is for (a
        ring's trainer), and says so in its hold (``holds.CONSUMER``).

        Arrays over a read-only segment's ``buf`` are read-only: writing raises ValueError.
        FileNotFoundError where the segment does not exist or is being removed.
        """
        path = store.path(name)
        fd = open_trusted(name, writable=writable, expected_nbytes=expected_nbytes, store=store)
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        _held_or_gone(fd, name, path, (holds.CONSUMER,) if consumer else (), st)
        try:
            nbytes = st.st_size
            if nbytes == 0:
                raise OSError(errno.EINVAL, f"shared-memory segment {name!r} is empty", path)
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=prot)
        except BaseException:
            os.close(fd)
            raise
        return cls(name, mm, nbytes, fd, owner=False, writable=writable, inode=st.st_ino, store=store)

    # -- use --------------------------------------------------------------------------
    @property
    def buf(self) -> mmap.mmap:
        """The mapping (supports the buffer protocol: ``np.frombuffer``, ``memoryview``)."""
        if self._mm is None:
            raise ValueError(f"shared-memory segment {self.name!r} is closed")
        return self._mm

    @property
    def closed(self) -> bool:
        return self._mm is None

    def present(self) -> bool:
        """True while the store still holds this very file under this name (not removed,
        not replaced by another file)."""
        try:
            return os.lstat(self.store.path(self.name)).st_ino == self.inode
        except FileNotFoundError:
            return False

    def damage(self) -> str | None:
        """None while the store holds this very file, whole; else what happened to it:
        removed, replaced by another file, or truncated below the size this process maps
        (a read past the new end would kill the reader with SIGBUS)."""
        try:
            st = os.lstat(self.store.path(self.name))
        except FileNotFoundError:
            return "was removed"
        if st.st_ino != self.inode:
            return "was replaced by another file"
        if st.st_size < self.nbytes:
            return f"was truncated from {self.nbytes} to {st.st_size} bytes"
        return None

    def flush(self) -> None:
        if self._mm is not None and self.writable:
            self._mm.flush()

    def held_by_others(self, role: int | None = None) -> bool:
        """True while another open file (another process, or another mapping here) holds
        ``role`` (``holds.CREATOR``, ``holds.CONSUMER``; None: any hold) on this file."""
        if self._mm is None:
            raise ValueError(f"shared-memory segment {self.name!r} is closed")
        return holds.held_by_others(self._fd, role)

    def close(self, *, let_go: bool = False) -> None:
        """Release this process's mapping (deferred while numpy views are alive; the hold
        stays with the mapping). ``let_go``: drop this mapping's hold now even if views keep
        the mapping, so that the segment can be removed (the last user out is leaving;
        views it still holds stay valid, an unlinked file's pages live on while mapped)."""
        if self._mm is None:
            return
        self._mm = None
        if let_go:
            holds.let_go(self._fd)
        self._finalizer()  # runs _close_mapping once and detaches the finalizer

    def unlink(self) -> None:
        """Remove the name from the store; only the owner may do so."""
        if not self.owner:
            raise PermissionError(
                f"segment {self.name!r} was attached, not created, by this process; only its owner unlinks it"
            )
        try:
            os.unlink(self.store.path(self.name))
        except FileNotFoundError:
            pass

    def __enter__(self) -> "SharedSegment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._mm is None else ("rw" if self.writable else "ro")
        return f"SharedSegment({self.name!r}, nbytes={self.nbytes}, {state}, owner={self.owner})"


def unlink_segment(name: str, store: Store = DEFAULT) -> bool:
    """Remove a segment by name (cleanup of what a dead owner left); True if it existed."""
    try:
        os.unlink(store.path(name))
        return True
    except FileNotFoundError:
        return False
