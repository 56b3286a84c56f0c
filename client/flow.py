"""The batches of one attachment, in order: ``start``, wait for each ``ready``, ``release`` it.

Runs in the trainer process, on the Client's main socket. Backpressure is by credit: the
daemon renders into the trainer's free ring slots only, so a batch the trainer holds is a
slot the daemon cannot fill; the batch being read is ``held`` and released when the next
one is asked for (or the iteration ends). A release names the batch it gives back (slot,
epoch, batch, generation), so a late one can never free a slot announced again since.

A ``Flow`` lives as long as one attachment: a reattach starts a new one (nothing held).
"""

from __future__ import annotations

import time
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
