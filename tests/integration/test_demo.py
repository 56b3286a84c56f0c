"""The main job, ``pixpool demo``, end to end on the synthetic dataset (processes: daemon, workers, trainers)."""

from __future__ import annotations

import subprocess
import sys

from pixpool.shared.names import list_segments


def test_demo_runs_two_trainers_and_leaves_nothing(tmp_path):
    before = set(list_segments())
    proc = subprocess.run(
        [sys.executable, "-m", "pixpool.shared.cli", "demo", "--workdir", str(tmp_path), "--num-images", "16", "--imgsz", "128",
         "--epochs", "1", "--batch-size", "4", "--trainers", "2", "--workers", "1", "--timeout-s", "240"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "2 trainers attached" in out
    # Each trainer saw every one of the 16 samples once in its epoch.
    assert out.count("samples per epoch {0: 16}") == 2, out
    assert "no pixpool segment left" in out
    assert set(list_segments()) - before == set()
