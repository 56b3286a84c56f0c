"""``Client``: a trainer's stream from a pixpool daemon, one epoch's batches at a time, in order.

Runs in the trainer process. The Client composes the trainer side's parts, each in its
module: ``daemon_socket`` (is a daemon there at all: fail at once, or wait), ``connection``
(the main socket and its reply tables), ``snapshot_check`` (which snapshot the stream is
on), ``delivery`` (the locality proof and the reader of the batch bytes), ``record_files``
(the records' file names, fetched when first read), ``heartbeat`` (the thread that says
this trainer is alive), ``flow`` (start, ready, release) and ``tensors`` (what a batch is
handed out as). What is left here is their order: attach, iterate, attach again after a
daemon restart, close.

Batch lifetime: by default (``zero_copy=True``, this low-level API's contract) the images
and targets of a batch yielded by ``epoch()`` are a view of a ring slot (local) or of the
received frames (TCP). They stay valid until the next batch is requested; then the slot is
released to the daemon (credit-based backpressure). Copy what must outlive that, or pass
``zero_copy=False`` for batches the caller owns (``attach()``'s default; the cost is in
``client/loader.py``). Such a batch is either a copy, whose slot is released as soon as the
copy is made (the workers render into it while the caller works on the batch), or, for
torch batches, a lent slot: the images tensor wraps the slot, which is released only once
every tensor over it is gone (``flow.py``: at most the ring's slots less one are lent,
past that batches are copied; ``lend=False`` always copies).

Faults, as the trainer sees them:
- no daemon: ``DaemonNotFound`` within a second, naming the socket directory
  (``daemon_socket.py``), unless ``wait_s`` asks to wait that long for one; a daemon that
  says it is starting there (preparing its snapshot) is waited for up to
  ``daemon_socket.STARTING_WAIT_S`` (or ``wait_s`` where longer); a daemon that
  listens gets ``timeout_s`` to answer the attach (``DaemonTimeout`` says where it looked);
  either wait says every few seconds that it still waits;
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
  removed from it while attached): ``NotAuthorized`` at once (``auth_watch.py``);
- the Client was closed: ``ClosedError``.

``imgsz``: a stream whose ``settings.augment.imgsz`` is None takes the daemon's (the
``attached`` reply's ``imgsz``, by ``StreamSettings.for_imgsz``); ``client.settings`` is the
stream's settings with it filled in, and a reattach asks for that same size.

The task: ``client.task`` (detect, segment, pose, obb; ``client.spec`` its ``TaskSpec``),
``client.kpt_shape`` and ``client.flip_idx`` (pose) are the daemon's dataset's, from each
``attached`` reply. Each batch's ``targets`` has ``spec.target_width`` columns for it, and a
segment batch carries ``masks`` (``tensors.py``).

``expect``: the data the trainer names (``shared/stream/served_data.py``: ``expect``). Each
attach then checks that the daemon serves exactly that (the split's resolved image sources,
the data's class names, the task where given) and otherwise detaches and raises
``DatasetMismatchError`` naming both; without it the trainer takes whatever the daemon serves.
"""

from __future__ import annotations

import logging
import os
import socket as _socket
import time
from typing import Any, Callable, Iterator

import zmq

from ..shared.errors import (
    ClosedError,
    DaemonTimeout,
    DatasetMismatchError,
    PixpoolError,
    ProtocolError,
    SnapshotChangedError,
)
from ..shared.stream.config import StreamSettings
from ..shared.stream.path_table import PathTable
from ..shared.stream.served_data import check_served
from ..shared.task import BASE_COLUMNS, TaskSpec, WithSpec
from ..shared.transport import endpoint as ep
from ..shared.transport.procmem import pid_namespace
from ..shared.transport.store import Store
from ..shared.wire.trainer import DELIVERY_FRAMES, DELIVERY_SHM, attached_task
from .connection import KEEP_WAITING, Connection, Lost
from .daemon_socket import await_daemon
from .delivery import open_reader, prove
from .flow import Flow
from .heartbeat import Heartbeat, WaitCount
from .options import ClientOptions
from .record_files import RecordFiles, fetch_files, fetch_records
from .snapshot_check import StreamSnapshot
from .tensors import Conversion, TrainerBatch, to_batch

__all__ = ["Client", "TrainerBatch"]

log = logging.getLogger(__name__)


class Client(WithSpec):
    """Attach a training stream to a pixpool daemon (local ipc, or TCP with CURVE keys).

    ``Client.connect(settings, options)`` makes one and attaches it; ``Client(settings,
    options)`` only holds the stream's state (no socket, no file looked at) until ``open()``.
    ``options`` is a ``ClientOptions`` (``options.py``), checked where it was made."""

    def __init__(self, settings: StreamSettings, options: ClientOptions | None = None):
        """The stream's state, not attached yet: ``open()`` (or ``Client.connect``) attaches."""
        if not isinstance(settings, StreamSettings):
            raise TypeError(f"settings must be a StreamSettings, got {type(settings).__name__}")
        options = ClientOptions() if options is None else options
        if not isinstance(options, ClientOptions):
            raise TypeError(f"options must be a ClientOptions, got {type(options).__name__}")
        self.options = options
        self.settings = settings  # with the daemon's imgsz filled in once attached
        self.expect = options.expect
        # The ipc endpoint is resolved by ``open()`` (it looks at the socket directory).
        self.endpoint = options.endpoint or None
        self.remote = options.remote
        # ``store``: where this process sees the daemon's store (a container may mount it
        # elsewhere); default the path the daemon names. Over ipc the client always tries
        # to map its ring; over TCP only when told where the store is.
        self.store = Store.of(options.store) if options.store is not None else None
        self._asked = DELIVERY_SHM if (not self.remote or self.store is not None) else DELIVERY_FRAMES
        self.delivery = self._asked  # what the daemon granted, once attached
        self.keys_dir = options.keys_dir
        self.timeout_s = options.timeout_s
        self.wait_s = options.wait_s
        self.slots = options.slots
        # None: torch when a device is given or HSV runs on the device; False: raw numpy
        # slot views (device HSV then is the caller's job, e.g. digests of the slot bytes).
        as_torch = options.as_torch
        self.as_torch = (options.device is not None or settings.hsv_on_device) if as_torch is None else bool(as_torch)
        self.device = options.device
        self.heartbeat_interval_s = options.heartbeat_interval_s
        # Optional: accumulates "deliver_s" (ready message received -> batch built, tensors
        # included) and "batches", for bench/memory.py --what ownership.
        self.timings = options.timings
        self.zero_copy = bool(options.zero_copy)
        self._conversion = Conversion(as_torch=self.as_torch, zero_copy=self.zero_copy, device=options.device)
        self._release_at_once = self._conversion.copies_on_host
        # A caller that owns its torch batches gets the slot's images lent rather than copied
        # while few are out (``flow.py``); ``lend=False`` always copies.
        self._lends = self._release_at_once and self.as_torch and options.lend
        self.follow_snapshot = bool(options.follow_snapshot)
        self._snapshot = StreamSnapshot(follow=self.follow_snapshot)
        # The daemon's class names (from attach) and every record's image file name: a
        # ``RecordFiles`` per attach that fetches the names when first read (an attach carries
        # nothing per record); ``fetch_files=True`` fetches them at each attach instead.
        self.fetch_files = options.fetch_files
        self.names: list[str] = []
        self.files: RecordFiles = RecordFiles(0, lambda: PathTable.from_packed(b""))
        self.num_records = 0
        self.layout = None
        # The daemon's dataset's task (``attached``): what the target rows carry beyond boxes;
        # ``task``, ``kpt_shape`` and ``flip_idx`` are read from it. Set by each attach.
        self.spec: TaskSpec | None = None
        self.position: tuple[int, int] = (settings.start_epoch, 0)
        self.reattaches = 0
        # Seconds this trainer spent waiting for the daemon's batches (the heartbeat reports
        # those of the current attachment).
        self.data_wait = WaitCount()
        self.closed = False
        self._ctx: zmq.Context | None = None  # the sockets' context, the connection and the
        self._conn: Connection | None = None  # heartbeat: made by ``open()``
        self._heartbeat: Heartbeat | None = None
        self._reader = None  # delivery.SlotReader or FrameReader, from the attach reply
        self._ident: tuple[int, int] | None = None  # (trainer_id, token); read by the heartbeat thread
        self._flow: Flow | None = None
        self._generation = 0  # bumped by each epoch() call

    @classmethod
    def connect(cls, settings: StreamSettings, options: ClientOptions | None = None) -> "Client":
        """A Client of ``settings`` attached with ``options`` (``open()``)."""
        return cls(settings, options).open()

    def open(self) -> "Client":
        """Attach: wait for the daemon (``wait_s``), send the attach, map the ring or take
        frames, start the heartbeat. Once; a failure closes this Client and raises."""
        if self.closed:
            raise self._closed_error()
        if self._ctx is not None:
            raise PixpoolError(f"this Client of the pixpool daemon at {self.endpoint} is open already")
        self._ctx = zmq.Context()
        try:
            self.endpoint = self.options.endpoint or ep.ipc_endpoint(self.options.socket_dir)
            self._conn = Connection(
                self._ctx, self.endpoint, remote=self.remote, keys_dir=self.keys_dir, timeout_s=self.timeout_s
            )
            self._heartbeat = Heartbeat(
                self._conn.socket,
                interval_s=self.heartbeat_interval_s,
                identity=lambda: self._ident,
                data_wait_s=self.data_wait.since_attach_s,
            )
            self._attach(wait_s=self.wait_s)
        except BaseException:
            self._teardown()
            raise
        self._heartbeat.start()
        return self

    # -- what the connection asks (``connection.Peer``) ---------------------------------
    @property
    def ident(self) -> tuple[int, int] | None:
        return self._ident

    def daemon_gone(self) -> bool:
        if self._heartbeat.lost is not None and self._heartbeat.lost == self._ident:
            return True
        ring = self._ring
        if ring is not None and not ring.daemon_alive():
            return True  # the daemon no longer maps this trainer's ring: dead, or detached it
        return self._heartbeat.silent()

    def daemon_answers(self) -> bool:
        """The daemon answered this trainer's heartbeat lately (its loop runs)."""
        return self._ident is not None and self._heartbeat.answered_lately()

    @property
    def data_wait_s(self) -> float:
        """Seconds this trainer waited for batches, over all its attachments."""
        return self.data_wait.total_s

    @property
    def snapshot(self) -> dict:
        """The snapshot this stream is on (``snapshot_check.identity``), fixed at the first attach."""
        return self._snapshot.identity

    @property
    def _ring(self):
        """The mapped ring of a local trainer (None over TCP, where bytes come as frames)."""
        return self._reader.ring if self._reader is not None else None

    # -- attach -------------------------------------------------------------------------
    def _attach(self, *, wait_s: float) -> None:
        await_daemon(self.endpoint, wait_s=wait_s)
        self._conn.open()
        self._conn.send(
            "attach",
            settings=self.settings.to_dict(),
            pid=os.getpid(),
            host=_socket.gethostname(),
            slots=self.slots,
            delivery=self._asked,
            pid_ns=pid_namespace(),
        )
        deadline = time.monotonic() + self.timeout_s
        attached = self._conn.wait(
            {"attached": lambda msg, frames: msg}, deadline=deadline, what="reply to attach", peer=self
        )
        try:
            self._snapshot.check(attached, endpoint=self.endpoint, position=self.position)
            self._take_task(attached)
            if self.expect is not None:
                check_served(self.expect, attached, where=self.endpoint)
        except (SnapshotChangedError, ProtocolError, DatasetMismatchError):
            self._detach(attached["trainer_id"], attached["token"])  # so that daemon removes the new ring
            raise
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self.settings = self.settings.for_imgsz(attached["imgsz"])
        self.num_records = attached["num_records"]
        self.names = list(attached.get("names") or [])
        self._heartbeat.reset()
        self.data_wait.attached()
        self._ident = (attached["trainer_id"], attached["token"])
        self._flow = Flow(self._conn, self._ident, peer=self, timeout_s=self.timeout_s)
        granted, ring = prove(self._conn, attached, asked=self._asked, store=self.store, deadline=deadline, peer=self)
        self._reader = open_reader(attached, granted, ring)
        self.delivery = self._reader.delivery
        self.layout = self._reader.layout
        split, records = self.settings.split, self.num_records
        self.files = RecordFiles(
            records,
            lambda: self._fetch(fetch_files, split, records),
            fetch_sizes=lambda: self._fetch(fetch_records, split, records, sizes=True),
        )
        if self.fetch_files:
            self.files.table()

    def _fetch(self, how: Callable, split: str, records: int, **options: Any) -> Any:
        """``how`` (``fetch_files``: the names of ``split``'s ``records``; ``fetch_records``: with
        their decoded sizes) over a socket of its own (``record_files.py``)."""
        if self.closed:
            raise ClosedError(
                f"this Client of the pixpool daemon at {self.endpoint} is closed before its records' file names were "
                "read; read them (files, a batch's files) before close(), or attach again"
            )
        conn = Connection(
            self._ctx, self.endpoint, remote=self.remote, keys_dir=self.keys_dir, timeout_s=self.timeout_s
        )
        try:
            conn.open()
            return how(conn, split=split, records=records, deadline=time.monotonic() + self.timeout_s, **options)
        finally:
            conn.close()

    def _take_task(self, attached: dict) -> None:
        """The task of an ``attached`` reply, checked against its ring layout's row width."""
        spec = attached_task(attached)
        width = spec.target_width()
        layout_width = attached["layout"].get("target_width", BASE_COLUMNS)
        if layout_width != width:
            raise ProtocolError(
                f"the daemon serves the {spec.name} task (rows of {width} columns) but its ring layout has rows of "
                f"{layout_width}; the daemon and this trainer disagree: run the same pixpool release on both"
            )
        self.spec = spec

    def _reattach(self) -> None:
        log.warning(
            "pixpool daemon at %s went away; attaching again (position epoch %d batch %d)",
            self.endpoint,
            *self.position,
        )
        deadline = time.monotonic() + self.timeout_s
        self._ident = None
        self._flow = None
        while True:
            try:
                # A restarted daemon binds its socket only once its snapshot is ready: wait for it.
                self._attach(wait_s=max(0.0, deadline - time.monotonic()))
                self.reattaches += 1
                return
            except (Lost, DaemonTimeout):  # not SnapshotChangedError: that one ends the stream
                if time.monotonic() > deadline:
                    raise DaemonTimeout(
                        f"the pixpool daemon at {self.endpoint} went away and none came back within {self.timeout_s} s"
                    ) from None

    def _detach(self, trainer_id: int, token: int) -> None:
        """Say goodbye for an identity and wait briefly for the answer; a daemon that does not
        answer sweeps a silent trainer anyway."""
        try:
            self._conn.send("detach", trainer_id=trainer_id, token=token)

            def detached(msg: dict, frames: list):
                return msg if msg["trainer_id"] == trainer_id else KEEP_WAITING

            deadline = time.monotonic() + min(2.0, self.timeout_s)
            self._conn.wait({"detached": detached}, deadline=deadline, what="reply to detach", peer=self)
        except (PixpoolError, Lost, zmq.ZMQError) as exc:
            log.info("detaching trainer %d from the pixpool daemon at %s: %s", trainer_id, self.endpoint, exc)

    # -- iteration ----------------------------------------------------------------------
    def epoch(self, epoch: int, *, start_batch: int = 0) -> Iterator[TrainerBatch]:
        """Yield the batches of ``epoch`` from ``start_batch`` on, in order.

        One iterator at a time: starting another one ends this one.
        """
        if self.closed:
            raise self._closed_error()
        return self._epoch(epoch, start_batch)

    def _closed_error(self) -> ClosedError:
        return ClosedError(
            f"this Client of the pixpool daemon at {self.endpoint} is closed; "
            "iterate before close() (inside its with block), or make a new one"
        )

    def _epoch(self, epoch: int, start_batch: int) -> Iterator[TrainerBatch]:
        self._generation += 1
        mine = self._generation
        b = start_batch
        self.position = (epoch, b)
        try:
            while True:
                try:
                    flow = self._flow
                    if flow is None:
                        raise self._closed_error()  # closed while this iterator was suspended
                    n = flow.start(epoch, b)
                    while b < n:
                        flow.release_returned()
                        t_wait = time.perf_counter()
                        msg, frames = flow.next_ready(epoch, b)
                        t0 = time.perf_counter()
                        self.data_wait.add(t0 - t_wait)
                        arrays = self._reader.arrays(msg, frames)
                        lend = self._lends and self._reader.ring is not None and flow.lent < self.layout.slots - 1
                        out = to_batch(arrays, msg, self._conversion, self.settings, lend=lend)
                        if lend:
                            flow.lend(arrays[0], msg)
                        elif self._release_at_once:
                            # The batch is the caller's own copy: the slot is free for the
                            # workers during the caller's step, not only after it.
                            flow.release(msg)
                        else:
                            flow.held = msg
                        del arrays
                        if self.timings is not None:
                            self.timings["deliver_s"] = self.timings.get("deliver_s", 0.0) + time.perf_counter() - t0
                            self.timings["batches"] = self.timings.get("batches", 0) + 1
                        yield out
                        if self.closed:
                            raise self._closed_error()  # closed while the caller held this batch
                        if self._generation != mine:
                            raise PixpoolError(
                                f"this iterator over epoch {epoch} was replaced by a newer Client.epoch() call; "
                                "use one at a time"
                            )
                        flow.release_held()
                        b += 1
                        self.position = (epoch, b)
                    return
                except Lost:
                    self._reattach()
        finally:
            # Only the current iterator owns the held slot (an old one may be collected late).
            if self._generation == mine and self._flow is not None and self._conn.usable:
                try:
                    self._flow.release_held()
                except zmq.ZMQError:
                    pass

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """Detach (the daemon unlinks this trainer's ring) and close everything; idempotent."""
        if self.closed:
            return
        if self._ident is not None and self._conn is not None and self._conn.usable:
            self._flow = None  # what it holds goes with the ring
            self._detach(*self._ident)
        self._ident = None
        self._teardown()

    def _teardown(self) -> None:
        self.closed = True
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._conn is not None:
            self._conn.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._ctx is not None:
            self._ctx.term()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
