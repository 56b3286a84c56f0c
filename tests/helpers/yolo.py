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


def coco128_yaml(coco128: Path, root: Path, labels: str = "labels") -> Path:
    """coco128's images with its ``labels`` folder (``labels`` boxes, ``labels-seg`` segments) as
    ``labels/`` in the YOLO layout both loaders read (images/ -> labels/), and a data.yaml with
    the 80 COCO names, its val: the same images."""
    import json
    import shutil

    shutil.copytree(coco128 / "images" / "train2017", root / "images" / "train2017")
    shutil.copytree(coco128 / labels / "train2017", root / "labels" / "train2017")
    categories = json.loads((coco128 / "annotations" / "instances_train2017.json").read_text())["categories"]
    names = [c["name"] for c in sorted(categories, key=lambda c: c["id"])]
    lines = ["train: images/train2017", "val: images/train2017", "names:"]
    lines += [f"  {i}: {json.dumps(n)}" for i, n in enumerate(names)]
    (root / "data.yaml").write_text("\n".join(lines) + "\n")
    return root / "data.yaml"


def synth_yaml(root: Path, task: str) -> Path:
    """``pixpool synth OUT --task TASK``: the synthetic set of ``task`` and its data.yaml."""
    proc = subprocess.run(
        [sys.executable, "-m", "pixpool.cli", "synth", str(root), "--task", task],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "data.yaml"
