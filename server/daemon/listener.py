"""``Listener``: the daemon's sockets, where it listens and who may talk to it.

Runs in the daemon process. It owns the daemon's ROUTER sockets: the local ipc one (one
daemon per socket directory, decided by an ``flock`` the kernel drops when the holder dies;
the lock file holds the daemon's pid, for people to read; a socket file left by a killed
daemon is replaced; the directory is opened once and every file in it reached through that
descriptor, so a directory swapped for a link after start changes nothing) and, when asked,
a TCP one behind CURVE with a ZAP authenticator admitting only the keys in
``keys/authorized`` now (``authorized.py``). Frames over ``MAX_WIRE_BYTES`` make libzmq drop
the peer before allocating them; ``intake.read_request`` bounds the frames and bytes of a
whole message. Binding sweeps the rings a killed daemon left (``sweeps.py``).

Connections that never finish their handshake are bounded: before binding, the
listener raises the process's soft open-file limit to the hard one (``descriptors.py``);
every ROUTER closes a connection whose handshake has not completed in
``handshake_guard.HANDSHAKE_S``; on the TCP one a ``HandshakeGuard`` caps those connections
per peer address and in all, from the descriptors free at start.
"""

from __future__ import annotations

import fcntl
import os

import zmq

from ...shared.errors import ConfigError
from ...shared.stream.config import DaemonConfig
from ...shared.transport import endpoint as ep
from ...shared.transport.control import request_status
from ...shared.wire.trainer import MAX_WIRE_BYTES
from .authorized import AuthorizedKeys
from .descriptors import open_descriptors, raise_nofile_limit
from .handshake_guard import HANDSHAKE_S, HandshakeGuard, pending_caps
from .sweeps import sweep_rings

__all__ = ["LOCK_NAME", "Listener"]

# The lock file in the socket directory: one daemon per directory.
LOCK_NAME = "daemon.lock"


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
        self.guard: HandshakeGuard | None = None  # with TCP: caps on its unfinished handshakes

    def open(self) -> list[zmq.Socket]:
        limit = raise_nofile_limit()
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
            in_use = open_descriptors()
            per_peer, total = pending_caps(limit.soft - (in_use if in_use is not None else 64))
            self.guard = HandshakeGuard(self._ctx, remote, port, per_peer=per_peer, total=total)
            # The kernel's accept queue as deep as the guard's cap (libzmq's default is 100; the
            # kernel clamps it to net.core.somaxconn): a burst of connections, trainers among
            # them, is accepted and judged by the guard rather than having SYNs dropped and
            # retried a second or more later.
            remote.setsockopt(zmq.BACKLOG, total)
            _bind(remote, f"tcp://{host}:{port}")
            self.remote = remote
        return self.sockets

    def _router(self) -> zmq.Socket:
        sock = self._ctx.socket(zmq.ROUTER)
        self.sockets.append(sock)  # closed in close() even if binding fails (ctx.term waits for it)
        sock.setsockopt(zmq.LINGER, 0)
        # A frame over MAX_WIRE_BYTES makes libzmq drop the peer before allocating it;
        # smaller oversized frames reach decode(), which answers with an error.
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_WIRE_BYTES)
        # A peer that connects and sends nothing is closed after this (libzmq's default: 30 s).
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_S * 1000))
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
        lock_fd = os.open(LOCK_NAME, lock_flags, 0o600, dir_fd=dir_fd)
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
        sweep_rings(self.config.segment_store)  # what a killed daemon (this directory's or another's) left
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
        if self.guard is not None:
            self.guard.close()
            self.guard = None
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
