"""``pixpool yolo train data=B.yaml`` against a daemon serving A: refused, naming both (issue 26, class 7).

Runs in the Ultralytics venv (marked ``ultralytics``; skipped where Ultralytics is not
importable). Dataset B has A's class names, so the class-list check alone let the run train
on A's images while Ultralytics validated on B's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip(
    "ultralytics",
    reason="Ultralytics is not installed here (pip install 'pixpool[ultralytics]'); CI runs these in its own venv",
)

from helpers.daemon import real_daemon

pytestmark = pytest.mark.ultralytics


def test_yolo_train_refuses_a_daemon_serving_another_dataset(synthetic_data, tmp_path):
    from pixpool.server.synthetic import write_synthetic

    other = write_synthetic(tmp_path / "other", num_images=12, seed=1)
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path / "ultralytics-config")}
    project = tmp_path / "runs"
    with real_daemon(synthetic_data.data_yaml, imgsz=64, workers=1) as (_, d):
        cmd = [
            sys.executable,
            "-m",
            "pixpool.cli",
            "yolo",
            "train",
            f"data={other.data_yaml}",
            f"socket_dir={d}",
        ]
        cmd += ["model=yolo11n.yaml", "epochs=1", "imgsz=64", "batch=4", "workers=1", "device=cpu"]
        cmd += [f"project={project}", "name=run", "exist_ok=True"]
        proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, "trained on the daemon's dataset A although data= names B:\n" + proc.stdout[-2000:]
    err = proc.stderr
    assert str(other.images_dir) in err and str(synthetic_data.images_dir) in err, err[-4000:]
    assert not (project / "run").exists(), "a refused run leaves no run folder"
