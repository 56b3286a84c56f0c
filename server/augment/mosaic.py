"""Mosaic of four records and the single-image letterbox placement, as canvas tiles.

Runs wherever a sample is rendered. Only computes where each source image goes on the
canvas and the matching labels; ``canvas.fill`` writes the pixels (reading the source's
read-only views, never writing them). The source's task decides how its polygons enter
(``resample.py``) and how they are clipped to the canvas (OBB: ``obb.clip_rotated``).
"""

from __future__ import annotations

import numpy as np

from ...shared.stream.source import ImageSource
from ...shared.task import TaskSpec
from .affine import uniform
from .labels import Labels
from .obb import clip_rotated
from .resample import resampled_targets

Tile = tuple[np.ndarray, tuple[int, int, int, int], tuple[int, int]]


def clip_to(labels: Labels, width: float, height: float, spec: TaskSpec) -> Labels:
    """``labels.clip``, or for OBB polygons the clip that keeps each box's direction."""
    if not spec.rotated or not len(labels.points):
        return labels.clip(width, height)
    clipped = labels.clip(width, height)  # keypoints (none for obb) and polygon-less boxes
    boxes, points = clip_rotated(labels.boxes, labels.points, labels.offsets, width, height)
    return Labels(labels.classes, boxes, points, labels.offsets, clipped.keypoints)


def draw_mosaic(rng: np.random.Generator, num_records: int, imgsz: int) -> tuple[np.ndarray, int, int]:
    """(three partner record indices, centre x, centre y) drawn in that order."""
    partners = rng.integers(0, num_records, size=3)
    xc = int(uniform(rng, imgsz / 2, 3 * imgsz / 2))
    yc = int(uniform(rng, imgsz / 2, 3 * imgsz / 2))
    return partners, xc, yc


def mosaic_tiles(source: ImageSource, indices: list[int], imgsz: int, xc: int, yc: int) -> tuple[list[Tile], Labels]:
    """Four records around the centre (xc, yc) of a 2·imgsz canvas: top-left, top-right,
    bottom-left, bottom-right; labels shifted and clipped to the canvas."""
    canvas = 2 * imgsz  # the mosaic canvas side
    spec = source.spec
    tiles: list[Tile] = []
    placed = []
    for k, index in enumerate(indices):
        image = source.image(int(index))
        h, w = image.shape[:2]
        if k == 0:
            xa0, ya0, xa1, ya1 = max(xc - w, 0), max(yc - h, 0), xc, yc
            xb0, yb0 = w - (xa1 - xa0), h - (ya1 - ya0)
        elif k == 1:
            xa0, ya0, xa1, ya1 = xc, max(yc - h, 0), min(xc + w, canvas), yc
            xb0, yb0 = 0, h - (ya1 - ya0)
        elif k == 2:
            xa0, ya0, xa1, ya1 = max(xc - w, 0), yc, xc, min(canvas, yc + h)
            xb0, yb0 = w - (xa1 - xa0), 0
        else:
            xa0, ya0, xa1, ya1 = xc, yc, min(xc + w, canvas), min(canvas, yc + h)
            xb0, yb0 = 0, 0
        tiles.append((image, (xa0, ya0, xa1, ya1), (xb0, yb0)))
        placed.append((resampled_targets(source, int(index), spec.polygon_points), w, h, xa0 - xb0, ya0 - yb0))
    return tiles, clip_to(Labels.from_placed(placed), canvas, canvas, spec)


def letterbox_tile(source: ImageSource, index: int, imgsz: int) -> tuple[list[Tile], Labels]:
    """One record centred on an imgsz square canvas (long side already imgsz)."""
    image = source.image(int(index))
    h, w = image.shape[:2]
    top, left = (imgsz - h) // 2, (imgsz - w) // 2
    spec = source.spec
    labels = Labels.from_targets(resampled_targets(source, int(index), spec.polygon_points), w, h, left, top)
    return [(image, (left, top, left + w, top + h), (0, 0))], clip_to(labels, imgsz, imgsz, spec)
