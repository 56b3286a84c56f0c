"""The trainer side: attach to the daemon and iterate over one epoch's batches in order.

Runs in the trainer process. ``Client`` owns two ZeroMQ sockets, each used only by the
thread that created it (zmq sockets are not thread-safe): the main DEALER (attach, start,
ready, release, detach) in the caller's thread, and a heartbeat DEALER in a background
thread that tells the daemon this trainer is alive while the training step runs.

Batch lifetime: by default (``zero_copy=True``, this low-level API's contract) the images
and targets of a batch yielded by ``epoch()`` are a view of a ring slot (local) or of the
received frames (TCP). They stay valid until the next batch is requested; then the slot is
released to the daemon (credit-based backpressure). Copy what must outlive that, or pass
``zero_copy=False`` for batches the caller owns (``attach()``'s default; the cost is in
``client/loader.py``). ``samples`` is always the caller's own (a copy of B integers).

Faults, as the trainer sees them:
- no daemon yet: attach waits up to ``timeout_s`` (``DaemonTimeout`` says where it looked);
- the daemon stops cleanly: ``DaemonStopped`` with the daemon's reason;
- the daemon dies (it no longer holds this trainer's ring, seen from any PID namespace:
  ``Ring.daemon_alive``; or it falls silent; or the restarted one no longer knows this
  trainer): the client attaches again within ``timeout_s`` and resumes at its epoch and
  batch position, if the daemon serves the snapshot the stream began on
  (``snapshot_check.py``); moving to the new ring, it removes the dead daemon's old one as
  the last one out. On another snapshot (a new dataset version) it stops with
  ``SnapshotChangedError`` naming both, unless ``follow_snapshot=True`` (then it warns and
  goes on with the new one);
- a batch does not come within ``timeout_s``: if the daemon still answers this trainer's
  heartbeats it is slow, not gone (a stalled worker, a busy machine), and the client logs
  a warning and keeps waiting; only a daemon that answers nothing is ``DaemonTimeout``
  (or, once attached, lost and attached again);
- over TCP, the daemon refuses this trainer's CURVE key (not in its ``authorized/``, or
  removed from it while attached): ``NotAuthorized`` at once (``auth_watch.py``).
"""

from __future__ import annotations

import logging
import os
import socket as _socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import zmq

from ..shared.errors import ConfigError, DaemonStopped, DaemonTimeout, PixpoolError, ProtocolError
from ..shared.stream import protocol as proto
from ..shared.stream.config import StreamSettings
from ..shared.transport import endpoint as ep
from ..shared.transport.procmem import pid_namespace
from ..shared.transport.ring import DEFAULT_SLOTS
from . import snapshot_check
from ._torch import require_torch
from .auth_watch import AuthWatch
from .delivery import delivery_for, map_ring, open_reader

log = logging.getLogger(__name__)

_STEP_MS = 100


@dataclass(frozen=True)
class TrainerBatch:
    """One delivered batch. ``images`` uint8 (B, 3, S, S) RGB (numpy, or torch when asked)."""

    images: Any
    targets: Any  # float32 (n, 6): batch_index, class, cx, cy, w, h (normalised)
    samples: np.ndarray  # int64 (B,) record indices
    epoch: int
    batch: int


class _Lost(Exception):
    """The daemon this client was attached to is gone; attach again."""


class Client:
    """Attach a training stream to a pixpool daemon (local ipc, or TCP with CURVE keys)."""

    def __init__(
        self,
        settings: StreamSettings,
        *,
        socket_dir: str | os.PathLike | None = None,
        endpoint: str | None = None,
        keys_dir: str | os.PathLike | None = None,
        timeout_s: float = 60.0,
        slots: int = DEFAULT_SLOTS,
        as_torch: bool | None = None,
        device: Any = None,
        heartbeat_interval_s: float = 1.0,
        timings: dict | None = None,
        fetch_files: bool = False,
        store: str | os.PathLike | None = None,
        zero_copy: bool = True,
        follow_snapshot: bool = False,
    ):
        if not isinstance(settings, StreamSettings):
            raise TypeError(f"settings must be a StreamSettings, got {type(settings).__name__}")
        self.settings = settings
        self.endpoint = endpoint or ep.ipc_endpoint(socket_dir)
        self.remote = delivery_for(self.endpoint) == proto.DELIVERY_FRAMES
        # ``store``: where this process sees the daemon's store (a container may mount it
        # elsewhere); default the path the daemon names. Over ipc the client always tries
        # to map its ring; over TCP only when told where the store is.
        self.store = os.fspath(store) if store is not None else None
        self._asked = proto.DELIVERY_SHM if (not self.remote or self.store is not None) else proto.DELIVERY_FRAMES
        self.delivery = self._asked  # what the daemon granted, once attached
        if self.remote and keys_dir is None:
            raise ConfigError(
                f"{self.endpoint}: TCP needs CURVE keys; pass keys_dir (made by `pixpool keys DIR`)", field="keys_dir"
            )
        self.keys_dir = keys_dir
        self.timeout_s = float(timeout_s)
        self.slots = slots
        # None: torch when a device is given or HSV runs on the device; False: raw numpy
        # slot views (device HSV then is the caller's job, e.g. digests of the slot bytes).
        self.as_torch = (device is not None or settings.hsv_on_device) if as_torch is None else bool(as_torch)
        self.device = device
        self.heartbeat_interval_s = heartbeat_interval_s
        # Optional: accumulates "deliver_s" (ready message received -> batch built, tensors
        # included) and "batches", for bench/serve.py.
        self.timings = timings
        self.zero_copy = bool(zero_copy)
        # The snapshot this stream is on (``snapshot_check.identity``), fixed at the first
        # attach; a reattach onto another one stops the trainer unless it follows the daemon.
        self.follow_snapshot = bool(follow_snapshot)
        self.snapshot: dict = {}
        self.snapshot_changes = 0
        # The daemon's class names (from attach) and, with ``fetch_files``, every record's
        # image file name (``records`` requests right after attach, before any batch flows).
        self.fetch_files = fetch_files
        self.names: list[str] = []
        self.files: list[str] = []
        self.position: tuple[int, int] = (settings.start_epoch, 0)
        self.reattaches = 0
        # Seconds this trainer spent waiting for the daemon's batches (the heartbeat reports it).
        self.data_wait_s = 0.0
        self._ctx = zmq.Context()
        self._sock: zmq.Socket | None = None
        self._auth_watch: AuthWatch | None = None  # over TCP: says at once when the daemon refuses the key
        self._reader = None  # delivery.SlotReader or FrameReader, from the attach reply
        self._ident: tuple[int, int] | None = None  # (trainer_id, token); read by the heartbeat thread
        self._held: dict | None = None  # the ``ready`` message of the batch being read
        self._generation = 0  # bumped by each epoch() call
        self._lost: tuple[int, int] | None = None
        self._last_ack = time.monotonic()
        self._hb_stop = threading.Event()
        self._hb = threading.Thread(target=self._heartbeat_loop, name="pixpool-heartbeat", daemon=True)
        try:
            self._attach()
        except BaseException:
            self._teardown()
            raise
        self._hb.start()

    # -- sockets ------------------------------------------------------------------------
    def _socket(self, *, watch: bool = False) -> zmq.Socket:
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if self.remote:
            ep.configure_client(s, self.keys_dir)
            if watch:
                self._auth_watch = AuthWatch(s, self.endpoint, self.keys_dir)
        s.connect(self.endpoint)
        return s

    def _recv(self, deadline: float, what: str, *, patient: bool = False) -> tuple[dict, list]:
        """Next message on the main socket; raises _Lost, DaemonStopped, DaemonTimeout.

        ``patient`` (waiting for a batch): past the deadline, keep waiting while the daemon
        answers heartbeats; a batch can be slow where a control reply never is."""
        while True:
            if self._sock.poll(_STEP_MS):
                frames = self._sock.recv_multipart(copy=False)
                msg = proto.decode(frames[0].bytes, reply=True)
                if msg["op"] == "stopped":
                    raise DaemonStopped(f"daemon stopped: {msg['reason']}")
                if msg["op"] == "error":
                    if msg.get("code") == "unknown_trainer" and self._ident and msg.get("trainer_id") == self._ident[0]:
                        raise _Lost()
                    if msg.get("code") == "unknown_trainer":
                        continue  # about an identity this client no longer uses
                    raise proto.error_from(msg)  # the daemon's error class and message
                return msg, frames[1:]
            if self._auth_watch is not None:
                self._auth_watch.check()
            if self._ident is not None and self._daemon_gone():
                if self._sock.poll(_STEP_MS):
                    continue  # its last word (``stopped``) may still be on its way: read it first
                raise _Lost()
            if time.monotonic() > deadline and patient and self._daemon_answers():
                log.warning(
                    "no %s from the pixpool daemon at %s within %.1f s, but it answers heartbeats: it is slow, not gone; waiting on",
                    what,
                    self.endpoint,
                    self.timeout_s,
                )
                deadline = time.monotonic() + self.timeout_s
            elif time.monotonic() > deadline:
                raise DaemonTimeout(
                    f"no {what} from a pixpool daemon at {self.endpoint} within {self.timeout_s} s; start one with `pixpool serve DATA` (or check `pixpool status`)"
                )

    def _daemon_gone(self) -> bool:
        if self._lost is not None and self._lost == self._ident:
            return True
        ring = self._ring
        if ring is not None and not ring.daemon_alive():
            return True  # the daemon no longer maps this trainer's ring: dead, or detached it
        return time.monotonic() - self._last_ack > max(10.0, 10 * self.heartbeat_interval_s)

    def _daemon_answers(self) -> bool:
        """The daemon answered this trainer's heartbeat lately (its loop runs)."""
        return self._ident is not None and time.monotonic() - self._last_ack < max(2.0, 3 * self.heartbeat_interval_s)

    def _attach(self) -> None:
        self._close_socket()
        self._sock = self._socket(watch=True)
        self._sock.send(
            proto.encode(
                "attach",
                settings=self.settings.to_dict(),
                pid=os.getpid(),
                host=_socket.gethostname(),
                slots=self.slots,
                delivery=self._asked,
                pid_ns=pid_namespace(),
            )
        )
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg, _ = self._recv(deadline, "reply to attach")
            if msg["op"] == "attached":
                break
        self._check_snapshot(msg)
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self.num_records = msg["num_records"]
        self.names = list(msg.get("names") or [])
        self._held = None
        self._last_ack = time.monotonic()
        self._ident = (msg["trainer_id"], msg["token"])
        self._reader = open_reader(msg, *self._prove(msg, deadline))
        self.delivery = self._reader.delivery
        self.layout = self._reader.layout
        if self.fetch_files:
            self.files = self._records()

    def _check_snapshot(self, attached: dict) -> None:
        """Fix the stream's snapshot at the first attach; on a later one, refuse another
        snapshot (detaching from the daemon that offered it, so it removes the new ring)
        unless ``follow_snapshot``."""
        after = snapshot_check.identity(attached)
        before = self.snapshot
        if before and snapshot_check.changed(before, after):
            error = snapshot_check.refusal(before, after, endpoint=self.endpoint, position=self.position)
            if not self.follow_snapshot:
                self._detach_from(attached)
                raise error
            log.warning("following the daemon onto another snapshot (follow_snapshot=True): %s", error)
            self.snapshot_changes += 1
        self.snapshot = after

    def _detach_from(self, attached: dict) -> None:
        try:
            self._sock.send(proto.encode("detach", trainer_id=attached["trainer_id"], token=attached["token"]))
            deadline = time.monotonic() + min(2.0, self.timeout_s)
            while True:
                msg, _ = self._recv(deadline, "reply to detach")
                if msg["op"] == "detached" and msg["trainer_id"] == attached["trainer_id"]:
                    return
        except (PixpoolError, _Lost, zmq.ZMQError) as exc:  # the daemon sweeps a silent trainer anyway
            log.info("detaching from the daemon's other snapshot: %s", exc)

    def _prove(self, attached: dict, deadline: float):
        """(granted delivery, mapped ring or None): the locality handshake (``client/delivery.py``)."""
        if self._asked != proto.DELIVERY_SHM:
            return proto.DELIVERY_FRAMES, None
        ring, nonce = map_ring(attached, self.store)
        try:
            self._send("prove", nonce=nonce)
            while True:
                msg, _ = self._recv(deadline, "reply to prove")
                if msg["op"] == "proved" and msg["trainer_id"] == self._ident[0]:
                    return msg["delivery"], ring
        except BaseException:
            if ring is not None:
                ring.close()
            raise

    def _records(self) -> list[str]:
        files: list[str] = []
        deadline = time.monotonic() + self.timeout_s
        while True:
            self._sock.send(proto.encode("records", start=len(files)))
            while True:
                msg, _ = self._recv(deadline, "reply to records")
                if msg["op"] == "records" and msg["start"] == len(files):
                    break
            files.extend(msg["files"])
            if len(files) >= msg["total"] or not msg["files"]:
                return files

    def _reattach(self) -> None:
        log.warning(
            "pixpool daemon at %s went away; attaching again (position epoch %d batch %d)",
            self.endpoint,
            *self.position,
        )
        deadline = time.monotonic() + self.timeout_s
        self._ident = None
        while True:
            try:
                self._attach()
                self.reattaches += 1
                return
            except (_Lost, DaemonTimeout):  # not SnapshotChangedError: that one ends the stream
                if time.monotonic() > deadline:
                    raise DaemonTimeout(
                        f"the pixpool daemon at {self.endpoint} went away and none came back within {self.timeout_s} s"
                    ) from None

    def _send(self, op: str, **fields: Any) -> None:
        tid, token = self._ident
        self._sock.send(proto.encode(op, trainer_id=tid, token=token, **fields))

    # -- heartbeat thread ---------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        s = self._socket()
        try:
            while not self._hb_stop.wait(self.heartbeat_interval_s):
                ident = self._ident
                if ident is None:
                    continue
                try:
                    s.send(
                        proto.encode("heartbeat", trainer_id=ident[0], token=ident[1], data_wait_s=self.data_wait_s),
                        zmq.NOBLOCK,
                    )
                except zmq.Again:
                    pass
                while s.poll(0):
                    try:
                        msg = proto.decode(s.recv(), reply=True)
                    except ProtocolError:
                        continue
                    if msg["op"] == "heartbeat" and self._ident and msg["trainer_id"] == self._ident[0]:
                        self._last_ack = time.monotonic()
                    elif (
                        msg["op"] == "error"
                        and msg.get("code") == "unknown_trainer"
                        and msg.get("trainer_id") == ident[0]
                    ):
                        self._lost = ident
        finally:
            s.close(linger=0)

    # -- iteration ----------------------------------------------------------------------
    def _release_held(self) -> None:
        if self._held is not None and self._ident is not None:
            msg, self._held = self._held, None
            self._release(msg)

    def _release(self, ready: dict) -> None:
        """Give back the batch a ``ready`` announced, naming it (not only its slot)."""
        self._send(
            "release", slot=ready["slot"], epoch=ready["epoch"], batch=ready["batch"], generation=ready["generation"]
        )

    def _start(self, epoch: int, batch: int) -> int:
        self._release_held()
        self._send("start", epoch=epoch, batch=batch)
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg, _ = self._recv(deadline, "reply to start")
            if msg["op"] == "started" and msg["epoch"] == epoch and msg["trainer_id"] == self._ident[0]:
                return msg["num_batches"]
            if msg["op"] == "ready" and msg["trainer_id"] == self._ident[0]:
                self._release(msg)  # from before this start: give it back

    def epoch(self, epoch: int, *, start_batch: int = 0) -> Iterator[TrainerBatch]:
        """Yield the batches of ``epoch`` from ``start_batch`` on, in order.

        One iterator at a time: starting another one ends this one.
        """
        self._generation += 1
        mine = self._generation
        b = start_batch
        self.position = (epoch, b)
        try:
            while True:
                try:
                    n = self._start(epoch, b)
                    while b < n:
                        t_wait = time.perf_counter()
                        msg, frames = self._next_ready(epoch, b)
                        t0 = time.perf_counter()
                        self.data_wait_s += t0 - t_wait
                        out = self._wrap(msg, frames)
                        if self.timings is not None:
                            self.timings["deliver_s"] = self.timings.get("deliver_s", 0.0) + time.perf_counter() - t0
                            self.timings["batches"] = self.timings.get("batches", 0) + 1
                        self._held = msg
                        yield out
                        if self._generation != mine:
                            raise PixpoolError(
                                f"this iterator over epoch {epoch} was replaced by a newer Client.epoch() call; use one at a time"
                            )
                        self._release_held()
                        b += 1
                        self.position = (epoch, b)
                    return
                except _Lost:
                    self._reattach()
        finally:
            # Only the current iterator owns the held slot (an old one may be collected late).
            if (
                self._generation == mine
                and self._ident is not None
                and self._sock is not None
                and not self._sock.closed
            ):
                try:
                    self._release_held()
                except zmq.ZMQError:
                    pass

    def _next_ready(self, epoch: int, batch: int) -> tuple[dict, list]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg, frames = self._recv(deadline, f"batch {batch} of epoch {epoch}", patient=True)
            if msg["op"] != "ready" or msg["trainer_id"] != self._ident[0]:
                continue
            if (msg["epoch"], msg["batch"]) == (epoch, batch):
                return msg, frames
            self._release(msg)
            if msg["epoch"] == epoch and msg["batch"] > batch:
                raise ProtocolError(
                    f"daemon announced batch {msg['batch']} while batch {batch} of epoch {epoch} was due"
                )

    @property
    def _ring(self):
        """The mapped ring of a local trainer (None over TCP, where bytes come as frames)."""
        return self._reader.ring if self._reader is not None else None

    def _wrap(self, msg: dict, frames: list) -> TrainerBatch:
        images, targets, samples = self._reader.arrays(msg, frames)
        samples = samples.copy()  # B integers: never worth a view
        if self.as_torch:
            images, targets = self._to_torch(images, targets, samples, msg["epoch"])
        elif not self.zero_copy:
            images, targets = images.copy(), targets.copy()
        return TrainerBatch(images=images, targets=targets, samples=samples, epoch=msg["epoch"], batch=msg["batch"])

    def _to_torch(self, images: np.ndarray, targets: np.ndarray, samples: np.ndarray, epoch: int):
        torch = require_torch("a Client that yields torch tensors (as_torch, device or hsv_on_device)")

        # A copy to another device is the caller's own already (a copy from pageable memory
        # has read its source when ``to`` returns, non_blocking or not); on the CPU an owned
        # batch is one host copy of the slot.
        on_host = self.device is None or torch.device(self.device).type == "cpu"
        own = not self.zero_copy and on_host
        timg = torch.from_numpy(images.copy() if own or not images.flags.writeable else images)
        ttgt = torch.from_numpy(targets.copy() if own or not targets.flags.writeable else targets)
        if self.device is not None:
            timg = timg.to(self.device, non_blocking=True)
            ttgt = ttgt.to(self.device, non_blocking=True)
        if self.settings.hsv_on_device and self.settings.augment.augment:  # validation streams get no HSV
            from .hsv_torch import apply_hsv

            timg = apply_hsv(timg, self.settings, epoch, samples)
        return timg, ttgt

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """Detach (the daemon unlinks this trainer's ring) and close everything."""
        if self._ident is not None and self._sock is not None:
            try:
                self._held = None
                self._send("detach")
                deadline = time.monotonic() + min(2.0, self.timeout_s)
                while True:
                    msg, _ = self._recv(deadline, "reply to detach")
                    if msg["op"] == "detached":
                        break
            except (PixpoolError, _Lost, zmq.ZMQError):
                pass
        self._ident = None
        self._teardown()

    def _teardown(self) -> None:
        self._hb_stop.set()
        if self._hb.is_alive():
            self._hb.join(5.0)
        self._close_socket()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._ctx.term()

    def _close_socket(self) -> None:
        if self._auth_watch is not None:
            self._auth_watch.close()
            self._auth_watch = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
