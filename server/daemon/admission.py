"""Sockets and admission: where the daemon listens, who may talk to it, what a trainer may ask.

Runs in the daemon process.

- ``preflight`` checks every path, key and address of a ``DaemonConfig`` before anything
  is decoded or allocated: a bad socket directory or missing keys fail in a second, not
  after the whole dataset was prepared.
- ``Listener`` owns the daemon's ROUTER sockets: the local ipc one (one daemon per socket
  directory, decided by an ``flock`` the kernel drops when the holder dies; the lock file
  holds the daemon's pid, for people to read; a socket file left by a killed daemon is
  replaced; the directory is opened once and every file in it reached through that
  descriptor, so a directory swapped for a link after start changes nothing) and, when
  asked, a TCP one behind CURVE with a ZAP authenticator admitting only the keys in
  ``keys/authorized`` now (``authorized.py``). Frames over ``MAX_WIRE_BYTES`` make libzmq
  drop the peer before allocating them; ``intake.read_request`` bounds the frames and
  bytes of a whole message.
- ``sweep_rings`` removes the rings nobody holds (``shared.holds``): a live daemon maps
  each of its rings, so an unheld ring is a dead daemon's, whatever the pid in its name
  (PID 1 in every container); run at start and every ``SWEEP_EVERY_S`` while serving.
- ``ring_for`` decides an ``attach``: the trainer's settings (at the snapshot's imgsz) and the
  ring's bytes against the budgets
  (per ring, all rings, and the memory budget of snapshot plus rings). A refusal is an
  ``error`` reply to that trainer only; the others are served on.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os

import zmq

from ...shared.errors import CapacityError, ConfigError
from ...shared.stream import protocol as proto
from ...shared.stream.config import DaemonConfig, StreamSettings
from ...shared.transport import endpoint as ep
from ...shared.transport.control import request_status
from ...shared.transport.ring import MAX_SLOTS, MIN_SLOTS, RingLayout
from ...shared.transport.store import check_store, free_nbytes, size_nbytes
from .authorized import AuthorizedKeys

log = logging.getLogger(__name__)

_LOCK_NAME = "daemon.lock"


def preflight(config: DaemonConfig) -> DaemonConfig:
    """ConfigError for a store pixpool may not use (``shared.store.check_store``), a socket
    directory others can enter or another daemon serves, an over-long ipc path, a bad TCP
    address or unusable CURVE keys; creates the socket directory (mode 0700). Returns the
    config with the store's canonical path. ``Listener.open`` decides again at bind time
    (another daemon may start in between); this only makes the common mistakes fail before
    any decoding."""
    config = dataclasses.replace(config, store=check_store(config.store))
    path = ep.socket_path(config.socket_dir, create=True)
    if config.tcp is not None:
        ep.parse_tcp(config.tcp)
        ep.check_server_keys(config.keys_dir)
    if config.metrics_port is not None:
        _check_port_free(config.metrics_host, config.metrics_port)
    lock_path = path.parent / _LOCK_NAME
    if lock_path.exists():
        fd = os.open(lock_path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"another pixpool daemon already serves {path.parent}; stop it or use another --socket-dir"
            ) from None
        finally:
            os.close(fd)  # closing drops the probe's lock
    return config


class Listener:
    """The daemon's sockets (see module docstring). ``close`` the sockets first, ``release``
    the directory lock last, once the workers are gone."""

    def __init__(self, ctx: zmq.Context, config: DaemonConfig):
        self._ctx = ctx
        self.config = config
        self.sockets: list[zmq.Socket] = []
        self.remote: zmq.Socket | None = None
        self.endpoint: str | None = None
        self._socket_path: str | None = None
        self._lock_fd: int | None = None
        self._dir_fd: int | None = None  # the socket directory, opened once at bind
        self._auth = None
        self.authorized: AuthorizedKeys | None = None  # with TCP: the keys admitted now

    def open(self) -> list[zmq.Socket]:
        local = self._router()
        local.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self._bind_local(local)
        if self.config.tcp is not None:
            host, port = ep.parse_tcp(self.config.tcp)
            self.authorized = AuthorizedKeys(self.config.keys_dir)
            self.authorized.current()  # read once now: a bad folder is logged at start
            self._auth = ep.start_authenticator(self._ctx, self.config.keys_dir, self.authorized)
            remote = self._router()
            ep.configure_server(remote, self.config.keys_dir)
            _bind(remote, f"tcp://{host}:{port}")
            self.remote = remote
        return self.sockets

    def _router(self) -> zmq.Socket:
        sock = self._ctx.socket(zmq.ROUTER)
        self.sockets.append(sock)  # closed in close() even if binding fails (ctx.term waits for it)
        sock.setsockopt(zmq.LINGER, 0)
        # A frame over MAX_WIRE_BYTES makes libzmq drop the peer before allocating it;
        # smaller oversized frames reach decode(), which answers with an error.
        sock.setsockopt(zmq.MAXMSGSIZE, proto.MAX_WIRE_BYTES)
        return sock

    def _bind_local(self, sock: zmq.Socket) -> None:
        path = ep.socket_path(self.config.socket_dir, create=True)
        # Everything in the socket directory goes through one descriptor of it, opened now
        # (a symbolic link refused): if the directory is later moved and a link put in its
        # place, shutdown still removes this daemon's own socket file, not a file of that
        # name wherever the link points.
        try:
            dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ConfigError(
                f"cannot open the socket directory {path.parent} ({exc.strerror}); "
                "name a real directory with --socket-dir"
            ) from None
        self._dir_fd = dir_fd
        # One daemon per socket directory, decided by a lock the kernel drops when the
        # holder dies: two daemons starting at once cannot both bind (libzmq's ipc bind
        # would replace the other's socket file).
        lock_flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        lock_fd = os.open(_LOCK_NAME, lock_flags, 0o600, dir_fd=dir_fd)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise ConfigError(
                f"another pixpool daemon already serves {path.parent}; stop it or use another --socket-dir"
            ) from None
        self._lock_fd = lock_fd
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, f"{os.getpid()}\n".encode(), 0)
        sweep_rings(self.config.store)  # what a killed daemon (this directory's or another's) left
        if _exists_in(dir_fd, ep.SOCKET_NAME):
            if request_status(f"ipc://{path}", timeout_s=0.5, ctx=self._ctx) is not None:
                raise ConfigError(f"another pixpool daemon already serves {path}; stop it or use another --socket-dir")
            os.unlink(ep.SOCKET_NAME, dir_fd=dir_fd)  # left by a killed daemon
        self.endpoint = f"ipc://{path}"
        _bind_unix(sock, dir_fd, self.endpoint)
        os.chmod(ep.SOCKET_NAME, 0o600, dir_fd=dir_fd)
        self._socket_path = str(path)

    def is_remote(self, sock: zmq.Socket) -> bool:
        return sock is self.remote

    def close(self) -> None:
        """Close the sockets and remove the socket file (through the directory's descriptor)."""
        for s in self.sockets:
            s.close(linger=0)
        if self._socket_path and self._dir_fd is not None:
            try:
                os.unlink(ep.SOCKET_NAME, dir_fd=self._dir_fd)
            except FileNotFoundError:
                pass

    def release(self) -> None:
        """Stop the authenticator and drop the directory lock (no new daemon binds before)."""
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None


# How often a serving daemon sweeps the store for rings nobody holds: a killed daemon's
# ring goes within this long of its trainer letting go of it (a trainer that moves to a
# new ring removes the old one itself; this covers one that could not).
SWEEP_EVERY_S = 5.0


def sweep_rings(store: str | None = None) -> list[str]:
    """Remove this user's batch rings that no process holds (``shared.holds.remove_unused``):
    a live daemon holds every ring it serves and a trainer the ring it reads, in any PID
    namespace, so a ring nobody holds is a dead daemon's leftover. Returns the names removed."""
    from ...shared.transport.holds import remove_unused
    from ...shared.transport.names import list_segments, parse
    from ...shared.transport.shm import owner_of

    uid = os.geteuid()
    gone = []
    for name in list_segments(store):
        parsed = parse(name)
        if parsed is None or parsed.kind != "ring" or parsed.uid != uid or owner_of(name, store) != uid:
            continue
        if remove_unused([name], store) == "removed":
            gone.append(name)
    if gone:
        log.warning(
            "removed %d batch ring(s) that no process holds (their daemon died without cleaning up): %s",
            len(gone),
            ", ".join(gone),
        )
    return gone


def check_quota(config: DaemonConfig, client: str, held: int) -> None:
    """CapacityError when ``client`` already holds its share of sessions (``held``)."""
    if client and held >= config.max_trainers_per_client:
        who = f"CURVE key {client[4:]}" if client.startswith("key:") else f"uid {client[4:]}"
        raise CapacityError(
            f"{who} already has {held} trainers attached, the daemon's limit per client "
            f"(max_trainers_per_client = {config.max_trainers_per_client}); detach one of them "
            "or raise max_trainers_per_client (--max-trainers-per-client)"
        )


def ring_for(
    msg: dict,
    settings: StreamSettings,
    *,
    source,
    renderer,
    config: DaemonConfig,
    rings_nbytes: int,
    ring_budget_nbytes: int,
    trainers: int,
    snapshot_nbytes: int,
) -> RingLayout:
    """The ring an ``attach`` gets, or ConfigError/CapacityError saying what to change.

    ``settings`` are already at the snapshot's imgsz (``StreamSettings.for_imgsz``, which
    refused a trainer asking for another): the ring is sized by ``source.imgsz``."""
    slots = msg["slots"]
    if not MIN_SLOTS <= slots <= MAX_SLOTS:
        raise ConfigError(
            f"slots {slots} is out of range; use {MIN_SLOTS} to {MAX_SLOTS} (all workers render into one slot together, so {MAX_SLOTS} keep a trainer fed whatever the worker count)",
            field="slots",
        )
    if msg["delivery"] not in proto.DELIVERIES:
        raise ConfigError(
            f"delivery {msg['delivery']!r}: use {proto.DELIVERY_SHM!r} (same machine) or {proto.DELIVERY_FRAMES!r} (TCP)"
        )
    max_t = max(1, renderer.max_targets(source.max_instances, settings))
    layout = RingLayout(slots=slots, batch_size=settings.batch_size, imgsz=source.imgsz, max_targets=max_t)
    if layout.nbytes > config.max_ring_nbytes:
        raise CapacityError(
            f"a ring of {slots} slots for batch {settings.batch_size} at imgsz {source.imgsz} needs {layout.nbytes} bytes "
            f"({max_t} target rows per slot: the snapshot's densest image has {source.max_instances} instances), "
            f"over the daemon's limit of {config.max_ring_nbytes}; use fewer slots or a smaller batch, fix that image's labels, or raise max_ring_nbytes"
        )
    if rings_nbytes + layout.nbytes > ring_budget_nbytes:
        raise CapacityError(
            f"a ring of {layout.nbytes} bytes on top of the {rings_nbytes} bytes of attached trainers' rings exceeds the daemon's "
            f"budget of {ring_budget_nbytes} bytes; use fewer slots or a smaller batch, or raise max_total_ring_nbytes"
        )
    budget = config.memory_budget_nbytes
    if budget is not None and snapshot_nbytes + rings_nbytes + layout.nbytes > budget:
        raise CapacityError(
            f"a ring of {layout.nbytes} bytes on top of the snapshot's {snapshot_nbytes} and the attached trainers' {rings_nbytes} bytes "
            f"exceeds the daemon's memory budget of {budget} bytes (in use {snapshot_nbytes + rings_nbytes}); "
            "use fewer slots or a smaller batch, detach a trainer, or raise the budget (--memory-budget)"
        )
    if trainers >= config.max_trainers:
        raise CapacityError(f"{trainers} trainers are attached, the daemon's limit; detach one or raise max_trainers")
    return layout


class ShmWatch:
    """Warns once when the store's free space falls under a threshold, and once when it recovers.

    The default threshold is a tenth of the store's size: below it, the next preparation or
    ring may be refused and other programs using that file system may fail."""

    def __init__(self, warn_free_nbytes: int | None, store: str = "/dev/shm"):
        self.store = store
        self.size_nbytes = size_nbytes(store)
        self.warn_free_nbytes = self.size_nbytes // 10 if warn_free_nbytes is None else warn_free_nbytes
        self.low = False

    def check(self) -> bool:
        """True while free space is under the threshold."""
        free = free_nbytes(self.store)
        low = free < self.warn_free_nbytes
        if low and not self.low:
            log.warning(
                "the store %s has %d bytes free of %d, under the warning threshold of %d; remove old snapshots (`pixpool clean`), "
                "detach trainers, or enlarge it",
                self.store,
                free,
                self.size_nbytes,
                self.warn_free_nbytes,
            )
        elif self.low and not low:
            log.info("the store %s has %d bytes free again (threshold %d)", self.store, free, self.warn_free_nbytes)
        self.low = low
        return low


def default_ring_budget(store: str = "/dev/shm") -> int:
    """Rings live in the store beside the snapshot: by default all of them together may take
    at most half of what the store has free when the daemon starts."""
    return free_nbytes(store) // 2


def _check_port_free(host: str, port: int) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        raise ConfigError.for_field(
            "metrics_port",
            port,
            f"cannot be bound on {host} ({exc.strerror}); choose another {{metrics_port}} or {{metrics_host}}",
        ) from None


def _exists_in(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _bind_unix(sock: zmq.Socket, dir_fd: int, endpoint: str) -> None:
    """Bind the local ROUTER to a unix socket this process made in the directory ``dir_fd``.

    libzmq's own ipc bind and close each unlink the socket file by its path name (ipc_listener:
    before bind and on close), so a directory swapped for a link in between would make it
    remove a file elsewhere. Handed a listening descriptor (``ZMQ_USE_FD``) it unlinks
    nothing; ``Listener.close`` removes the file through ``dir_fd``. The bind names the
    directory by ``/proc/self/fd`` (the descriptor, not the path) where /proc is mounted.
    """
    import socket

    proc_dir = f"/proc/self/fd/{dir_fd}"
    where = proc_dir if os.path.isdir(proc_dir) else endpoint[len("ipc://") :].rpartition("/")[0]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(f"{where}/{ep.SOCKET_NAME}")
        listener.listen(128)
        listener.setblocking(False)
        sock.setsockopt(zmq.USE_FD, listener.fileno())
        _bind(sock, endpoint)
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot listen on {endpoint} ({exc}); choose another --socket-dir") from None
    except BaseException:
        listener.close()
        raise
    listener.detach()  # libzmq owns the descriptor now and closes it with the socket


def _bind(sock: zmq.Socket, endpoint: str) -> None:
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise ConfigError(f"cannot listen on {endpoint}: {exc}; choose another address or --socket-dir") from None
