"""How a finished batch reaches its trainer: the daemon's side of delivery, in one place.

Runs in the daemon process. Every announced batch is a ``ready`` message. A local trainer
(``DELIVERY_SHM``) reads the slot in place, so the message is all it gets; a remote one
(``DELIVERY_FRAMES``) gets the slot's images, targets and samples as three more frames,
sent zero-copy from the ring, and a segment ring's mask planes as a fourth. Either way the
trainer releases the slot with ``release``, so credit-based backpressure is the same. The
trainer's side is ``pixpool.client.delivery``.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from ...shared.wire.trainer import DELIVERY_FRAMES, Op, encode_reply
from .scheduler import Announcement
from .sessions import TrainerSession

log = logging.getLogger(__name__)


def send(sock: zmq.Socket, identity: bytes, frame: bytes, *extra: Any) -> None:
    """One reply to one peer; never blocks and never raises for a peer that is gone."""
    try:
        sock.send_multipart([identity, frame, *extra], zmq.NOBLOCK, copy=not extra)
    except zmq.ZMQError as exc:  # peer gone or its queue full: it will time out or re-sync
        log.debug("dropping reply to %r: %s", identity, exc)


def announce(t: TrainerSession, a: Announcement) -> None:
    frame = encode_reply(
        Op.READY,
        trainer_id=a.trainer_id,
        slot=a.slot,
        epoch=a.epoch,
        batch=a.batch,
        generation=a.generation,
        size=a.size,
        n_targets=a.n_targets,
    )
    if t.delivery == DELIVERY_FRAMES:
        r = t.ring
        frames = [r.images(a.slot, a.size).data, r.targets(a.slot, a.n_targets).data, r.samples(a.slot, a.size).data]
        if r.layout.has_masks:
            frames.append(r.masks(a.slot, a.size).data)
        send(t.sock, t.identity, frame, *frames)
    else:
        send(t.sock, t.identity, frame)


def tell(t: TrainerSession, frame: bytes) -> None:
    """A control message (error, stopped) to the trainer's last known address."""
    send(t.sock, t.identity, frame)
