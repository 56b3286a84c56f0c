"""The embedded default dataset: coloured shapes on textured backgrounds, exact labels.

Runs in the process that asks for it (``pixpool synth``, the demo, the test fixtures) and
only writes files under the given root, which the caller owns.

Every instance is a polygon known exactly (vertices rounded to 0.01 px, the precision the
COCO json stores); its box is the polygon's extents and its pixels are that polygon filled.
The same seed gives the same bytes (numpy's PCG64 stream, libjpeg at quality 95), so a
snapshot fingerprint of the set is stable across runs. Layout under ``root``::

    images/train/synth_NNNN.jpg
    labels/train/synth_NNNN.txt          YOLO segment lines, normalised, 6 decimals
    annotations/instances_train.json     COCO: polygons, bbox, area, iscrowd 0
    data.yaml                            YOLO: train folder and class names

What it exercises: 8 classes whose COCO category ids are odd (1, 3, ..., 15), so readers
must map them to 0..7; non-contiguous image ids; sizes from 160 to 640 px per side in both
orientations, plus one very wide (640x96) and one tiny (48x40) image; 0-6 objects per
image, with two background images (one with an empty label file, one with none).

``task`` picks the set (``pixpool synth --task``): ``detect`` (the default, the bytes above
unchanged), ``segment`` (the same layout and shapes from a random stream of its own, 1-10
shapes per image so that masks overlap), ``pose`` and ``obb`` (``tasks.py``:
drawn figures with keypoints, rotated rectangles with their 4 corners).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import numpy as np

from ...shared.task import TaskSpec, task_spec
from ..readers._common import polygon_area
from .draw import (
    BACKGROUND_INDICES,
    CATEGORY_IDS,
    CLASS_NAMES,
    CLASSES,
    JPEG_QUALITY,
    SYNTH_TASKS,
    TINY_INDEX,
    SyntheticData,
    background,
    background_declaration,
    draw,
    size_wh,
    yolo_line,
)

__all__ = ["CATEGORY_IDS", "CLASS_NAMES", "SYNTH_TASKS", "SyntheticData", "write_synthetic"]

# Most instances drawn in one image of the polygon sets written here: a segment set is denser.
_MAX_INSTANCES = {"detect": 6, "segment": 10}


def _shape(kind: str, w: int, h: int, rng: np.random.Generator) -> np.ndarray:
    """Vertices (k, 2) in pixels, clamped to the image and rounded to 0.01 px."""
    short = min(w, h)
    r = rng.uniform(0.08, 0.3) * short + 3.0
    cx = rng.uniform(0.1, 0.9) * w
    cy = rng.uniform(0.1, 0.9) * h
    theta = rng.uniform(0, math.pi)
    if kind == "rectangle":
        a, b = r, r * rng.uniform(0.4, 1.0)
        local = np.array([[-a, -b], [a, -b], [a, b], [-a, b]])
    elif kind == "ellipse":
        t = np.linspace(0, 2 * math.pi, int(rng.integers(16, 25)), endpoint=False)
        local = np.stack([r * np.cos(t), r * rng.uniform(0.4, 1.0) * np.sin(t)], axis=1)
    elif kind == "triangle":
        t = np.array([0.0, 2 * math.pi / 3, 4 * math.pi / 3]) + rng.uniform(-0.3, 0.3, size=3)
        rad = r * rng.uniform(0.6, 1.0, size=3)
        local = np.stack([rad * np.cos(t), rad * np.sin(t)], axis=1)
    else:  # irregular star-shaped polygon: sorted angles keep it simple (no self-crossing)
        k = int(rng.integers(5, 10))
        t = np.sort(rng.uniform(0, 2 * math.pi, size=k))
        rad = r * rng.uniform(0.45, 1.0, size=k)
        local = np.stack([rad * np.cos(t), rad * np.sin(t)], axis=1)
    rot = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    pts = local @ rot.T + [cx, cy]
    pts[:, 0] = np.clip(pts[:, 0], 0, w)
    pts[:, 1] = np.clip(pts[:, 1], 0, h)
    return np.round(pts, 2)


def _data_yaml(num_images: int, seed: int, spec: TaskSpec) -> str:
    # detect keeps its header line byte for byte; the other sets name their task
    what = "" if spec.is_default else f" ({spec.name})"
    lines = [
        f"# pixpool synthetic dataset{what}: {num_images} images, seed {seed}",
        "train: images/train",
        "val: images/train",
        f"nc: {len(CLASS_NAMES)}",
        "names:",
        *(f"  {i}: {name}" for i, name in enumerate(CLASS_NAMES)),
        *background_declaration(num_images),
    ]
    return "\n".join(lines) + "\n"


def write_synthetic(root: str | Path, *, num_images: int = 24, seed: int = 0, task: str = "detect") -> SyntheticData:
    """Write the synthetic dataset of ``task`` under ``root`` (created if needed); same seed, same bytes.

    With fewer than 10 images some of the special cases (wide, tiny, the two backgrounds)
    are simply not reached.
    """
    if num_images < 1:
        raise ValueError(f"num_images must be >= 1, got {num_images}")
    spec = task_spec(task)
    if spec.has_keypoints or spec.rotated:  # figures and rotated rectangles, drawn by ``tasks.py``
        from .tasks import write_obb, write_pose

        writer = write_pose if spec.has_keypoints else write_obb
        return writer(Path(root), num_images=num_images, seed=seed, spec=spec)
    root = Path(root)
    images_dir = root / "images" / "train"
    labels_dir = root / "labels" / "train"
    ann_dir = root / "annotations"
    for folder in (images_dir, labels_dir, ann_dir):
        folder.mkdir(parents=True, exist_ok=True)

    # detect draws from the seed itself (its bytes are fixed); segment from a stream of its own
    rng = np.random.default_rng(seed if spec.is_default else [seed, SYNTH_TASKS.index(spec.name)])
    max_count = _MAX_INSTANCES[spec.name]
    coco_images, coco_anns = [], []
    for i in range(num_images):
        w, h = size_wh(i, rng)
        img = background(w, h, rng)
        if i in BACKGROUND_INDICES:
            count = 0
        elif i == TINY_INDEX:
            count = 1
        else:
            count = int(rng.integers(1, max_count + 1))
        image_id = 100 + 3 * i
        stem = f"synth_{i:04d}"
        lines = []
        for _ in range(count):
            cls = int(rng.integers(len(CLASSES)))
            _, kind, colour = CLASSES[cls]
            pts = _shape(kind, w, h, rng)
            draw(img, pts, colour, rng)
            lines.append(yolo_line(cls, pts, w, h))
            x0, y0 = pts.min(axis=0)
            x1, y1 = pts.max(axis=0)
            coco_anns.append(
                {
                    "id": len(coco_anns) + 1,
                    "image_id": image_id,
                    "category_id": CATEGORY_IDS[cls],
                    "segmentation": [[float(v) for v in pts.reshape(-1)]],
                    "bbox": [float(x0), float(y0), round(float(x1 - x0), 2), round(float(y1 - y0), 2)],
                    "area": round(polygon_area(pts), 2),
                    "iscrowd": 0,
                }
            )
        if not cv2.imwrite(str(images_dir / f"{stem}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY]):
            raise OSError(f"cv2.imwrite could not write {images_dir / f'{stem}.jpg'}")
        if i != BACKGROUND_INDICES[1]:  # one background image has no label file at all
            (labels_dir / f"{stem}.txt").write_text("".join(line + "\n" for line in lines))
        coco_images.append({"id": image_id, "file_name": f"{stem}.jpg", "width": w, "height": h})

    coco = {
        "info": {"description": f"pixpool synthetic dataset, seed {seed}", "version": "1"},
        "images": coco_images,
        "annotations": coco_anns,
        "categories": [
            {"id": cid, "name": name, "supercategory": "shape"} for cid, name in zip(CATEGORY_IDS, CLASS_NAMES)
        ],
    }
    coco_json = ann_dir / "instances_train.json"
    coco_json.write_text(json.dumps(coco, separators=(",", ":")) + "\n")
    data_yaml = root / "data.yaml"
    data_yaml.write_text(_data_yaml(num_images, seed, spec))
    return SyntheticData(
        root=root,
        images_dir=images_dir,
        labels_dir=labels_dir,
        coco_json=coco_json,
        data_yaml=data_yaml,
        num_images=num_images,
        spec=spec,
    )
