"""Opening a file in a store only when it is what pixpool may map.

Runs in every process that touches a store. /dev/shm is writable by every user of the
machine (sticky, mode 1777), and every pixpool name is predictable or told over a socket, so anyone could create a file under a
name pixpool is about to map. Every open of a file in a store therefore goes through
``open_trusted`` (``shm``'s mappings, ``holds``, ``store.resident_nbytes`` and the label index too): non-blocking
(``O_NONBLOCK``: a FIFO planted under a pixpool name would otherwise block the open until
someone writes to it, before any check could run), never through a symlink
(``O_NOFOLLOW``), then one check on the opened descriptor (``fstat``, no window between
check and use): a regular file, owned by the uid the name carries
(``names.expected_owner``), writable by nobody else (no group/other write bit), and, where
the caller knows it, of the expected size. Anything else is ``UntrustedSegmentError``
naming the file, what it is, its owner and mode, and what to do. ``O_NONBLOCK`` changes nothing for a
regular file (reads and ``mmap`` of one never block on it; Linux has had no mandatory
locks since 5.15), so the descriptor is used as opened.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import UntrustedSegmentError
from .names import expected_owner
from .store import DEFAULT, Store

__all__ = ["check_trusted", "describe_owner", "file_kind", "open_trusted", "owner_of", "read_prefix"]


def _user(uid: int) -> str:
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def describe_owner(uid: int) -> str:
    """``uid 1001 (alice)``: a file's owner, for messages."""
    return _user(uid)


_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def file_kind(st: os.stat_result) -> str:
    """What ``st`` (an ``lstat``/``fstat``) is, in words: "a regular file", "a named pipe (FIFO)", ..."""
    return next((words for test, words in _KINDS if test(st.st_mode)), "a regular file")


def check_trusted(
    name: str,
    st: os.stat_result,
    *,
    expected_nbytes: int | None = None,
    store: Store = DEFAULT,
    any_mode: bool = False,
) -> None:
    """UntrustedSegmentError unless ``st`` (of segment ``name``) is what pixpool may map:
    a regular file of the expected owner that nobody else can write, of the expected size.
    ``any_mode``: the mode is not checked (to remove or lock a file of ours, not to read it)."""
    path = store.path(name)
    mode = stat.S_IMODE(st.st_mode)
    owner = expected_owner(name)
    clean = f"pixpool clean{'' if store.is_default else f' --store {store}'} {name}"
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedSegmentError(
            f"{path} is {file_kind(st)} of {_user(st.st_uid)} (mode {mode:04o}), not a regular file; pixpool maps only "
            f"its own segment files and left it alone. Ask its owner (or root) to remove it (`rm -r {path}`), then start again",
            path=path,
        )
    if st.st_uid != owner:
        raise UntrustedSegmentError(
            f"{path} belongs to {_user(st.st_uid)} (mode {mode:04o}), but its name is {_user(owner)}'s: another user created it, "
            f"and pixpool does not map data it cannot trust. Ask that user (or root) to remove it (`rm {path}`), then start again",
            path=path,
        )
    if not any_mode and mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedSegmentError(
            f"{path} (owner {_user(st.st_uid)}) has mode {mode:04o}: group or others may write it, so its bytes cannot be trusted; "
            f"remove it with `{clean}` (or `rm {path}`) and prepare again",
            path=path,
        )
    if expected_nbytes is not None and st.st_size != expected_nbytes:
        raise UntrustedSegmentError(
            f"{path} has {st.st_size} bytes, expected {expected_nbytes}; it is not the segment pixpool made. "
            f"Remove it with `{clean}` and start again",
            path=path,
        )


# Opening what is no regular file fails with these, before any fstat could tell: ELOOP (a
# symlink under O_NOFOLLOW), EISDIR (a directory opened for writing), ENXIO (a socket; a FIFO
# opened for writing with no reader), EACCES/EPERM (someone else's file we may not open).
_OPEN_REFUSALS = frozenset({errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EACCES, errno.EPERM})


def open_trusted(
    name: str,
    *,
    writable: bool = False,
    expected_nbytes: int | None = None,
    store: Store = DEFAULT,
    any_mode: bool = False,
) -> int:
    """A descriptor of segment ``name`` that passed ``check_trusted``; the caller closes it.
    Never blocks and never follows a link (module docstring). FileNotFoundError where it is
    gone; UntrustedSegmentError, naming the file, what it is and whose, for anything else."""
    path = store.path(name)
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in _OPEN_REFUSALS:
            # Say what is there and whose it is (lstat: the link itself, never its target).
            try:
                check_trusted(name, os.lstat(path), store=store, any_mode=any_mode)
            except FileNotFoundError:
                raise exc from None
        raise
    try:
        check_trusted(name, os.fstat(fd), expected_nbytes=expected_nbytes, store=store, any_mode=any_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_prefix(name: str, nbytes: int, *, store: Store = DEFAULT) -> bytes:
    """The first ``nbytes`` of a trusted segment, by a plain read (no mapping)."""
    fd = open_trusted(name, store=store)
    try:
        return os.pread(fd, nbytes, 0)
    finally:
        os.close(fd)


def owner_of(name: str, store: Store = DEFAULT) -> int | None:
    """uid of the file behind segment ``name`` (not followed if a link), None if it is gone."""
    try:
        return os.lstat(store.path(name)).st_uid
    except FileNotFoundError:
        return None
