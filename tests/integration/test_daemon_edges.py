"""A daemon whose surroundings change under it: its socket directory swapped for a symbolic
link, a snapshot segment truncated while it serves.

Integration tests over a real snapshot of the synthetic dataset (processes: daemon, workers).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from helpers.daemon import real_daemon, short_socket_dir
from pixpool.server.daemon.run import stop_process


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
