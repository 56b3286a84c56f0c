"""CutMix: a rectangle of a random partner sample pasted over the sample, with the partner's
instances inside it.

Runs wherever a sample is rendered: the draws, the rectangle and the labels; the kernel pastes
the partner's layer under the rectangle (``kernel.py`` step 2). Behaviour as Ultralytics 8.4's
``CutMix`` (our code), after mixup and before the flips, with probability ``cutmix`` (not in
the closed epochs):

1. the partner: a random record through the sample's own steps 1-4 (mosaic, affine, copy-paste);
2. ``CANDIDATES`` rectangles, each drawn as: lam ~ Beta(1, 1); cut = sqrt(1 - lam); cut_w, cut_h =
   int(S cut); a centre (integers in [0, S)); corners centre -/+ cut // 2, clipped to [0, S];
3. the rectangles that overlap no instance box of the sample (intersection over each box's
   area summing to 0) are the choices; none: nothing is pasted. One is chosen uniformly;
4. the partner's instances whose box overlaps it by intersection over the partner box's area
   >= 0.01 when the sample has polygons, else 0.1; none: nothing is pasted;
5. those instances, clipped to the rectangle (keypoints outside it invisible; OBB polygons
   clipped keeping their direction, and those left with no area dropped), are appended.
"""

from __future__ import annotations

import math

import numpy as np

from ...shared.stream.rng import Draws
from ...shared.task import TaskSpec
from .labels import Labels, clip_keypoints
from .obb import clip_rotated

CANDIDATES = 3
BETA = 1.0
AREA_RATIO_POLYGONS = 0.01
AREA_RATIO = 0.10


def draw_rectangles(rng: Draws | np.random.Generator, imgsz: int) -> np.ndarray:
    """float32 (CANDIDATES, 4) x1, y1, x2, y2 of the candidate rectangles on an S x S sample."""
    out = np.empty((CANDIDATES, 4), np.float32)
    for i in range(CANDIDATES):
        lam = rng.beta(BETA, BETA)
        cut = math.sqrt(1.0 - lam)
        half_w, half_h = int(imgsz * cut) // 2, int(imgsz * cut) // 2
        cx = int(rng.integers(0, imgsz))
        cy = int(rng.integers(0, imgsz))
        out[i] = (
            min(max(cx - half_w, 0), imgsz),
            min(max(cy - half_h, 0), imgsz),
            min(max(cx + half_w, 0), imgsz),
            min(max(cy + half_h, 0), imgsz),
        )
    return out


def _over_second(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """(n, m) intersection of boxes ``first`` with ``second`` over each ``second`` box's area."""
    x1 = np.maximum(first[:, None, 0], second[None, :, 0])
    y1 = np.maximum(first[:, None, 1], second[None, :, 1])
    x2 = np.minimum(first[:, None, 2], second[None, :, 2])
    y2 = np.minimum(first[:, None, 3], second[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (second[:, 2] - second[:, 0]) * (second[:, 3] - second[:, 1])
    return inter / (area[None, :] + np.float32(1e-7))


def cut_labels(
    labels: Labels, partner: Labels, imgsz: int, task: TaskSpec, rng: Draws | np.random.Generator
) -> tuple[Labels, tuple[int, int, int, int] | None]:
    """(the sample's labels with the partner's instances in the rectangle appended, the rectangle
    x1, y1, x2, y2 in pixels, or None when nothing is pasted). Draws steps 2-3 from ``rng``."""
    rects = draw_rectangles(rng, imgsz)
    free = np.flatnonzero(_over_second(rects, labels.boxes).sum(axis=1) <= 0) if len(labels) else np.arange(CANDIDATES)
    if len(free) == 0:
        return labels, None
    rect = rects[int(rng.choice(free))]
    threshold = AREA_RATIO_POLYGONS if len(labels.points) else AREA_RATIO
    inside = np.flatnonzero(_over_second(rect[None], partner.boxes)[0] >= threshold) if len(partner) else []
    if len(inside) == 0:
        return labels, None
    x1, y1, x2, y2 = (int(v) for v in rect.astype(np.int32))
    pasted = clip_to_rectangle(partner.select(np.asarray(inside, np.int64)), x1, y1, x2, y2, task)
    return Labels.concat([labels, pasted]), (x1, y1, x2, y2)


def clip_to_rectangle(labels: Labels, x1: int, y1: int, x2: int, y2: int, task: TaskSpec) -> Labels:
    """``labels`` clipped to the rectangle: boxes and polygon vertices clamped into it, keypoints
    outside it invisible and clamped; OBB polygons clipped keeping their direction (in the
    rectangle's frame), and OBB instances left without area dropped."""
    lo = np.array([x1, y1, x1, y1], np.float32)
    hi = np.array([x2, y2, x2, y2], np.float32)
    keypoints = labels.keypoints
    if keypoints is not None:
        shifted = keypoints.copy()
        shifted[..., 0] -= np.float32(x1)
        shifted[..., 1] -= np.float32(y1)
        keypoints = clip_keypoints(shifted, x2 - x1, y2 - y1)
        keypoints[..., 0] += np.float32(x1)
        keypoints[..., 1] += np.float32(y1)
    if task.rotated and len(labels.points):
        shift = np.array([x1, y1], np.float32)
        boxes, points = clip_rotated(
            labels.boxes - np.tile(shift, 2), labels.points - shift, labels.offsets, x2 - x1, y2 - y1
        )
        out = Labels(labels.classes, boxes + np.tile(shift, 2), points + shift, labels.offsets, keypoints)
        b = boxes
        return out.select((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) > 0)
    boxes = np.clip(labels.boxes, lo, hi)
    points = np.clip(labels.points, lo[:2], hi[:2])
    return Labels(labels.classes, boxes, points, labels.offsets, keypoints)


def rectangle_mask(imgsz: int, rect: tuple[int, int, int, int]) -> np.ndarray:
    """uint8 (S, S): 1 inside the rectangle x1 <= x < x2, y1 <= y < y2."""
    x1, y1, x2, y2 = rect
    mask = np.zeros((imgsz, imgsz), np.uint8)
    mask[y1:y2, x1:x2] = 1
    return mask
