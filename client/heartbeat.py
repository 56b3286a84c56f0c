"""The Client's heartbeat: a background thread that tells the daemon this trainer is alive.

Runs in the trainer process, on its own thread with its own DEALER socket (made in that
thread: ZeroMQ sockets are not thread-safe), while the caller's thread trains. Each
``interval_s`` it sends ``heartbeat`` for the identity the Client holds now (none between
attaches) with the seconds spent waiting for batches since that attach (``WaitCount``), and reads the replies without
blocking: an answer for the current identity is the daemon's sign of life (``last_ack``);
``unknown_trainer`` for it means the daemon no longer knows this trainer (``lost``: a
restarted daemon, or one that swept a trainer it thought silent). The caller's thread
reads both through ``silent`` and ``answered_lately``.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import zmq

from ..shared.errors import ProtocolError
from ..shared.wire.trainer import decode, encode


class WaitCount:
    """Seconds a trainer waited for batches: in all, and since its latest attach.

    The heartbeat reports the second: the daemon divides it by how long this attachment has
    lasted (``pixpool monitor``'s wait column), and a daemon restarted mid-run knows only the
    attachment it made, so wait and time must cover that one span (the whole run's wait over
    a new daemon's minutes read 253 %)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._at_attach_s = 0.0

    def add(self, seconds: float) -> None:
        self.total_s += seconds

    def attached(self) -> None:
        """A new attachment starts: its count starts at zero."""
        self._at_attach_s = self.total_s

    def since_attach_s(self) -> float:
        return self.total_s - self._at_attach_s


class Heartbeat:
    def __init__(
        self,
        make_socket: Callable[[], zmq.Socket],
        *,
        interval_s: float,
        identity: Callable[[], tuple[int, int] | None],
        data_wait_s: Callable[[], float],
    ):
        self.interval_s = interval_s
        self._make_socket = make_socket
        self._identity = identity
        self._data_wait_s = data_wait_s
        self.last_ack = time.monotonic()
        self.lost: tuple[int, int] | None = None  # the identity the daemon said it does not know
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pixpool-heartbeat", daemon=True)
        # Replies, by op: the daemon's answer, or its word that it does not know the trainer.
        self._replies = {"heartbeat": self._on_answer, "error": self._on_error}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def reset(self) -> None:
        """A new attach: its identity has just been answered."""
        self.last_ack = time.monotonic()

    def silent(self) -> bool:
        """No answer for ten intervals (at least 10 s): the daemon is taken for gone."""
        return time.monotonic() - self.last_ack > max(10.0, 10 * self.interval_s)

    def answered_lately(self) -> bool:
        """An answer within three intervals (at least 2 s): the daemon's loop runs."""
        return time.monotonic() - self.last_ack < max(2.0, 3 * self.interval_s)

    def _loop(self) -> None:
        s = self._make_socket()
        try:
            while not self._stop.wait(self.interval_s):
                ident = self._identity()
                if ident is None:
                    continue
                try:
                    s.send(
                        encode("heartbeat", trainer_id=ident[0], token=ident[1], data_wait_s=self._data_wait_s()),
                        zmq.NOBLOCK,
                    )
                except zmq.Again:
                    pass
                while s.poll(0):
                    try:
                        msg = decode(s.recv(), reply=True)
                    except ProtocolError:
                        continue
                    handler = self._replies.get(msg["op"])
                    if handler is not None:
                        handler(msg, ident)
        finally:
            s.close(linger=0)

    def _on_answer(self, msg: dict, sent_for: tuple[int, int]) -> None:
        current = self._identity()
        if current is not None and msg["trainer_id"] == current[0]:
            self.last_ack = time.monotonic()

    def _on_error(self, msg: dict, sent_for: tuple[int, int]) -> None:
        if msg.get("code") == "unknown_trainer" and msg.get("trainer_id") == sent_for[0]:
            self.lost = sent_for
