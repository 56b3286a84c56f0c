"""The synthetic pose and OBB sets (``pixpool synth --task pose|obb``): drawn figures with their
keypoints, rotated rectangles with their 4 corners, in Ultralytics' YOLO label formats.

Runs in the process that asks for it (``pixpool synth``, tests, benchmarks) and only writes
files under the given root, which the caller owns. Same backgrounds, image sizes, special
cases (wide, tiny, two backgrounds) and determinism as ``synthetic.py``, each set from a
random stream of its own. Layout under ``root``::

    images/train/synth_NNNN.jpg
    labels/train/synth_NNNN.txt          pose: class cx cy w h + 5 x (x y v); obb: class + 4 corners
    annotations/instances_train.json     pose only: COCO keypoints (COCO has no rotated boxes)
    data.yaml                            train folder, class names; pose: kpt_shape, flip_idx

Pose: a stick figure per instance, 5 keypoints (head, left hand, right hand, left foot,
right foot; "left" is the figure's own left, on the image's right as it faces the viewer),
``kpt_shape: [5, 3]``, ``flip_idx: [0, 2, 1, 4, 3]``. Visibility as COCO writes it: 2 seen,
1 labelled but hidden (a patch of background is drawn over it), 0 not labelled (x = y = 0,
and that limb is not drawn). The box is the drawn figure's extent. Every labelled point lies
inside its image, as Ultralytics' label check requires.

OBB: filled rectangles at any angle, wholly inside the image (so the 4 corners are exact
and need no clipping), aspect 0.25-1; corners in drawing order, normalised.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import numpy as np

from ...shared.task import TaskSpec
from . import draw as _s

# -- pose -------------------------------------------------------------------------------------
POSE_CLASSES = (("light_figure", (225, 225, 240)), ("dark_figure", (40, 30, 60)))
POSE_NAMES = tuple(name for name, _ in POSE_CLASSES)
KEYPOINT_NAMES = ("head", "left_hand", "right_hand", "left_foot", "right_foot")
FLIP_IDX = (0, 2, 1, 4, 3)
KPT_SHAPE = (len(KEYPOINT_NAMES), 3)
# COCO's skeleton: 1-based keypoint pairs joined by a line (each limb to the head here).
_SKELETON = ((1, 2), (1, 3), (1, 4), (1, 5))
_P_UNLABELLED = 0.08  # a limb missing: the point is not labelled (v = 0)
_P_HIDDEN = 0.08  # a point covered by a patch of background: labelled, not seen (v = 1)

# -- obb --------------------------------------------------------------------------------------
OBB_CLASSES = (
    ("red_plate", (40, 40, 220)),
    ("green_plate", (60, 190, 60)),
    ("blue_plate", (210, 90, 30)),
    ("yellow_plate", (30, 220, 230)),
    ("white_plate", (235, 235, 235)),
)
OBB_NAMES = tuple(name for name, _ in OBB_CLASSES)


def _task_rng(seed: int, task: str) -> np.random.Generator:
    return np.random.default_rng([seed, _s.SYNTH_TASKS.index(task)])


def _count(i: int, rng: np.random.Generator, most: int) -> int:
    if i in _s.BACKGROUND_INDICES:
        return 0
    if i == _s.TINY_INDEX:
        return 1
    return int(rng.integers(1, most + 1))


def _folders(root: Path) -> tuple[Path, Path]:
    images_dir, labels_dir = root / "images" / "train", root / "labels" / "train"
    for folder in (images_dir, labels_dir):
        folder.mkdir(parents=True, exist_ok=True)
    return images_dir, labels_dir


def _write_image(path: Path, img: np.ndarray) -> None:
    if not cv2.imwrite(str(path), img, [cv2.IMWRITE_JPEG_QUALITY, _s.JPEG_QUALITY]):
        raise OSError(f"cv2.imwrite could not write {path}")


def _yaml(task: str, num_images: int, seed: int, names: tuple[str, ...], extra: list[str]) -> str:
    lines = [
        f"# pixpool synthetic dataset ({task}): {num_images} images, seed {seed}",
        "train: images/train",
        "val: images/train",
        f"nc: {len(names)}",
        "names:",
        *(f"  {i}: {name}" for i, name in enumerate(names)),
        *extra,
        *_s.background_declaration(num_images),
    ]
    return "\n".join(lines) + "\n"


def _figure(w: int, h: int, rng: np.random.Generator) -> tuple[np.ndarray, float, float]:
    """One figure about the origin, in pixels: (7, 2) points (the 5 keypoints, then neck and hip),
    head radius, line width."""
    short = min(w, h)
    tall = rng.uniform(0.3, 0.8) * short
    neck = np.array([0.0, -0.22 * tall])
    hip = np.array([0.0, 0.12 * tall])
    head = neck + [0.0, -0.12 * tall]
    arm, leg = 0.3 * tall, 0.38 * tall
    # angles from straight down: arms anywhere from hanging to raised, legs apart
    a_left, a_right = rng.uniform(0.3, 2.6, size=2)
    l_left, l_right = rng.uniform(0.05, 0.6, size=2)
    shoulder = neck + [0.0, 0.04 * tall]
    pts = np.array(
        [
            head,
            shoulder + arm * np.array([math.sin(a_left), math.cos(a_left)]),
            shoulder + arm * np.array([-math.sin(a_right), math.cos(a_right)]),
            hip + leg * np.array([math.sin(l_left), math.cos(l_left)]),
            hip + leg * np.array([-math.sin(l_right), math.cos(l_right)]),
            neck,
            hip,
        ]
    )
    tilt = rng.uniform(-0.35, 0.35)
    rot = np.array([[math.cos(tilt), -math.sin(tilt)], [math.sin(tilt), math.cos(tilt)]])
    return pts @ rot.T, 0.1 * tall, max(1.5, tall / 28)


def _place(pts: np.ndarray, pad: float, w: int, h: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Shift ``pts`` to a random spot where every point, ``pad`` around it, lies inside the image.

    A shape too big for the image is first shrunk about the origin; returns the points and
    that scale (1 when it fitted), so that sizes drawn with it can shrink alike."""
    size = np.array([w, h], dtype=np.float64)
    span = pts.max(axis=0) - pts.min(axis=0) + 2 * pad
    scale = min(1.0, float((size / np.maximum(span, 1e-9)).min()) * 0.98)
    pts, pad = pts * scale, pad * scale
    lo, hi = pts.min(axis=0) - pad, pts.max(axis=0) + pad
    offset = rng.uniform(0, 1, size=2) * np.maximum(size - (hi - lo), 0) - lo
    return pts + offset, scale


def write_pose(root: Path, *, num_images: int, seed: int, spec: TaskSpec) -> _s.SyntheticData:
    images_dir, labels_dir = _folders(root)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    rng = _task_rng(seed, "pose")
    coco_images, coco_anns = [], []
    for i in range(num_images):
        w, h = _s.size_wh(i, rng)
        img = _s.background(w, h, rng)
        image_id = 100 + 3 * i
        stem = f"synth_{i:04d}"
        lines = []
        for _ in range(_count(i, rng, 4)):
            cls = int(rng.integers(len(POSE_CLASSES)))
            pts, radius, width = _figure(w, h, rng)
            pts, scale = _place(pts, radius + width, w, h, rng)
            radius, width = radius * scale, width * scale
            vis = np.full(5, 2, dtype=np.int64)
            draw = rng.uniform(size=5)
            vis[1:][draw[1:] < _P_UNLABELLED] = 0  # the head is always there
            vis[(vis == 2) & (draw > 1 - _P_HIDDEN)] = 1
            colour = tuple(int(np.clip(c + j, 0, 255)) for c, j in zip(POSE_CLASSES[cls][1], rng.integers(-20, 21, 3)))
            thick = max(1, round(width))
            neck, hip = pts[5], pts[6]
            drawn = [pts[0], neck, hip]
            cv2.line(img, _px(neck), _px(hip), colour, thick, cv2.LINE_AA)
            for k, root_pt in ((1, neck), (2, neck), (3, hip), (4, hip)):
                if vis[k]:
                    cv2.line(img, _px(root_pt), _px(pts[k]), colour, thick, cv2.LINE_AA)
                    drawn.append(pts[k])
            cv2.circle(img, _px(pts[0]), max(1, round(radius)), colour, -1, cv2.LINE_AA)
            for k in np.flatnonzero(vis == 1):  # hide the point under a patch of background
                half = max(2, round(2.5 * width))
                x, y = _px(pts[k])
                cv2.rectangle(img, (x - half, y - half), (x + half, y + half), _patch(img, x, y, half), -1)
            drawn = np.array(drawn)
            pad = np.array([[-radius, -radius], [radius, radius]])
            lo = np.clip(np.minimum(drawn.min(axis=0) - thick / 2, pts[0] + pad[0]), 0, [w, h])
            hi = np.clip(np.maximum(drawn.max(axis=0) + thick / 2, pts[0] + pad[1]), 0, [w, h])
            kp = np.round(pts[:5], 2)
            kp[vis == 0] = 0.0
            box = np.round(np.concatenate([lo, hi]), 2)
            cx, cy, bw, bh = (
                (box[0] + box[2]) / 2 / w,
                (box[1] + box[3]) / 2 / h,
                (box[2] - box[0]) / w,
                (box[3] - box[1]) / h,
            )
            points = " ".join(f"{x / w:.6f} {y / h:.6f} {v:d}" for (x, y), v in zip(kp, vis.tolist()))
            lines.append(f"{cls} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f} {points}")
            coco_anns.append(
                {
                    "id": len(coco_anns) + 1,
                    "image_id": image_id,
                    "category_id": _s.CATEGORY_IDS[cls],
                    "bbox": [
                        float(box[0]),
                        float(box[1]),
                        round(float(box[2] - box[0]), 2),
                        round(float(box[3] - box[1]), 2),
                    ],
                    "area": round(float((box[2] - box[0]) * (box[3] - box[1])), 2),
                    "iscrowd": 0,
                    "keypoints": [v for (x, y), s in zip(kp.tolist(), vis.tolist()) for v in (x, y, s)],
                    "num_keypoints": int((vis > 0).sum()),
                }
            )
        _write_image(images_dir / f"{stem}.jpg", img)
        if i != _s.BACKGROUND_INDICES[1]:
            (labels_dir / f"{stem}.txt").write_text("".join(line + "\n" for line in lines))
        coco_images.append({"id": image_id, "file_name": f"{stem}.jpg", "width": w, "height": h})
    categories = [
        {
            "id": cid,
            "name": name,
            "supercategory": "figure",
            "keypoints": list(KEYPOINT_NAMES),
            "skeleton": [list(e) for e in _SKELETON],
        }
        for cid, name in zip(_s.CATEGORY_IDS, POSE_NAMES)
    ]
    coco = {
        "info": {"description": f"pixpool synthetic pose dataset, seed {seed}", "version": "1"},
        "images": coco_images,
        "annotations": coco_anns,
        "categories": categories,
    }
    coco_json = root / "annotations" / "instances_train.json"
    coco_json.write_text(json.dumps(coco, separators=(",", ":")) + "\n")
    extra = [f"kpt_shape: [{KPT_SHAPE[0]}, {KPT_SHAPE[1]}]", f"flip_idx: [{', '.join(map(str, FLIP_IDX))}]"]
    data_yaml = root / "data.yaml"
    data_yaml.write_text(_yaml("pose", num_images, seed, POSE_NAMES, extra))
    return _s.SyntheticData(
        root=root,
        images_dir=images_dir,
        labels_dir=labels_dir,
        coco_json=coco_json,
        data_yaml=data_yaml,
        names=POSE_NAMES,
        num_images=num_images,
        spec=spec.with_keypoints(KPT_SHAPE, FLIP_IDX),
    )


def _px(p: np.ndarray) -> tuple[int, int]:
    return round(float(p[0])), round(float(p[1]))


def _patch(img: np.ndarray, x: int, y: int, half: int) -> tuple[int, int, int]:
    """The background colour just beside a point (left of it, else right), to hide it with."""
    h, w = img.shape[:2]
    xs = x - 3 * half if x - 3 * half >= 0 else min(w - 1, x + 3 * half)
    return tuple(int(v) for v in img[min(max(y, 0), h - 1), xs])


def write_obb(root: Path, *, num_images: int, seed: int, spec: TaskSpec) -> _s.SyntheticData:
    images_dir, labels_dir = _folders(root)
    rng = _task_rng(seed, "obb")
    for i in range(num_images):
        w, h = _s.size_wh(i, rng)
        img = _s.background(w, h, rng)
        lines = []
        for _ in range(_count(i, rng, 8)):
            cls = int(rng.integers(len(OBB_CLASSES)))
            long_px = rng.uniform(0.1, 0.45) * min(w, h) + 4.0
            a, b = long_px / 2, long_px / 2 * rng.uniform(0.25, 1.0)
            theta = rng.uniform(0, math.pi)
            local = np.array([[-a, -b], [a, -b], [a, b], [-a, b]])
            rot = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
            corners = np.round(_place(local @ rot.T, 0.0, w, h, rng)[0], 2)
            _s.draw(img, corners, OBB_CLASSES[cls][1], rng)
            lines.append(_s.yolo_line(cls, corners, w, h))
        stem = f"synth_{i:04d}"
        _write_image(images_dir / f"{stem}.jpg", img)
        if i != _s.BACKGROUND_INDICES[1]:
            (labels_dir / f"{stem}.txt").write_text("".join(line + "\n" for line in lines))
    data_yaml = root / "data.yaml"
    data_yaml.write_text(_yaml("obb", num_images, seed, OBB_NAMES, []))
    return _s.SyntheticData(
        root=root,
        images_dir=images_dir,
        labels_dir=labels_dir,
        coco_json=None,
        data_yaml=data_yaml,
        names=OBB_NAMES,
        num_images=num_images,
        spec=spec,
    )
