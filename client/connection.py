"""The Client's main socket: one DEALER to the daemon, used only in the caller's thread.

Runs in the trainer process. ZeroMQ sockets are not thread-safe, so this socket carries
every request of the caller's thread (attach, prove, records, start, release, detach) and
the heartbeat thread has its own (``heartbeat.py``); both are made by ``Connection.socket``
(over TCP with the CURVE keys, the main one watched by ``AuthWatch``).

``wait`` receives replies until one answers what the caller asked. Replies are dispatched
through tables keyed by the protocol's op strings (``shared/wire/trainer.py``): two
replies mean the same whatever was asked (``stopped`` ends the stream, ``error`` raises the
daemon's error class, or ``Lost`` where the daemon no longer knows this trainer); the
caller's table names the replies it waits for, each handler returning the answer or
``KEEP_WAITING``; any other reply is a stale one (from before a reattach) and is skipped.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Protocol

import zmq

from ..shared.errors import DaemonStopped, DaemonTimeout
from ..shared.transport import endpoint as ep
from ..shared.wire.error_codes import error_from
from ..shared.wire.trainer import decode, encode
from .auth_watch import AuthWatch

log = logging.getLogger(__name__)

_STEP_MS = 100
SAY_EVERY_S = 5.0  # how often a trainer waiting for its attach reply says so

KEEP_WAITING = object()  # a handler's answer: not the reply the caller waits for
Handler = Callable[[dict, list], Any]


class Lost(Exception):
    """The daemon this client was attached to is gone; attach again."""


class Peer(Protocol):
    """What ``wait`` asks the Client about the daemon it is attached to."""

    @property
    def ident(self) -> tuple[int, int] | None: ...

    def daemon_gone(self) -> bool: ...

    def daemon_answers(self) -> bool: ...


def _stopped(msg: dict, frames: list, peer: Peer) -> Any:
    raise DaemonStopped(f"daemon stopped: {msg['reason']}")


def _error(msg: dict, frames: list, peer: Peer) -> Any:
    if msg.get("code") == "unknown_trainer":
        ident = peer.ident
        if ident is not None and msg.get("trainer_id") == ident[0]:
            raise Lost()
        return KEEP_WAITING  # about an identity this client no longer uses
    raise error_from(msg)  # the daemon's error class and message


# Replies that mean the same whatever the caller waits for.
_ALWAYS: dict[str, Callable[[dict, list, Peer], Any]] = {"stopped": _stopped, "error": _error}


class Connection:
    def __init__(self, ctx: zmq.Context, endpoint: str, *, remote: bool, keys_dir, timeout_s: float):
        self.endpoint = endpoint
        self.remote = remote
        self.keys_dir = keys_dir
        self.timeout_s = timeout_s
        self._ctx = ctx
        self.sock: zmq.Socket | None = None
        self._auth_watch: AuthWatch | None = None  # over TCP: says at once when the daemon refuses the key

    def socket(self, *, watch: bool = False) -> zmq.Socket:
        """A new DEALER connected to the daemon (the caller's thread owns it)."""
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if self.remote:
            ep.configure_client(s, self.keys_dir)
            if watch:
                self._auth_watch = AuthWatch(s, self.endpoint, self.keys_dir)
        s.connect(self.endpoint)
        return s

    def open(self) -> None:
        """A fresh main socket (a reattach must not read the dead daemon's queued replies)."""
        self.close()
        self.sock = self.socket(watch=True)

    @property
    def usable(self) -> bool:
        return self.sock is not None and not self.sock.closed

    def send(self, op: str, **fields: Any) -> None:
        self.sock.send(encode(op, **fields))

    def wait(
        self, handlers: dict[str, Handler], *, deadline: float, what: str, peer: Peer, patient: bool = False
    ) -> Any:
        """The first answer of ``handlers`` (op -> handler) to the replies that come; raises
        ``Lost``, ``DaemonStopped``, the daemon's error, ``DaemonTimeout``.

        ``patient`` (waiting for a batch): past the deadline, keep waiting while the daemon
        answers heartbeats; a batch can be slow where a control reply never is."""
        start = said = time.monotonic()
        while True:
            if self.sock.poll(_STEP_MS):
                frames = self.sock.recv_multipart(copy=False)
                msg = decode(frames[0].bytes, reply=True)
                always = _ALWAYS.get(msg["op"])
                if always is not None:
                    answer = always(msg, frames[1:], peer)
                else:
                    handler = handlers.get(msg["op"])
                    answer = handler(msg, frames[1:]) if handler is not None else KEEP_WAITING
                if answer is not KEEP_WAITING:
                    return answer
                continue
            if self._auth_watch is not None:
                self._auth_watch.check()
            if peer.ident is not None and peer.daemon_gone():
                if self.sock.poll(_STEP_MS):
                    continue  # its last word (``stopped``) may still be on its way: read it first
                raise Lost()
            now = time.monotonic()
            if now > deadline and patient and peer.daemon_answers():
                log.warning(
                    "no %s from the pixpool daemon at %s within %.1f s, but it answers heartbeats: "
                    "it is slow, not gone; waiting on",
                    what,
                    self.endpoint,
                    self.timeout_s,
                )
                deadline = now + self.timeout_s
            elif now > deadline:
                raise DaemonTimeout(
                    f"no {what} from a pixpool daemon at {self.endpoint} within {self.timeout_s} s; "
                    "start one with `pixpool serve DATA` (or check `pixpool status`)"
                )
            elif peer.ident is None and now - said >= SAY_EVERY_S:
                said = now
                log.warning(
                    "waiting for the %s from the pixpool daemon at %s (%.0f s of %g s): it listens but has not "
                    "answered yet",
                    what,
                    self.endpoint,
                    now - start,
                    self.timeout_s,
                )

    def close(self) -> None:
        if self._auth_watch is not None:
            self._auth_watch.close()
            self._auth_watch = None
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
