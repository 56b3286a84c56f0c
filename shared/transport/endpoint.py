"""Where the daemon listens and how a peer proves who it is (ipc directory, CURVE keys).

Runs in the daemon (bind side) and in trainers and CLI commands (connect side).

- Local endpoint: ``ipc://<socket dir>/daemon.sock``. The socket directory is created mode
  0700 and must not be enterable by other users (group access is tolerated when an
  administrator set it up): whoever can enter it can talk to the daemon.
  Default: ``$XDG_RUNTIME_DIR/pixpool``, else ``<tempdir>/pixpool-<uid>``, else, where another
  user made that one first (the temporary directory is everyone's, and sticky: only they or root
  can remove it), ``~/.pixpool/run-<host>``, which nobody else can create
  (``default_socket_dir``). The daemon and its clients decide alike, so they meet.
- TCP: only with CURVE. ``pixpool keys DIR`` writes ``server.key``/``server.key_secret``,
  ``client.key``/``client.key_secret`` (ZeroMQ certificate files) and copies the client's
  public key into ``DIR/authorized/``; the daemon admits exactly the public keys found
  there now (a ZAP authenticator thread re-reads the folder when it changes), everyone
  else is refused during the handshake, and a removed key's sessions end.
  Both sides refuse keys others could change (``check_keys_dir``): the directory, its
  ``authorized/`` folder and the key files must be the caller's and writable by nobody
  else, the secret key 0600, the same rule as the socket directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import zmq

from ..errors import ConfigError

log = logging.getLogger(__name__)

SOCKET_NAME = "daemon.sock"


def default_socket_dir(*, create: bool = False) -> Path:
    """Where the daemon listens unless told (module docstring); with ``create``, the temporary
    directory's ``pixpool-<uid>`` is made first where it is missing, so that the choice below
    sees what is there now."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "pixpool"
    shared = Path(tempfile.gettempdir()) / f"pixpool-{os.getuid()}"
    if create:
        try:
            shared.mkdir(mode=0o700)
        except FileExistsError:
            pass
    try:
        owner = shared.lstat().st_uid
    except FileNotFoundError:
        # Gone since a daemon started in the fallback (its maker removed it): the daemon is still there.
        private = _home_socket_dir()
        return private if not create and (private / SOCKET_NAME).exists() else shared
    if owner == os.geteuid():
        return shared  # ours: ``socket_dir`` still refuses it if it is a link or open to others
    private = _home_socket_dir()
    if (shared, owner) not in _told:
        _told.add((shared, owner))
        log.warning(
            "%s belongs to uid %d, not to you (uid %d): another user made it first; left alone, "
            "the daemon's socket is in %s instead (or choose one with --socket-dir)",
            shared,
            owner,
            os.geteuid(),
            private,
        )
    return private


_told: set = set()  # (directory, owner) already warned about in this process


def _home_socket_dir() -> Path:
    """``~/.pixpool/run-<host>``: under the home directory, where nobody else may create
    anything; per host, since a home directory may be shared between machines (NFS) while a
    unix socket is not."""
    return Path(os.path.expanduser("~")) / ".pixpool" / f"run-{socket.gethostname()}"


def socket_dir(path: str | os.PathLike | None, *, create: bool) -> Path:
    """The socket directory, created 0700 when asked; refuses one others can enter."""
    d = Path(path) if path is not None else default_socket_dir(create=create)
    if d.is_symlink():
        target = os.readlink(d)
        state = "" if d.exists() else ", which does not exist"
        raise ConfigError(
            f"socket directory {d} is a symbolic link (to {target}{state}); name a real directory with --socket-dir"
        )
    if create:
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create the socket directory {d} ({exc.strerror}); choose one with --socket-dir "
                "(or set XDG_RUNTIME_DIR)"
            ) from None
    if not d.exists():
        return d
    check_private(
        d,
        "socket directory",
        forbidden=stat.S_IRWXO,
        problem="is open to other users",
        fix=f"run `chmod 700 {d}` or choose another with --socket-dir",
        not_yours="choose another with --socket-dir",
    )
    return d


def check_private(path: Path, what: str, *, forbidden: int, problem: str, fix: str, not_yours: str) -> None:
    """ConfigError unless ``path`` is the caller's own (not a link) and has none of the
    ``forbidden`` mode bits: the one rule for the socket directory and the key files, since
    whoever can write either decides who talks to the daemon."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{what} {path} is a symbolic link; name the real path ({not_yours})")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{what} {path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}); {not_yours}")
    mode = stat.S_IMODE(st.st_mode)
    if mode & forbidden:
        raise ConfigError(f"{what} {path} {problem} (mode {mode:04o}); {fix}")


_GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


def check_keys_dir(keys_dir: str | os.PathLike, *, secret: str) -> None:
    """ConfigError unless the CURVE key directory, its ``authorized/`` folder and every key
    in it are the caller's and writable by nobody else, and ``secret`` (the secret key file
    this side loads) is readable by nobody else (0600): a key dropped into a writable
    folder would be admitted over TCP, a readable secret key lets anyone pose as this side."""
    d = Path(keys_dir)
    redo = f"`pixpool keys {d} --force` makes a fresh set"
    for path in [d, *(p for p in (d / "authorized",) if p.exists())]:
        check_private(
            path,
            "key directory",
            forbidden=_GROUP_OTHER_WRITE,
            problem="is writable by group or others, who could add keys",
            fix=f"run `chmod go-w {path}` and check what is in it, or {redo}",
            not_yours=redo,
        )
    authorized = d / "authorized"
    keys = sorted(authorized.glob("*.key")) if authorized.is_dir() else []
    for path in [d / "server.key", d / "client.key", *keys]:
        if path.exists():
            check_private(
                path,
                "key file",
                forbidden=_GROUP_OTHER_WRITE,
                problem="is writable by group or others",
                fix=f"run `chmod 644 {path}` after checking it, or {redo}",
                not_yours=redo,
            )
    path = d / secret
    if path.exists():
        check_private(
            path,
            "secret key file",
            forbidden=stat.S_IRWXG | stat.S_IRWXO,
            problem="is readable or writable by others",
            fix=f"run `chmod 600 {path}`, or {redo}",
            not_yours=redo,
        )


# sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
_MAX_IPC_PATH = 107


def socket_path(directory: str | os.PathLike | None, *, create: bool = False) -> Path:
    path = socket_dir(directory, create=create) / SOCKET_NAME
    if len(os.fsencode(str(path))) > _MAX_IPC_PATH:
        raise ConfigError(
            f"ipc socket path {path} is {len(os.fsencode(str(path)))} bytes, over the {_MAX_IPC_PATH}-byte limit of a unix socket; choose a shorter --socket-dir"
        )
    return path


def ipc_endpoint(directory: str | os.PathLike | None, *, create: bool = False) -> str:
    return f"ipc://{socket_path(directory, create=create)}"


def parse_tcp(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--tcp {value!r} must be HOST:PORT, e.g. 127.0.0.1:5555")
    return host, int(port)


def write_keys(directory: str | os.PathLike, *, force: bool = False) -> dict[str, Path]:
    """Make a server and a client CURVE key pair in ``directory`` (mode 0700).

    Existing pairs are kept unless ``force``: new ones would lock out every deployed
    trainer that holds the old client key."""
    import zmq.auth

    if not zmq.has("curve"):
        raise ConfigError(
            f"this libzmq {zmq.zmq_version()} was built without CURVE; install a pyzmq wheel with libsodium"
        )
    d = Path(directory)
    existing = [p for p in (d / "server.key_secret", d / "client.key_secret") if p.exists()]
    if existing and not force:
        raise ConfigError(
            f"{existing[0]} already exists; keys there are in use by daemons and trainers. Pass --force to replace them"
        )
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(d, 0o700)  # also when it existed: it holds secret keys
    out = {}
    for who in ("server", "client"):
        public, secret = zmq.auth.create_certificates(str(d), who)
        os.chmod(secret, 0o600)
        os.chmod(public, 0o644)  # whatever the umask: check_keys_dir refuses group-writable keys
        out[who] = Path(public)
        out[who + "_secret"] = Path(secret)
    authorized = d / "authorized"
    authorized.mkdir(mode=0o700, exist_ok=True)
    os.chmod(authorized, 0o700)
    shutil.copy(out["client"], authorized / "client.key")
    os.chmod(authorized / "client.key", 0o644)
    out["authorized"] = authorized
    return out


def _load(path: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    import zmq.auth

    if not path.is_file():
        raise ConfigError(f"CURVE key file {path} is missing; make keys with `pixpool keys {path.parent}`")
    public, sec = zmq.auth.load_certificate(str(path))
    if secret and sec is None:
        raise ConfigError(f"{path} holds no secret key; expected the *.key_secret file written by `pixpool keys`")
    return public, sec


def configure_server(sock: zmq.Socket, keys_dir: str | os.PathLike) -> None:
    public, secret = _load(Path(keys_dir) / "server.key_secret", secret=True)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


def configure_client(sock: zmq.Socket, keys_dir: str | os.PathLike) -> None:
    d = Path(keys_dir)
    check_keys_dir(d, secret="client.key_secret")
    public, secret = _load(d / "client.key_secret", secret=True)
    server_public, _ = _load(d / "server.key", secret=False)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_public


def check_server_keys(keys_dir: str | os.PathLike) -> None:
    """ConfigError unless ``keys_dir`` holds a usable server key pair and authorized client keys.

    The daemon calls this before it decodes anything, so a bad ``--keys`` fails at once."""
    if not zmq.has("curve"):
        raise ConfigError(
            f"this libzmq {zmq.zmq_version()} was built without CURVE; install a pyzmq wheel with libsodium"
        )
    check_keys_dir(keys_dir, secret="server.key_secret")
    _load(Path(keys_dir) / "server.key_secret", secret=True)
    authorized = Path(keys_dir) / "authorized"
    if not authorized.is_dir() or not any(authorized.glob("*.key")):
        raise ConfigError(
            f"no authorized client keys in {authorized}; run `pixpool keys {keys_dir}` and give trainers its client key pair"
        )


def start_authenticator(ctx: zmq.Context, keys_dir: str | os.PathLike, provider):
    """ZAP handler (a thread) asking ``provider.callback(domain, z85_key)`` for each CURVE
    handshake; the daemon's provider re-reads ``keys_dir/authorized`` when it changes
    (``pixpool.server.daemon.authorized``)."""
    from zmq.auth.thread import ThreadAuthenticator

    check_server_keys(keys_dir)
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=provider)
    return auth
