"""The examples run as the documents say, against a daemon the user started with their own
settings: ``examples/torchrun_ddp.py`` takes the daemon's imgsz (and task, dtype) unless told.

Integration test: the daemon runs in a spawned process; torchrun and its ranks are children,
killed as a process group past the timeout (``helpers/ranks.py``).
"""

from __future__ import annotations

from helpers.daemon import real_daemon
from helpers.ranks import EXAMPLE, TORCHRUN, run_group

# Not the example's or the daemon's default (640): a rank that brought its own size would be refused.
IMGSZ = 96


def test_torchrun_example_as_documented_trains_at_the_daemons_imgsz(synthetic_data):
    # docs/usage.md: `torchrun --nproc-per-node 2 examples/torchrun_ddp.py --socket-dir DIR`,
    # plus the CPU-sized settings a test can afford; no --imgsz.
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=2) as (_proc, d):
        cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", str(EXAMPLE), "--socket-dir", d]
        cmd += ["--epochs", "1", "--batch-size", "4", "--scale", "tiny", "--timeout-s", "60"]
        done = run_group(cmd)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "epoch 0: mean loss " in done.stdout, done.stdout[-4000:]
    assert f"imgsz {IMGSZ}" in done.stdout, done.stdout[-4000:]  # rank 0 says what the daemon serves
