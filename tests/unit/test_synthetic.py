"""The embedded synthetic dataset: deterministic bytes, the layout both readers expect, and
the special cases it promises (backgrounds, wide, tiny, portrait, non-contiguous ids)."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

from pixpool.cli import main
from pixpool.server.readers import load_dataset
from pixpool.server.synthetic import CATEGORY_IDS, CLASS_NAMES, write_synthetic


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes(synthetic_data, tmp_path):
    again = write_synthetic(tmp_path / "again", num_images=24, seed=0)
    first, second = _tree_bytes(synthetic_data.root), _tree_bytes(again.root)
    assert len(first) == 24 + 23 + 2  # images, label files (one background has none), json, yaml
    assert first == second


def test_other_seed_other_images(synthetic_data, tmp_path):
    other = write_synthetic(tmp_path / "other", num_images=24, seed=1)
    a = (synthetic_data.images_dir / "synth_0000.jpg").read_bytes()
    assert a != (other.images_dir / "synth_0000.jpg").read_bytes()


def test_layout_and_attributes(synthetic_data):
    root = synthetic_data.root
    assert synthetic_data.images_dir == root / "images" / "train"
    assert synthetic_data.labels_dir == root / "labels" / "train"
    assert synthetic_data.coco_json == root / "annotations" / "instances_train.json"
    assert synthetic_data.data_yaml == root / "data.yaml"
    assert synthetic_data.names == CLASS_NAMES and 6 <= len(CLASS_NAMES) <= 10
    raw = json.loads(synthetic_data.coco_json.read_text())
    assert [c["name"] for c in raw["categories"]] == list(CLASS_NAMES)
    assert [c["id"] for c in raw["categories"]] == list(CATEGORY_IDS)


def test_images_match_their_sizes_and_cover_the_special_cases(synthetic_data):
    dataset = load_dataset(synthetic_data.coco_json)
    sizes = []
    for record in dataset.records:
        img = cv2.imread(record.image_path)
        assert img is not None and img.shape == (*record.size_hw, 3)
        assert img.std() > 3  # textured, not a flat fill
        sizes.append(record.size_hw)
    assert (96, 640) in sizes and (40, 48) in sizes
    assert any(h > w for h, w in sizes) and any(w > h for h, w in sizes)
    assert all(160 <= h <= 640 and 160 <= w <= 640 for h, w in sizes if (h, w) not in ((96, 640), (40, 48)))


def test_backgrounds_and_instance_counts(synthetic_data):
    records = load_dataset(synthetic_data.data_yaml).records
    counts = [r.num_instances for r in records]
    assert all(0 <= c <= 6 for c in counts)
    background = [Path(r.image_path).stem for r in records if r.num_instances == 0]
    assert len(background) >= 2
    label_files = [synthetic_data.labels_dir / f"{stem}.txt" for stem in background]
    assert any(not p.exists() for p in label_files)  # a missing label file is background
    assert any(p.exists() and p.stat().st_size == 0 for p in label_files)  # so is an empty one
    assert len({c for r in records for c in r.classes.tolist()}) == len(CLASS_NAMES)


def test_labels_are_exact_polygons(synthetic_data):
    """Boxes are the polygon extents; COCO bbox/area agree with the polygon; the shape is drawn."""
    raw = json.loads(synthetic_data.coco_json.read_text())
    images = {img["id"]: img for img in raw["images"]}
    for ann in raw["annotations"]:
        pts = np.array(ann["segmentation"][0]).reshape(-1, 2)
        x, y, w, h = ann["bbox"]
        np.testing.assert_allclose([x, y, x + w, y + h], [*pts.min(axis=0), *pts.max(axis=0)], atol=1e-9)
        assert w > 0 and h > 0 and ann["iscrowd"] == 0 and ann["area"] > 0
        img = images[ann["image_id"]]
        assert (pts >= 0).all() and (pts[:, 0] <= img["width"]).all() and (pts[:, 1] <= img["height"]).all()
    # The shape drawn last in an image is never covered: its pixels have the class colour's
    # look, i.e. they differ from the background just outside its box.
    last = {}
    for ann in raw["annotations"]:
        last[ann["image_id"]] = ann
    for image_id, ann in last.items():
        img = cv2.imread(str(synthetic_data.images_dir / images[image_id]["file_name"]))
        mask = np.zeros(img.shape[:2], np.uint8)
        pts = np.array(ann["segmentation"][0]).reshape(-1, 2)
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1)
        mask = cv2.erode(mask, np.ones((3, 3), np.uint8))
        if mask.sum() < 20:
            continue
        inside = img[mask.astype(bool)].astype(np.float32)
        assert inside.std(axis=0).max() < 25, images[image_id]["file_name"]  # a uniform fill


def test_cli_synth_writes_the_dataset(tmp_path, capsys):
    out = tmp_path / "synth"
    assert main(["synth", str(out), "--num-images", "12", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert str(out / "annotations" / "instances_train.json") in printed
    assert str(out / "data.yaml") in printed
    assert len(list((out / "images" / "train").glob("*.jpg"))) == 12
    assert len(load_dataset(out / "data.yaml")) == 12
