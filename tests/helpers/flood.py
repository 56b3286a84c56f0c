"""Descriptor floods for the daemon tests: a daemon that cannot raise its file limit, and
idle TCP connections that never send a byte.

Runs in the pytest process (``IdleFlood``) and as a spawned daemon's target
(``run_daemon_with_nofile``). Loopback only: ``IdleFlood`` refuses any other address.
Every socket it opens is closed with linger 0 (an RST, so nothing waits in TIME_WAIT).
"""

from __future__ import annotations

import errno
import ipaddress
import resource
import selectors
import socket
import struct
import time

from pixpool.server.daemon.run import run_daemon

_LINGER_0 = struct.pack("ii", 1, 0)
# Connections are opened in waves, each waited for (bounded) before the next: a burst larger
# than the listener's accept backlog would only have its SYNs dropped and retried later (the
# first retry comes after 1 s). A wave stops waiting when none of its connections completed
# for _STALL_S; once a whole wave completes none, the listener is not accepting (at its
# cap), and the rest are opened without waiting: they stay pending in the kernel, as a real
# flood's would.
_WAVE, _WAVE_WAIT_S, _STALL_S = 50, 4.0, 1.2


def run_daemon_with_nofile(config, *, renderer=None, nofile: int = 1024) -> None:
    """``run_daemon`` in a process whose soft AND hard RLIMIT_NOFILE are ``nofile``: the
    daemon cannot raise it, as under a service manager or container runtime that sets both."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    run_daemon(config, renderer=renderer)


def raise_own_nofile(needed: int) -> bool:
    """Raise this process's soft descriptor limit to at least ``needed`` (up to its hard
    limit); False where the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return True
    if hard != resource.RLIM_INFINITY and hard < needed:
        return False
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return True


class IdleFlood:
    """Non-blocking connects to loopback addresses that send nothing; ``close`` resets them all."""

    def __init__(self):
        self.sockets: list[socket.socket] = []

    def open(self, host: str, port: int, count: int, *, source: str = "127.0.0.1") -> None:
        """``count`` connections to ``host:port`` from the loopback address ``source`` (another
        address of 127/8 than a trainer's shows that a cap per peer address spares it)."""
        for address in (host, source):
            if not ipaddress.ip_address(address).is_loopback:
                raise ValueError(f"IdleFlood uses loopback addresses only, not {address}")
        waiting = True
        for first in range(0, count, _WAVE):
            wave = []
            for _ in range(min(_WAVE, count - first)):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self.sockets.append(s)  # closed in close() whatever happens next
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
                s.bind((source, 0))
                s.setblocking(False)
                code = s.connect_ex((host, port))
                if code not in (0, errno.EINPROGRESS):
                    raise OSError(code, f"connect to {host}:{port} failed: {errno.errorcode.get(code, code)}")
                wave.append(s)
            if waiting:
                waiting = _await_connected(wave, _WAVE_WAIT_S) > 0

    def close(self) -> None:
        for s in self.sockets:
            s.close()
        self.sockets.clear()

    def __enter__(self) -> IdleFlood:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _await_connected(wave: list[socket.socket], timeout_s: float) -> int:
    """Wait until every socket of ``wave`` finished connecting (or failed), at most ``timeout_s``
    and no longer than ``_STALL_S`` without progress; how many did."""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        for s in wave:
            sel.register(s, selectors.EVENT_WRITE)
        pending = len(wave)
        while pending:
            ready = sel.select(max(0.0, min(_STALL_S, deadline - time.monotonic())))
            if not ready:
                break
            for key, _ in ready:
                sel.unregister(key.fileobj)
                pending -= 1
    return len(wave) - pending
