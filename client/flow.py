"""The batches of one attachment, in order: ``start``, wait for each ``ready``, ``release`` it.

Runs in the trainer process, on the Client's main socket. Backpressure is by credit: the
daemon renders into the trainer's free ring slots only, so a batch the trainer holds is a
slot the daemon cannot fill; the batch being read is ``held`` and released when the next
one is asked for (or the iteration ends). A release names the batch it gives back (slot,
epoch, batch, generation), so a late one can never free a slot announced again since.

A ``Flow`` lives as long as one attachment: a reattach starts a new one (nothing held).

Lent slots: a batch the caller owns (``attach()``'s default) is either a copy, whose slot is
released at once, or a *lent* slot: its images tensor wraps the slot itself (no copy of
~20 MB per batch at 640), and the slot is released only once that tensor and every tensor
or array derived from it are gone (a ``weakref.finalize`` on the wrapped array, which
torch's storage keeps alive). The finalizer may run in any thread, so it only queues the
batch; the caller's thread sends the release at its next request (``release_returned``). The
Client lends while fewer than the ring's slots less one are out (``lent``), so the workers
always have a slot to render into; past that a batch is copied. In a ``for batch in loader`` loop
the previous batch is still bound while the next one is handed out, so two slots are out
then, and each is released one batch later than a copy's would be.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from typing import Any

from ..shared.errors import ProtocolError
from .connection import KEEP_WAITING, Connection, Peer


class Flow:
    def __init__(self, conn: Connection, ident: tuple[int, int], *, peer: Peer, timeout_s: float):
        self.conn = conn
        self.ident = ident
        self.peer = peer
        self.timeout_s = timeout_s
        self.held: dict | None = None  # the ``ready`` message of the batch being read
        self.lent = 0  # slots lent to the caller and not yet released
        # ``ready`` messages of lent batches the caller has let go of (appended by finalizers,
        # in any thread; deque appends and pops are atomic).
        self._returned: deque[dict] = deque()

    def lend(self, array: Any, ready: dict) -> None:
        """The batch ``ready`` announced is handed out as a tensor over ``array`` (a view of its
        slot): release the slot once ``array`` is freed."""
        self.lent += 1
        weakref.finalize(array, self._returned.append, ready)

    def release_returned(self) -> None:
        """Release every lent slot whose batch the caller has let go of since the last call."""
        while self._returned:
            self.release(self._returned.popleft())
            self.lent -= 1

    def send(self, op: str, **fields: Any) -> None:
        tid, token = self.ident
        self.conn.send(op, trainer_id=tid, token=token, **fields)

    def release(self, ready: dict) -> None:
        """Give back the batch a ``ready`` announced, naming it (not only its slot)."""
        self.send(
            "release", slot=ready["slot"], epoch=ready["epoch"], batch=ready["batch"], generation=ready["generation"]
        )

    def release_held(self) -> None:
        if self.held is not None:
            msg, self.held = self.held, None
            self.release(msg)

    def start(self, epoch: int, batch: int) -> int:
        """Ask for ``epoch`` from ``batch`` on; the epoch's number of batches."""
        self.release_held()
        self.release_returned()
        self.send("start", epoch=epoch, batch=batch)
        mine = self.ident[0]

        def started(msg: dict, frames: list):
            return msg["num_batches"] if msg["epoch"] == epoch and msg["trainer_id"] == mine else KEEP_WAITING

        def early(msg: dict, frames: list):
            if msg["trainer_id"] == mine:
                self.release(msg)  # from before this start: give it back
            return KEEP_WAITING

        deadline = time.monotonic() + self.timeout_s
        return self.conn.wait(
            {"started": started, "ready": early}, deadline=deadline, what="reply to start", peer=self.peer
        )

    def next_ready(self, epoch: int, batch: int) -> tuple[dict, list]:
        """The ``ready`` message (and data frames) of ``batch`` of ``epoch``; another one
        announced meanwhile (from before a start) is given back."""
        mine = self.ident[0]

        def ready(msg: dict, frames: list):
            if msg["trainer_id"] != mine:
                return KEEP_WAITING
            if (msg["epoch"], msg["batch"]) == (epoch, batch):
                return msg, frames
            self.release(msg)
            if msg["epoch"] == epoch and msg["batch"] > batch:
                raise ProtocolError(
                    f"daemon announced batch {msg['batch']} while batch {batch} of epoch {epoch} was due"
                )
            return KEEP_WAITING

        deadline = time.monotonic() + self.timeout_s
        return self.conn.wait(
            {"ready": ready}, deadline=deadline, what=f"batch {batch} of epoch {epoch}", peer=self.peer, patient=True
        )
