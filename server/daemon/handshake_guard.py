"""``HandshakeGuard``: a bound on the TCP connections that have not finished their handshake.

Runs in the daemon process, inside its loop (``service.py``); the listener makes one for its
TCP ROUTER before binding it (``listener.py``).

libzmq accepts every TCP connection the moment it arrives and gives it a descriptor; a peer
that then sends nothing costs the daemon that descriptor until the handshake times out, and
ZeroMQ has no cap per peer. 1,050 such connections, no key needed, took a daemon's whole
table at the common soft limit of 1024 and its next look at the store failed (issue 26).
Two measures bound them:

- ``ZMQ_HANDSHAKE_IVL`` (``HANDSHAKE_S``, set by the listener on every ROUTER): libzmq closes
  a connection whose ZMTP greeting and CURVE handshake have not completed in that time.
- This guard: a socket monitor reports each accepted connection's descriptor. A connection
  from an address that already has ``per_peer`` connections younger than the handshake
  interval, or that would make more than ``total`` such connections from all addresses, is
  shut down at once. The guard calls ``shutdown(2)`` on libzmq's descriptor and never
  ``close``: libzmq reads the end of the stream and closes the connection itself, so no
  descriptor number is freed under libzmq's feet. An IPv6 peer counts by its /64 (one
  host's usual share).

A connection older than the handshake interval that is still open completed a CURVE
handshake with an authorized key (libzmq would have closed it otherwise): it is a
trainer's, and no longer counted. The guard cannot see the handshake end (the monitor's
``HANDSHAKE_SUCCEEDED`` carries no descriptor), so a trainer's fresh connection counts for
``HANDSHAKE_S``: up to ``per_peer`` trainers behind one address can connect at once, and a
trainer refused here is reconnected by ZeroMQ on its own (every ``RECONNECT_IVL``).

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


def pending_caps(free_descriptors: int) -> tuple[int, int]:
    """(per peer, total) caps on handshaking connections for ``free_descriptors`` free at start."""
    total = max(TOTAL_MIN, min(TOTAL_MAX, free_descriptors // 4))
    return min(PER_PEER_MAX, max(1, total // 4)), total


class HandshakeGuard:
    """Shuts down the connections to ``router`` past the caps (module docstring).
    Make it before ``router`` binds (connections accepted earlier are not reported);
    ``on_events`` when ``socket`` is readable; ``close`` before the router closes."""

    def __init__(self, ctx: zmq.Context, router: zmq.Socket, port: int, *, per_peer: int, total: int):
        self.port, self.per_peer, self.total = port, per_peer, total
        self.refused = 0  # connections shut down by this guard since start
        self._router = router
        self._young: dict[int, tuple[str, float]] = {}  # descriptor -> (peer key, accepted at)
        self._per_peer: dict[str, int] = {}  # peer key -> its connections in _young
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
        for fd in [fd for fd, (_, at) in self._young.items() if at < horizon]:
            self._forget(fd)

    def _forget(self, fd: int) -> None:
        entry = self._young.pop(fd, None)
        if entry is not None:
            left = self._per_peer[entry[0]] - 1
            if left:
                self._per_peer[entry[0]] = left
            else:
                del self._per_peer[entry[0]]

    def _admit(self, fd: int, now: float) -> None:
        self._forget(fd)  # an entry under the same number is stale: closed without an event
        with _Borrowed(fd) as sock:
            if sock is None:
                return  # already closed by libzmq (and its number reused by something else)
            try:
                if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.getsockname()[1] != self.port:
                    return
                key = _peer_key(sock.getpeername()[0])
            except OSError:
                return  # the peer is gone already
            from_peer = self._per_peer.get(key, 0)
            if from_peer < self.per_peer and len(self._young) < self.total:
                self._young[fd] = (key, now)
                self._per_peer[key] = from_peer + 1
                return
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                return
        self.refused += 1
        self._refused_since_log += 1
        self._last_refused = (key, from_peer)

    def _log(self, now: float) -> None:
        if not self._refused_since_log or now - self._logged_at < _LOG_EVERY_S:
            return
        key, from_peer = self._last_refused
        log.warning(
            "shut down %d TCP connection(s) that had not completed a handshake, over the caps of %d per address "
            "and %d in all (the last from %s, which had %d); a peer that opens connections and sends nothing, or a "
            "firewall rule (connlimit) or NetworkPolicy missing before --tcp",
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


def _peer_key(address: str) -> str:
    """An IPv4 address as it is; an IPv6 one by its /64 (an IPv4-mapped one as the IPv4)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
