"""The daemon's "starting" mark: a lock in its socket directory, taken first thing.

Code both sides import. A daemon binds its socket only once its snapshot is ready (seconds
to minutes), and before this mark a trainer started beside it (``pixpool serve ... &`` then
``pixpool train``) found no socket directory and gave up at once. So the daemon, before it
imports its modules or reads a byte of the dataset, makes its socket directory and takes a
write lock on ``daemon.starting`` in it (``StartingMark.take``); a client that finds no
listening socket asks whether that lock is held (``is_starting``) and, if so, waits.

The lock is an open-file-description lock (``F_OFD_SETLK``, ``holds.py``): it belongs to
the daemon's open file, not to a pid, and the kernel drops it when the daemon dies however
it dies, so a daemon killed while starting never leaves a mark that makes clients wait for
it. The file itself stays (like ``daemon.lock``); only the lock says anything. A client
tests it with ``F_OFD_GETLK`` and takes nothing, so a client looking never gets in the way
of a daemon taking it.

The daemon holds the mark until it exits: one daemon per socket directory is decided here
first (a second one is refused before it reads its dataset). A daemon that fails before it
serves (a wrong dataset path) removes the mark and every directory it made (``release``).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from ..errors import ConfigError
from . import endpoint as ep
from .holds import _setlk as _set_lock
from .holds import held_by_others

__all__ = ["MARK_NAME", "StartingMark", "is_starting"]

MARK_NAME = "daemon.starting"


class StartingMark:
    """The daemon's side: ``take`` makes the socket directory (0700, checked as
    ``endpoint.socket_dir`` checks it) and locks the mark; ``release`` drops it."""

    def __init__(self, directory: Path, fd: int, made: list[Path]):
        self.directory = directory
        self._fd: int | None = fd
        self._made = made  # the directories ``take`` created, deepest first

    @classmethod
    def take(cls, socket_dir: str | os.PathLike | None) -> "StartingMark":
        """ConfigError where the socket directory is refused, or another daemon holds its mark
        (it is starting or serving there)."""
        wanted = ep.socket_dir(socket_dir, create=False)
        missing = _missing_dirs(wanted)
        directory = ep.socket_dir(socket_dir, create=True)
        made = missing if directory == wanted else []
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(directory / MARK_NAME, flags, 0o600)
        except OSError as exc:
            _remove_dirs(made)
            raise ConfigError(
                f"cannot make {directory / MARK_NAME} ({exc.strerror}); name a real directory of yours with --socket-dir"
            ) from None
        if not _set_lock(fd, fcntl.F_WRLCK, 0, 0):
            os.close(fd)
            raise ConfigError(
                f"another pixpool daemon already serves {directory} (or is starting there); stop it or use another "
                "--socket-dir"
            )
        return cls(directory, fd, made)

    def release(self, *, served: bool) -> None:
        """Drop the lock. A daemon that never served (``served`` False) also removes the mark
        and the directories it made, where nothing else is in them: a failed ``serve`` leaves
        nothing behind."""
        if self._fd is None:
            return
        if not served:
            try:
                os.unlink(self.directory / MARK_NAME)  # still locked by us: nobody else took it
            except FileNotFoundError:
                pass
        os.close(self._fd)
        self._fd = None
        if not served:
            _remove_dirs(self._made)


def is_starting(directory: Path) -> bool:
    """True while a live daemon holds the mark in ``directory`` (it is starting, or serving)."""
    try:
        fd = os.open(directory / MARK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False  # no mark (or nothing we may read): no daemon says it is starting
    try:
        return held_by_others(fd)
    finally:
        os.close(fd)


def _missing_dirs(directory: Path) -> list[Path]:
    """``directory`` and its ancestors that do not exist yet, deepest first."""
    out = []
    d = Path(os.path.abspath(directory))
    while not d.exists() and d != d.parent:
        out.append(d)
        d = d.parent
    return out


def _remove_dirs(dirs: list[Path]) -> None:
    for d in dirs:  # deepest first; one that holds anything (another process's files) stays
        try:
            d.rmdir()
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                raise
            if exc.errno != errno.ENOENT:
                return
