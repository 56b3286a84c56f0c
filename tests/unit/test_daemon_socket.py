"""A trainer without a daemon fails at once, naming the socket directory and how to start one;
``wait_s`` waits for a daemon that is starting and says so while it waits. No process is
started: a listening unix socket stands in for the daemon's."""

from __future__ import annotations

import logging
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pixpool.client import daemon_socket
from pixpool.client.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.errors import ConfigError, DaemonNotFound, DaemonTimeout
from pixpool.shared.stream.config import StreamSettings

_FAST_S = 2.0 + 1.0  # the bound on an error path, with slack for a loaded machine


@pytest.fixture
def sdir() -> Path:
    # ipc paths are limited to ~107 bytes: a short directory under /tmp.
    d = Path(tempfile.mkdtemp(prefix="pxs-", dir="/tmp"))
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def _fails_fast(socket_dir: Path) -> DaemonNotFound:
    t0 = time.monotonic()
    with pytest.raises(DaemonNotFound) as err:
        Client.connect(StreamSettings(), ClientOptions(socket_dir=socket_dir, timeout_s=60.0))
    assert time.monotonic() - t0 < _FAST_S
    message = str(err.value)
    assert str(socket_dir) in message and f"pixpool serve DATA --socket-dir {socket_dir}" in message
    assert "wait_s" in message and "--wait-s" in message
    assert err.value.socket_dir == str(socket_dir)
    return err.value


def test_a_socket_dir_that_does_not_exist_fails_at_once(sdir):
    missing = sdir / "nope"
    err = _fails_fast(missing)
    assert "does not exist" in str(err)
    assert isinstance(err, DaemonTimeout)  # code that caught the old wait still catches it


def test_a_socket_dir_without_a_daemon_socket_fails_at_once(sdir):
    err = _fails_fast(sdir)
    assert "holds no daemon socket (daemon.sock)" in str(err)


def test_a_socket_left_by_a_killed_daemon_fails_at_once(sdir):
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(sdir / "daemon.sock"))  # bound, never listening, then closed: the file stays
    left.close()
    err = _fails_fast(sdir)
    assert "nothing listens on it" in str(err)


def test_wait_s_waits_for_a_daemon_that_starts_and_says_so(sdir, monkeypatch, caplog):
    monkeypatch.setattr(daemon_socket, "SAY_EVERY_S", 0.2)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    started = threading.Event()

    def start_daemon():
        started.wait(30)  # once the trainer has said it waits
        listener.bind(str(sdir / "daemon.sock"))
        listener.listen()

    class SaidItWaits(logging.Handler):
        def emit(self, record):
            started.set()

    said = SaidItWaits()
    logging.getLogger(daemon_socket.__name__).addHandler(said)
    binder = threading.Thread(target=start_daemon)
    binder.start()
    try:
        with caplog.at_level(logging.WARNING, logger=daemon_socket.__name__):
            daemon_socket.await_daemon(f"ipc://{sdir}/daemon.sock", wait_s=30.0)
    finally:
        started.set()
        binder.join(30)
        listener.close()
        logging.getLogger(daemon_socket.__name__).removeHandler(said)
    waits = [r.getMessage() for r in caplog.records if "waiting for a pixpool daemon" in r.getMessage()]
    assert waits and str(sdir) in waits[0] and "s of 30 s waited" in waits[0]


def test_wait_s_gives_up_after_its_seconds_naming_the_dir(sdir, monkeypatch, caplog):
    monkeypatch.setattr(daemon_socket, "SAY_EVERY_S", 0.2)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=daemon_socket.__name__):
        with pytest.raises(DaemonTimeout, match=f"no pixpool daemon started at {sdir} within 1 s") as err:
            daemon_socket.await_daemon(f"ipc://{sdir}/daemon.sock", wait_s=1.0)
    assert not isinstance(err.value, DaemonNotFound)
    assert 1.0 <= time.monotonic() - t0 < 1.0 + _FAST_S
    assert any(str(sdir) in r.getMessage() for r in caplog.records)


def test_tcp_endpoints_are_not_looked_for_on_disk():
    daemon_socket.await_daemon("tcp://127.0.0.1:5555", wait_s=0.0)  # returns: nothing to look at


@pytest.mark.parametrize("bad", [-1, float("nan"), True, "5"])
def test_wait_s_must_be_seconds(sdir, bad):
    with pytest.raises(ConfigError, match="wait_s"):
        Client.connect(StreamSettings(), ClientOptions(socket_dir=sdir, wait_s=bad))


def test_a_daemon_that_listens_but_does_not_answer_is_waited_for_and_named(sdir, monkeypatch, caplog):
    from pixpool.client import connection

    monkeypatch.setattr(connection, "SAY_EVERY_S", 0.2)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # accepts connections, never speaks
    silent.bind(str(sdir / "daemon.sock"))
    silent.listen()
    try:
        with caplog.at_level(logging.WARNING, logger=connection.__name__):
            with pytest.raises(DaemonTimeout, match=f"no reply to attach from a pixpool daemon at ipc://{sdir}"):
                Client.connect(StreamSettings(), ClientOptions(socket_dir=sdir, timeout_s=1.0))
    finally:
        silent.close()
    waits = [r.getMessage() for r in caplog.records if "has not answered yet" in r.getMessage()]
    assert waits and f"ipc://{sdir}/daemon.sock" in waits[0] and "of 1 s" in waits[0]
