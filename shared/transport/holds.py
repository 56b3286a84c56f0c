"""Holds: who uses a segment, decided from the store itself with open-file-description locks.

Code both sides import; ``shared.transport.shm`` takes the holds, ``pixpool clean``/``ls``, the
daemon's sweeps and the snapshot's last-one-out rule ask them. It is the one rule for
"in use", "alive" and "mine", whatever PID namespace or container the asker runs in.

The rule:
- Every process that maps a segment holds a read lock on byte ``MAPPED`` of its file, taken
  with ``F_OFD_SETLK`` on the descriptor it maps. Such a lock belongs to the open file
  description, not to a pid: every process that shares the store sees it, from any PID or
  mount namespace, and it goes only when the last reference to that open file goes. The
  mapping itself is such a reference (the kernel keeps the file of a mapping open, and
  Python's ``mmap`` keeps a duplicate descriptor), so the hold lasts exactly as long as the
  mapping: while numpy views keep a closed segment's mapping alive, the hold stays; when a
  killed process's mappings are torn down, its holds go without anyone's help.
- Some holders say more, each on a byte of its own: the process that created a segment
  (a ring's daemon) on ``CREATOR``, the one process a segment is for (a ring's trainer) on
  ``CONSUMER``. Locks may lie past the end of a file; these bytes are never data.
- "In use" is: some open file description holds a lock on the segment (``holds_of``).
- Removal (``remove_unused``) opens each file, takes a non-blocking WRITE lock over the
  whole of it (refused while anyone holds anything), checks that the name still is that
  file, unlinks it while holding the lock, and closes. A group (a snapshot's three parts)
  goes only when every part could be locked, or none does.
- Attaching (``shared.transport.shm``) opens, takes its read lock, then checks that the name still is
  the file it opened: a remover may have unlinked it in between. Against a remover this is
  race-free: either the attacher's lock comes first and the remover is refused, or the
  remover's lock comes first and the attacher finds the name gone (FileNotFoundError),
  never a mapping of a removed file.

Linux only (``F_OFD_*``, Linux >= 3.15). ``struct flock`` is packed as the 32 bytes of
x86-64 and aarch64 (``l_pid`` 0, as OFD locks require).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import struct
import time
from dataclasses import dataclass

from .store import DEFAULT, Store
from .trusted import open_trusted

log = logging.getLogger(__name__)

# Lock bytes (offsets in the segment's file; lengths 1).
MAPPED, CREATOR, CONSUMER = 0, 1, 2

# struct flock: short l_type, short l_whence, (pad), off_t l_start, off_t l_len, pid_t l_pid, (pad)
_FLOCK = struct.Struct("=hh4xqqi4x")
_WHOLE = (0, 0)  # l_start 0, l_len 0: from the start to beyond any end
# A remover holds its write lock for the microseconds between lock and unlink (or, for a
# group of which one part is in use, lock and give up); an attacher that meets it waits
# this long for the outcome before it decides the segment is being removed.
BUSY_WAIT_S = 1.0


def _flock(kind: int, start: int, length: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, start, length, 0)


def _setlk(fd: int, kind: int, start: int, length: int) -> bool:
    """True if the lock was set; False where another open file description's lock conflicts."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(kind, start, length))
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def _conflicts(fd: int, start: int, length: int) -> bool:
    """True while another open file description holds a lock on the range (any kind)."""
    got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _flock(fcntl.F_WRLCK, start, length))
    return _FLOCK.unpack(got)[0] != fcntl.F_UNLCK


_HOLD_MAPPED = _flock(fcntl.F_RDLCK, MAPPED, 1)  # the common case, packed once (attach is a hot path)


def hold(fd: int, roles: tuple[int, ...] = (MAPPED,)) -> bool:
    """Take this open file's read locks on ``MAPPED`` and ``roles``. False (nothing held)
    while a remover holds its write lock: the file is being removed, or was just probed."""
    if not roles or roles == (MAPPED,):
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _HOLD_MAPPED)
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
    wanted = sorted({MAPPED, *roles})
    for i, byte in enumerate(wanted):
        if not _setlk(fd, fcntl.F_RDLCK, byte, 1):
            for taken in wanted[:i]:
                _setlk(fd, fcntl.F_UNLCK, taken, 1)
            return False
    return True


def hold_waiting(fd: int, roles: tuple[int, ...] = (MAPPED,), *, wait_s: float = BUSY_WAIT_S) -> bool:
    """``hold``, waiting up to ``wait_s`` while a remover's write lock is in the way (it is
    held for microseconds; there is no notification to wait on, so this polls)."""
    if hold(fd, roles):
        return True
    deadline = time.monotonic() + wait_s
    pause_s = 0.0005
    while not hold(fd, roles):
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause_s)  # a bounded poll of another process's lock, not synchronisation of ours
        pause_s = min(pause_s * 2, 0.02)
    return True


def let_go(fd: int) -> None:
    """Drop every lock this open file holds (a mapping that stays then holds nothing)."""
    _setlk(fd, fcntl.F_UNLCK, *_WHOLE)


def held_by_others(fd: int, role: int | None = None) -> bool:
    """True while another open file description holds ``role`` (None: anything) on the file
    behind ``fd``; this descriptor's own locks never count."""
    return _conflicts(fd, *((role, 1) if role is not None else _WHOLE))


def same_file(fd: int, path: str, st: os.stat_result | None = None) -> bool:
    """True while ``path`` still names the file open as ``fd`` (not removed, not replaced);
    ``st``: ``fd``'s ``fstat`` where the caller has it already (an open file's inode never changes)."""
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    st = os.fstat(fd) if st is None else st
    return (named.st_dev, named.st_ino) == (st.st_dev, st.st_ino)


@dataclass(frozen=True)
class Holds:
    """What the locks on one segment say (``holds_of``)."""

    in_use: bool  # some process maps it (or holds it open to map it)
    creator: bool  # its creator still holds it (a ring: its daemon is alive)
    consumer: bool  # the process it is for holds it (a ring: its trainer)


def _open_probe(path: str) -> int | None:
    """A read-only descriptor of the regular file at ``path``, None where there is none: gone,
    or no regular file (nothing maps a FIFO or a directory, so nothing holds it). Non-blocking
    and no-follow like every open in a store (``trusted.open_trusted``): a FIFO planted under a
    pixpool name must not block the probe. The owner is not checked: reading locks reads no
    byte of the file, and ``ls``/``clean`` ask about their own files only."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EACCES, errno.EPERM):
            return None  # a symlink, a socket, a file we may not open: no segment of ours
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def holds_of(name: str, store: Store = DEFAULT) -> Holds | None:
    """The holds on segment ``name`` in ``store`` (default /dev/shm); None if it is gone or is
    no regular file (``_open_probe``)."""
    fd = _open_probe(store.path(name))
    if fd is None:
        return None
    try:
        return Holds(
            in_use=_conflicts(fd, *_WHOLE), creator=_conflicts(fd, CREATOR, 1), consumer=_conflicts(fd, CONSUMER, 1)
        )
    finally:
        os.close(fd)


def remove_unused(names, store: Store = DEFAULT) -> str:
    """Remove segments ``names`` of ``store`` as one unit if nobody holds any of them.

    Returns "removed" (every part that existed is gone), "in use" (some process holds a
    part: nothing was removed) or "gone" (none existed). A name replaced by another file
    between open and lock counts as in use (someone just made it).

    Only files of the owner a name claims are part of a unit (``trusted.open_trusted``: a regular
    file, opened non-blocking, never through a link): anything else under one of ``names``
    (another user's file, a FIFO, a directory) is no part of it, is left alone and logged,
    and neither keeps the rest nor stops the removal."""
    from ..errors import UntrustedSegmentError

    opened: list[tuple[str, int]] = []
    try:
        for name in names:
            path = store.path(name)
            try:
                # Write locks need a descriptor open for writing; any mode: an own file made
                # writable by others is still ours to remove (that is how it goes away).
                fd = open_trusted(name, writable=True, store=store, any_mode=True)
            except FileNotFoundError:
                continue
            except UntrustedSegmentError as exc:
                log.warning("not removed (no file of ours): %s", exc)
                continue
            opened.append((path, fd))
            if not _setlk(fd, fcntl.F_WRLCK, *_WHOLE) or not same_file(fd, path):
                return "in use"
        if not opened:
            return "gone"
        for path, _ in opened:
            try:
                os.unlink(path)  # under our write lock: nobody attaches it meanwhile
            except FileNotFoundError:
                pass  # an owner's plain unlink came first
        return "removed"
    finally:
        for _, fd in opened:
            os.close(fd)  # drops the write lock (and, after a refusal, leaves the file as it was)
