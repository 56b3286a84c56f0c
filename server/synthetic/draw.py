"""What every synthetic set shares: the classes, the image sizes, the backgrounds and the drawing.

Runs in the process that writes a synthetic set (``shapes.py`` for detect and segment,
``tasks.py`` for pose and obb); pure functions of their generator, no files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from ...shared.task import DETECT, TASKS, TaskSpec

# (name, shape, BGR colour): two colours per shape kind.
CLASSES = (
    ("red_rectangle", "rectangle", (40, 40, 220)),
    ("green_ellipse", "ellipse", (60, 190, 60)),
    ("blue_triangle", "triangle", (210, 90, 30)),
    ("yellow_polygon", "polygon", (30, 220, 230)),
    ("purple_rectangle", "rectangle", (170, 50, 150)),
    ("cyan_ellipse", "ellipse", (220, 210, 40)),
    ("orange_triangle", "triangle", (20, 140, 250)),
    ("white_polygon", "polygon", (235, 235, 235)),
)
CLASS_NAMES = tuple(name for name, _, _ in CLASSES)
#: COCO category id of class i: deliberately not contiguous.
CATEGORY_IDS = tuple(2 * i + 1 for i in range(len(CLASSES)))

#: The sets ``write_synthetic`` writes, one per training task (the order seeds their streams).
SYNTH_TASKS = TASKS

WIDE_INDEX, TINY_INDEX = 1, 2
BACKGROUND_INDICES = (3, 9)  # 3: empty label file, 9: no label file
JPEG_QUALITY = 95


@dataclass(frozen=True)
class SyntheticData:
    """Where ``write_synthetic`` put the dataset."""

    root: Path
    images_dir: Path
    labels_dir: Path
    coco_json: Path | None  # None for obb: COCO has no rotated boxes
    data_yaml: Path
    names: tuple[str, ...] = CLASS_NAMES
    num_images: int = 0
    spec: TaskSpec = DETECT

    @property
    def task(self) -> str:
        return self.spec.name


def size_wh(i: int, rng: np.random.Generator) -> tuple[int, int]:
    if i == WIDE_INDEX:
        return 640, 96
    if i == TINY_INDEX:
        return 48, 40
    w, h = (int(v) for v in rng.integers(160, 641, size=2))
    if i % 4 == 0 and w > h:  # make sure portrait images exist whatever the draw
        w, h = h, w
    return w, h


def background(w: int, h: int, rng: np.random.Generator) -> np.ndarray:
    kind = int(rng.integers(3))
    c0 = rng.uniform(30, 225, size=3).astype(np.float32)
    c1 = rng.uniform(30, 225, size=3).astype(np.float32)
    if kind == 0:  # smooth noise: a coarse random grid upsampled, plus grain
        coarse = rng.uniform(40, 215, size=(h // 16 + 2, w // 16 + 2, 3)).astype(np.float32)
        img = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_LINEAR)
    else:
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        angle = rng.uniform(0, math.pi)
        along = xx * math.cos(angle) + yy * math.sin(angle)
        if kind == 1:  # linear gradient between two colours
            t = (along - along.min()) / max(float(along.max() - along.min()), 1.0)
        else:  # stripes of a random period
            period = rng.uniform(6, 40)
            t = 0.5 + 0.5 * np.sin(along * (2 * math.pi / period))
        img = c0 + t[..., None] * (c1 - c0)
    img = img + rng.normal(0, 6, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def draw(img: np.ndarray, pts: np.ndarray, colour: tuple[int, int, int], rng: np.random.Generator) -> None:
    jitter = rng.integers(-25, 26, size=3)
    fill = tuple(int(np.clip(c + j, 0, 255)) for c, j in zip(colour, jitter))
    fixed = np.round(pts * 16).astype(np.int32)  # 4 fractional bits: sub-pixel vertices
    cv2.fillPoly(img, [fixed], fill, lineType=cv2.LINE_AA, shift=4)
    edge = tuple(int(c * 0.6) for c in fill)
    cv2.polylines(img, [fixed], True, edge, thickness=1, lineType=cv2.LINE_AA, shift=4)


def yolo_line(cls: int, pts: np.ndarray, w: int, h: int) -> str:
    norm = pts / [w, h]
    return f"{cls} " + " ".join(f"{v:.6f}" for v in norm.reshape(-1))


def background_declaration(num_images: int) -> list[str]:
    """The data.yaml line that says the set's image without a label file is a background by
    design (``readers.DECLARED_BACKGROUND_KEY``): reading the set then warns of nothing."""
    from ..readers import DECLARED_BACKGROUND_KEY

    if num_images <= BACKGROUND_INDICES[1]:
        return []  # too few images to reach it: every image has a label file
    return [
        f"{DECLARED_BACKGROUND_KEY}: 1  # synth_{BACKGROUND_INDICES[1]:04d}.jpg has no label file: a background image"
    ]
