"""Is a daemon listening at the trainer's socket? Fail at once, or wait for one that is starting.

Runs in the trainer process, before a ``Client`` connects over ipc (TCP has no file to look
at). ZeroMQ connects to an ipc path that nobody serves without complaint and retries for
ever, so a trainer started with a mistyped ``--socket-dir``, or before any daemon, used to
wait its whole ``timeout_s`` (60 s, 120 s for ``pixpool train``) and only then hear that no
daemon answered. The socket file says more, in well under a second:

- the socket directory does not exist, or holds no ``daemon.sock``: no daemon serves it yet
  (a daemon that is preparing its snapshot binds only once the snapshot is ready);
- ``daemon.sock`` exists but refuses a plain unix-socket connect (``ECONNREFUSED``): a
  killed daemon left it, and nothing listens (a new daemon replaces it when it binds);
- the connect succeeds: a daemon listens; the ``Client`` takes over (``timeout_s``).

Without ``wait_s`` the first two are a ``DaemonNotFound`` naming the directory and the
command that starts a daemon there. With ``wait_s`` the trainer waits up to that long for a
daemon to bind, saying every ``SAY_EVERY_S`` seconds where it waits and for how long.
The probe connect is closed before any byte is sent: the daemon's ZeroMQ listener drops a
peer that never greets, and counts nothing against anyone.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from pathlib import Path

from ..shared.errors import DaemonNotFound, DaemonTimeout

log = logging.getLogger(__name__)

SAY_EVERY_S = 5.0  # how often a waiting trainer says it still waits
_POLL_S = 0.1  # how often it looks again (a bounded wait; the file appears when the daemon binds)


def ipc_path(endpoint: str) -> Path | None:
    """The socket file of an ``ipc://`` endpoint; None for TCP."""
    return Path(endpoint[len("ipc://") :]) if endpoint.startswith("ipc://") else None


def listening(path: Path) -> str | None:
    """None where a daemon listens at ``path``, else why not, in words."""
    if not path.parent.is_dir():
        return f"the socket directory {path.parent} does not exist"
    if not path.exists():
        return f"the socket directory {path.parent} holds no daemon socket ({path.name})"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(os.fspath(path))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return f"{path} is left by a daemon that stopped: nothing listens on it"
        return None  # another failure (permissions, a full backlog): ZeroMQ's connect says more
    finally:
        probe.close()
    return None


def await_daemon(endpoint: str, *, wait_s: float = 0.0, what: str = "a pixpool daemon") -> None:
    """Return once a daemon listens at ``endpoint`` (at once over TCP); ``DaemonNotFound`` at
    once where none does and ``wait_s`` is 0, ``DaemonTimeout`` after ``wait_s`` seconds else."""
    path = ipc_path(endpoint)
    if path is None:
        return
    why = listening(path)
    if why is None:
        return
    if wait_s <= 0:
        raise DaemonNotFound(
            f"no pixpool daemon at {path.parent}: {why}. Start one with `pixpool serve DATA --socket-dir "
            f"{path.parent}` (or pass the socket directory a daemon serves); to wait for a daemon that is still "
            "starting, pass wait_s=SECONDS (`pixpool train --wait-s SECONDS`)",
            socket_dir=str(path.parent),
        )
    start = time.monotonic()
    said = start
    while why is not None:
        now = time.monotonic()
        if now - start >= wait_s:
            raise DaemonTimeout(
                f"no pixpool daemon started at {path.parent} within {wait_s:g} s ({why}); start one with "
                f"`pixpool serve DATA --socket-dir {path.parent}`, or wait longer (wait_s)"
            )
        if now - said >= SAY_EVERY_S:
            said = now
            log.warning("waiting for %s at %s: %s (%.0f s of %g s waited)", what, path.parent, why, now - start, wait_s)
        time.sleep(_POLL_S)  # polling interval of a bounded wait for a file only the daemon creates
        why = listening(path)
