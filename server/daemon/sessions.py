"""Trainer sessions: who is attached, with which ring, and whether they are still alive.

Runs in the daemon process, inside its single-threaded loop. The daemon owns every ring it
creates here and unlinks each one itself when the trainer detaches, dies, goes silent past
``heartbeat_timeout_s``, or the daemon stops.

A session is identified by ``trainer_id`` and a random ``token`` that every later request
must carry, so a trainer id guessed or left over from before a restart is refused
(``UnknownTrainer``, which the client answers by attaching again).

Locality is proved, not guessed from host names or pids: a session starts with frame
delivery; a trainer that asked for shm delivery reads the nonce in its ring's header
(``shared.transport.ring``) through the store path it was told and sends it back (``prove``), and
only a matching nonce switches it to reading slots in place. Its pid is watched only then,
and only when it runs in the daemon's own PID namespace (``pid_namespace``); otherwise its
death is noticed by its silence (``heartbeat_timeout_s``).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

import msgpack
import psutil
import zmq

from ...shared.errors import CapacityError
from ...shared.stream.config import StreamSettings
from ...shared.transport.names import new_ring_token, ring_segment
from ...shared.transport.procmem import pid_namespace
from ...shared.transport.ring import Ring, RingLayout
from ...shared.transport.store import DEFAULT, Store
from ...shared.wire.status import TrainerStatus
from ...shared.wire.trainer import DELIVERY_FRAMES, DELIVERY_SHM
from .scheduler import Scheduler

log = logging.getLogger(__name__)

# 64 random bits per name: a collision is someone else's doing, not chance.
_RING_NAME_TRIES = 8


# Validation sessions take their ids from here on: a trainer attaches one per validation pass,
# and from the same counter as training streams they would number trainers 1, 3, 7, ...
# Trainers keep 1, 2, 3, ...; the wire only asks for a unique id (``shared/wire/_fields.py``).
VAL_IDS_FROM = 1 << 32


def _is_val(settings: StreamSettings) -> bool:
    return settings.split == "val"


class UnknownTrainer(Exception):
    def __init__(self, trainer_id: int):
        super().__init__(trainer_id)
        self.trainer_id = trainer_id


@dataclass
class TrainerSession:
    trainer_id: int
    token: int
    settings: StreamSettings
    settings_dict: dict
    pid: int
    host: str
    delivery: str
    sock: zmq.Socket
    identity: bytes
    ring: Ring
    pid_ns: str = ""  # the trainer's PID namespace as it reported it (``pid_namespace``)
    requested: str = DELIVERY_FRAMES  # the delivery it asked for; ``delivery`` is what it got
    watch_pid: bool = False  # proved local and in the daemon's PID namespace: its pid can be watched
    attached_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    data_wait_s: float = (
        0.0  # the trainer's own count of seconds spent waiting for batches since this attach (heartbeats)
    )
    client: str = ""  # who attached it (``intake.peer_of``): ``key:<z85>`` over TCP, ``uid:<n>`` over ipc
    # A validation stream's trainer (the training session of the same process), 0 when none
    # is attached: the number every view shows for it; a training stream's is its own id.
    of_trainer: int = 0

    @property
    def name(self) -> str:
        """What the log calls this session: a trainer's validation passes are not another trainer."""
        if not _is_val(self.settings):
            return f"trainer {self.trainer_id}"
        return f"trainer {self.of_trainer}'s validation stream" if self.of_trainer else "a validation stream"


class Sessions:
    """The attached trainers of one daemon. ``on_detach(ring_name)`` runs before a ring goes."""

    def __init__(
        self,
        daemon_pid: int,
        scheduler: Scheduler,
        *,
        heartbeat_timeout_s: float,
        on_detach: Callable[[str], None],
        store: Store = DEFAULT,
    ):
        self.daemon_pid = daemon_pid
        self.store = store
        self.pid_ns = pid_namespace()
        self.scheduler = scheduler
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._on_detach = on_detach
        self.trainers: dict[int, TrainerSession] = {}
        self._ids = itertools.count(1)
        self._val_ids = itertools.count(VAL_IDS_FROM)

    def __len__(self) -> int:
        return len(self.trainers)

    @property
    def rings_nbytes(self) -> int:
        return sum(t.ring.layout.nbytes for t in self.trainers.values())

    @property
    def training(self) -> int:
        """Attached trainers: a trainer's validation pass (a session on the val split) is no trainer."""
        return sum(1 for t in self.trainers.values() if not _is_val(t.settings))

    def describe(self, now: float, budget_nbytes: int) -> tuple[TrainerStatus, ...]:
        """The sessions as the status reply lists them, in attach order, as many as fit in
        ``budget_nbytes`` of msgpack (``len(self)`` says how many there are)."""
        out = []
        listed_nbytes = 0
        for t in self.trainers.values():
            entry = self._status_of(t, now)
            listed_nbytes += len(msgpack.packb(entry.to_wire(), use_bin_type=True))
            if listed_nbytes > budget_nbytes:
                break
            out.append(entry)
        return tuple(out)

    def _status_of(self, t: TrainerSession, now: float) -> TrainerStatus:
        s = self.scheduler.progress(t.trainer_id)
        return TrainerStatus(
            trainer_id=t.trainer_id,
            pid=t.pid,
            host=t.host,
            delivery=t.delivery,
            pid_watched=t.watch_pid,
            settings_wire=t.settings_dict,
            split=t.settings.split,
            of_trainer=t.of_trainer,
            epoch=s.epoch,
            next_batch=s.next_batch,
            num_batches=s.num_batches,
            batches_delivered=s.batches_delivered,
            images_delivered=s.images_delivered,
            img_per_s=round(s.img_per_s, 2),
            slots=s.slots,
            slots_in_use=s.slots_in_use,
            ring=t.ring.name,
            ring_nbytes=t.ring.layout.nbytes,
            ring_mask_nbytes=t.ring.layout.slots * t.ring.layout.masks_nbytes,
            last_seen_s=round(now - t.last_seen, 3),
            attached_s=round(now - t.attached_at, 3),
            data_wait_s=round(t.data_wait_s, 3),
        )

    def held_by(self, client: str) -> int:
        """How many sessions ``client`` (``TrainerSession.client``) holds now."""
        return sum(t.client == client for t in self.trainers.values())

    def attach(
        self,
        msg: dict,
        settings: StreamSettings,
        layout: RingLayout,
        *,
        sock: zmq.Socket,
        identity: bytes,
        client: str = "",
    ) -> TrainerSession:
        ring = self._create_ring(layout)
        # The trainer id is taken only once the ring exists: a failed attach uses up nothing.
        tid = next(self._val_ids if _is_val(settings) else self._ids)
        pid_ns = msg.get("pid_ns") if isinstance(msg.get("pid_ns"), str) else ""
        # Frames until the trainer proves it maps this ring (``prove``).
        t = TrainerSession(
            tid,
            secrets.randbits(62),
            settings,
            settings.to_dict(),
            msg["pid"],
            msg["host"],
            DELIVERY_FRAMES,
            sock,
            identity,
            ring,
            pid_ns=pid_ns,
            requested=msg["delivery"],
            client=client,
        )
        t.of_trainer = self._trainer_of(t) if _is_val(settings) else tid
        self.trainers[tid] = t
        self.scheduler.add(tid, settings, layout.slots)
        # A validation stream comes and goes with every pass: the operator's log is the trainers'.
        log.log(
            logging.DEBUG if _is_val(settings) else logging.INFO,
            "%s attached (pid %d, seed %d, batch %d, ring %s of %d bytes)",
            t.name,
            t.pid,
            settings.seed,
            settings.batch_size,
            ring.name,
            layout.nbytes,
        )
        return t

    def _trainer_of(self, val: TrainerSession) -> int:
        """The training session of the process that attached ``val`` (same pid, host and client), or 0."""
        for t in self.trainers.values():
            if not _is_val(t.settings) and (t.pid, t.host, t.client) == (val.pid, val.host, val.client):
                return t.trainer_id
        return 0

    def _create_ring(self, layout: RingLayout) -> Ring:
        """A ring under a fresh unguessable name, created exclusively (``O_EXCL``): a file
        someone put under a name first is never adopted; a collision draws another name."""
        for _ in range(_RING_NAME_TRIES):
            name = ring_segment(self.daemon_pid, new_ring_token())
            try:
                return Ring.create(name, layout, store=self.store)
            except FileExistsError:
                log.warning(
                    "ring name %s already exists in %s (not made by this daemon); drawing another", name, self.store
                )
        raise CapacityError(
            f"could not create a batch ring under {_RING_NAME_TRIES} fresh random names in {self.store}: every one existed already; "
            f"someone is filling it with pixpool names, see `ls -l {self.store}`"
        )

    def prove(self, t: TrainerSession, nonce: str) -> str:
        """Decide ``t``'s delivery from the nonce it read in its ring (module docstring)."""
        local = t.requested == DELIVERY_SHM and bool(nonce) and secrets.compare_digest(nonce, t.ring.nonce())
        t.delivery = DELIVERY_SHM if local else DELIVERY_FRAMES
        t.watch_pid = local and t.pid > 0 and bool(t.pid_ns) and t.pid_ns == self.pid_ns
        # Said at the default level only where a trainer asked to map its ring and could not.
        log.log(
            logging.INFO if t.requested == DELIVERY_SHM and not local and not _is_val(t.settings) else logging.DEBUG,
            "%s: %s (%s)",
            t.name,
            "maps its ring in place" if local else "gets its batches as frames",
            "same PID namespace, pid watched" if t.watch_pid else "liveness by heartbeat",
        )
        return t.delivery

    def get(self, msg: dict) -> TrainerSession:
        """The session a request names, with a matching token; marks it seen."""
        t = self.trainers.get(msg["trainer_id"])
        if t is None or t.token != msg["token"]:
            raise UnknownTrainer(msg["trainer_id"])
        t.last_seen = time.monotonic()
        return t

    def detach(self, trainer_id: int, reason: str) -> None:
        t = self.trainers.pop(trainer_id, None)
        if t is None:
            return
        self.scheduler.remove(trainer_id)
        self._on_detach(t.ring.name)
        t.ring.close()
        t.ring.unlink()
        log.log(
            logging.DEBUG if _is_val(t.settings) else logging.INFO,
            "%s detached: %s; ring %s removed",
            t.name,
            reason,
            t.ring.name,
        )

    def detach_all(self, reason: str) -> None:
        for tid in list(self.trainers):
            self.detach(tid, reason)

    def check(self, now: float) -> None:
        """Detach trainers whose process is gone or whose heartbeat is too old.

        A trainer that proved it maps its ring holds the ring's ``CONSUMER`` lock
        (``shared.transport.holds``) for as long as its mapping lives: when that hold is gone, so is the
        trainer, whatever PID namespace it runs in (a container's trainer is PID 1 there, so
        its pid says nothing here). The pid is watched too where it means something."""
        for t in list(self.trainers.values()):
            if t.delivery == DELIVERY_SHM and not t.ring.trainer_holds():
                self.detach(t.trainer_id, f"it no longer maps its ring {t.ring.name} (its process is gone)")
            elif t.watch_pid and not psutil.pid_exists(t.pid):
                self.detach(t.trainer_id, f"process {t.pid} is gone")
            elif now - t.last_seen > self.heartbeat_timeout_s:
                self.detach(
                    t.trainer_id, f"no heartbeat for {now - t.last_seen:.1f} s (timeout {self.heartbeat_timeout_s} s)"
                )
