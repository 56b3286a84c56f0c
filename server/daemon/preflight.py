"""``preflight``: the daemon's settings checked before anything is decoded or allocated.

Runs in the daemon process, first thing in ``run_daemon``: every path, key and address of a
``DaemonConfig`` is checked, so a bad socket directory, missing keys or a taken metrics port
fail in a second, not after the whole dataset was prepared. ``Listener.open`` decides again
at bind time (another daemon may start in between); this only makes the common mistakes fail
early.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os

from ...shared.errors import ConfigError
from ...shared.stream.config import DaemonConfig
from ...shared.transport import endpoint as ep
from .listener import LOCK_NAME

__all__ = ["preflight"]


def preflight(config: DaemonConfig) -> DaemonConfig:
    """ConfigError for a store pixpool may not use (``Store.checked``), a socket
    directory others can enter or another daemon serves, an over-long ipc path, a bad TCP
    address or unusable CURVE keys; creates the socket directory (mode 0700). Returns the
    config with the store's canonical path. ``Listener.open`` decides again at bind time
    (another daemon may start in between); this only makes the common mistakes fail before
    any decoding."""
    config = dataclasses.replace(config, store=config.segment_store.checked().directory)
    path = ep.socket_path(config.socket_dir, create=True)
    if config.tcp is not None:
        ep.parse_tcp(config.tcp)
        ep.check_server_keys(config.keys_dir)
    if config.metrics_port is not None:
        _check_port_free(config.metrics_host, config.metrics_port)
    lock_path = path.parent / LOCK_NAME
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
