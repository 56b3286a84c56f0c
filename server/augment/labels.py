"""Working labels of one sample while it travels the route, in pixel coordinates.

Runs wherever a sample is rendered. Created fresh per sample from the source's targets
(which may be read-only shared-memory views: they are only ever read, never written);
every transform returns new arrays.

- ``classes``: int32 (n,)
- ``boxes``: float32 (n, 4) pixel x1, y1, x2, y2
- ``points``: float32 (m, 2) pixel x, y of every polygon, instance after instance, and
  ``offsets``: int64 (n + 1,), instance i's polygon is ``points[offsets[i]:offsets[i+1]]``
  (empty where an instance has none; fewer than 3 vertices count as none).
- ``keypoints``: pose only, float32 (n, K, 3) pixel x, y and visibility; None for the other
  tasks. A point that leaves the image (a clip, an affine) gets visibility 0 and is clamped
  to the image, as Ultralytics' ``Instances.clip`` does.

Segment and OBB polygons are resampled as each record enters the route (``record.read``, through
``resample.cached_targets``), before they become labels here; detect and pose take them as they are.

All polygons live in one array so every transform is one vectorised pass, not a Python
loop over instances (coco128 averages ~7 instances per image, 28 per mosaic).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...shared.errors import ConfigError
from ...shared.stream.records import Targets
from ...shared.task import BASE_COLUMNS, DETECT, TaskSpec
from .obb import clip_rotated, xywhr
from .resample import MIN_VERTICES
from .visible import visible_boxes

# Candidate filter after a geometric transform (the customary YOLO thresholds).
MIN_SIDE_PX = 2.0
MAX_ASPECT = 100.0
MIN_AREA_RATIO = 0.10
MIN_AREA_RATIO_POLYGONS = 0.01

# Points per part above which ``Labels.from_placed`` places each part's points by its own call
# rather than by a size and an offset repeated per point: coco128's detect-json records hold ~165
# points (one call per array is cheaper), its segment records ~7000 (resampled; a call per part is).
POINTS_PER_CALL = 256


@dataclass
class Labels:
    classes: np.ndarray
    boxes: np.ndarray
    points: np.ndarray
    offsets: np.ndarray
    keypoints: np.ndarray | None = None

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
        source = targets.polygons if len(targets.polygons) == n else ()
        polys = [p for p in source if len(p) >= MIN_VERTICES]
        lengths = np.zeros(n + 1, dtype=np.int64)
        if polys:
            lengths[1:] = [len(p) if len(p) >= MIN_VERTICES else 0 for p in source]
            points_px = np.concatenate(polys).astype(np.float32, copy=False).reshape(-1, 2)
            _scale_shift(points_px, width, height, padw, padh)
        else:
            points_px = np.zeros((0, 2), np.float32)
        keypoints = place_keypoints(targets.keypoints, width, height, padw, padh)
        classes = np.asarray(targets.classes, dtype=np.int32).reshape(-1).copy()
        return cls(classes, boxes, points_px, np.cumsum(lengths), keypoints)

    @classmethod
    def from_placed(cls, placed: list[tuple[Targets, int, int, float, float]]) -> "Labels":
        """``Labels.concat([Labels.from_targets(t, w, h, padw, padh) for ... in placed])``,
        the same arrays, built with one multiply and one add per array instead of per part
        (a mosaic places four records; a range's samples place theirs together): each part's size
        and offset repeated per row and per polygon point. Elementwise float32 arithmetic, so
        batching the parts changes no bit; the tests compare both."""
        if not any(t.polygons or t.keypoints is not None for t, *_ in placed):
            return cls._from_placed_boxes(placed)
        parts = [p for p in placed if len(p[0].classes)]  # concat drops empty parts
        if not parts:
            return cls.empty()
        points_nm, lengths, part_points = [], [], []
        sizes = [len(t.classes) for t, *_ in parts]
        for (targets, *_), n in zip(parts, sizes):
            source = targets.polygons if len(targets.polygons) == n else ()
            counts = [len(p) for p in source]
            if counts and min(counts) >= MIN_VERTICES:  # every instance has a polygon: the common case
                points_nm.extend(source)
            elif counts:
                counts = [k if k >= MIN_VERTICES else 0 for k in counts]
                points_nm.extend(p for p, k in zip(source, counts) if k)
            else:
                counts = [0] * n
            lengths.extend(counts)
            part_points.append(sum(counts))
        # each row's part's width, height, padw, padh
        rows = np.repeat(np.array([(w, h, pw, ph) for _, w, h, pw, ph in parts], np.float32), sizes, axis=0)
        # ``Targets`` holds int32 (n,) classes and float32 (n, 4) boxes; the dtype casts any other
        # type as ``from_targets``' ``np.asarray`` does
        out_boxes = np.concatenate([t.boxes for t, *_ in parts], dtype=np.float32)
        pairs = out_boxes.reshape(-1, 2, 2)  # (x1, y1), (x2, y2)
        pairs *= rows[:, None, :2]
        pairs += rows[:, None, 2:]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        if points_nm:
            np.cumsum(lengths, out=offsets[1:])
            out_points = np.empty((int(offsets[-1]), 2), np.float32)
            try:  # the polygons as ``Targets`` holds them, (k, 2) each
                np.concatenate(points_nm, out=out_points)
            except ValueError:  # flat (2k,) ones, as ``from_targets`` takes them too
                np.concatenate([np.asarray(p).reshape(-1, 2) for p in points_nm], out=out_points)
            if len(out_points) > POINTS_PER_CALL * len(parts):
                # long polygons (a segment's, resampled): a call per part costs less than a size
                # and an offset per point
                pos = 0
                for k, (_, width, height, padw, padh) in zip(part_points, parts):
                    _scale_shift(out_points[pos : pos + k], width, height, padw, padh)
                    pos += k
            else:
                per_point = np.repeat(rows, lengths, axis=0)
                _scale_shift(out_points, per_point[:, 0], per_point[:, 1], per_point[:, 2], per_point[:, 3])
        else:  # every length is 0 (detect records): the zeros are the offsets
            out_points = np.zeros((0, 2), np.float32)
        raw = [t.keypoints for t, *_ in parts]
        out_keypoints = None
        if not any(k is None for k in raw):
            out_keypoints = place_keypoints(
                np.concatenate(raw, dtype=np.float32), rows[:, 0:1], rows[:, 1:2], rows[:, 2:3], rows[:, 3:4]
            )
        classes = np.concatenate([t.classes for t, *_ in parts], dtype=np.int32)
        return cls(classes, out_boxes, out_points, offsets, out_keypoints)

    @classmethod
    def _from_placed_boxes(cls, placed: list[tuple[Targets, int, int, float, float]]) -> "Labels":
        """``from_placed`` where no part has polygons or keypoints (a detect mosaic, its records
        from ``resample.cached_targets``): the same boxes by the same float32 multiply and add
        per element, without the per-part polygon and keypoint bookkeeping."""
        parts = [p for p in placed if len(p[0].classes)]  # concat drops empty parts
        if not parts:
            return cls.empty()
        classes = np.concatenate([np.asarray(t.classes, dtype=np.int32).reshape(-1) for t, *_ in parts])
        boxes = np.concatenate([np.asarray(t.boxes, dtype=np.float32).reshape(-1, 4) for t, *_ in parts])
        if len(parts) == 1:
            _, width, height, padw, padh = parts[0]
            boxes *= np.array([width, height, width, height], np.float32)
            boxes += np.array([padw, padh, padw, padh], np.float32)
        else:
            rows = np.array([(w, h, w, h, pw, ph, pw, ph) for _, w, h, pw, ph in parts], np.float32)
            rows = np.repeat(rows, [len(t.classes) for t, *_ in parts], axis=0)
            boxes *= rows[:, :4]
            boxes += rows[:, 4:]
        return cls(classes, boxes, np.zeros((0, 2), np.float32), np.zeros(len(classes) + 1, np.int64))

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
        if keep.dtype == bool and keep.all():
            return self  # every instance in order: the arrays are only ever read, never written
        idx = np.flatnonzero(keep) if keep.dtype == bool else np.asarray(keep, dtype=np.int64)
        if not len(self.points):
            # No polygon anywhere (detect and pose records): every count is 0, so the
            # offsets are zeros and no point moves; the same arrays as below, in fewer calls.
            keypoints = None if self.keypoints is None else self.keypoints[idx]
            return Labels(self.classes[idx], self.boxes[idx], self.points, np.zeros(len(idx) + 1, np.int64), keypoints)
        counts = self.counts[idx]
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        # Each (x, y) float32 pair moved as one 8-byte item: numpy copies single items much
        # faster than rows of two (the same bytes either way).
        pairs = np.ascontiguousarray(self.points, dtype=np.float32).view(np.int64).reshape(-1)
        if keep.dtype == bool:
            # in order: each point kept with its instance
            picked = pairs[np.repeat(keep, self.counts)]
        else:
            # point index j of the output comes from start[instance] + (j - new_start[instance])
            gather = np.repeat(self.offsets[idx] - offsets[:-1], counts) + np.arange(offsets[-1])
            picked = pairs[gather]
        points = picked.view(np.float32).reshape(-1, 2)
        keypoints = None if self.keypoints is None else self.keypoints[idx]
        return Labels(self.classes[idx], self.boxes[idx], points, offsets, keypoints)

    def clip(self, width, height, *, rotated: bool = False) -> "Labels":
        """Boxes, polygon vertices and keypoints clipped to [0, width] x [0, height]; a keypoint
        outside it gets visibility 0 first. ``rotated`` (OBB): each polygon clipped keeping its
        box's direction (``obb.clip_rotated``; a polygon-less box clamped). ``width`` and
        ``height`` are numbers, or (n,) arrays: a bound per instance (a range's instances, each
        sample on its own canvas), each run of instances with one bound clipped as above."""
        if np.ndim(width):
            return self._clip_runs(np.asarray(width), np.asarray(height), rotated)
        keypoints = None if self.keypoints is None else clip_keypoints(self.keypoints, width, height)
        if rotated and len(self.points):
            boxes, points = clip_rotated(self.boxes, self.points, self.offsets, width, height)
            return Labels(self.classes, boxes, points, self.offsets, keypoints)
        if width == height:
            # The route's canvases are square: a float32 scalar bound, the fast loop, and the
            # same float32 max-then-min per element as the (4,) bound below.
            hi = np.float32(width)
            points = np.clip(self.points, 0, hi) if len(self.points) else self.points
            return Labels(self.classes, np.clip(self.boxes, 0, hi), points, self.offsets, keypoints)
        hi = np.array([width, height, width, height], dtype=np.float32)
        # no points: nothing to clip (and the arrays are only ever read)
        points = np.clip(self.points, 0, hi[:2]) if len(self.points) else self.points
        return Labels(self.classes, np.clip(self.boxes, 0, hi), points, self.offsets, keypoints)

    def _clip_runs(self, width: np.ndarray, height: np.ndarray, rotated: bool) -> "Labels":
        """``clip`` with a bound per instance: each run of instances with one bound through the
        scalar ``clip`` (a range whose samples are all mosaics is one run), the runs concatenated:
        the very operations each sample's instances get alone."""
        n = len(self)
        change = np.flatnonzero((width[1:] != width[:-1]) | (height[1:] != height[:-1])) + 1
        edges = [0, *change.tolist(), n]
        firsts = edges[:-1]
        bounds = zip(width[firsts].tolist(), height[firsts].tolist())
        if len(firsts) == 1:
            w, h = next(bounds)
            return self.clip(w, h, rotated=rotated)
        return Labels.concat(
            [self.rows(a, b).clip(w, h, rotated=rotated) for a, b, (w, h) in zip(firsts, edges[1:], bounds)]
        )

    def rows(self, start: int, stop: int) -> "Labels":
        """Instances ``start .. stop`` (views; their points' offsets re-based on their first point)."""
        a, b = self.offsets[start], self.offsets[stop]
        keypoints = None if self.keypoints is None else self.keypoints[start:stop]
        return Labels(
            self.classes[start:stop],
            self.boxes[start:stop],
            self.points[a:b],
            self.offsets[start : stop + 1] - a,
            keypoints,
        )

    @staticmethod
    def concat(parts: list["Labels"]) -> "Labels":
        parts = [p for p in parts if len(p)]
        if not parts:
            return Labels.empty()
        if len(parts) == 1:
            return parts[0]
        sizes = [len(p) for p in parts]
        offsets = np.zeros(sum(sizes) + 1, np.int64)
        ends = [int(p.offsets[-1]) for p in parts]
        if any(ends):  # else no part has a point: every offset is 0 and no point moves
            # each part's offsets after its own first 0, shifted by the points before the part
            np.concatenate([p.offsets[1:] for p in parts], out=offsets[1:])
            offsets[1:] += np.repeat(np.cumsum([0] + ends[:-1]), sizes)
            points = np.concatenate([p.points for p in parts])
        else:
            points = parts[0].points
        keypoints = None if any(p.keypoints is None for p in parts) else np.concatenate([p.keypoints for p in parts])
        return Labels(
            np.concatenate([p.classes for p in parts]),
            np.concatenate([p.boxes for p in parts]),
            points,
            offsets,
            keypoints,
        )

    def flipped(
        self, width: float, height: float, *, horizontal: bool, flip_idx: tuple[int, ...] | None = None
    ) -> "Labels":
        """Labels of the image mirrored left-right (``horizontal``) or top-bottom. Keypoints are
        mirrored with them and renumbered by ``flip_idx`` (keypoint j becomes keypoint
        ``flip_idx[j]``'s slot: a left wrist becomes a right one). Ultralytics renumbers on
        either mirror, top-bottom too, and so do we: its trainers expect that order."""
        # the box's two sides swapped (x2, y1, x1, y2 or x1, y2, x2, y1), then each mirrored in place
        boxes = self.boxes.take(_FLIP_LR if horizontal else _FLIP_UD, axis=1)
        # no points (detect, pose): nothing to mirror, and the empty array is only ever read
        points = self.points.copy() if len(self.points) else self.points
        keypoints = None if self.keypoints is None else self.keypoints.copy()
        if horizontal:
            w = np.float32(width)
            np.subtract(w, boxes[:, 0], out=boxes[:, 0])
            np.subtract(w, boxes[:, 2], out=boxes[:, 2])
            points[:, 0] = w - self.points[:, 0]
            if keypoints is not None:
                keypoints[..., 0] = w - self.keypoints[..., 0]
        else:
            h = np.float32(height)
            np.subtract(h, boxes[:, 1], out=boxes[:, 1])
            np.subtract(h, boxes[:, 3], out=boxes[:, 3])
            points[:, 1] = h - self.points[:, 1]
            if keypoints is not None:
                keypoints[..., 1] = h - self.keypoints[..., 1]
        if keypoints is not None and flip_idx is not None:
            keypoints = np.ascontiguousarray(keypoints[:, list(flip_idx)])
        return Labels(self.classes, boxes, points, self.offsets, keypoints)


_FLIP_LR = np.array([2, 1, 0, 3])  # a box's columns with its left and right sides swapped
_FLIP_UD = np.array([0, 3, 2, 1])  # with its top and bottom swapped


def transform_labels(
    labels: Labels,
    matrix: np.ndarray | tuple[float, ...],
    imgsz: int,
    scale: float,
    *,
    perspective: bool,
    rotated: bool = False,
    visible: bool = False,
) -> Labels:
    """Labels through the 3x3 ``matrix`` (or its nine row-major entries, a tuple of Python floats)
    onto an ``imgsz`` x ``imgsz`` output, then filtered.

    Boxes come from the four transformed corners, or from the transformed polygon where
    the instance has one (vertices clipped to the output, then their extent; OBB polygons,
    ``rotated``, are clipped keeping their direction instead: ``obb.clip_rotated``; segment
    polygons, ``visible``, get the extent of their part inside the output and their vertices are
    clipped to that box: ``visible.visible_boxes``); both are clipped to the output. Keypoints go
    through the matrix too; those that land outside the output get visibility 0 and are clamped
    to it. The candidate filter compares each new box
    with its old box scaled by ``scale``; its area threshold is the polygon one when any
    instance has one.
    """
    if len(labels) == 0:
        return Labels.empty()
    # the entries as Python floats: the same float64 products, without an array index per entry
    entries = matrix if isinstance(matrix, tuple) else [v for row in np.asarray(matrix).tolist() for v in row]
    moved, keep = transform_rows(
        labels, entries, perspective, np.float32(scale), imgsz, rotated=rotated, visible=visible
    )
    return moved.select(keep)


def transform_rows(
    labels: Labels,
    entries,
    perspective,
    scale,
    imgsz: int,
    *,
    owner: np.ndarray | None = None,
    rotated: bool = False,
    visible: bool = False,
) -> tuple[Labels, np.ndarray]:
    """``transform_labels`` up to its filter: (the labels through the matrix and clipped, every
    instance; bool (n,) the instances the candidate filter keeps).

    One matrix (``entries`` nine Python floats, ``perspective`` a bool, ``scale`` a float32), or one
    per row (nine float64 (n, 1) columns, a bool (n,) or None, a float32 (n, 1) column), as
    ``corner_boxes`` takes them. With ``owner`` (int64 (n,), each row's sample, a range's rows) what
    the route decides per sample is decided per owner: the area threshold (the polygon one where
    the sample has a polygon) and, for OBB, whether the sample's boxes go through ``clip_rotated``.
    Every other operation is per row or per point (each sample's points through its matrix by a
    call of their own, ``visible_boxes`` and ``clip_rotated`` per instance, the extents a reduction
    per polygon), so a row gets the bytes it gets with its sample alone
    (tests/unit/test_range_labels.py)."""
    old = labels.boxes
    new = corner_boxes(old, entries, perspective)
    points = labels.points
    # Without points no instance has a polygon (the common detect case: skip the diff).
    has = labels.has_polygons if len(points) else None
    ratio = MIN_AREA_RATIO
    pointed = None  # per row, where rows are several samples': whether its sample has points
    if len(points) and owner is None:
        moved = _apply(points.astype(np.float64), entries, perspective)  # float64, as the corners
        if has.any():
            ratio = MIN_AREA_RATIO_POLYGONS
    elif len(points):
        moved = _apply_per_sample(points.astype(np.float64), labels.offsets, entries, perspective, owner)
        pointed = (np.bincount(owner, labels.counts) > 0)[owner]
        polygons = (np.bincount(owner, has) > 0)[owner]
        ratio = np.where(polygons, np.float32(MIN_AREA_RATIO_POLYGONS), np.float32(MIN_AREA_RATIO))
    if len(points) and rotated:
        clipped = np.clip(new, 0, imgsz).astype(np.float32)
        new, points = clip_rotated(clipped, moved.astype(np.float32), labels.offsets, imgsz, imgsz)
        if pointed is not None:
            # a sample without polygons skips ``clip_rotated`` when alone: its boxes clipped once
            new = np.where(pointed[:, None], new, clipped)
    elif len(points) and visible:
        box, points = visible_boxes(moved, labels.offsets, imgsz)
        new[has] = box[has]
    elif len(points):
        q = np.clip(moved, 0, imgsz)
        starts = labels.offsets[:-1][has]
        lo = np.minimum.reduceat(q, starts, axis=0)
        hi = np.maximum.reduceat(q, starts, axis=0)
        new[has] = np.concatenate([lo, hi], axis=1)
        points = q.astype(np.float32)
    new = new.clip(0, imgsz).astype(np.float32)  # ``np.clip``'s very call, without its dispatch
    keypoints = labels.keypoints
    if keypoints is not None:
        keypoints = transformed_keypoints(keypoints, entries, perspective, imgsz)
    keep = candidates(old * scale, new, ratio)
    return Labels(labels.classes, new, points, labels.offsets, keypoints), keep


_CORNER_X = np.array([0, 2, 0, 2])
_CORNER_Y = np.array([1, 3, 3, 1])


def corner_boxes(boxes: np.ndarray, entries, perspective) -> np.ndarray:
    """float64 (n, 4) x1, y1, x2, y2 extent of the four corners of float32 (n, 4) ``boxes`` through a
    matrix whose row-major ``entries`` are nine Python floats (one matrix) or nine (n, 1) float64
    columns (a matrix per box: a range's boxes, each through its sample's); ``perspective`` a bool,
    or a bool (n,) (which boxes' matrices divide by z) or None (none does).

    Each corner goes through exactly the float64 operations of ``_apply`` (corners as (4, n) x and
    y arrays instead of (4n, 2) points: elementwise, so the same bits, and a box's bits do not
    depend on the boxes computed with it); this is the hot path, and a handful of whole-array calls
    costs less than the reshapes. The corners lie along the first axis, so every call runs over n
    values at a time (numpy runs an axis of 4 as n calls of 4). Each extent still reduces a box's
    corners one after another in the same order, so it has the same bits, a zero's sign included."""
    b = boxes.astype(np.float64).T
    x = b.take(_CORNER_X, axis=0)  # corners (x1, y1), (x2, y2), (x1, y2), (x2, y1)
    y = b.take(_CORNER_Y, axis=0)
    m0, m1, m2, m3, m4, m5, m6, m7, m8 = (e.reshape(-1) if isinstance(e, np.ndarray) else e for e in entries)
    xt = m0 * x + m1 * y + m2
    yt = m3 * x + m4 * y + m5
    if perspective is True:
        z = m6 * x + m7 * y + m8
        xt /= z
        yt /= z
    elif perspective is not None and perspective is not False:
        z = m6 * x + m7 * y + m8
        np.divide(xt, z, out=xt, where=perspective)
        np.divide(yt, z, out=yt, where=perspective)
    out = np.empty((len(boxes), 4), np.float64)
    np.minimum.reduce(xt, axis=0, out=out[:, 0])
    np.minimum.reduce(yt, axis=0, out=out[:, 1])
    np.maximum.reduce(xt, axis=0, out=out[:, 2])
    np.maximum.reduce(yt, axis=0, out=out[:, 3])
    return out


def transformed_keypoints(keypoints: np.ndarray, entries, perspective, imgsz: int) -> np.ndarray:
    """(n, K, 3) ``keypoints`` through a matrix (``entries`` and ``perspective`` as ``corner_boxes``
    takes them: one matrix, or one per instance) onto the ``imgsz`` output, each point in float64 by
    the operations of ``_apply``, then float32; those that land outside get visibility 0 and are
    clamped (``clip_keypoints``)."""
    xy = keypoints[..., :2].astype(np.float64)
    x, y = xy[..., 0], xy[..., 1]
    m0, m1, m2, m3, m4, m5, m6, m7, m8 = entries
    moved = np.empty_like(xy)
    moved[..., 0] = m0 * x + m1 * y + m2
    moved[..., 1] = m3 * x + m4 * y + m5
    if perspective is True:
        z = m6 * x + m7 * y + m8
        moved /= z[..., None]
    elif perspective is not None and perspective is not False:
        z = m6 * x + m7 * y + m8
        np.divide(moved, z[..., None], out=moved, where=perspective[:, None, None])
    out = np.concatenate([moved.astype(np.float32), keypoints[..., 2:3]], axis=2)
    return clip_keypoints(out, imgsz, imgsz)


def _scale_shift(points: np.ndarray, width, height, padw, padh) -> None:
    """In place on float32 (m, 2) ``points``: x * width + padw, y * height + padh, each one float32
    multiply and one add per element; the sizes and offsets numbers, or float32 (m,) arrays (one
    per point). Column by column: numpy broadcasts a (2,) operand over (m, 2) several times slower
    than it runs a scalar over a column."""
    x, y = points[:, 0], points[:, 1]
    x *= np.float32(width)
    y *= np.float32(height)
    x += np.float32(padw)
    y += np.float32(padh)


def clip_keypoints(keypoints: np.ndarray, width, height) -> np.ndarray:
    """A copy of (n, K, 3) ``keypoints`` with visibility 0 where a point lies outside
    [0, width] x [0, height], and every point then clamped to it; ``width`` and ``height`` numbers,
    or float32 (n, 1) columns (a bound per instance)."""
    out = np.array(keypoints, dtype=np.float32, copy=True)
    x, y = out[..., 0], out[..., 1]
    outside = (x < 0) | (x > width) | (y < 0) | (y > height)
    out[..., 2][outside] = 0.0
    np.clip(x, 0, width, out=x)
    np.clip(y, 0, height, out=y)
    return out


def place_keypoints(keypoints: np.ndarray | None, width, height, padw, padh) -> np.ndarray | None:
    """Normalised (n, K, 3) keypoints in pixels of a ``width`` x ``height`` image placed at (padw, padh);
    visibility as it is. A new array (the source's may be a read-only shared-memory view). The
    sizes and offsets are numbers, or float32 (n, 1) columns (one per instance)."""
    if keypoints is None:
        return None
    src = np.asarray(keypoints, dtype=np.float32)
    out = src.copy()
    out[..., 0] = src[..., 0] * np.float32(width)
    out[..., 0] += np.float32(padw)
    out[..., 1] = src[..., 1] * np.float32(height)
    out[..., 1] += np.float32(padh)
    return out


def candidates(before: np.ndarray, after: np.ndarray, area_ratio) -> np.ndarray:
    """bool (n,): boxes that survived a transform (size, area kept, aspect). ``area_ratio`` a
    number, or float32 (n,) (a threshold per box); compared in float32 either way."""
    # column by column: numpy runs an (n, 2) slice of an (n, 4) array as n calls of 2
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    eps = np.float32(1e-16)
    aspect = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > MIN_SIDE_PX) & (h2 > MIN_SIDE_PX) & (w2 * h2 / (w1 * h1 + eps) > area_ratio) & (aspect < MAX_ASPECT)


def _apply(points: np.ndarray, entries, perspective: bool) -> np.ndarray:
    """(m, 2) float64 points through a matrix, its row-major ``entries`` nine Python floats;
    elementwise (no BLAS), so the rounding does not depend on how many points are transformed
    together."""
    x, y = points[:, 0], points[:, 1]
    m0, m1, m2, m3, m4, m5, m6, m7, m8 = entries
    out = np.empty_like(points)
    out[:, 0] = m0 * x + m1 * y + m2
    out[:, 1] = m3 * x + m4 * y + m5
    if perspective:
        z = m6 * x + m7 * y + m8
        out /= z[:, None]
    return out


def _apply_per_sample(points: np.ndarray, offsets: np.ndarray, entries, perspective, owner: np.ndarray) -> np.ndarray:
    """``_apply`` on each sample's points with its matrix: a range's rows (``owner`` non-decreasing,
    ``entries`` and ``perspective`` per row as ``transform_rows`` takes them). One call per sample,
    not a matrix gathered per point: a segment polygon has a thousand points, and nine float64
    entries per point would cost more than the calls."""
    edges = np.flatnonzero(np.diff(owner, prepend=-1, append=-1))  # each sample's first row, then n
    firsts = edges[:-1]
    ends = offsets[edges].tolist()
    matrices = np.concatenate(entries, axis=1)[firsts].tolist()
    divides = [False] * len(firsts) if perspective is None else perspective[firsts].tolist()
    out = np.empty_like(points)
    for a, b, matrix, divide in zip(ends[:-1], ends[1:], matrices, divides):
        if b > a:
            out[a:b] = _apply(points[a:b], matrix, divide)
    return out


def pack(labels: Labels, imgsz: int, *, task: TaskSpec = DETECT, keypoints: int = 0) -> np.ndarray:
    """float32 (n, W - 1), a target row without its batch index (``shared.task``): class,
    cx, cy, w, h normalised by ``imgsz``; obb: the rotated box's cx, cy, w, h (normalised) and angle
    (radians) from the instance's final points; pose: then ``keypoints`` (K) x (x, y normalised,
    visibility)."""
    spec = task
    n = len(labels)
    out = np.empty((n, BASE_COLUMNS - 1 + spec.extra_columns(keypoints)), dtype=np.float32)
    out[:, 0] = labels.classes
    inv = np.float32(1.0 / imgsz)
    if spec.rotated:
        r = xywhr(labels.points, labels.offsets)
        out[:, 1:5] = r[:, :4] / imgsz
        out[:, 5] = r[:, 4]
        return out
    b = labels.boxes
    # x and y together, as (n, 2) pairs: the same float32 operations per value in half the calls
    lo, hi = b[:, :2], b[:, 2:4]
    np.multiply((lo + hi) * np.float32(0.5), inv, out=out[:, 1:3])
    np.multiply(hi - lo, inv, out=out[:, 3:5])
    if spec.has_keypoints and n:
        if labels.keypoints is None or labels.keypoints.shape[1] != keypoints:
            got = None if labels.keypoints is None else labels.keypoints.shape
            raise ConfigError(f"pose rows need keypoints (n, {keypoints}, 3) on every instance, the labels have {got}")
        kp = labels.keypoints.copy()
        kp[..., :2] *= inv
        out[:, 5:] = kp.reshape(n, 3 * keypoints)
    return out
