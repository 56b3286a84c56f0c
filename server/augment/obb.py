"""Oriented boxes on the route: clipping that keeps a box's direction, and the final ``xywhr``.

Runs wherever a sample is rendered. An OBB instance travels as its polygon (the label's four
corners resampled to the obb ``TaskSpec.polygon_points``) like a segment does; only two steps differ
from the polygon route, both as Ultralytics' OBB task does them (behaviour read from
``Instances.clip(preserve_obb=True)`` and ``ops.xyxyxyxy2xywhr``; our own code):

- **Clipping** (mosaic canvas, after the affine): a polygon wholly inside the image is kept, its
  box its extent. One that crosses the border is replaced by the rectangle, in the direction of
  its own minimum-area rectangle, that bounds its visible part (its convex hull intersected with
  the image), resampled to as many points as it had; its box is that visible part's extent.
  One with no visible area becomes all zeros (the candidate filter then drops it). Clamping the
  vertices instead, as for segments, would bend the rectangle and change its angle.
- **xywhr**: the minimum-area rectangle of the final points (``cv2.minAreaRect`` in float32),
  ``w`` the longer side, the angle in radians in [-pi/4, 3pi/4).

cv2 is imported on first use: a worker that serves no OBB stream never loads it here.
"""

from __future__ import annotations

import math

import numpy as np

from .resample import resample_polygons


def _cv2():
    import cv2

    return cv2


def _rect_angle_rad(points: np.ndarray) -> float:
    """The direction of ``points``' minimum-area rectangle's longer side, in radians (OpenCV's angle,
    plus 90 degrees where its first side is the shorter one)."""
    (_, _), (w, h), angle = _cv2().minAreaRect(points.astype(np.float32))
    if w < h:
        angle += 90.0
    return math.radians(angle)


def clip_rotated(
    boxes: np.ndarray, points: np.ndarray, offsets: np.ndarray, width: float, height: float
) -> tuple[np.ndarray, np.ndarray]:
    """(float32 (n, 4) boxes, float32 points) of OBB polygons clipped to [0, width] x [0, height]
    (see the module docstring); an instance without a polygon keeps its box, clamped. New arrays.
    Each instance's result depends only on its own box and polygon, so several samples' instances
    clipped together get the bytes each gets alone."""
    cv2 = _cv2()
    hi = np.array([width, height, width, height], np.float32)
    out_boxes = np.clip(boxes, 0, hi).astype(np.float32)
    out_points = np.asarray(points, dtype=np.float32).copy()
    counts = np.diff(offsets)
    nonempty = np.flatnonzero(counts > 0)
    if not len(nonempty):
        return out_boxes, out_points
    # every polygon's extent at once; only those that leave the bound go through cv2 one by one
    starts = offsets[:-1][nonempty]
    lo = np.minimum.reduceat(out_points, starts, axis=0)
    up = np.maximum.reduceat(out_points, starts, axis=0)
    polygon = counts[nonempty] >= 3
    inside = polygon & (lo >= 0).all(1) & (up[:, 0] <= width) & (up[:, 1] <= height)
    out_boxes[nonempty[inside]] = np.concatenate([lo[inside], up[inside]], axis=1)
    canvas = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float32)
    for i in nonempty[polygon & ~inside].tolist():
        a, b = int(offsets[i]), int(offsets[i + 1])
        seg = out_points[a:b]
        area, visible = cv2.intersectConvexConvex(cv2.convexHull(seg), canvas)
        if visible is None or area <= 0:
            out_boxes[i] = 0
            seg[:] = 0
            continue
        visible = visible.reshape(-1, 2).astype(np.float32)
        out_boxes[i] = (*visible.min(0), *visible.max(0))
        theta = _rect_angle_rad(seg)
        c, s = np.float32(math.cos(theta)), np.float32(math.sin(theta))
        basis = np.array([[c, -s], [s, c]], np.float32)  # columns: the rectangle's two directions
        aligned = visible @ basis
        (u1, v1), (u2, v2) = aligned.min(0), aligned.max(0)
        corners = np.array([[u2, v2], [u2, v1], [u1, v1], [u1, v2]], np.float32) @ basis.T
        seg[:] = resample_polygons([corners], b - a)[0]
    return out_boxes, out_points


def xywhr(points: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """float64 (n, 5): centre x, y, width (the longer side), height, angle in radians in [-pi/4, 3pi/4)
    of each instance's minimum-area rectangle, in the points' units (zeros where an instance has
    fewer than 3 points)."""
    cv2 = _cv2()
    n = len(offsets) - 1
    out = np.zeros((n, 5), np.float64)
    for i in range(n):
        a, b = int(offsets[i]), int(offsets[i + 1])
        if b - a < 3:
            continue
        (cx, cy), (w, h), angle = cv2.minAreaRect(points[a:b].astype(np.float32))
        theta = angle / 180.0 * math.pi
        if w < h:
            w, h = h, w
            theta += math.pi / 2
        while theta >= 3 * math.pi / 4:
            theta -= math.pi
        while theta < -math.pi / 4:
            theta += math.pi
        out[i] = (cx, cy, w, h, theta)
    return out
