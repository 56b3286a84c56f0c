"""A trainer started just after ``pixpool serve`` (the README's "Your own data" lines: ``serve
... &`` then ``train``) waits for that daemon instead of failing while it starts; a daemon
killed while starting makes nobody wait; a ``serve`` that fails on a wrong path leaves no
socket directory behind.

Integration test: ``pixpool serve`` and ``pixpool train`` run as the user's commands, as
child processes with the default socket directory (``XDG_RUNTIME_DIR`` pointed into the
test's folder), stopped and reaped by the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers.daemon import wait_for
from pixpool.shared.transport.store import DEFAULT

PIXPOOL = [sys.executable, "-m", "pixpool.cli"]


@pytest.fixture
def runtime_dir():
    d = Path(tempfile.mkdtemp(prefix="pxr-", dir="/tmp"))  # short: ipc paths are limited to ~107 bytes
    yield d
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def _env(runtime_dir: Path) -> dict:
    return {**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir)}


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(60)


def test_a_trainer_started_just_after_serve_waits_for_it(synthetic_data, runtime_dir, tmp_path):
    before = set(DEFAULT.segments())
    env = _env(runtime_dir)
    # As the README's block: the daemon in the background, the trainer at once after it; no --wait-s.
    serve = subprocess.Popen(
        [*PIXPOOL, "serve", str(synthetic_data.data_yaml), "--imgsz", "64", "--workers", "1", "--processes", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        time.sleep(0.3)  # the shell's gap between `serve ... &` and the next line (about what the README saw)
        train = subprocess.run(
            [*PIXPOOL, "train", "--model", "tiny", "--batch-size", "8", "--epochs", "1", "--val", "0"]
            + ["--project", str(tmp_path / "runs" / "cpu"), "--progress", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        rc = _stop(serve)
        log = serve.stdout.read()
    assert train.returncode == 0, train.stdout + train.stderr
    assert "epoch 1/1" in train.stdout, train.stdout
    assert rc == 0, log
    assert set(DEFAULT.segments()) - before == set()


def test_a_daemon_killed_while_starting_makes_no_trainer_wait(runtime_dir, tmp_path):
    before = set(DEFAULT.segments())
    env = _env(runtime_dir)
    sdir = runtime_dir / "pixpool"
    # A dataset big enough that the daemon is still preparing when it is killed.
    from pixpool.server.synthetic import write_synthetic

    data = write_synthetic(tmp_path / "big", num_images=200, seed=1)
    serve = subprocess.Popen(
        [*PIXPOOL, "serve", str(data.data_yaml), "--imgsz", "640", "--workers", "1", "--processes", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        from pixpool.shared.transport.starting import is_starting

        wait_for(lambda: is_starting(sdir) or serve.poll() is not None, 60.0, "the daemon's starting mark")
        assert not (sdir / "daemon.sock").exists(), "the daemon served before the test could kill it starting"
    finally:
        os.killpg(serve.pid, signal.SIGKILL)  # the daemon and its decoders: nothing runs its clean-up
        serve.wait(60)
    t0 = time.monotonic()
    train = subprocess.run(
        [*PIXPOOL, "train", "--model", "tiny", "--epochs", "1", "--project", str(tmp_path / "r")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert train.returncode == 1 and f"no pixpool daemon at {sdir}" in train.stderr, train.stderr
    assert time.monotonic() - t0 < 30.0  # process start and imports; no starting wait (120 s)
    _remove_unheld(set(DEFAULT.segments()) - before)


def _remove_unheld(names: set[str]) -> None:
    """The partial snapshot the killed daemon was writing: nobody holds it any more."""
    from pixpool.shared.transport.holds import holds_of
    from pixpool.shared.transport.shm import unlink_segment

    for name in names:
        held = holds_of(name)
        if held is not None and not held.in_use:
            unlink_segment(name)


def test_serve_on_a_wrong_path_leaves_no_socket_directory(tmp_path, runtime_dir):
    where = runtime_dir / "a" / "sock"
    done = subprocess.run(
        [*PIXPOOL, "serve", str(tmp_path / "missing" / "data.yaml"), "--socket-dir", str(where)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "data.yaml does not exist" in done.stderr, done.stderr
    assert not (runtime_dir / "a").exists(), list((runtime_dir / "a").rglob("*"))
    # Its default socket directory too (XDG_RUNTIME_DIR/pixpool), made by this serve.
    done = subprocess.run(
        [*PIXPOOL, "serve", str(tmp_path / "missing" / "data.yaml")],
        env=_env(runtime_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "data.yaml does not exist" in done.stderr, done.stderr
    assert not (runtime_dir / "pixpool").exists()
