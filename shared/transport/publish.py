"""Publishing a whole file in a store under its name: nothing under any name until it is complete.

Runs in the process that writes a small file beside a snapshot (the label index: the daemon,
``pixpool prepare``). A reader must see the old file or the new one, never a part; and the
temporary file must not be a name anyone can predict: a named temporary file such as
``<final>.tmp<pid>`` outlives a killed writer, stops every later writer with the same pid
(PID 1 in a container) at its ``O_EXCL``, and another user may create it first.

How: the bytes go into an anonymous file (``O_TMPFILE``, mode 0600), which has no name while
it is written, so a writer killed then leaves nothing. It is then linked under the final
name (``linkat``, ``AT_EMPTY_PATH``; or through ``/proc/self/fd``) where that name is free, or
under a random temporary name renamed over the final one where a file is there already
(``linkat`` never replaces). A store whose file system has no ``O_TMPFILE`` (or a kernel
that refuses both ways of linking one) gets a named temporary file instead, created with
``O_EXCL`` under a random name (64 bits: nobody squats it ahead) and retried on a clash.
The random names are ``<final>.tmp-<16 hex>`` (``names.temporary_name``): while it is
being written or renamed its writer holds a lock on it (``shared.transport.holds``); one that
nobody holds is a killed writer's debris, which ``sweep_debris`` (run by ``prepare`` and
the daemon at start, and by ``pixpool clean``) removes, as it removes the ``.tmp<pid>``
files older releases left.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os

from . import holds
from .names import parse, temporary_name
from .store import DEFAULT, Store

__all__ = ["publish_bytes", "sweep_debris"]

log = logging.getLogger(__name__)

_MODE = 0o600
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_CLASH_RETRIES = 16  # random names clash only with a squatter's guesses, never by chance
# Errors that say "this file system or kernel cannot do that": fall back to a named file.
_UNSUPPORTED = frozenset(
    {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT, errno.EPERM, errno.EXDEV, errno.ENOSYS}
)

_libc = None


def _linkat_empty_path(fd: int, path: str) -> None:
    """``linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH)``: give the anonymous file ``fd`` a name."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if _libc.linkat(fd, b"", _AT_FDCWD, os.fsencode(path), _AT_EMPTY_PATH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


def _link(fd: int, path: str) -> None:
    """Name the anonymous file ``fd`` ``path``. ``AT_EMPTY_PATH`` needs CAP_DAC_READ_SEARCH before
    Linux 6.10 (any owner of the descriptor since); the ``/proc/self/fd`` way needs /proc."""
    try:
        _linkat_empty_path(fd, path)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOENT, errno.EINVAL, errno.ENOSYS):
            raise
        os.link(f"/proc/self/fd/{fd}", path, follow_symlinks=True)


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def publish_bytes(name: str, data, store: Store = DEFAULT) -> None:
    """Make ``data`` the file ``name`` in ``store`` (default /dev/shm), mode 0600, at once
    (module docstring). OSError where the final name cannot be taken: another user's file
    there (a sticky store lets nobody replace another's file), a directory, a full store."""
    final = store.path(name)
    try:
        fd = os.open(store.directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, _MODE)
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
        log.debug("%s: no O_TMPFILE (%s); writing %s under a random temporary name", store, exc.strerror, name)
        return _publish_named(name, data, store)
    try:
        holds.hold(fd, (holds.CREATOR,))  # whatever name it gets shows a live writer while this is open
        _write_all(fd, data)
        try:
            _link(fd, final)  # the common case: the name is free, and nothing else ever had a name
            return
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
            log.debug("%s: cannot link an O_TMPFILE file (%s); writing %s under a random temporary name",
                      store, exc.strerror, name)  # fmt: skip
            return _publish_named(name, data, store)
        for _ in range(_CLASH_RETRIES):
            tmp = store.path(temporary_name(name))
            try:
                _link(fd, tmp)
            except FileExistsError:
                continue  # someone guessed 64 random bits; pick others
            _replace(tmp, final)
            return
        raise FileExistsError(
            errno.EEXIST, f"{_CLASH_RETRIES} random temporary names beside {final} were all taken", final
        )
    finally:
        os.close(fd)


def _replace(tmp: str, final: str) -> None:
    try:
        os.replace(tmp, final)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _publish_named(name: str, data, store: Store) -> None:
    """``publish_bytes`` where the store has no anonymous files: a random name, ``O_EXCL``,
    held (so no sweep takes it) from creation to the rename."""
    final = store.path(name)
    for _ in range(_CLASH_RETRIES):
        tmp = store.path(temporary_name(name))
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _MODE)
        except FileExistsError:
            continue
        try:
            # A sweep that opened the new file before this lock may have removed it: then
            # this name is lost, and the next one is tried.
            if not (holds.hold(fd, (holds.CREATOR,)) and holds.same_file(fd, tmp)):
                continue
            try:
                _write_all(fd, data)
            except BaseException:
                _unlink_quietly(tmp)
                raise
            _replace(tmp, final)
            return
        finally:
            os.close(fd)
    raise FileExistsError(errno.EEXIST, f"{_CLASH_RETRIES} random temporary names beside {final} were all taken", final)


def sweep_debris(store: Store = DEFAULT, *, prefix: str = "") -> list[str]:
    """Remove this user's temporary files (``names.parse`` kind "debris") whose names start with
    ``prefix`` and that no writer holds: what killed writers left. Returns the names removed.
    Another user's file under such a name is not ours and stays (``holds.remove_unused``)."""
    uid = os.geteuid()
    gone = []
    for seg in store.segments():
        parsed = parse(seg)
        if parsed is None or parsed.kind != "debris" or parsed.uid != uid or not seg.startswith(prefix):
            continue
        if holds.remove_unused([seg], store) == "removed":
            gone.append(seg)
    if gone:
        log.info("removed %d temporary file(s) that killed writers left: %s", len(gone), ", ".join(gone))
    return gone
