"""``pixpool yolo train data=B.yaml`` against a daemon serving A: refused, naming both.

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


def test_yolo_train_refuses_a_yaml_alias_bomb_before_ultralytics_reads_it(tmp_path):
    from pixpool.integrations.ultralytics.trainer import PixpoolDetectionTrainer
    from pixpool.shared.errors import DatasetError

    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "data.yaml"
    bomb.write_text("\n".join(levels) + "\npath: *l8\ntrain: images\nnames: [a]\n")
    with pytest.raises(DatasetError, match=r"data\.yaml:\d+: YAML alias \*l0 refused") as info:
        PixpoolDetectionTrainer(overrides={"data": str(bomb), "model": "yolo11n.yaml", "project": str(tmp_path)})
    assert str(bomb) in str(info.value)
    assert not (tmp_path / "train").exists()  # no run folder made for a refused data=
