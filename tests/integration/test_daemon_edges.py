"""A daemon whose surroundings change under it: its socket directory swapped for a symbolic
link, a snapshot segment truncated while it serves.

Integration tests over a real snapshot of the synthetic dataset (processes: daemon, workers).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from helpers.daemon import WAIT_S, ask_status, real_daemon, short_socket_dir
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.server.daemon.run import stop_process
from pixpool.shared.errors import DaemonStopped
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.store import DEFAULT


def test_shutdown_removes_its_socket_file_even_through_a_swapped_directory(synthetic_data):
    """After start, the socket directory is moved away and a symbolic link to another folder
    holding a file named daemon.sock takes its place: stopping the daemon removes its own
    socket file (in the moved directory), never the other folder's file."""
    sdir = short_socket_dir()
    moved = sdir + "-moved"
    other = Path(tempfile.mkdtemp(prefix="pxo-", dir="/tmp"))
    victim = other / "daemon.sock"
    victim.write_text("someone else's file")
    try:
        with real_daemon(synthetic_data.coco_json, imgsz=64, workers=1, socket_dir=sdir) as (proc, _):
            os.rename(sdir, moved)
            os.symlink(other, sdir)
            stop_process(proc)
            assert proc.exitcode == 0
        assert victim.read_text() == "someone else's file"
        assert not os.path.exists(os.path.join(moved, "daemon.sock")), "the daemon's own socket file is removed"
    finally:
        if os.path.islink(sdir):
            os.unlink(sdir)
        shutil.rmtree(sdir, ignore_errors=True)
        shutil.rmtree(moved, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)


def test_a_truncated_snapshot_segment_stops_the_daemon_naming_it(synthetic_data, capfd):
    """Someone truncates the image arena while the daemon serves: instead of failing every
    batch while ``status`` answers, the daemon stops, exits non-zero, names the segment in
    its log, and its trainer gets DaemonStopped saying why."""
    s = StreamSettings(seed=3, batch_size=4, augment=AugmentConfig(imgsz=96))
    with real_daemon(synthetic_data.coco_json, imgsz=96, workers=1) as (proc, d):
        segments = ask_status(d)["snapshot"]["segments"]
        img = next(n for n in segments if n.endswith("-img"))
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            it = c.epoch(0)
            next(it)
            ring = c._ring.name
            size = os.path.getsize(DEFAULT.path(img))
            os.truncate(DEFAULT.path(img), size // 4)  # what `truncate -s` on /dev/shm/...-img does
            with pytest.raises(DaemonStopped, match=f"{img} was truncated"):
                for _ in range(100):  # the daemon checks within a fraction of a second
                    for _ in c.epoch(0):
                        pass
        proc.join(WAIT_S)
        assert proc.exitcode not in (0, None), "a daemon whose snapshot was damaged must exit non-zero"
        left = [n for n in [*segments, ring] if os.path.exists(DEFAULT.path(n))]
        assert not left, "the stopped daemon left segments behind"
    err = capfd.readouterr().err
    assert f"{img} was truncated from {size} to {size // 4} bytes" in err, err[-3000:]
