"""The DaemonSet's daemon stops cleanly on SIGTERM within its terminationGracePeriodSeconds.

Integration test: ``pixpool serve`` runs as a child with the manifest's own flags (only the
paths, sizes and ports changed for this machine), a trainer attached mid-epoch; SIGTERM, as
the kubelet sends it. The daemon must exit 0 inside the grace period, its workers gone, its
rings unlinked, the trainer told it stopped; the snapshot stays (``--keep-snapshot``) for the
next pod and is removed here by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from helpers.commands import REPO
from helpers.daemon import WAIT_S, ask_status, free_port, segments_of, short_socket_dir, wait_for
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.errors import DaemonStopped
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.shm import unlink_segment

IMGSZ = 96


def manifest_command(data: str, overrides: dict[str, str]) -> tuple[list[str], int]:
    """The DaemonSet container's command with DATA and each flag in ``overrides`` replaced; its grace period."""
    ds = yaml.safe_load((REPO / "deploy" / "daemonset.yaml").read_text())
    pod = ds["spec"]["template"]["spec"]
    argv = list(pod["containers"][0]["command"])
    assert argv[:2] == ["pixpool", "serve"] and not argv[2].startswith("-")
    argv[2] = data
    for flag, value in overrides.items():
        assert flag in argv, f"the DaemonSet no longer passes {flag}; update this test"
        argv[argv.index(flag) + 1] = value
    argv[0] = str(Path(sys.executable).with_name("pixpool"))
    return argv, int(pod["terminationGracePeriodSeconds"])


def test_the_daemonsets_daemon_exits_cleanly_on_sigterm_within_the_grace_period(synthetic_data, tmp_path):
    socket_dir = short_socket_dir()
    overrides = {
        "--imgsz": str(IMGSZ),
        "--workers": "1",
        "--processes": "1",
        "--socket-dir": socket_dir,
        "--metrics-port": str(free_port()),
        "--metrics-host": "127.0.0.1",
    }
    argv, grace_s = manifest_command(str(synthetic_data.coco_json), overrides)
    assert "--keep-snapshot" in argv
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    snapshot_segments: list[str] = []
    try:
        st = wait_for(lambda: proc.poll() is None and ask_status(socket_dir, 1.0), WAIT_S, "daemon status")
        if proc.poll() is not None:
            pytest.fail(f"pixpool serve exited {proc.returncode}: {(tmp_path / 'serve.log').read_text()[-2000:]}")
        snapshot_segments = list(st["snapshot"]["segments"])
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert workers
        settings = StreamSettings(seed=0, batch_size=4, augment=AugmentConfig(imgsz=IMGSZ))
        with Client.connect(settings, ClientOptions(socket_dir=socket_dir, timeout_s=WAIT_S)) as client:
            batches = client.epoch(0)
            next(batches)  # mid-epoch, a slot held
            assert segments_of(proc.pid)
            t0 = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            try:
                rc = proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"the daemon did not exit within terminationGracePeriodSeconds={grace_s}: the kubelet would SIGKILL it"
                )
            took_s = time.monotonic() - t0
            with pytest.raises(DaemonStopped):
                for _ in batches:
                    pass
        assert rc == 0, (tmp_path / "serve.log").read_text()[-2000:]
        assert took_s < grace_s
        psutil.wait_procs(workers, timeout=10)
        assert not [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
        assert segments_of(proc.pid) == []  # its rings are unlinked
        # Kept for the next pod: the daemon did not remove it. (Whether the files are still
        # there is not asked: /dev/shm is the machine's, and another run's `pixpool clean` may
        # sweep an unmapped snapshot of this uid at any moment.)
        text = (tmp_path / "serve.log").read_text()
        assert f"snapshot {st['snapshot']['name']} removed" not in text, text[-2000:]
        print(f"SIGTERM -> exit in {took_s:.2f} s (grace {grace_s} s)")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()
        for name in snapshot_segments:
            unlink_segment(name)
        import shutil

        shutil.rmtree(socket_dir, ignore_errors=True)
