"""Running ``pixpool yolo train`` as a user would, and reading the run folder it leaves; a
pixpool trainer built in process, and the route with every random step off (``PLAIN``).

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
    # Ultralytics' own log lines as a user sees them: an in-process bench arm imported earlier in
    # the session (bench/_ultralytics_arm.py) sets YOLO_VERBOSE=False in this process's environment.
    return subprocess.run(
        cmd,
        check=False,
        env={**os.environ, "YOLO_VERBOSE": "True", **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def results_rows(project: Path) -> list[dict[str, float]]:
    """The run's ``results.csv``, one dict per epoch, as numbers (Ultralytics pads its column names)."""
    with open(project / "run" / "results.csv") as f:
        return [{k.strip(): float(v) for k, v in row.items()} for row in csv.DictReader(f)]


# The route with every random step off: both loaders then letterbox each image, centred.
PLAIN = dict(
    mosaic=0.0,
    degrees=0.0,
    translate=0.0,
    scale=0.0,
    shear=0.0,
    perspective=0.0,
    flipud=0.0,
    fliplr=0.0,
    hsv_h=0.0,
    hsv_s=0.0,
    hsv_v=0.0,
    mixup=0.0,
    copy_paste=0.0,
)


def detection_trainer(data_yaml, tmp_path: Path, **overrides):
    """A ``PixpoolDetectionTrainer`` on ``data_yaml`` as a test builds one in process (imgsz 160,
    batch 8, 4 epochs closing mosaic for 2, CPU, no plots, run folder under ``tmp_path``)."""
    from pixpool.integrations.ultralytics.trainer import PixpoolDetectionTrainer

    args = dict(
        data=str(data_yaml),
        model="yolo11n.yaml",
        imgsz=160,
        batch=8,
        epochs=4,
        close_mosaic=2,
        device="cpu",
        plots=False,
        project=str(tmp_path / "runs"),
        name="t",
        exist_ok=True,
    )
    return PixpoolDetectionTrainer(overrides={**args, **overrides})
