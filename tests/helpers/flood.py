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


class HeldFlood:
    """Idle connections from many loopback addresses, each opened again the moment the server
    ends it, until ``close``: a flood kept up the way an attacker keeps one up.

    A thread of this process watches every socket; what the server sends (a ZMTP greeting)
    is read and dropped, and a socket the server ends (EOF or reset) is closed and replaced
    by a new connection from the same source address."""

    def __init__(self, host: str, port: int, sources: list[str], per_source: int):
        for address in (host, *sources):
            if not ipaddress.ip_address(address).is_loopback:
                raise ValueError(f"HeldFlood uses loopback addresses only, not {address}")
        self.host, self.port, self.sources, self.per_source = host, port, list(sources), per_source
        self.reopened = 0  # connections the server ended and this flood opened again
        self.failed = 0  # connects that failed at once (then that connection is not replaced)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = False
        self._thread = None

    def start(self) -> HeldFlood:
        import threading

        # In waves, as IdleFlood opens: a burst past the accept backlog would only have its
        # SYNs dropped and retried seconds later, and a slow machine would then never hold
        # the cap (libzmq closes each idle connection after its handshake interval).
        waiting = True
        for source in self.sources:
            wave = [self._open(source) for _ in range(self.per_source)]
            if waiting:
                waiting = _await_connected(wave, _WAVE_WAIT_S) > 0
        self._thread = threading.Thread(target=self._hold, name="held-flood", daemon=True)
        self._thread.start()
        return self

    @property
    def open_count(self) -> int:
        return len(self._sel.get_map()) - 1

    def _open(self, source: str) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
            s.bind((source, 0))
            s.setblocking(False)
            code = s.connect_ex((self.host, self.port))
            if code not in (0, errno.EINPROGRESS):
                raise OSError(code, f"connect to {self.host}:{self.port} failed: {errno.errorcode.get(code, code)}")
            self._sel.register(s, selectors.EVENT_READ, source)
        except BaseException:
            s.close()
            raise
        return s

    def _hold(self) -> None:
        while not self._stopping:
            for key, _ in self._sel.select(1.0):
                if key.fileobj is self._wake_r:
                    continue
                s = key.fileobj
                try:
                    if s.recv(4096):
                        continue  # the server's greeting: the connection stays, silent
                except BlockingIOError:
                    continue
                except OSError:
                    pass  # reset: ended, as by EOF
                self._sel.unregister(s)
                s.close()
                if self._stopping:
                    continue
                try:
                    self._open(key.data)
                    self.reopened += 1
                except OSError:
                    self.failed += 1

    def close(self) -> None:
        self._stopping = True
        self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(10.0)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()
        self._sel.close()
        self._wake_w.close()

    def __enter__(self) -> HeldFlood:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
