"""The producer daemon: one control loop over trainer sockets and worker pipes.

Runs in the daemon process (``pixpool serve`` or ``run_daemon`` in a spawned process). It
owns every batch ring it creates and unlinks each one itself; the snapshot it unlinks only
when it created it and was not asked to keep it (``run_daemon``).

The loop is single-threaded: one ``zmq.Poller`` watches the ROUTER socket(s) (ipc, and TCP
with CURVE when asked) and every worker's pipe. Each turn it
1. handles trainer messages (``shared.protocol``; anything malformed gets an ``error`` reply
   and the loop goes on), 2. collects finished jobs and announces batches in order,
3. respawns dead workers and re-queues their job (bytes depend only on the job, so a re-run
   is identical), 4. detaches trainers whose process is gone or whose heartbeat is older
   than ``heartbeat_timeout_s`` (ring unlinked, slots reclaimed), 5. hands free workers jobs.
SIGTERM/SIGINT set a flag; shutdown then tells every trainer ``stopped``, stops the workers
(stop -> join -> terminate -> kill), unlinks the rings and removes the socket file.

Local trainers (``delivery="shm"``) read slots in place; remote ones (``"frames"``) get the
slot's bytes as three zero-copy frames after the ``ready`` message and release the slot the
same way, so credit-based backpressure is identical.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import multiprocessing as mp
import os
import secrets
import signal
import socket as _socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
import zmq

from ..shared import endpoint as ep
from ..shared import protocol as proto
from ..shared.config import StreamSettings
from ..shared.errors import CapacityError, ConfigError, DaemonStopped, PixpoolError, ProtocolError
from ..shared.names import ring_segment
from ..shared.ring import MAX_SLOTS, MIN_SLOTS, Ring, RingLayout
from ..shared.shm import unlink_segment
from . import route as _route
from .scheduler import Scheduler
from .worker import WorkerHandle, spawn_worker, stop_worker, stop_workers

log = logging.getLogger(__name__)

_POLL_MS = 100
_LIVENESS_EVERY_S = 0.25


@dataclass
class _Trainer:
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
    local: bool
    attached_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)


class Daemon:
    """Serve ``source`` (an ImageSource picklable by name, e.g. a Snapshot) to trainers."""

    def __init__(
        self,
        source: Any,
        *,
        workers: int = 2,
        socket_dir: str | os.PathLike | None = None,
        tcp: str | None = None,
        keys_dir: str | os.PathLike | None = None,
        heartbeat_timeout_s: float = 10.0,
        route: str | None = None,
        snapshot_info: dict | None = None,
        max_ring_nbytes: int = 2 << 30,
        max_total_ring_nbytes: int | None = None,
        max_trainers: int = 64,
        job_timeout_s: float = 300.0,
    ):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"--workers {workers!r}: the daemon needs at least one worker")
        if tcp is not None and keys_dir is None:
            raise ConfigError("--tcp requires CURVE keys: make them with `pixpool keys DIR` and pass --keys DIR")
        if heartbeat_timeout_s <= 0:
            raise ConfigError(f"--heartbeat-timeout-s {heartbeat_timeout_s} must be positive")
        self.source = source
        self.num_workers = workers
        self.socket_dir = socket_dir
        self.tcp = tcp
        self.keys_dir = keys_dir
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        self.route_name = route
        self.route = _route.load(route)
        self.snapshot_info = dict(snapshot_info or {})
        self.max_ring_nbytes = max_ring_nbytes
        # Rings live in /dev/shm beside the snapshot: by default all of them together may
        # take at most half of what /dev/shm had free when the daemon started.
        self.max_total_ring_nbytes = _default_ring_budget() if max_total_ring_nbytes is None else max_total_ring_nbytes
        self.max_trainers = max_trainers
        self.job_timeout_s = float(job_timeout_s)
        self.pid = os.getpid()
        self.host = _socket.gethostname()
        self.scheduler = Scheduler()
        self.trainers: dict[int, _Trainer] = {}
        self.workers: list[WorkerHandle] = []
        self.worker_restarts = 0
        self._ids = itertools.count(1)
        self._stop_reason: str | None = None
        self._started = time.monotonic()
        self._start_failures = 0
        self._fatal: str | None = None
        self.endpoint: str | None = None
        self._socket_path: str | None = None
        self._lock_fd: int | None = None
        self._remote: zmq.Socket | None = None

    # -- public -------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Safe from a signal handler: the loop notices within one poll interval."""
        if self._stop_reason is None:
            self._stop_reason = reason

    def serve(self) -> None:
        """Run until ``request_stop`` (or SIGTERM/SIGINT when on the main thread)."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda signum, _frame: self.request_stop(f"signal {signal.Signals(signum).name}"))
        ctx = zmq.Context()
        auth = None
        socks: list[zmq.Socket] = []
        self._ctx = ctx
        self._mp = mp.get_context("spawn")
        try:
            local = ctx.socket(zmq.ROUTER)
            local.setsockopt(zmq.LINGER, 0)
            local.setsockopt(zmq.ROUTER_MANDATORY, 0)
            # A frame over MAX_WIRE_BYTES makes libzmq drop the peer before allocating it;
            # smaller oversized frames reach decode(), which answers with an error.
            local.setsockopt(zmq.MAXMSGSIZE, proto.MAX_WIRE_BYTES)
            socks.append(local)
            self._bind_local(local)
            if self.tcp is not None:
                host, port = ep.parse_tcp(self.tcp)
                auth = ep.start_authenticator(ctx, self.keys_dir)
                remote = ctx.socket(zmq.ROUTER)
                socks.append(remote)  # closed in _shutdown even if binding fails (ctx.term waits for it)
                remote.setsockopt(zmq.LINGER, 0)
                remote.setsockopt(zmq.MAXMSGSIZE, proto.MAX_WIRE_BYTES)
                ep.configure_server(remote, self.keys_dir)
                _bind(remote, f"tcp://{host}:{port}")
                self._remote = remote
            for i in range(self.num_workers):  # appended one by one: _shutdown reaps those started if a spawn fails
                self.workers.append(spawn_worker(self._mp, i, self.source, self.route_name))
            log.info("daemon %d serving %s on %s with %d workers", self.pid, self.snapshot_info.get("name", "source"), self.endpoint, self.num_workers)
            self._loop(socks)
        finally:
            self._shutdown(socks)
            if auth is not None:
                auth.stop()
            ctx.term()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self._fatal is not None:
            raise DaemonStopped(self._fatal)

    # -- setup --------------------------------------------------------------------------
    def _bind_local(self, sock: zmq.Socket) -> None:
        path = ep.socket_path(self.socket_dir, create=True)
        # One daemon per socket directory, decided by a lock the kernel drops when the
        # holder dies: two daemons starting at once cannot both bind (libzmq's ipc bind
        # would replace the other's socket file).
        lock_fd = os.open(path.parent / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise ConfigError(f"another pixpool daemon already serves {path.parent}; stop it or use another --socket-dir") from None
        self._lock_fd = lock_fd
        if path.exists():
            if _daemon_answers(self._ctx, f"ipc://{path}"):
                raise ConfigError(f"another pixpool daemon already serves {path}; stop it or use another --socket-dir")
            path.unlink()  # left by a killed daemon
        self.endpoint = f"ipc://{path}"
        _bind(sock, self.endpoint)
        os.chmod(path, 0o600)
        self._socket_path = str(path)

    # -- loop ---------------------------------------------------------------------------
    def _loop(self, socks: list[zmq.Socket]) -> None:
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)
        fds = {}
        for w in self.workers:
            fds[w.conn.fileno()] = w
            poller.register(w.conn.fileno(), zmq.POLLIN)
        last_liveness = 0.0
        while self._stop_reason is None:
            try:
                events = dict(poller.poll(_POLL_MS))
            except zmq.error.InterruptedSystemCall:  # a signal arrived; the flag is checked above
                continue
            for s in socks:
                if s in events:
                    self._drain(s)
            for fd, w in list(fds.items()):
                if fd in events:
                    self._from_worker(w, poller, fds)
            now = time.monotonic()
            if now - last_liveness >= _LIVENESS_EVERY_S:
                last_liveness = now
                for w in list(fds.values()):
                    if w.process.exitcode is None and w.job is not None and now - w.job_started > self.job_timeout_s:
                        # A worker stuck in one batch holds its slot forever: kill it; the
                        # dead-worker path below re-runs the job in a fresh one.
                        log.warning("worker %d (pid %s) spent over %.0f s on batch %d; killing it", w.index, w.pid, self.job_timeout_s, w.job.batch)
                        w.process.kill()
                        w.process.join(5.0)
                    if w.process.exitcode is not None:
                        self._worker_died(w, poller, fds)
                self._check_trainers(now)
            self._dispatch()

    def _drain(self, sock: zmq.Socket) -> None:
        for _ in range(1000):  # bounded so workers get attention under a flood
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            identity, body = frames[0], frames[1:]
            try:
                if len(body) != 1:
                    raise ProtocolError(f"expected one message frame, got {len(body)}")
                msg = proto.decode(body[0])
                self._handle(sock, identity, msg)
            except (ProtocolError, ConfigError) as exc:
                code = "protocol" if isinstance(exc, ProtocolError) else "config"
                self._send(sock, identity, proto.error_frame(code, str(exc)))
            except PixpoolError as exc:
                self._send(sock, identity, proto.error_frame(type(exc).__name__, str(exc)))
            except Exception as exc:  # a bug must not take the service down for everyone
                log.exception("request %r failed", body[:1])
                self._send(sock, identity, proto.error_frame("internal", f"{type(exc).__name__}: {exc}"))

    def _send(self, sock: zmq.Socket, identity: bytes, frame: bytes, *extra: Any) -> None:
        try:
            sock.send_multipart([identity, frame, *extra], zmq.NOBLOCK, copy=not extra)
        except zmq.ZMQError as exc:  # peer gone or its queue full: it will time out or re-sync
            log.debug("dropping reply to %r: %s", identity, exc)

    def _trainer_for(self, msg: dict) -> _Trainer:
        t = self.trainers.get(msg["trainer_id"])
        if t is None or t.token != msg["token"]:
            raise _Unknown(msg["trainer_id"])
        t.last_seen = time.monotonic()
        return t

    def _handle(self, sock: zmq.Socket, identity: bytes, msg: dict) -> None:
        op = msg["op"]
        if op == "status":
            self._send(sock, identity, proto.encode("status", **self.status()))
            return
        if op == "attach":
            self._attach(sock, identity, msg)
            return
        try:
            t = self._trainer_for(msg)
        except _Unknown as exc:
            self._send(sock, identity, proto.error_frame("unknown_trainer", f"trainer {exc.trainer_id} is not attached to daemon {self.pid} (detached, or the daemon restarted); attach again", trainer_id=exc.trainer_id))
            return
        if op == "heartbeat":
            self._send(sock, identity, proto.encode("heartbeat", trainer_id=t.trainer_id))
        elif op == "start":
            if msg["epoch"] < 0 or msg["batch"] < 0:
                raise ProtocolError(f"start at epoch {msg['epoch']} batch {msg['batch']}: both must be >= 0")
            t.sock, t.identity = sock, identity
            n = self.route.num_batches(len(self.source), t.settings, msg["epoch"])
            self.scheduler.start(t.trainer_id, epoch=msg["epoch"], batch=msg["batch"], num_batches=n)
            self._send(sock, identity, proto.encode("started", trainer_id=t.trainer_id, epoch=msg["epoch"], batch=msg["batch"], num_batches=n))
        elif op == "release":
            try:
                self.scheduler.release(t.trainer_id, msg["slot"])
            except ProtocolError as exc:
                self._send(sock, identity, proto.error_frame("order", str(exc), trainer_id=t.trainer_id))
        elif op == "detach":
            self._detach(t.trainer_id, "trainer detached")
            self._send(sock, identity, proto.encode("detached", trainer_id=t.trainer_id))

    def _attach(self, sock: zmq.Socket, identity: bytes, msg: dict) -> None:
        settings = StreamSettings.from_dict(msg["settings"])
        if settings.augment.imgsz != self.source.imgsz:
            raise ConfigError(f"trainer asks for imgsz {settings.augment.imgsz} but the daemon's snapshot is prepared at {self.source.imgsz}; set augment.imgsz={self.source.imgsz} or serve another snapshot")
        slots = msg["slots"]
        if not MIN_SLOTS <= slots <= MAX_SLOTS:
            raise ConfigError(f"slots {slots} is out of range; use {MIN_SLOTS} to {MAX_SLOTS}")
        if msg["delivery"] not in ("shm", "frames"):
            raise ConfigError(f"delivery {msg['delivery']!r}: use 'shm' (same machine) or 'frames' (TCP)")
        if msg["delivery"] == "shm" and sock is self._remote:
            raise ConfigError("delivery 'shm' is for trainers on the daemon's machine; over TCP use delivery 'frames'")
        max_t = max(1, self.route.max_targets(self.source.max_instances, settings))
        layout = RingLayout(slots=slots, batch_size=settings.batch_size, imgsz=self.source.imgsz, max_targets=max_t)
        if layout.nbytes > self.max_ring_nbytes:
            raise CapacityError(f"a ring of {slots} slots for batch {settings.batch_size} at imgsz {self.source.imgsz} needs {layout.nbytes} bytes, over the daemon's limit of {self.max_ring_nbytes}; use fewer slots or a smaller batch")
        in_rings = sum(t.ring.layout.nbytes for t in self.trainers.values())
        if in_rings + layout.nbytes > self.max_total_ring_nbytes:
            raise CapacityError(f"a ring of {layout.nbytes} bytes on top of the {in_rings} bytes of attached trainers' rings exceeds the daemon's "
                                f"budget of {self.max_total_ring_nbytes} bytes; use fewer slots or a smaller batch, or raise max_total_ring_nbytes")
        if len(self.trainers) >= self.max_trainers:
            raise CapacityError(f"{len(self.trainers)} trainers are attached, the daemon's limit; detach one or raise max_trainers")
        tid = next(self._ids)
        name = ring_segment(self.pid, tid)
        # A ring with this daemon's pid can only be a leftover of a killed daemon whose pid
        # was reused: nobody live owns it.
        unlink_segment(name)
        ring = Ring.create(name, layout)
        local = sock is not self._remote and msg["host"] == self.host
        t = _Trainer(tid, secrets.randbits(62), settings, settings.to_dict(), msg["pid"], msg["host"], msg["delivery"], sock, identity, ring, local)
        self.trainers[tid] = t
        self.scheduler.add(tid, settings, slots)
        log.info("trainer %d attached (pid %d, seed %d, batch %d, ring %s of %d bytes)", tid, t.pid, settings.seed, settings.batch_size, ring.name, layout.nbytes)
        self._send(sock, identity, proto.encode("attached", trainer_id=tid, token=t.token, ring=ring.name, layout=layout.to_dict(), num_records=len(self.source), daemon_pid=self.pid, host=self.host))

    def _detach(self, trainer_id: int, reason: str) -> None:
        t = self.trainers.pop(trainer_id, None)
        if t is None:
            return
        self.scheduler.remove(trainer_id)
        for w in self.workers:
            try:
                w.send({"op": "forget", "ring": t.ring.name})
            except (OSError, ValueError):
                pass
        t.ring.close()
        t.ring.unlink()
        log.info("trainer %d detached: %s; ring %s removed", trainer_id, reason, t.ring.name)

    def _check_trainers(self, now: float) -> None:
        for t in list(self.trainers.values()):
            if t.local and t.pid > 0 and not psutil.pid_exists(t.pid):
                self._detach(t.trainer_id, f"process {t.pid} is gone")
            elif now - t.last_seen > self.heartbeat_timeout_s:
                self._detach(t.trainer_id, f"no heartbeat for {now - t.last_seen:.1f} s (timeout {self.heartbeat_timeout_s} s)")

    # -- workers ------------------------------------------------------------------------
    def _dispatch(self) -> None:
        for w in self.workers:
            if not w.ready or w.job is not None:
                continue
            job = self.scheduler.next_job()
            if job is None:
                return
            t = self.trainers[job.trainer_id]
            size = self.route.batch_size_of(len(self.source), t.settings, job.epoch, job.batch)
            w.job, w.job_started = job, time.monotonic()
            try:
                w.send({"op": "job", "job": job.job_id, "ring": t.ring.name, "slot": job.slot, "settings": t.settings_dict, "epoch": job.epoch, "batch": job.batch, "size": size})
            except (OSError, ValueError):
                pass  # the worker died; the liveness check re-queues its job

    def _from_worker(self, w: WorkerHandle, poller: zmq.Poller, fds: dict) -> None:
        try:
            while w.conn.poll(0):
                reply = w.recv()
                if reply.get("op") == "hello":
                    w.pid, w.ready = reply["pid"], True
                    w.ready_s = time.monotonic() - w.spawned_at
                    continue
                job = w.job
                if job is None or reply.get("job") != job.job_id:
                    continue  # not the job this worker holds: keep waiting for that one
                w.job = None
                w.busy_s += time.monotonic() - w.job_started
                if reply["ok"]:
                    w.batches_done += 1
                    for a in self.scheduler.complete(job, size=reply["size"], n_targets=reply["n_targets"]):
                        self._announce(a)
                else:
                    self.scheduler.fail(job)
                    t = self.trainers.get(job.trainer_id)
                    if t is not None:
                        self._send(t.sock, t.identity, proto.error_frame("render", f"batch {job.batch} of epoch {job.epoch} failed in worker {w.pid}: {reply['error']}", trainer_id=t.trainer_id))
        except (EOFError, OSError):
            self._worker_died(w, poller, fds)

    def _announce(self, a) -> None:
        t = self.trainers[a.trainer_id]
        frame = proto.encode("ready", trainer_id=a.trainer_id, slot=a.slot, epoch=a.epoch, batch=a.batch, size=a.size, n_targets=a.n_targets)
        if t.delivery == "frames":
            r = t.ring
            extra = [r.images(a.slot, a.size).data, r.targets(a.slot, a.n_targets).data, r.samples(a.slot, a.size).data]
            self._send(t.sock, t.identity, frame, *extra)
        else:
            self._send(t.sock, t.identity, frame)

    def _worker_died(self, w: WorkerHandle, poller: zmq.Poller, fds: dict) -> None:
        fd = w.conn.fileno()
        if fds.pop(fd, None) is None:
            return
        poller.unregister(fd)
        w.process.join(1.0)
        code = w.process.exitcode
        job = w.job
        stop_worker(w, timeout_s=1.0)
        if self._stop_reason is not None:
            return
        # A worker that dies before it is ready will die again: stop instead of looping.
        self._start_failures = 0 if w.ready else self._start_failures + 1
        if self._start_failures >= 3:
            self._fatal = f"augmentation workers die before they are ready (last exit code {code}); run `pixpool serve -v` and check the worker's error above"
            self.request_stop("workers cannot start")
            return
        log.warning("worker %d (pid %s) died with exit code %s%s; starting a new one", w.index, w.pid, code, f", re-running batch {job.batch} of trainer {job.trainer_id}" if job else "")
        if job is not None:
            self.scheduler.retry(job)
        new = spawn_worker(self._mp, w.index, self.source, self.route_name)
        new.batches_done, new.busy_s = w.batches_done, w.busy_s
        self.workers[w.index] = new
        self.worker_restarts += 1
        fds[new.conn.fileno()] = new
        poller.register(new.conn.fileno(), zmq.POLLIN)

    # -- status and shutdown -------------------------------------------------------------
    def status(self) -> dict:
        from .daemon_status import build_status

        return build_status(self)

    def _shutdown(self, socks: list[zmq.Socket]) -> None:
        reason = self._stop_reason or "daemon error"
        frame = proto.encode("stopped", reason=f"daemon {self.pid} stopped ({reason})")
        for t in self.trainers.values():
            self._send(t.sock, t.identity, frame)
        # Rings and the socket go first: a service manager's SIGKILL after its stop timeout
        # must not find them still there. A worker still writing into an unlinked ring
        # only writes into memory that goes away with its mapping.
        for tid in list(self.trainers):
            self._detach(tid, "daemon stopping")
        for s in socks:
            s.close(linger=0)
        if self._socket_path:
            try:
                os.unlink(self._socket_path)
            except FileNotFoundError:
                pass
        stop_workers(self.workers, timeout_s=5.0)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # released last: no new daemon binds while workers still run
        log.info("daemon %d stopped (%s)", self.pid, reason)


class _Unknown(Exception):
    def __init__(self, trainer_id: int):
        self.trainer_id = trainer_id


def _default_ring_budget() -> int:
    st = os.statvfs("/dev/shm")
    return st.f_bavail * st.f_frsize // 2


def _bind(sock: zmq.Socket, endpoint: str) -> None:
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise ConfigError(f"cannot listen on {endpoint}: {exc}; choose another address or --socket-dir") from None


def _daemon_answers(ctx: zmq.Context, endpoint: str, timeout_ms: int = 500) -> bool:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(endpoint)
        s.send(proto.encode("status"))
        return bool(s.poll(timeout_ms))
    finally:
        s.close(linger=0)


from .run import run_daemon  # noqa: E402  (re-export: the entry tests and the CLI use)

__all__ = ["Daemon", "run_daemon", "DaemonStopped"]
