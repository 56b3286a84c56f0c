"""``HandshakeGuard``: a bound on the TCP connections that have not finished their handshake.

Runs in the daemon process, inside its loop (``service.py``); the listener makes one for its
TCP ROUTER before binding it (``listener.py``).

libzmq accepts every TCP connection the moment it arrives and gives it a descriptor; a peer
that then sends nothing costs the daemon that descriptor until the handshake times out, and
ZeroMQ has no cap per peer. 1,050 such connections, no key needed, took a daemon's whole
table at the common soft limit of 1024 and its next look at the store failed.
Two measures bound them:

- ``ZMQ_HANDSHAKE_IVL`` (``HANDSHAKE_S``, set by the listener on every ROUTER): libzmq closes
  a connection whose ZMTP greeting and CURVE handshake have not completed in that time.
- This guard: a socket monitor reports each accepted connection's descriptor. At most
  ``per_peer`` connections from one address and ``total`` from all may be unfinished at once.
  A new connection past either cap is kept, and room is made for it by shutting down the
  OLDEST unfinished one: its own address's oldest where it has any, else the oldest of all.
  Refusing the newest instead let a flood that keeps every slot taken (32 idle connections
  from each of 40 addresses, opened again as each is closed) lock every authorized trainer
  out; now a trainer's connection gets in, and finishes its handshake (milliseconds) long
  before the flood, which displaces its own address's connections first, reaches it. The
  guard calls ``shutdown(2)`` on libzmq's descriptor and never ``close``: libzmq reads the
  end of the stream and closes the connection itself, so no descriptor number is freed
  under libzmq's feet. An IPv6 peer counts by its /64 (one host's usual share).

A connection that completed a CURVE handshake is a trainer's and is never shut down here.
The monitor's ``HANDSHAKE_SUCCEEDED`` carries no descriptor, so the guard reads it from the
kernel when a connection is about to be shut down: the server has sent READY, which libzmq
sends only once the ZAP handler admitted the key, when the peer acknowledged more bytes
than the greeting and WELCOME together (``TCP_INFO``'s ``bytes_acked``, not retransmissions;
an unauthorized peer gets at most those plus an ERROR, and then libzmq closes it). Such a
connection is forgotten instead, as is one older than the handshake interval that is still
open (libzmq would have closed it otherwise). Where the kernel gives no ``bytes_acked``
(Linux before 4.1) every young connection counts as unfinished, and a trainer's connection
shut down here is reconnected by ZeroMQ on its own (every ``RECONNECT_IVL``).

Limits, honestly: the accept itself happens in libzmq's I/O thread before the guard hears of
it, so a burst faster than this loop can read events can still fill the table for a moment
(libzmq retries its accept, the housekeeping retries its step; nothing stops). Events are
read in order and acted on only for descriptors whose last event is ``ACCEPTED``, and the
descriptor is checked (a TCP socket on this listener's port, whose peer is read there and
then) right before ``shutdown``; the race left is libzmq closing it and accepting another
connection into the same number within those microseconds, whose cost is that connection
being reconnected. Bounding connections per address before they reach the host (a
firewall's ``connlimit``, a Kubernetes NetworkPolicy) remains the stronger measure, and
``docs/reliability.md`` says so.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import stat
import struct
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

__all__ = ["HANDSHAKE_S", "HandshakeGuard", "pending_caps"]

log = logging.getLogger(__name__)

# libzmq's default handshake interval is 30 s; a CURVE handshake is two round trips plus
# one ZAP look-up in this process, well under a second even across a continent.
HANDSHAKE_S = 5.0
# Caps on connections younger than HANDSHAKE_S: per peer address, and for all together at
# most a quarter of the descriptors the daemon had free at start (the rest stay for its own
# files, workers, trainers and scrapes), within these bounds.
PER_PEER_MAX, TOTAL_MIN, TOTAL_MAX = 32, 16, 1024
# Monitor events read per call, so that a flood of events does not starve the loop.
_EVENTS_PER_CALL = 4096
_LOG_EVERY_S = 30.0
# What a CURVE server sends before READY: the ZMTP 3 greeting (64 bytes) and the WELCOME
# command (2 + 168). More acknowledged than this means READY went out: the handshake succeeded.
_BEFORE_READY_BYTES = 64 + 170
# struct tcp_info (linux/tcp.h): the u64 tcpi_bytes_acked, there since Linux 4.1.
_TCP_INFO_BYTES, _BYTES_ACKED_AT = 256, 120


def pending_caps(free_descriptors: int) -> tuple[int, int]:
    """(per peer, total) caps on handshaking connections for ``free_descriptors`` free at start."""
    total = max(TOTAL_MIN, min(TOTAL_MAX, free_descriptors // 4))
    return min(PER_PEER_MAX, max(1, total // 4)), total


class HandshakeGuard:
    """Keeps the unfinished connections to ``router`` within the caps (module docstring).
    Make it before ``router`` binds (connections accepted earlier are not reported);
    ``on_events`` when ``socket`` is readable; ``close`` before the router closes."""

    def __init__(self, ctx: zmq.Context, router: zmq.Socket, port: int, *, per_peer: int, total: int):
        self.port, self.per_peer, self.total = port, per_peer, total
        self.refused = 0  # connections shut down by this guard since start
        self._router = router
        # descriptor -> (peer key, peer address, accepted at), oldest first
        self._young: dict[int, tuple[str, tuple, float]] = {}
        self._by_peer: dict[str, dict[int, None]] = {}  # peer key -> its descriptors in _young, oldest first
        self._refused_since_log = 0
        self._last_refused = ("", 0)
        self._logged_at = -_LOG_EVERY_S
        address = f"inproc://pixpool-handshake-guard-{id(self):x}"
        router.monitor(address, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self.socket = ctx.socket(zmq.PAIR)
        self.socket.setsockopt(zmq.LINGER, 0)
        # No high-water mark on the events: libzmq drops monitor events silently past it, and
        # a dropped ACCEPTED would be a connection this guard never counts.
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.connect(address)
        log.info(
            "TCP connections in their handshake: at most %d per address and %d in all, each closed after %.0f s",
            per_peer, total, HANDSHAKE_S,
        )  # fmt: skip

    def close(self) -> None:
        try:
            self._router.disable_monitor()
        except zmq.ZMQError:
            pass
        self.socket.close(linger=0)

    @property
    def pending(self) -> int:
        return len(self._young)

    def on_events(self) -> None:
        """Read the monitor's events; shut down what the new connections put past a cap."""
        latest: dict[int, bool] = {}  # descriptor -> its last event was ACCEPTED
        for _ in range(_EVENTS_PER_CALL):
            try:
                event = recv_monitor_message(self.socket, zmq.NOBLOCK)
            except zmq.Again:
                break
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                latest[fd] = True
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                latest[fd] = False
                self._forget(fd)
        now = time.monotonic()
        self.prune(now)
        for fd, accepted in latest.items():
            if accepted:
                self._admit(fd, now)
        self._log(now)

    def prune(self, now: float) -> None:
        """Forget connections older than the handshake interval: handshaked, or closed by libzmq."""
        horizon = now - HANDSHAKE_S - 1.0
        while self._young:
            fd, (_, _, at) = next(iter(self._young.items()))  # the oldest: entries are kept in accept order
            if at >= horizon:
                return
            self._forget(fd)

    def _forget(self, fd: int) -> None:
        entry = self._young.pop(fd, None)
        if entry is not None:
            mine = self._by_peer[entry[0]]
            del mine[fd]
            if not mine:
                del self._by_peer[entry[0]]

    def _admit(self, fd: int, now: float) -> None:
        self._forget(fd)  # an entry under the same number is stale: closed without an event
        with _Borrowed(fd) as sock:
            if sock is None:
                return  # already closed by libzmq (and its number reused by something else)
            peer = self._peer_of(sock)
            if peer is None:
                return
            key = _peer_key(peer[0])
            # Past a cap the newcomer stays and the oldest unfinished connection makes room
            # (module docstring); each step forgets one entry, so this ends.
            while len(self._by_peer.get(key, ())) >= self.per_peer or len(self._young) >= self.total:
                self._make_room(key)
            self._young[fd] = (key, peer, now)
            self._by_peer.setdefault(key, {})[fd] = None

    def _make_room(self, key: str) -> None:
        """Forget the oldest connection from ``key`` (from anyone where ``key`` has none) and
        shut it down unless it is gone already or finished its handshake."""
        fd = next(iter(self._by_peer.get(key) or self._young))
        victim_key, peer, _ = self._young[fd]
        from_peer = len(self._by_peer[victim_key])
        self._forget(fd)
        with _Borrowed(fd) as sock:
            # The same connection still (not a number libzmq closed and reused), unfinished.
            if sock is None or self._peer_of(sock) != peer or _handshake_done(sock):
                return
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                return
        self.refused += 1
        self._refused_since_log += 1
        self._last_refused = (victim_key, from_peer)

    def _peer_of(self, sock: socket.socket) -> tuple | None:
        """(address, port) of the peer of ``sock``, a TCP connection to this listener's port; None
        for anything else, or where the peer is gone already."""
        try:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.getsockname()[1] != self.port:
                return None
            return sock.getpeername()[:2]
        except OSError:
            return None

    def _log(self, now: float) -> None:
        if not self._refused_since_log or now - self._logged_at < _LOG_EVERY_S:
            return
        key, from_peer = self._last_refused
        log.warning(
            "shut down %d TCP connection(s) that had not completed a handshake, the oldest, to make room for newer "
            "ones over the caps of %d per address and %d in all (the last from %s, which had %d); a peer that opens "
            "connections and sends nothing, or a firewall rule (connlimit) or NetworkPolicy missing before --tcp",
            self._refused_since_log, self.per_peer, self.total, key, from_peer,
        )  # fmt: skip
        self._refused_since_log, self._logged_at = 0, now


class _Borrowed:
    """The socket behind libzmq's descriptor ``fd`` as a ``socket.socket`` for the duration of
    a ``with``, detached (never closed) at its end; None where ``fd`` is no socket now."""

    def __init__(self, fd: int):
        self._fd = fd
        self._sock: socket.socket | None = None

    def __enter__(self) -> socket.socket | None:
        try:
            if not stat.S_ISSOCK(os.fstat(self._fd).st_mode):
                return None
            self._sock = socket.socket(fileno=self._fd)
        except OSError:
            return None
        return self._sock

    def __exit__(self, *exc: object) -> None:
        if self._sock is not None:
            self._sock.detach()  # the descriptor stays libzmq's


def _handshake_done(sock: socket.socket) -> bool:
    """True when the server has sent READY on ``sock`` and the peer acknowledged it (module
    docstring); False where the kernel does not say."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
    except (OSError, AttributeError):  # AttributeError: no TCP_INFO on this platform
        return False
    if len(info) < _BYTES_ACKED_AT + 8:
        return False
    return struct.unpack_from("=Q", info, _BYTES_ACKED_AT)[0] > _BEFORE_READY_BYTES


def _peer_key(address: str) -> str:
    """An IPv4 address as it is; an IPv6 one by its /64 (an IPv4-mapped one as the IPv4)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
