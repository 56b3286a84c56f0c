"""Lent slots (``client/flow.py``): a slot lent with a batch goes back to the daemon only once
nothing over its array is left, from whichever thread lets go, and only at the caller's next request."""

from __future__ import annotations

import threading

import numpy as np
import torch

from pixpool.client.flow import Flow


class _Conn:
    def __init__(self):
        self.sent = []

    def send(self, op, **fields):
        self.sent.append((op, fields))


def _ready(slot: int, batch: int) -> dict:
    return {"slot": slot, "epoch": 0, "batch": batch, "generation": 1}


def _flow() -> tuple[Flow, _Conn]:
    conn = _Conn()
    return Flow(conn, (7, 99), peer=None, timeout_s=1.0), conn


def test_a_lent_slot_is_released_once_no_view_is_left_and_only_at_the_next_request():
    flow, conn = _flow()
    ring = np.zeros(64, np.uint8)
    view = ring[16:32].reshape(4, 4)
    flow.lend(view, _ready(1, 5))
    image = torch.from_numpy(view)  # what the Client hands out: the tensor's storage keeps view alive
    row = image[0]  # a tensor derived from it shares that storage
    del view
    flow.release_returned()
    assert conn.sent == [] and flow.lent == 1
    del image
    flow.release_returned()
    assert conn.sent == [] and flow.lent == 1, "a derived tensor still wraps the slot"
    del row
    assert conn.sent == [], "a let-go batch is queued, never sent from the finalizer"
    flow.release_returned()
    assert conn.sent == [
        ("release", {"trainer_id": 7, "token": 99, "slot": 1, "epoch": 0, "batch": 5, "generation": 1})
    ]
    assert flow.lent == 0


def test_a_slot_let_go_in_another_thread_is_released_by_the_callers_thread():
    flow, conn = _flow()
    holder = {"a": np.zeros((2, 2), np.uint8)}
    flow.lend(holder["a"], _ready(2, 6))
    t = threading.Thread(target=holder.clear)
    t.start()
    t.join(10.0)
    assert conn.sent == []
    flow.release_returned()
    assert [f["slot"] for _, f in conn.sent] == [2] and flow.lent == 0
