"""A daemon says it is starting from its first moment; a trainer that finds it starting waits,
one that finds nothing still fails fast, and a mark whose daemon is gone makes nobody wait.

No process is started: the daemon's side is ``StartingMark.take`` in this process (an
open-file-description lock conflicts with any other open file description, this process's
own included), a listening unix socket stands in for the daemon's socket, and closing the
mark's descriptor is what the kernel does when a daemon dies."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pixpool.client import daemon_socket
from pixpool.shared.errors import ConfigError, DaemonNotFound, DaemonTimeout
from pixpool.shared.transport.starting import MARK_NAME, StartingMark, is_starting

_FAST_S = 2.0 + 1.0  # the bound on an error path, with slack for a loaded machine


@pytest.fixture
def root() -> Path:
    d = Path(tempfile.mkdtemp(prefix="pxst-", dir="/tmp"))  # short: ipc paths are limited to ~107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_trainer_waits_for_a_daemon_that_is_starting_then_attaches(root):
    sdir = root / "sock"
    mark = StartingMark.take(sdir)  # what `pixpool serve` does before anything else
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        assert sdir.is_dir() and is_starting(sdir)
        binder = threading.Timer(1.5, lambda: (listener.bind(str(sdir / "daemon.sock")), listener.listen()))
        binder.start()
        t0 = time.monotonic()
        daemon_socket.await_daemon(f"ipc://{sdir}/daemon.sock")  # wait_s 0: as the README's trainer
        assert time.monotonic() - t0 >= 1.0  # it waited for the bind instead of failing
        binder.join(30)
    finally:
        listener.close()
        mark.release(served=True)


def test_the_starting_wait_is_bounded_and_says_why(root, monkeypatch):
    sdir = root / "sock"
    mark = StartingMark.take(sdir)
    try:
        with pytest.raises(DaemonTimeout, match="a daemon is starting there") as err:
            daemon_socket.await_daemon(f"ipc://{sdir}/daemon.sock", starting_wait_s=0.5)
        assert not isinstance(err.value, DaemonNotFound) and "within 0.5 s" in str(err.value)
    finally:
        mark.release(served=True)


def test_a_daemon_that_dies_while_starting_stops_the_wait_at_once(root):
    sdir = root / "sock"
    mark = StartingMark.take(sdir)
    threading.Timer(0.5, lambda: mark.release(served=True)).start()  # the kernel drops a dead daemon's lock
    t0 = time.monotonic()
    with pytest.raises(DaemonNotFound, match="stopped before it listened"):
        daemon_socket.await_daemon(f"ipc://{sdir}/daemon.sock", starting_wait_s=60.0)
    assert time.monotonic() - t0 < 0.5 + _FAST_S
    # The mark's file stays, unlocked: a later trainer is not made to wait by it.
    assert (sdir / MARK_NAME).exists() and not is_starting(sdir)
    t0 = time.monotonic()
    with pytest.raises(DaemonNotFound, match="holds no daemon socket"):
        daemon_socket.await_daemon(f"ipc://{sdir}/daemon.sock")
    assert time.monotonic() - t0 < _FAST_S


def test_no_daemon_at_all_still_fails_fast(root):
    t0 = time.monotonic()
    with pytest.raises(DaemonNotFound, match="does not exist"):
        daemon_socket.await_daemon(f"ipc://{root}/nope/daemon.sock")
    assert time.monotonic() - t0 < _FAST_S


def test_a_second_daemon_is_refused_while_the_first_is_starting(root):
    sdir = root / "sock"
    first = StartingMark.take(sdir)
    try:
        with pytest.raises(ConfigError, match="another pixpool daemon already serves"):
            StartingMark.take(sdir)
        assert is_starting(sdir)  # the refused one took nothing from the first
    finally:
        first.release(served=True)


def test_a_daemon_that_never_served_removes_the_directories_it_made(root):
    mark = StartingMark.take(root / "a" / "b" / "sock")
    mark.release(served=False)
    assert list(root.iterdir()) == []
    # A directory that was there before, or holds anything else, stays.
    (root / "kept").mkdir()
    (root / "kept" / "other").write_text("x")
    mark = StartingMark.take(root / "kept" / "sock2")
    (root / "kept" / "sock2" / "daemon.lock").write_text("")  # e.g. a bind that failed left it
    mark.release(served=False)
    assert (root / "kept" / "sock2" / "daemon.lock").exists() and not (root / "kept" / "sock2" / MARK_NAME).exists()
    assert (root / "kept" / "other").exists()


def test_train_help_says_how_long_a_starting_daemon_is_waited_for(capsys):
    from pixpool.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"up to {daemon_socket.STARTING_WAIT_S:g} s" in text and "is waited for anyway" in text


def test_pixpool_max_epochs_bounds_train_and_demo(monkeypatch, capsys):
    import argparse

    from pixpool.cli import demo, train

    monkeypatch.setenv("PIXPOOL_MAX_EPOCHS", "1")
    parser = argparse.ArgumentParser()
    train.configure(parser, "train")
    assert train.config_from_args(parser.parse_args(["--epochs", "30"])).epochs == 1
    assert "PIXPOOL_MAX_EPOCHS=1: training 1 epoch instead of 30" in capsys.readouterr().err
    assert train.config_from_args(parser.parse_args([])).epochs == 1  # the default (10) too
    monkeypatch.setenv("PIXPOOL_MAX_EPOCHS", "50")
    assert train.config_from_args(parser.parse_args(["--epochs", "30"])).epochs == 30  # a bound, not a setting
    monkeypatch.setenv("PIXPOOL_MAX_EPOCHS", "0")
    with pytest.raises(ConfigError, match="PIXPOOL_MAX_EPOCHS='0' must be a whole number"):
        train.config_from_args(parser.parse_args([]))
    monkeypatch.setenv("PIXPOOL_MAX_EPOCHS", "2")
    seen = {}
    monkeypatch.setattr(demo, "_demo", lambda workdir, args: seen.setdefault("epochs", args.epochs) and 0)
    parser = argparse.ArgumentParser()
    demo.configure(parser, "demo")
    demo.run(parser.parse_args(["--workdir", "/nonexistent"]))
    assert seen["epochs"] == 2
