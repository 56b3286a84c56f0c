"""Where a trainer finds an announced batch's bytes: the trainer's side of delivery, in one place.

Runs in the trainer process, inside ``Client``. The daemon's side is
``pixpool.server.daemon.delivery``; the choice is made once per attach, by proof
(``prove``): the trainer maps the ring it was given through the daemon's store path (or the
path this process sees that store under), reads the nonce in its header (``map_ring``) and
sends it back; the daemon answers which delivery it gets (``shared/wire/trainer.py``,
``prove``):

- ``SlotReader`` (``DELIVERY_SHM``): the trainer maps its ring (read-write, as the
  daemon created it) and reads each slot in place, after checking that the slot header
  says what the ``ready`` message announced;
- ``FrameReader`` (``DELIVERY_FRAMES``: TCP, or a trainer that cannot map the store): the
  three frames after ``ready`` are the slot's images, targets and samples, wrapped
  without a copy, and a fourth its mask planes where the layout has masks (segment).

Either way the arrays are views: valid until the slot is released. ``arrays`` gives
(images, targets (n, ``target_width``), samples, masks (B, M, M) or None).
"""

from __future__ import annotations

import logging

import numpy as np

from ..shared.errors import PixpoolError, ProtocolError
from ..shared.transport.ring import Ring, RingLayout
from ..shared.transport.store import Store
from ..shared.wire.trainer import DELIVERY_FRAMES, DELIVERY_SHM
from .connection import KEEP_WAITING, Connection, Peer

log = logging.getLogger(__name__)


class SlotReader:
    delivery = DELIVERY_SHM

    def __init__(self, ring: Ring, layout: RingLayout):
        self.layout = layout
        self.ring: Ring | None = ring

    def arrays(self, msg: dict, frames: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        size, n_t, slot = msg["size"], msg["n_targets"], msg["slot"]
        header = self.ring.read_header(slot)
        announced = (msg["epoch"], msg["batch"], size, n_t, msg["generation"])
        if header != announced:
            raise ProtocolError(
                f"slot {slot} holds epoch/batch/size/targets/generation {header}, announced {announced}"
            )
        ring = self.ring
        return ring.images(slot, size), ring.targets(slot, n_t), ring.samples(slot, size), ring.masks(slot, size)

    def close(self) -> None:
        """Let go of the ring; as the last one out of a dead daemon's ring (a trainer moving
        on to a new daemon), remove it (``Ring.leave``)."""
        if self.ring is not None:
            ring, self.ring = self.ring, None
            ring.leave()


class FrameReader:
    delivery = DELIVERY_FRAMES
    ring = None

    def __init__(self, layout: RingLayout):
        self.layout = layout

    def arrays(self, msg: dict, frames: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        lay = self.layout
        size, n_t, s = msg["size"], msg["n_targets"], lay.imgsz
        want = 4 if lay.has_masks else 3
        if len(frames) != want:
            what = "images, targets, samples" + (", masks" if lay.has_masks else "")
            raise ProtocolError(f"a batch as frames needs {want} data frames after 'ready' ({what}), got {len(frames)}")
        expected = [size * 3 * s * s, n_t * lay.row_nbytes, size * 8]
        if lay.has_masks:
            expected.append(size * lay.mask_side * lay.mask_side * lay.mask_itemsize)
        got = [len(f.buffer) for f in frames]
        if got != expected:
            raise ProtocolError(
                f"the data frames of batch {msg['batch']} have {got} bytes, its layout and 'ready' say {expected} "
                f"({size} samples, {n_t} target rows of {lay.target_width} columns)"
            )
        images = np.frombuffer(frames[0].buffer, np.uint8).reshape(size, 3, s, s)
        targets = np.frombuffer(frames[1].buffer, np.float32).reshape(n_t, lay.target_width)
        samples = np.frombuffer(frames[2].buffer, np.int64)
        masks = None
        if lay.has_masks:
            m = lay.mask_side
            masks = np.frombuffer(frames[3].buffer, lay.mask_dtype).reshape(size, m, m)
        return images, targets, samples, masks

    def close(self) -> None:
        pass


def delivery_for(endpoint: str) -> str:
    """How batches reach a trainer attached at ``endpoint``."""
    return DELIVERY_FRAMES if endpoint.startswith("tcp://") else DELIVERY_SHM


def map_ring(attached: dict, store: Store | None = None) -> tuple[Ring | None, str]:
    """(the mapped ring, its nonce) for an ``attached`` reply, looking in ``store`` (the path
    this process sees the daemon's store under; default the daemon's own path); (None, "")
    where this process cannot map it (another machine, another /dev/shm, another user)."""
    where = store if store is not None else Store.of(attached["store"])
    try:
        ring = Ring.attach(attached["ring"], store=where, trainer=True)
    except (OSError, PixpoolError) as exc:
        log.info(
            "ring %s is not mappable from here (%s: %s); batches come as frames",
            attached["ring"],
            type(exc).__name__,
            exc,
        )
        return None, ""
    return ring, ring.nonce()


def open_reader(attached: dict, delivery: str, ring: Ring | None) -> SlotReader | FrameReader:
    """The reader for an ``attached`` reply and the delivery the daemon granted; ``ring``
    (``map_ring``) is closed when it is not needed."""
    layout = RingLayout.from_dict(attached["layout"])
    if delivery == DELIVERY_SHM and ring is not None:
        return SlotReader(ring, layout)
    if ring is not None:
        ring.close()
    return FrameReader(layout)


def prove(conn: Connection, attached: dict, *, asked: str, store: Store | None, deadline: float, peer: Peer):
    """(granted delivery, mapped ring or None): the locality handshake for an ``attached``
    reply. A trainer that asked for frames proves nothing; one that cannot map its ring
    sends an empty nonce and gets frames."""
    if asked != DELIVERY_SHM:
        return DELIVERY_FRAMES, None
    ring, nonce = map_ring(attached, store)

    def proved(msg: dict, frames: list):
        return msg["delivery"] if msg["trainer_id"] == attached["trainer_id"] else KEEP_WAITING

    try:
        conn.send("prove", trainer_id=attached["trainer_id"], token=attached["token"], nonce=nonce)
        return conn.wait({"proved": proved}, deadline=deadline, what="reply to prove", peer=peer), ring
    except BaseException:
        if ring is not None:
            ring.close()
        raise
