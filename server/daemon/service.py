"""The producer daemon: one control loop over trainer sockets and worker pipes.

Runs in the daemon process (``pixpool serve``, or ``run_daemon`` in a spawned process). It
wires four parts together and owns none of their details:

- ``listener.Listener``: the ROUTER sockets (ipc, and TCP with CURVE when asked);
  ``admission.ring_for`` decides what an ``attach`` gets;
- ``sessions.Sessions``: attached trainers and their rings (the daemon unlinks each ring);
- ``supervisor.Supervisor``: the augmentation worker processes;
- ``metrics.Metrics`` (with ``metrics_port``): the Prometheus endpoint, fed the status reply
  every liveness tick; ``store_watch.StoreWatch`` warns when the store runs low;
- ``scheduler.Scheduler``: which part of which batch goes to which worker and slot (all
  workers fill one slot together), announced in order; once every part of a slot is in,
  the daemon packs its targets and writes its header (the one write the daemon makes into
  a ring, exactly once per announcement), and ``delivery`` sends it the trainer's way.

The loop is single-threaded: one ``zmq.Poller`` watches the sockets and every worker's
pipe. Each turn it 1. handles trainer messages (``shared.wire.trainer``, dispatched through
the op -> handler tables at the end of this module; anything malformed gets an ``error``
reply with a declared code and the loop goes on), 2. collects finished
jobs and announces batches in order, 3. every ``_LIVENESS_EVERY_S`` kills stuck workers,
replaces dead ones and detaches trainers that are gone or silent (and every
``sweeps.SWEEP_EVERY_S`` removes rings nobody holds: a killed daemon's), 4. hands free
workers jobs. SIGTERM/SIGINT set a flag; shutdown then tells every trainer ``stopped``, unlinks
the rings, closes the sockets, stops the workers and releases the socket directory.
The snapshot is not the daemon's to unlink: ``run.py`` decides that.
"""

from __future__ import annotations

import logging
import os
import signal
import socket as _socket
import threading
import time
from typing import Any, Callable

import zmq

from ...shared import __version__
from ...shared.errors import ConfigError, DaemonStopped, NotAuthorized, PixpoolError, ProtocolError
from ...shared.stream.config import DaemonConfig, StreamSettings
from ...shared.stream.path_table import PathTable
from ...shared.transport.procmem import pid_namespace
from ...shared.transport.spawn import spawn_context
from ...shared.wire.error_codes import error_frame, error_frame_for
from ...shared.wire.status import TRAINERS_BUDGET_BYTES, DaemonStatus, Health, SnapshotStatus, Status
from ...shared.wire.trainer import PROTOCOL_VERSION, RECORDS_PAGE, RECORDS_PAGE_BYTES, Op, decode, encode_reply
from . import admission, delivery, intake, sweeps
from . import renderer as _renderer
from .housekeeping import Housekeeping
from .listener import Listener
from .scheduler import Job, Scheduler
from .sessions import Sessions, TrainerSession, UnknownTrainer
from .store_watch import StoreWatch
from .supervisor import Supervisor

log = logging.getLogger(__name__)

_POLL_MS = 100
_LIVENESS_EVERY_S = 0.25


class Daemon:
    """Serve image sources (ImageSources picklable by name, e.g. Snapshots) to trainers.

    ``source`` is the training source, or a mapping split -> source (``train`` and, when a
    validation set is served, ``val``); ``snapshot_info`` and ``files`` likewise per split.
    ``renderer`` names the module the daemon and its workers render with (``renderer.py``
    says what it provides); tests name a stand-in, production keeps the default.
    """

    def __init__(
        self,
        source: Any,
        config: DaemonConfig,
        *,
        snapshot_info: dict | None = None,
        files=(),
        names: tuple[str, ...] = (),
        renderer: str = _renderer.DEFAULT_RENDERER,
    ):
        if not isinstance(config, DaemonConfig):
            raise TypeError(f"config must be a DaemonConfig, got {type(config).__name__}")
        per_split = isinstance(source, dict)
        self.sources = dict(source) if per_split else {"train": source}
        self.config = config
        self.renderer_name = renderer
        self.renderer = _renderer.load(renderer)
        self.split_info = dict(snapshot_info or {}) if per_split else {"train": dict(snapshot_info or {})}
        self.snapshot_info = self.split_info.get("train", {})
        # What trainers call their classes; files: their samples' image paths, per split, each
        # split's in one PathTable (a COCO-sized set's 118k paths as one buffer, not 118k strings).
        self.files = {k: _table(v) for k, v in dict(files).items()} if per_split else {"train": _table(files)}
        self.names = list(names)
        self.store = config.segment_store.checked()  # where the rings go (the snapshot's handle knows its own)
        self.ring_budget_nbytes, self.ring_budget_from = admission.ring_budget(config, self.store)
        # Snapshots' bytes (a source that is no Snapshot counts 0); one snapshot serving both
        # splits (same images) counts once.
        by_name = {getattr(src, "name", id(src)): getattr(src, "nbytes", None) for src in self.sources.values()}
        self.snapshot_nbytes = sum(sum(parts.values()) for parts in by_name.values() if isinstance(parts, dict))
        self.store_watch = StoreWatch(config.store_warn_free_nbytes, self.store)
        # The periodic steps: an OSError in one is counted and retried, never the daemon's end.
        self.housekeeping = Housekeeping()
        self.pid = os.getpid()
        self.pid_ns = pid_namespace()
        self.host = _socket.gethostname()
        self.started = time.monotonic()
        self.scheduler = Scheduler(parts=config.workers)
        self.sessions = Sessions(
            self.pid,
            self.scheduler,
            heartbeat_timeout_s=config.heartbeat_timeout_s,
            on_detach=self._forget_ring,
            store=self.store,
        )
        self.supervisor: Supervisor | None = None
        self.listener: Listener | None = None
        self.metrics = None  # metrics.Metrics while serving with metrics_port
        self._stop_reason: str | None = None
        self._admitted: frozenset[str] = frozenset()  # z85 keys in authorized/ at the last liveness tick
        self.fatal: str | None = None  # why the daemon stopped on its own (a lost segment)

    # -- public -------------------------------------------------------------------------
    @property
    def endpoint(self) -> str | None:
        return self.listener.endpoint if self.listener else None

    def request_stop(self, reason: str) -> None:
        """Safe from a signal handler: the loop notices within one poll interval."""
        if self._stop_reason is None:
            self._stop_reason = reason
        if self.supervisor is not None:
            self.supervisor.stopping = True

    def serve(self) -> None:
        """Run until ``request_stop`` (or SIGTERM/SIGINT when on the main thread)."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(
                    sig, lambda signum, _frame: self.request_stop(f"signal {signal.Signals(signum).name}")
                )
        ctx = zmq.Context()
        poller = zmq.Poller()
        self.listener = Listener(ctx, self.config)
        self.supervisor = Supervisor(
            spawn_context(),
            self.sources,
            self.renderer_name,
            self.scheduler,
            job_timeout_s=self.config.job_timeout_s,
            straggler_factor=self.config.straggler_factor,
            straggler_min_s=self.config.straggler_min_s,
            describe=self._describe,
            on_done=self._done,
            on_failed=self._failed,
            store=self.store,
        )
        try:
            socks = self.listener.open()
            self._check_keys()
            for s in socks:
                poller.register(s, zmq.POLLIN)
            self.supervisor.start(self.config.workers, poller)
            if self.config.metrics_port is not None:
                from .metrics import Metrics

                self.metrics = Metrics(self.config.metrics_host, self.config.metrics_port).start()
                self.metrics.publish(self.status())
            log.info(
                "daemon %d serving %s on %s with %d workers",
                self.pid,
                self.snapshot_info.get("name", "source"),
                self.endpoint,
                self.config.workers,
            )
            self._loop(poller, socks)
        finally:
            self._shutdown()
            ctx.term()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        fatal = self.fatal or self.supervisor.fatal
        if fatal is not None:
            raise DaemonStopped(fatal)

    # -- loop ---------------------------------------------------------------------------
    def _loop(self, poller: zmq.Poller, socks: list[zmq.Socket]) -> None:
        last_liveness, last_sweep = 0.0, time.monotonic()  # the listener swept at start
        # Every periodic step runs through ``housekeeping``: an OSError in one (EMFILE while a
        # flood holds the descriptors) is logged, counted and retried next tick.
        run = self.housekeeping.run
        guard = self.listener.guard  # with TCP: caps on connections still in their handshake
        if guard is not None:
            poller.register(guard.socket, zmq.POLLIN)
        while self._stop_reason is None:
            try:
                events = dict(poller.poll(_POLL_MS))
            except zmq.error.InterruptedSystemCall:  # a signal arrived; the flag is checked above
                continue
            if guard is not None and guard.socket in events:
                run("the TCP handshake guard", guard.on_events)
            for s in socks:
                if s in events:
                    self._drain(s)
            self.supervisor.on_events(events, poller)
            now = time.monotonic()
            if now - last_liveness >= _LIVENESS_EVERY_S:
                last_liveness = now
                self._check_segments()
                if self._stop_reason is not None:
                    return
                run("the worker check", self.supervisor.check, now, poller)
                run("the trainer check", self.sessions.check, now)
                self._check_keys()
                run("the store's free-space check", self.store_watch.check)
                if now - last_sweep >= sweeps.SWEEP_EVERY_S:
                    last_sweep = now
                    run(f"the sweep of {self.store}", sweeps.sweep_store, self.store)
                if guard is not None:
                    guard.prune(now)
                if self.metrics is not None:
                    run("publishing the metrics", self._publish_metrics)
            if self.supervisor.fatal is not None:
                self.request_stop("workers cannot start")
                return
            self.supervisor.dispatch()

    def _drain(self, sock: zmq.Socket) -> None:
        for _ in range(1000):  # bounded so workers get attention under a flood
            req = intake.read_request(sock, remote=self.listener.is_remote(sock))
            if req is None:
                return
            try:
                problem = req.problem()
                if problem is not None:
                    raise ProtocolError(problem)
                if self.listener.is_remote(sock) and not self._admits(req.peer):
                    # Its connection was admitted before the key left authorized/ (libzmq
                    # checks keys at the handshake only): refuse what it sends now.
                    raise NotAuthorized(self._not_authorized_text(req.peer[4:]))
                self._handle(sock, req, decode(req.frames[0]))
            except PixpoolError as exc:
                delivery.send(sock, req.identity, error_frame_for(exc))
            except Exception as exc:  # a bug must not take the service down for everyone
                log.exception("request %r failed", req.frames[:1])
                delivery.send(sock, req.identity, error_frame("internal", f"{type(exc).__name__}: {exc}"))

    def _handle(self, sock: zmq.Socket, req: intake.Request, msg: dict) -> None:
        """Dispatch a decoded request through the tables below ``Daemon``: requests open to any
        peer, and requests of an attached trainer's session (refused as ``unknown_trainer``
        for an id and token the daemon does not know)."""
        op = msg["op"]
        handler = _OPEN_REQUESTS.get(op)
        if handler is not None:
            handler(self, sock, req, msg)
            return
        try:
            t = self.sessions.get(msg)
        except UnknownTrainer as exc:
            delivery.send(
                sock,
                req.identity,
                error_frame(
                    "unknown_trainer",
                    f"trainer {exc.trainer_id} is not attached to daemon {self.pid} "
                    "(detached, or the daemon restarted); attach again",
                    trainer_id=exc.trainer_id,
                ),
            )
            return
        _SESSION_REQUESTS[op](self, sock, req.identity, t, msg)

    # -- requests open to any peer ------------------------------------------------------------
    def _on_status(self, sock: zmq.Socket, req: intake.Request, msg: dict) -> None:
        delivery.send(sock, req.identity, encode_reply(Op.STATUS, **self.status().to_wire()))

    def _on_health(self, sock: zmq.Socket, req: intake.Request, msg: dict) -> None:
        delivery.send(sock, req.identity, encode_reply(Op.HEALTH, **self.health().to_wire()))

    def _on_records(self, sock: zmq.Socket, req: intake.Request, msg: dict) -> None:
        split = msg.get("split", "train")
        files = self.files.get(split)
        start = msg["start"]
        if files is None or not 0 <= start <= len(files):
            raise ProtocolError(f"records from {start} of split {split!r}: the daemon serves {sorted(self.files)}")
        if msg.get("packed"):
            shapes = self._decoded_sizes(split) if msg.get("sizes") else None
            # 8 bytes of sizes a record: a page of short names holds at most RECORDS_PAGE_BYTES of them too.
            packed, count = files.page(start, RECORDS_PAGE_BYTES, None if shapes is None else RECORDS_PAGE_BYTES // 8)
            extra = {} if shapes is None else {"sizes": shapes[start : start + count].astype("<i4").tobytes()}
            reply = encode_reply(
                Op.RECORDS,
                start=start,
                total=len(files),
                files=[],
                names=self.names,
                packed=packed,
                count=count,
                **extra,
            )
        else:  # a trainer of an earlier release: names in a list, RECORDS_PAGE at a time, no more bytes than packed
            _, count = files.page(start, RECORDS_PAGE_BYTES)
            page = [files[i] for i in range(start, start + min(count, RECORDS_PAGE))]
            reply = encode_reply(Op.RECORDS, start=start, total=len(files), files=page, names=self.names)
        delivery.send(sock, req.identity, reply)

    def _decoded_sizes(self, split: str):
        """int64 (n, 2) decoded (height, width) of ``split``'s records (what rect validation batches
        are planned from), or None where its source keeps none."""
        from ..augment.val_rect import original_shapes

        try:
            return original_shapes(self.sources[split])
        except ConfigError:
            return None

    # -- requests of an attached trainer --------------------------------------------------------
    def _on_heartbeat(self, sock: zmq.Socket, identity: bytes, t: TrainerSession, msg: dict) -> None:
        wait = msg.get("data_wait_s")
        if isinstance(wait, (int, float)) and not isinstance(wait, bool) and 0 <= wait < 1e12:
            t.data_wait_s = float(wait)
        delivery.send(sock, identity, encode_reply(Op.HEARTBEAT, trainer_id=t.trainer_id))

    def _on_start(self, sock: zmq.Socket, identity: bytes, t: TrainerSession, msg: dict) -> None:
        if msg["epoch"] < 0 or msg["batch"] < 0:
            raise ProtocolError(f"start at epoch {msg['epoch']} batch {msg['batch']}: both must be >= 0")
        t.sock, t.identity = sock, identity
        records, settings, epoch = len(self.sources[t.settings.split]), t.settings, msg["epoch"]
        n = self.renderer.num_batches(records, settings, epoch)
        self.scheduler.start(
            t.trainer_id,
            epoch=epoch,
            batch=msg["batch"],
            num_batches=n,
            size_of=lambda b: self.renderer.batch_size_of(records, settings, epoch, b),
        )
        reply = encode_reply(Op.STARTED, trainer_id=t.trainer_id, epoch=msg["epoch"], batch=msg["batch"], num_batches=n)
        delivery.send(sock, identity, reply)

    def _on_release(self, sock: zmq.Socket, identity: bytes, t: TrainerSession, msg: dict) -> None:
        try:
            self.scheduler.release(
                t.trainer_id, msg["slot"], epoch=msg["epoch"], batch=msg["batch"], generation=msg["generation"]
            )
        except ProtocolError as exc:
            delivery.send(sock, identity, error_frame("order", str(exc), trainer_id=t.trainer_id))

    def _on_prove(self, sock: zmq.Socket, identity: bytes, t: TrainerSession, msg: dict) -> None:
        granted = self.sessions.prove(t, msg["nonce"])
        delivery.send(sock, identity, encode_reply(Op.PROVED, trainer_id=t.trainer_id, delivery=granted))

    def _on_detach(self, sock: zmq.Socket, identity: bytes, t: TrainerSession, msg: dict) -> None:
        self.sessions.detach(t.trainer_id, "trainer detached")
        delivery.send(sock, identity, encode_reply(Op.DETACHED, trainer_id=t.trainer_id))

    def _on_attach(self, sock: zmq.Socket, req: intake.Request, msg: dict) -> None:
        identity = req.identity
        admission.check_quota(self.config, req.peer, self.sessions.held_by(req.peer))
        settings = StreamSettings.from_dict(msg["settings"])
        source = self.sources.get(settings.split)
        if source is None:
            raise ConfigError(
                f"this daemon serves no {settings.split!r} split (it serves {sorted(self.sources)}); serve a validation set with "
                "--val DATA, or a data.yaml that names val:",
                field="split",
            )
        # A trainer that names no imgsz trains at the snapshot's; one naming another is refused here.
        settings = settings.for_imgsz(source.imgsz)
        # Where the trainer came in (ipc or TCP) does not decide its delivery: ``prove`` does.
        layout = admission.ring_for(
            msg,
            settings,
            source=source,
            renderer=self.renderer,
            config=self.config,
            rings_nbytes=self.sessions.rings_nbytes,
            ring_budget_nbytes=self.ring_budget_nbytes,
            ring_budget_from=self.ring_budget_from,
            trainers=len(self.sessions),
            snapshot_nbytes=self.snapshot_nbytes,
        )
        t = self.sessions.attach(msg, settings, layout, sock=sock, identity=identity, client=req.peer)
        spec = source.spec
        delivery.send(
            sock,
            identity,
            encode_reply(
                Op.ATTACHED,
                trainer_id=t.trainer_id,
                token=t.token,
                ring=t.ring.name,
                layout=layout.to_dict(),
                num_records=len(source),
                imgsz=source.imgsz,
                daemon_pid=self.pid,
                host=self.host,
                names=self.names,
                task=spec.name,
                kpt_shape=None if spec.kpt_shape is None else list(spec.kpt_shape),
                flip_idx=None if spec.flip_idx is None else list(spec.flip_idx),
                store=str(self.store),
                pid_ns=self.pid_ns,
                snapshot=self._identity(settings.split, source),
            ),
        )

    def _identity(self, split: str, source: Any) -> dict:
        """Which snapshot a trainer of ``split`` streams: a trainer that attaches again after a
        restart compares it with the one it began on (``client/client.py``). ``fingerprint``
        is the content's (``snapshot.fingerprint.content_fingerprint``; empty for a source
        that is no prepared snapshot, where records and names are what can be compared).
        ``served``: which files the split is (``shared.stream.served_data.describe``), which a
        trainer that names its data compares; absent for a source not read from files."""
        info = self.split_info.get(split, {})
        out = {"fingerprint": str(info.get("content", "")), "name": str(info.get("name", "")), "records": len(source)}
        if isinstance(info.get("served"), dict):
            out["served"] = info["served"]
        return out

    # -- supervisor callbacks ----------------------------------------------------------------
    def _describe(self, job: Job) -> dict:
        t = self.sessions.trainers[job.trainer_id]
        return {"ring": t.ring.name, "split": t.settings.split, "settings": t.settings_dict, "size": job.size}

    def _done(self, job: Job, counts: list) -> None:
        for a in self.scheduler.complete(job, counts=counts):
            t = self.sessions.trainers[a.trainer_id]
            # Every part is in and every duplicate of one was killed (supervisor): nothing
            # writes this slot any more. Pack, then the header, then announce, once.
            t.ring.pack_targets(a.slot, list(a.counts))
            t.ring.write_header(
                a.slot, epoch=a.epoch, batch=a.batch, size=a.size, n_targets=a.n_targets, generation=a.generation
            )
            delivery.announce(t, a)

    def _failed(self, job: Job, worker_pid: int, error: str) -> None:
        # A damaged snapshot fails every job: say that once, as the reason the daemon stops,
        # rather than as a render error per batch.
        self._check_segments()
        if self._stop_reason is not None:
            return
        t = self.sessions.trainers.get(job.trainer_id)
        if t is not None:
            delivery.tell(
                t,
                error_frame(
                    "render",
                    f"batch {job.batch} of epoch {job.epoch} failed in worker {worker_pid}: {error}",
                    trainer_id=t.trainer_id,
                ),
            )

    def _publish_metrics(self) -> None:
        guard = self.listener.guard
        self.metrics.publish(
            self.status(),
            housekeeping_errors=self.housekeeping.errors,
            handshakes_refused=guard.refused if guard is not None else 0,
        )

    def _check_segments(self) -> None:
        """``_check_segments_now``, an OSError in it counted and retried next tick (``housekeeping``):
        a look at the store that fails says nothing about the segments."""
        self.housekeeping.run("the segment check", self._check_segments_now)

    def _check_segments_now(self) -> None:
        """Notice segments removed from the store under the daemon (``rm``, a sweep by
        another tool), or truncated (``truncate -s``): never serve half. A lost ring costs
        its trainer a re-attach (it is told it is unknown, attaches again, gets a new ring
        and resumes at its position); a lost or truncated snapshot segment stops the daemon
        (exit non-zero, trainers told why), since a worker restarted later could not attach
        it, and a worker reading past a truncated end dies of SIGBUS on every batch."""
        damaged = {}
        for src in self.sources.values():
            if hasattr(src, "damaged_segments"):
                damaged.update(src.damaged_segments())
        shrunk = {name: what for name, what in sorted(damaged.items()) if what.startswith("was truncated")}
        if shrunk:
            what = "; ".join(f"snapshot segment {name} {w}" for name, w in shrunk.items())
            self.fatal = (
                f"{what} in {self.store} while daemon {self.pid} served it; every batch would fail "
                "(a worker reading past the end dies of SIGBUS), so the daemon stops. Find what "
                "truncates files in the store, then start the daemon again (it prepares the snapshot anew)"
            )
            log.error("%s", self.fatal)
            self.request_stop(what)
            return
        gone = sorted(damaged)
        if gone:
            self.fatal = (
                f"snapshot segment(s) {', '.join(gone)} were removed from {self.store} while daemon {self.pid} served them; "
                "stopping rather than serving half. Start the daemon again (it prepares the snapshot anew)"
            )
            log.error("%s", self.fatal)
            self.request_stop(f"snapshot removed from {self.store}")
            return
        for t in list(self.sessions.trainers.values()):
            if not t.ring.present():
                log.error(
                    "trainer %d: its ring %s was removed from %s; detaching it so that it attaches again to a new ring",
                    t.trainer_id,
                    t.ring.name,
                    self.store,
                )
                delivery.tell(
                    t,
                    error_frame(
                        "unknown_trainer",
                        f"ring {t.ring.name} was removed from {self.store}; attach again",
                        trainer_id=t.trainer_id,
                    ),
                )
                self.sessions.detach(t.trainer_id, f"ring {t.ring.name} removed from {self.store}")

    def _check_keys(self) -> None:
        """With TCP: take in changes to authorized/ and end the sessions of removed keys. A
        look at the folder that fails keeps the last complete read (``authorized.py``); any
        other OSError is counted and retried next tick, ending no session."""
        if self.listener is None or self.listener.authorized is None:
            return
        try:
            self._admitted = self.listener.authorized.current()
        except OSError as exc:
            self.housekeeping.failed("the authorized-keys check", exc)
            return
        for t in list(self.sessions.trainers.values()):
            if t.client.startswith("key:") and t.client[4:] not in self._admitted:
                log.warning(
                    "trainer %d: its CURVE key %s was removed from %s; ending its session",
                    t.trainer_id,
                    t.client[4:],
                    self.listener.authorized.folder,
                )
                text = self._not_authorized_text(t.client[4:])
                delivery.tell(t, error_frame("not_authorized", text, trainer_id=t.trainer_id))
                self.sessions.detach(t.trainer_id, "its CURVE key is no longer authorized")

    def _admits(self, peer: str) -> bool:
        """``peer`` (``key:<z85>``) is in authorized/: the set of the last tick, or, for a key
        not in it (added since), the folder read again."""
        if peer[4:] in self._admitted:
            return True
        self._admitted = self.listener.authorized.current()
        return peer.startswith("key:") and peer[4:] in self._admitted

    def _not_authorized_text(self, key: str) -> str:
        folder = self.listener.authorized.folder
        return (
            f"daemon {self.pid} does not authorize CURVE key {key}: it is not (or no longer) in {folder} "
            f"on {self.host}; have the daemon's operator copy this trainer's client.key into {folder}/ "
            "(`pixpool keys DIR` makes a pair and authorizes it)"
        )

    def _forget_ring(self, ring_name: str) -> None:
        if self.supervisor is not None:
            self.supervisor.forget_ring(ring_name)

    # -- status and shutdown -------------------------------------------------------------
    def status(self) -> Status:
        """The ``status`` reply (``shared.wire.status``): the daemon's own figures, each split's
        snapshot, the supervisor's workers and, as many as fit, the sessions' trainers."""
        now = time.monotonic()
        cfg = self.config
        guard = self.listener.guard if self.listener is not None else None
        daemon = DaemonStatus(
            pid=self.pid,
            host=self.host,
            store=str(self.store),
            pid_ns=self.pid_ns,
            version=__version__,
            protocol=PROTOCOL_VERSION,
            endpoint=self.endpoint or "",
            tcp=cfg.tcp or "",
            uptime_s=round(now - self.started, 3),
            worker_restarts=self.supervisor.restarts,
            redispatched_jobs=self.supervisor.redispatched,
            heartbeat_timeout_s=cfg.heartbeat_timeout_s,
            memory_budget_nbytes=cfg.memory_budget_nbytes,
            store_warn_free_nbytes=self.store_watch.warn_free_nbytes,
            store_low=self.store_watch.low,
            metrics=f"http://{cfg.metrics_host}:{cfg.metrics_port}/metrics" if cfg.metrics_port else "",
            trainers_total=len(self.sessions),
            housekeeping_errors=self.housekeeping.errors_total,
            tcp_handshakes_refused=guard.refused if guard else 0,
        )
        splits = {split: self._snapshot_status(split, src) for split, src in self.sources.items()}
        return Status(
            daemon=daemon,
            snapshot=splits["train"],
            splits=splits,
            workers=self.supervisor.describe(),
            trainers=self.sessions.describe(now, TRAINERS_BUDGET_BYTES),
        )

    def _snapshot_status(self, split: str, source: Any) -> SnapshotStatus:
        """A split's snapshot: the source's shape and what ``run.py`` knows of the snapshot it prepared."""
        return SnapshotStatus(
            records=len(source),
            imgsz=source.imgsz,
            max_instances=source.max_instances,
            task=source.spec.name,
            **self.split_info.get(split, {}),
        )

    def health(self) -> Health:
        """The ``health`` reply: alive (it answered), healthy (serving, not stopping), counts."""
        return Health(
            pid=self.pid,
            healthy=self.fatal is None and self._stop_reason is None and self.supervisor.fatal is None,
            trainers=self.sessions.training,
            workers_ready=self.supervisor.workers_ready,
            uptime_s=round(time.monotonic() - self.started, 3),
        )

    def _shutdown(self) -> None:
        reason = self._stop_reason or "daemon error"
        frame = encode_reply(Op.STOPPED, reason=f"daemon {self.pid} stopped ({reason})")
        for t in self.sessions.trainers.values():
            delivery.tell(t, frame)
        # Rings and the socket go first: a service manager's SIGKILL after its stop timeout
        # must not find them still there. A worker still writing into an unlinked ring
        # only writes into memory that goes away with its mapping.
        self.sessions.detach_all("daemon stopping")
        if self.metrics is not None:
            self.metrics.stop()
        self.listener.close()
        self.supervisor.stop(timeout_s=5.0)
        self.listener.release()  # the lock goes last: no new daemon binds while workers still run
        log.info("daemon %d stopped (%s)", self.pid, reason)


# op -> handler: every request is handled by exactly one entry of these two tables
# (``tests/unit/test_protocol.py`` checks they cover ``REQUESTS``).
def _table(files) -> PathTable:
    """A split's image paths as a PathTable (a list or tuple of paths is packed once)."""
    return files if isinstance(files, PathTable) else PathTable.from_paths(files)


_OPEN_REQUESTS: dict[Op, Callable[[Daemon, zmq.Socket, intake.Request, dict], None]] = {
    Op.ATTACH: Daemon._on_attach,
    Op.STATUS: Daemon._on_status,
    Op.HEALTH: Daemon._on_health,
    Op.RECORDS: Daemon._on_records,
}
_SESSION_REQUESTS: dict[Op, Callable[[Daemon, zmq.Socket, bytes, TrainerSession, dict], None]] = {
    Op.HEARTBEAT: Daemon._on_heartbeat,
    Op.START: Daemon._on_start,
    Op.RELEASE: Daemon._on_release,
    Op.PROVE: Daemon._on_prove,
    Op.DETACH: Daemon._on_detach,
}
