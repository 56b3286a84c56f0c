"""Working labels of one sample while it travels the route, in pixel coordinates.

Runs wherever a sample is rendered. Created fresh per sample from the source's targets
(which may be read-only shared-memory views: they are only ever read, never written);
every transform returns new arrays.

- ``classes``: int32 (n,)
- ``boxes``: float32 (n, 4) pixel x1, y1, x2, y2
- ``points``: float32 (m, 2) pixel x, y of every polygon, instance after instance, and
  ``offsets``: int64 (n + 1,), instance i's polygon is ``points[offsets[i]:offsets[i+1]]``
  (empty where an instance has none; fewer than 3 vertices count as none).

All polygons live in one array so every transform is one vectorised pass, not a Python
loop over instances (coco128 averages ~7 instances per image, 28 per mosaic).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...shared.stream.records import Targets

# Candidate filter after a geometric transform (the customary YOLO thresholds).
MIN_SIDE_PX = 2.0
MAX_ASPECT = 100.0
MIN_AREA_RATIO = 0.10
MIN_AREA_RATIO_POLYGONS = 0.01


@dataclass
class Labels:
    classes: np.ndarray
    boxes: np.ndarray
    points: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.classes)

    @classmethod
    def empty(cls) -> "Labels":
        return cls(
            np.zeros(0, np.int32), np.zeros((0, 4), np.float32), np.zeros((0, 2), np.float32), np.zeros(1, np.int64)
        )

    @classmethod
    def from_targets(cls, targets: Targets, width: int, height: int, padw: float = 0.0, padh: float = 0.0) -> "Labels":
        """Scale normalised targets to a ``width`` x ``height`` image placed at (padw, padh)."""
        n = len(targets.classes)
        boxes = np.asarray(targets.boxes, dtype=np.float32).reshape(-1, 4) * np.array(
            [width, height, width, height], np.float32
        )
        boxes += np.array([padw, padh, padw, padh], np.float32)
        polys = [p for p in targets.polygons if len(p) >= 3] if len(targets.polygons) == n else []
        lengths = np.zeros(n + 1, dtype=np.int64)
        if polys:
            lengths[1:] = [len(p) if len(p) >= 3 else 0 for p in targets.polygons]
            points = np.concatenate(polys).astype(np.float32, copy=False).reshape(-1, 2) * np.array(
                [width, height], np.float32
            )
            points += np.array([padw, padh], np.float32)
        else:
            points = np.zeros((0, 2), np.float32)
        return cls(np.asarray(targets.classes, dtype=np.int32).reshape(-1).copy(), boxes, points, np.cumsum(lengths))

    @classmethod
    def from_placed(cls, placed: list[tuple[Targets, int, int, float, float]]) -> "Labels":
        """``Labels.concat([Labels.from_targets(t, w, h, padw, padh) for ... in placed])``,
        the same arrays, built with one multiply and one add per array instead of per part
        (a mosaic places four records). Elementwise float32 arithmetic, so batching the
        parts changes no bit; the tests compare both."""
        classes, boxes, box_affine, points, point_affine, lengths = [], [], [], [], [], []
        for targets, width, height, padw, padh in placed:
            n = len(targets.classes)
            if n == 0:
                continue  # concat drops empty parts
            classes.append(np.asarray(targets.classes, dtype=np.int32).reshape(-1))
            boxes.append(np.asarray(targets.boxes, dtype=np.float32).reshape(-1, 4))
            box_affine.append((n, (width, height, width, height, padw, padh, padw, padh)))
            polys = [p for p in targets.polygons if len(p) >= 3] if len(targets.polygons) == n else []
            if polys:
                lengths.extend(len(p) if len(p) >= 3 else 0 for p in targets.polygons)
                points.extend(polys)
                point_affine.append((sum(len(p) for p in polys), (width, height, padw, padh)))
            else:
                lengths.extend([0] * n)
        if not classes:
            return cls.empty()
        box_rows = np.repeat(np.array([a for _, a in box_affine], np.float32), [k for k, _ in box_affine], axis=0)
        out_boxes = np.concatenate(boxes) * box_rows[:, :4]
        out_boxes += box_rows[:, 4:]
        if points:
            point_rows = np.repeat(
                np.array([a for _, a in point_affine], np.float32), [k for k, _ in point_affine], axis=0
            )
            out_points = np.concatenate(points).astype(np.float32, copy=False).reshape(-1, 2) * point_rows[:, :2]
            out_points += point_rows[:, 2:]
        else:
            out_points = np.zeros((0, 2), np.float32)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.concatenate(classes), out_boxes, out_points, offsets)

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def has_polygons(self) -> np.ndarray:
        return self.counts >= 3

    @property
    def polygons(self) -> list[np.ndarray]:
        """Per-instance (k, 2) views of ``points``."""
        return np.split(self.points, self.offsets[1:-1]) if len(self) else []

    def select(self, keep: np.ndarray) -> "Labels":
        """The instances ``keep`` (bool mask or indices, in the given order)."""
        idx = np.flatnonzero(keep) if keep.dtype == bool else np.asarray(keep, dtype=np.int64)
        counts = self.counts[idx]
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        # point index j of the output comes from start[instance] + (j - new_start[instance])
        gather = np.repeat(self.offsets[idx] - offsets[:-1], counts) + np.arange(offsets[-1])
        return Labels(self.classes[idx], self.boxes[idx], self.points[gather], offsets)

    def clip(self, width: float, height: float) -> "Labels":
        """Boxes and polygon vertices clipped to [0, width] x [0, height]."""
        hi = np.array([width, height, width, height], dtype=np.float32)
        return Labels(self.classes, np.clip(self.boxes, 0, hi), np.clip(self.points, 0, hi[:2]), self.offsets)

    @staticmethod
    def concat(parts: list["Labels"]) -> "Labels":
        parts = [p for p in parts if len(p)]
        if not parts:
            return Labels.empty()
        if len(parts) == 1:
            return parts[0]
        shifts = np.cumsum([0] + [p.offsets[-1] for p in parts[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shifts)]).astype(np.int64)
        return Labels(
            np.concatenate([p.classes for p in parts]),
            np.concatenate([p.boxes for p in parts]),
            np.concatenate([p.points for p in parts]),
            offsets,
        )

    def flipped(self, width: float, height: float, *, horizontal: bool) -> "Labels":
        """Labels of the image mirrored left-right (``horizontal``) or top-bottom."""
        boxes = self.boxes.copy()
        points = self.points.copy()
        if horizontal:
            w = np.float32(width)
            boxes[:, 0] = w - self.boxes[:, 2]
            boxes[:, 2] = w - self.boxes[:, 0]
            points[:, 0] = w - self.points[:, 0]
        else:
            h = np.float32(height)
            boxes[:, 1] = h - self.boxes[:, 3]
            boxes[:, 3] = h - self.boxes[:, 1]
            points[:, 1] = h - self.points[:, 1]
        return Labels(self.classes, boxes, points, self.offsets)


def transform_labels(labels: Labels, matrix: np.ndarray, size: int, scale: float, *, perspective: bool) -> Labels:
    """Labels through the 3x3 ``matrix`` onto a ``size`` x ``size`` output, then filtered.

    Boxes come from the four transformed corners, or from the transformed polygon where
    the instance has one (vertices clipped to the output, then their extent); both are
    clipped to the output. The candidate filter compares each new box with its old box
    scaled by ``scale``; its area threshold is the polygon one when any instance has one.
    """
    n = len(labels)
    if n == 0:
        return Labels.empty()
    old = labels.boxes
    corners = old[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(n * 4, 2).astype(np.float64)
    xy = _apply(corners, matrix, perspective).reshape(n, 8)
    xs, ys = xy[:, 0::2], xy[:, 1::2]
    new = np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], axis=1)
    has = labels.has_polygons
    points = labels.points
    if len(points):
        q = np.clip(_apply(points.astype(np.float64), matrix, perspective), 0, size)
        starts = labels.offsets[:-1][has]
        lo = np.minimum.reduceat(q, starts, axis=0)
        hi = np.maximum.reduceat(q, starts, axis=0)
        new[has] = np.concatenate([lo, hi], axis=1)
        points = q.astype(np.float32)
    new = np.clip(new, 0, size).astype(np.float32)
    keep = candidates(old * np.float32(scale), new, MIN_AREA_RATIO_POLYGONS if has.any() else MIN_AREA_RATIO)
    return Labels(labels.classes, new, points, labels.offsets).select(keep)


def candidates(before: np.ndarray, after: np.ndarray, area_ratio: float) -> np.ndarray:
    """bool (n,): boxes that survived a transform (size, area kept, aspect)."""
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    eps = np.float32(1e-16)
    aspect = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > MIN_SIDE_PX) & (h2 > MIN_SIDE_PX) & (w2 * h2 / (w1 * h1 + eps) > area_ratio) & (aspect < MAX_ASPECT)


def _apply(points: np.ndarray, matrix: np.ndarray, perspective: bool) -> np.ndarray:
    """(m, 2) float64 points through ``matrix``; elementwise (no BLAS), so the rounding
    does not depend on how many points are transformed together."""
    x, y = points[:, 0], points[:, 1]
    m = matrix
    out = np.empty_like(points)
    out[:, 0] = m[0, 0] * x + m[0, 1] * y + m[0, 2]
    out[:, 1] = m[1, 0] * x + m[1, 1] * y + m[1, 2]
    if perspective:
        z = m[2, 0] * x + m[2, 1] * y + m[2, 2]
        out /= z[:, None]
    return out


def pack(labels: Labels, size: int) -> np.ndarray:
    """float32 (n, 5): class, cx, cy, w, h normalised by ``size``."""
    b = labels.boxes
    out = np.empty((len(labels), 5), dtype=np.float32)
    out[:, 0] = labels.classes
    inv = np.float32(1.0 / size)
    out[:, 1] = (b[:, 0] + b[:, 2]) * np.float32(0.5) * inv
    out[:, 2] = (b[:, 1] + b[:, 3]) * np.float32(0.5) * inv
    out[:, 3] = (b[:, 2] - b[:, 0]) * inv
    out[:, 4] = (b[:, 3] - b[:, 1]) * inv
    return out
