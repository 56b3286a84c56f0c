"""``pixpool synth --task segment|pose|obb``: Ultralytics' label formats per task, the pose set's
keypoint layout, deterministic bytes, and the detect set unchanged. Starts no process.

The label checks restate the rules Ultralytics' ``verify_image_label`` applies (columns per
task, normalised coordinates within [0, 1], integer classes below nc); that its own loader
trains on the sets was checked with Ultralytics 8.4.190 (bench/_ultralytics_arm.py collect).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from pixpool.cli import main
from pixpool.server.synthetic import write_synthetic
from pixpool.server.synthetic.tasks import FLIP_IDX, KPT_SHAPE, OBB_NAMES, POSE_NAMES

# What `write_synthetic(root, num_images=24, seed=0)` wrote on main at f6ca3bf, before the task
# sets existed: sha256 over (relative path, sha256 of the bytes) of every file, split into the
# text files and the JPEGs. The JPEG figure also pins the encoder (OpenCV 5.0's libjpeg-turbo
# at quality 95): a new OpenCV that encodes otherwise shows here, and only there. The text
# figure changed once since, on purpose: the data.yaml's last line now declares its unlabelled
# image a background (``background_without_labels: 1``); labels and JPEGs are unchanged.
_DETECT_TEXT_SHA256 = "960cada001822312649f77d70d3714ba98f01953d79101ff600c33a54335b2cb"
_DETECT_JPEG_SHA256 = "123f8800ad9b5a9f9966bb8c86aad5ccd31e9357bb8fcfa0ba045f79498ecf61"


def _tree_sha256(root: Path, *, jpeg: bool) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and (p.suffix == ".jpg") == jpeg:
            h.update(str(p.relative_to(root)).encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _labels(data, *, ragged: bool = False) -> dict[str, np.ndarray | list[np.ndarray]]:
    """stem -> (rows, columns) float array of each label file (one background file is empty);
    ``ragged``: a list of rows instead (segment polygons have their own lengths)."""
    out = {}
    for p in sorted(data.labels_dir.glob("*.txt")):
        rows = [np.array(line.split(), dtype=np.float64) for line in p.read_text().splitlines() if line.strip()]
        widths = {len(r) for r in rows}
        if len(widths) > 1 and not ragged:
            raise AssertionError(f"{p.name}: rows of {sorted(widths)} columns in one file")
        out[p.stem] = rows if ragged else np.array(rows).reshape(len(rows), -1 if rows else 0)
    return out


@pytest.fixture(scope="module")
def task_sets(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("synth_tasks")
    return {task: write_synthetic(root / task, num_images=12, seed=0, task=task) for task in ("segment", "pose", "obb")}


def test_detect_is_what_main_wrote(synthetic_data):
    assert synthetic_data.task == "detect"
    assert _tree_sha256(synthetic_data.root, jpeg=False) == _DETECT_TEXT_SHA256
    assert _tree_sha256(synthetic_data.root, jpeg=True) == _DETECT_JPEG_SHA256


def test_each_task_is_deterministic_and_its_own_set(task_sets, tmp_path):
    for task, data in task_sets.items():
        again = write_synthetic(tmp_path / task, num_images=12, seed=0, task=task)
        assert _tree_bytes(data.root) == _tree_bytes(again.root), task
        other = write_synthetic(tmp_path / f"{task}-seed1", num_images=12, seed=1, task=task)
        assert (other.images_dir / "synth_0000.jpg").read_bytes() != (data.images_dir / "synth_0000.jpg").read_bytes()
    firsts = {(d.images_dir / "synth_0000.jpg").read_bytes() for d in task_sets.values()}
    assert len(firsts) == 3


def _check_common(data, labels: dict[str, np.ndarray], nc: int) -> None:
    spec = yaml.safe_load(data.data_yaml.read_text())
    assert spec["train"] == "images/train" and spec["nc"] == nc == len(spec["names"])
    assert len(list(data.images_dir.glob("*.jpg"))) == data.num_images
    assert len(labels) == data.num_images - 1  # one background image has no label file
    assert sum(len(rows) == 0 for rows in labels.values()) == 1  # and one an empty file
    for stem, rows in labels.items():
        if len(rows):
            cls = np.array([row[0] for row in rows])
            assert (cls == np.round(cls)).all() and cls.min() >= 0 and cls.max() < nc, stem


def test_segment_labels_are_polygons_in_the_image(task_sets):
    data = task_sets["segment"]
    labels = _labels(data, ragged=True)
    _check_common(data, labels, 8)
    counts = [len(rows) for rows in labels.values()]
    assert max(counts) > 6  # denser than the detect set, so that masks overlap
    for stem, rows in labels.items():
        for row in rows:
            assert row.size % 2 == 1 and row.size >= 7, stem  # class + at least 3 points
            assert row[1:].min() >= 0 and row[1:].max() <= 1, stem
    raw = json.loads(data.coco_json.read_text())
    assert len(raw["annotations"]) == sum(counts)


def test_pose_labels_keypoints_and_yaml(task_sets):
    data = task_sets["pose"]
    labels = _labels(data)
    _check_common(data, labels, len(POSE_NAMES))
    spec = yaml.safe_load(data.data_yaml.read_text())
    assert tuple(spec["kpt_shape"]) == KPT_SHAPE == (5, 3)
    assert tuple(spec["flip_idx"]) == FLIP_IDX
    assert sorted(FLIP_IDX) == list(range(5)) and all(FLIP_IDX[FLIP_IDX[k]] == k for k in range(5))
    vis_seen = set()
    left_right = []
    for stem, rows in labels.items():
        if not len(rows):
            continue
        assert rows.shape[1] == 1 + 4 + 5 * 3, stem
        boxes, kpts = rows[:, 1:5], rows[:, 5:].reshape(-1, 5, 3)
        assert boxes.min() >= 0 and boxes.max() <= 1
        vis = kpts[..., 2]
        assert set(np.unique(vis)) <= {0.0, 1.0, 2.0}, stem
        vis_seen |= set(np.unique(vis).tolist())
        assert (kpts[vis == 0][:, :2] == 0).all(), stem  # an unlabelled point is written as 0 0 0
        x1, y1 = boxes[:, 0] - boxes[:, 2] / 2, boxes[:, 1] - boxes[:, 3] / 2
        x2, y2 = boxes[:, 0] + boxes[:, 2] / 2, boxes[:, 1] + boxes[:, 3] / 2
        labelled = vis > 0
        tol = 2e-6
        assert (kpts[..., 0][labelled] >= np.repeat(x1, 5).reshape(-1, 5)[labelled] - tol).all(), stem
        assert (kpts[..., 0][labelled] <= np.repeat(x2, 5).reshape(-1, 5)[labelled] + tol).all(), stem
        assert (kpts[..., 1][labelled] >= np.repeat(y1, 5).reshape(-1, 5)[labelled] - tol).all(), stem
        assert (kpts[..., 1][labelled] <= np.repeat(y2, 5).reshape(-1, 5)[labelled] + tol).all(), stem
        both = labelled[:, 1] & labelled[:, 2]
        left_right += (kpts[both, 1, 0] - kpts[both, 2, 0]).tolist()
    assert vis_seen == {0.0, 1.0, 2.0}  # seen, hidden and unlabelled points all occur
    # The figure's left hand is on the image's right (it faces the viewer) for most figures:
    # that is the left/right structure flip_idx swaps.
    assert np.mean(np.array(left_right) > 0) > 0.6
    raw = json.loads(data.coco_json.read_text())
    assert raw["categories"][0]["keypoints"] == ["head", "left_hand", "right_hand", "left_foot", "right_foot"]
    ann = raw["annotations"][0]
    assert len(ann["keypoints"]) == 15 and ann["num_keypoints"] == sum(v > 0 for v in ann["keypoints"][2::3])


def test_obb_labels_are_rotated_rectangles_drawn_inside_the_image(task_sets):
    data = task_sets["obb"]
    labels = _labels(data)
    _check_common(data, labels, len(OBB_NAMES))
    assert data.coco_json is None
    angles = []
    for stem, rows in labels.items():
        if not len(rows):
            continue
        assert rows.shape[1] == 9, stem
        img = cv2.imread(str(data.images_dir / f"{stem}.jpg"))
        h, w = img.shape[:2]
        for row in rows:
            c = row[1:].reshape(4, 2) * [w, h]
            assert (c >= 0).all() and (c[:, 0] <= w).all() and (c[:, 1] <= h).all(), stem
            sides = np.linalg.norm(np.roll(c, -1, axis=0) - c, axis=1)
            # opposite sides equal and the diagonals equal: a rectangle (to the 0.01 px rounding)
            assert abs(sides[0] - sides[2]) < 0.05 and abs(sides[1] - sides[3]) < 0.05, stem
            assert abs(np.linalg.norm(c[2] - c[0]) - np.linalg.norm(c[3] - c[1])) < 0.05, stem
            edge = c[1] - c[0]
            angles.append(np.arctan2(edge[1], edge[0]) % np.pi)
    # drawn at every angle, not only axis-aligned
    assert np.histogram(angles, np.linspace(0, np.pi, 5))[0].min() > 0


def test_cli_synth_task_writes_the_set(tmp_path, capsys):
    out = tmp_path / "pose"
    assert main(["synth", str(out), "--num-images", "4", "--seed", "2", "--task", "pose"]) == 0
    printed = capsys.readouterr().out
    assert "(pose)" in printed and str(out / "data.yaml") in printed
    assert yaml.safe_load((out / "data.yaml").read_text())["flip_idx"] == list(FLIP_IDX)
    out = tmp_path / "obb"
    assert main(["synth", str(out), "--num-images", "4", "--task", "obb"]) == 0
    assert "COCO json" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["synth", str(tmp_path / "x"), "--task", "classify"])
    with pytest.raises(ValueError, match="--task"):
        write_synthetic(tmp_path / "y", task="classify")
