"""One POSIX shared-memory segment: a file under /dev/shm mapped with ``mmap``.

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
"""

from __future__ import annotations

import errno
import mmap
import os
import weakref

from .names import SHM_DIR

_MODE = 0o600


def _segment_path(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"invalid shared-memory name {name!r}: one path component, no '/'")
    return os.path.join(SHM_DIR, name)


def _close_mapping(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        # numpy views still export the buffer; the mapping is released when they die.
        pass


class SharedSegment:
    """A named shared-memory segment mapped into this process (see module docstring)."""

    def __init__(self, name: str, mm: mmap.mmap, nbytes: int, *, owner: bool, writable: bool):
        self.name = name
        self.nbytes = nbytes
        self.owner = owner
        self.writable = writable
        self._mm: mmap.mmap | None = mm
        self._finalizer = weakref.finalize(self, _close_mapping, mm)

    # -- construction ---------------------------------------------------------------
    @classmethod
    def create(cls, name: str, nbytes: int, *, reserve: bool = True) -> "SharedSegment":
        """Create a new segment of ``nbytes`` (fails if the name exists); this process owns it.

        ``reserve`` allocates the pages now (``posix_fallocate``) so that a full /dev/shm
        shows up here as ``OSError(ENOSPC)`` instead of a SIGBUS on first write later.
        Any failure after the name exists unlinks it before re-raising.
        """
        if nbytes <= 0:
            raise ValueError(f"shared-memory segment {name!r} needs a positive size, got {nbytes}")
        path = _segment_path(name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _MODE)
        try:
            os.ftruncate(fd, nbytes)
            if reserve:
                os.posix_fallocate(fd, 0, nbytes)
            mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)  # the mapping keeps the memory; the descriptor is no longer needed
        return cls(name, mm, nbytes, owner=True, writable=True)

    @classmethod
    def attach(cls, name: str, *, writable: bool = False) -> "SharedSegment":
        """Map an existing segment; read-only (``PROT_READ``) unless ``writable``.

        Arrays over a read-only segment's ``buf`` are read-only: writing raises ValueError.
        """
        path = _segment_path(name)
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
        try:
            nbytes = os.fstat(fd).st_size
            if nbytes == 0:
                raise OSError(errno.EINVAL, f"shared-memory segment {name!r} is empty", path)
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=prot)
        finally:
            os.close(fd)
        return cls(name, mm, nbytes, owner=False, writable=writable)

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

    def flush(self) -> None:
        if self._mm is not None and self.writable:
            self._mm.flush()

    def close(self) -> None:
        """Release this process's mapping (deferred while numpy views are alive)."""
        if self._mm is None:
            return
        self._mm = None
        self._finalizer()  # runs _close_mapping once and detaches the finalizer

    def unlink(self) -> None:
        """Remove the name from /dev/shm; only the owner may do so."""
        if not self.owner:
            raise PermissionError(f"segment {self.name!r} was attached, not created, by this process; only its owner unlinks it")
        try:
            os.unlink(_segment_path(self.name))
        except FileNotFoundError:
            pass

    def __enter__(self) -> "SharedSegment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._mm is None else ("rw" if self.writable else "ro")
        return f"SharedSegment({self.name!r}, nbytes={self.nbytes}, {state}, owner={self.owner})"


def unlink_segment(name: str) -> bool:
    """Remove a segment by name (cleanup of what a dead owner left); True if it existed."""
    try:
        os.unlink(_segment_path(name))
        return True
    except FileNotFoundError:
        return False
