"""Small hand-written YOLO and COCO sets for the segment, pose and obb tasks (readers, snapshot tests).

Each builder writes a few noise JPEGs and the label text given, and returns the data.yaml or
json path; the label lines are the test's own, so what a reader must return is known exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from helpers.snapshot import write_jpegs

#: Five keypoints with left/right pairs, as COCO names them: flip_idx (0, 2, 1, 4, 3).
KPT_NAMES = ["nose", "left_eye", "right_eye", "left_ear", "right_ear"]
KPT_FLIP = (0, 2, 1, 4, 3)


def yolo_set(root: Path, labels: list[str | None], *, names=("a", "b", "c"), sizes_hw=None, **yaml_keys) -> Path:
    """``root``/images/train/img_NNN.jpg with ``labels[i]`` as its label text (None: no label
    file) and a data.yaml with ``names`` and ``yaml_keys`` (kpt_shape, flip_idx, ...)."""
    sizes_hw = sizes_hw or [(48 + 8 * i, 64) for i in range(len(labels))]
    paths = write_jpegs(root / "images" / "train", sizes_hw)
    (root / "labels" / "train").mkdir(parents=True, exist_ok=True)
    for path, text in zip(paths, labels):
        if text is not None:
            (root / "labels" / "train" / (Path(path).stem + ".txt")).write_text(text)
    data = {"path": ".", "train": "images/train", "names": list(names), **yaml_keys}
    (root / "data.yaml").write_text(yaml.safe_dump(data))
    return root / "data.yaml"


def label_path(yaml_path: Path, i: int) -> Path:
    return yaml_path.parent / "labels" / "train" / f"img_{i:03d}.txt"


def coco_pose_set(root: Path, annotations: list[dict], *, kpt_names=KPT_NAMES, sizes_hw=((40, 60), (50, 80))) -> Path:
    """A COCO keypoints json over noise JPEGs: one category "person" with ``kpt_names``;
    ``annotations`` are completed with ids and category 1 (their image_id picks the image)."""
    images_dir = root / "images" / "train"
    paths = write_jpegs(images_dir, sizes_hw)
    images = [
        {"id": i + 1, "file_name": Path(p).name, "height": h, "width": w}
        for i, (p, (h, w)) in enumerate(zip(paths, sizes_hw))
    ]
    anns = [{"id": j + 1, "category_id": 1, "iscrowd": 0, **a} for j, a in enumerate(annotations)]
    cats = [{"id": 1, "name": "person", "keypoints": list(kpt_names) if kpt_names is not None else None}]
    if kpt_names is None:
        del cats[0]["keypoints"]
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    path = root / "annotations" / "instances_train.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path
