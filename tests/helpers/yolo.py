"""Running ``pixpool yolo train`` as a user would, and reading the run folder it leaves.

Used by the Ultralytics integration tests (they skip where Ultralytics is not installed).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path


def yolo_train(project: Path, env: dict[str, str], timeout_s: float, **pairs) -> subprocess.CompletedProcess:
    """``python -m pixpool.cli yolo train KEY=VALUE ...`` into ``project/run``, with ``env`` on top
    of this process's environment; the output is captured, the exit status not checked."""
    cmd = [sys.executable, "-m", "pixpool.cli", "yolo", "train", *(f"{k}={v}" for k, v in pairs.items())]
    cmd += [f"project={project}", "name=run", "exist_ok=True"]
    return subprocess.run(
        cmd, check=False, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout_s
    )


def results_rows(project: Path) -> list[dict[str, float]]:
    """The run's ``results.csv``, one dict per epoch, as numbers (Ultralytics pads its column names)."""
    with open(project / "run" / "results.csv") as f:
        return [{k.strip(): float(v) for k, v in row.items()} for row in csv.DictReader(f)]
