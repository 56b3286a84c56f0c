"""Which CURVE client keys the daemon admits: exactly the public keys in ``keys/authorized/``
now, not when the daemon started.

Runs in the daemon process, from two threads: the ZAP authenticator thread (pyzmq's
``ThreadAuthenticator``) calls ``callback`` for every new TCP connection's handshake, and the
daemon's loop calls ``admits`` for every request that comes in over TCP and ``current`` on
its liveness tick, to end the sessions of a key that was removed. A lock guards the cache.

The folder is read again whenever it changes: the signature is the inode, ctime, mode and
owner of the key directory and of ``authorized/``, plus each ``*.key`` file's name, inode,
size and ctime (a key copied in, removed, renamed, rewritten in place or made writable by
others all change it), so a handshake costs one ``scandir`` and a re-read happens only
after a change. The folder and its keys must stay
the daemon user's and writable by nobody else (``shared.transport.endpoint.check_keys_dir``); while
they are not, no key is admitted (fail closed) and the daemon says so in its log once.

A connection made while a key was authorized stays open after the key is removed (libzmq
authenticates at the handshake only, and a ROUTER cannot drop one peer), so the daemon
checks ``admits`` for every request from it, answering ``not_authorized``.

A look at the folder that fails for want of a resource (``EMFILE`` while a flood holds the
descriptors, ``ENFILE``, ``ENOMEM``) says nothing about the keys: the keys of the last
complete read stay admitted, the failure is counted (``read_errors``) and logged once, and
the next look reads again; a removed key so goes at the first look that works. Only a
folder that is gone, unreadable or not private admits nobody. (Were a failed read to admit
nobody, one moment out of descriptors would end every TCP session.)
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

from ...shared.errors import ConfigError
from ...shared.transport.endpoint import check_keys_dir

log = logging.getLogger(__name__)

# Failures of a look at the folder that come from the process's resources, not the folder.
_TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EINTR, errno.EAGAIN})


class AuthorizedKeys:
    """The z85 public keys in ``keys_dir/authorized`` (module docstring); a pyzmq
    credentials provider (``callback(domain, key)``)."""

    def __init__(self, keys_dir: str | os.PathLike):
        self.keys_dir = Path(keys_dir)
        self.folder = self.keys_dir / "authorized"
        self._lock = threading.Lock()
        self._signature: tuple | None = None
        self._keys: frozenset[str] = frozenset()
        self._problem: str | None = None
        self.reloads = 0
        self.read_errors = 0  # looks at the folder that failed for want of a resource (module docstring)
        self._unreadable = False  # in a run of such failures (logged once per run)

    def current(self) -> frozenset[str]:
        """The keys admitted now, re-read if the folder changed since the last look."""
        try:
            signature = self._read_signature()
            with self._lock:
                if signature != self._signature:
                    keys, problem = self._load()
                    self._keys, self._problem, self._signature = keys, problem, signature
                    self._logged_load()
                if self._unreadable:
                    self._unreadable = False
                    log.info("the folder of authorized keys %s is readable again", self.folder)
                return self._keys
        except OSError as exc:
            if exc.errno not in _TRANSIENT:
                raise
            with self._lock:
                self.read_errors += 1
                if not self._unreadable:
                    self._unreadable = True
                    log.warning(
                        "could not look at %s (%s); the %d key(s) of the last complete read stay admitted "
                        "until a look works",
                        self.folder, exc, len(self._keys),
                    )  # fmt: skip
                return self._keys

    def _logged_load(self) -> None:
        self.reloads += 1
        if self._problem is not None:
            log.error("admitting no TCP client: %s", self._problem)
        else:
            log.info("authorized client keys: %d in %s", len(self._keys), self.folder)

    def admits(self, key: str) -> bool:
        return key in self.current()

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's ZAP hook (authenticator thread): admit ``key`` (z85 bytes) or not."""
        allowed = self.admits(key.decode("ascii", "replace"))
        if not allowed:
            log.warning(
                "refused a TCP client whose CURVE key %s is not in %s", key.decode("ascii", "replace"), self.folder
            )
        return allowed

    def _read_signature(self) -> tuple:
        # ctime, not mtime: it also moves on chmod and chown, which decide trust as much as
        # the keys themselves do.
        try:
            outer, inner = os.stat(self.keys_dir), os.stat(self.folder)
            with os.scandir(self.folder) as entries:
                files = sorted(
                    (e.name, e.inode(), e.stat().st_size, e.stat().st_ctime_ns)
                    for e in entries
                    if e.name.endswith(".key")
                )
        except OSError as exc:
            if exc.errno in _TRANSIENT:
                raise
            return ("unreadable", exc.errno)
        return tuple((st.st_ino, st.st_ctime_ns, st.st_mode, st.st_uid) for st in (outer, inner)) + (tuple(files),)

    def _load(self) -> tuple[frozenset[str], str | None]:
        import zmq.auth

        try:
            check_keys_dir(self.keys_dir, secret="server.key_secret")
        except ConfigError as exc:
            return frozenset(), str(exc)
        if not self.folder.is_dir():
            return frozenset(), (
                f"the folder {self.folder} of authorized keys is gone; "
                f"make it again with `pixpool keys {self.keys_dir}`"
            )
        keys = set()
        for path in sorted(self.folder.glob("*.key")):
            try:
                public, _ = zmq.auth.load_certificate(str(path))
            except (OSError, ValueError, KeyError) as exc:  # being written right now, or no key file
                if isinstance(exc, OSError) and exc.errno in _TRANSIENT:
                    raise  # says nothing about this key: current() keeps the last complete read
                log.warning("skipping %s: not a CURVE public key file (%s); a key made by `pixpool keys` is", path, exc)
                continue
            keys.add(public.decode("ascii"))
        return frozenset(keys), None
