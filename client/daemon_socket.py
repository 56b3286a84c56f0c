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

A daemon that is starting (it has not bound yet: it is reading its dataset or preparing its
snapshot) says so from its first moment with a lock in the socket directory
(``shared.transport.starting``); a trainer that finds that lock held waits for the daemon to
bind, up to ``STARTING_WAIT_S`` (or ``wait_s`` where that is longer), and stops waiting as
soon as the lock goes (the daemon died or failed). A trainer started in the same instant as
its daemon may look before the daemon's process has taken the lock, so where neither a
socket nor a mark is there it looks again for ``START_GRACE_S`` before it gives up.

Where no daemon is there nor starting, the first two are a ``DaemonNotFound`` naming the
directory and the command that starts a daemon there. With ``wait_s`` the trainer waits up
to that long for any daemon to bind. A waiting trainer says every ``SAY_EVERY_S`` seconds
where it waits and for how long.
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
from ..shared.transport.starting import is_starting

log = logging.getLogger(__name__)

SAY_EVERY_S = 5.0  # how often a waiting trainer says it still waits
_POLL_S = 0.1  # how often it looks again (a bounded wait; the file appears when the daemon binds)
# How long a trainer waits, by default, for a daemon that says it is starting: a snapshot of a
# few thousand images is prepared well within it; a larger set needs ``wait_s``.
STARTING_WAIT_S = 120.0
# How long a trainer that finds nothing looks again before it gives up: covers a daemon
# started in the same instant whose process has not yet taken its starting lock.
START_GRACE_S = 1.0


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


def await_daemon(
    endpoint: str,
    *,
    wait_s: float = 0.0,
    starting_wait_s: float = STARTING_WAIT_S,
    what: str = "a pixpool daemon",
) -> None:
    """Return once a daemon listens at ``endpoint`` (at once over TCP). Where none listens:
    wait up to ``max(wait_s, starting_wait_s)`` while a daemon there says it is starting, up
    to ``wait_s`` else; ``DaemonNotFound`` (after ``START_GRACE_S``) where ``wait_s`` is 0 and
    no daemon is starting, ``DaemonTimeout`` once the wait is over."""
    path = ipc_path(endpoint)
    if path is None:
        return
    why = listening(path)
    if why is None:
        return
    start = time.monotonic()
    said = start
    was_starting = False
    while why is not None:
        now = time.monotonic()
        starting = is_starting(path.parent)
        if starting:
            why = f"a daemon is starting there (reading its dataset or preparing its snapshot); {why}"
        elif was_starting:
            why = f"the daemon that was starting there stopped before it listened (see its output); {why}"
        was_starting = was_starting or starting
        limit_s = max(wait_s, starting_wait_s) if starting else wait_s
        if limit_s <= 0 and (was_starting or now - start >= START_GRACE_S):
            raise DaemonNotFound(
                f"no pixpool daemon at {path.parent}: {why}. Start one with `pixpool serve DATA --socket-dir "
                f"{path.parent}` (or pass the socket directory a daemon serves); to wait for a daemon that is still "
                "starting, pass wait_s=SECONDS (`pixpool train --wait-s SECONDS`)",
                socket_dir=str(path.parent),
            )
        if limit_s > 0 and now - start >= limit_s:
            longer = "wait longer (wait_s, `--wait-s`)" if starting else "or wait longer (wait_s)"
            raise DaemonTimeout(
                f"no pixpool daemon started at {path.parent} within {limit_s:g} s ({why}); "
                + (longer if starting else f"start one with `pixpool serve DATA --socket-dir {path.parent}`, {longer}")
            )
        if limit_s > 0 and now - said >= SAY_EVERY_S:
            said = now
            log.warning(
                "waiting for %s at %s: %s (%.0f s of %g s waited)", what, path.parent, why, now - start, limit_s
            )
        time.sleep(_POLL_S)  # polling interval of a bounded wait for a file only the daemon creates
        why = listening(path)
