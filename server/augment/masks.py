"""Segment masks of one sample, rendered from its final polygons as Ultralytics' ``Format`` does.

Runs wherever a segment sample is rendered (workers, writing into their ring slot's mask
plane; the reference pipeline; the digest command); writes only the caller's output plane.

The definition (behaviour of Ultralytics 8.4's ``polygon2mask``/``polygons2masks_overlap``, our
own code): each instance's polygon, its pixel coordinates truncated to integers, is filled
(``cv2.fillPoly``, value 1) into a zero S x S uint8 image, which is resized to M x M
(M = S // mask_ratio) with ``cv2.INTER_LINEAR``. With ``overlap_mask`` all instances share one
plane: they are ordered by the area of their resized mask, largest first (ties keep instance
order; an instance whose mask is empty comes last, where Ultralytics' negated unsigned areas
put it first: it covers no pixel either way), and instance i of that order (1-based) is
written where its mask is set, later ones over earlier ones (so a smaller instance lies on top).
The instances, and their target rows, are reordered to match. Without ``overlap_mask`` there is
one plane per instance, in instance order.

The fast form: an instance is rasterised only inside its bounding window, widened to whole
mask_ratio blocks and one block beyond on every side, and only that window is resized.
When S is a multiple of mask_ratio the resize is a whole-block scale, so each mask pixel reads
source pixels of its own block (and its neighbours') only, and the window's result is the
full image's in that window, zero elsewhere (``tests/unit/test_augment_masks.py`` compares
with the full-size definition). Otherwise the full-size form runs.
"""

from __future__ import annotations

import numpy as np

from .labels import Labels


def _cv2():
    import cv2

    return cv2


def _window_mask(
    pts: np.ndarray, lo: np.ndarray, hi: np.ndarray, imgsz: int, ratio: int
) -> tuple[np.ndarray, int, int]:
    """(uint8 mask window, its mask-plane row, column) of one polygon, its truncated int32
    vertices ``pts`` (pixel x, y on the S x S image) with extent ``lo`` .. ``hi``: the resized
    mask restricted to a window that holds every set pixel."""
    cv2 = _cv2()
    side = imgsz // ratio
    if imgsz % ratio:
        full = np.zeros((imgsz, imgsz), np.uint8)
        cv2.fillPoly(full, [pts], 1)
        return cv2.resize(full, (side, side), interpolation=cv2.INTER_LINEAR), 0, 0
    # whole blocks around the polygon's pixels, one more block on every side, inside the plane
    bx0 = max(int(lo[0]) // ratio - 1, 0)
    by0 = max(int(lo[1]) // ratio - 1, 0)
    bx1 = min(int(hi[0]) // ratio + 2, side)
    by1 = min(int(hi[1]) // ratio + 2, side)
    if bx1 <= bx0 or by1 <= by0:
        return np.zeros((0, 0), np.uint8), 0, 0
    window = np.zeros(((by1 - by0) * ratio, (bx1 - bx0) * ratio), np.uint8)
    shifted = pts - np.array([bx0 * ratio, by0 * ratio], np.int32)
    cv2.fillPoly(window, [shifted], 1)
    if ratio == 1:
        return window, by0, bx0
    small = cv2.resize(window, (bx1 - bx0, by1 - by0), interpolation=cv2.INTER_LINEAR)
    return small, by0, bx0


def _windows(labels: Labels, imgsz: int, ratio: int) -> list[tuple[np.ndarray, int, int]]:
    """``_window_mask`` of every instance, with the truncation and the extents in one pass over all points."""
    n = len(labels)
    counts = labels.counts
    empty = (np.zeros((0, 0), np.uint8), 0, 0)
    if n == 0 or not len(labels.points):
        return [empty] * n
    pts = labels.points.astype(np.int32)  # truncation, as an int32 cast does
    has = np.flatnonzero(counts > 0)
    starts = labels.offsets[:-1][has]
    # per column: numpy's reductions along a length-2 axis are slow
    x, y = np.ascontiguousarray(pts[:, 0]), np.ascontiguousarray(pts[:, 1])
    lo = np.stack([np.minimum.reduceat(x, starts), np.minimum.reduceat(y, starts)], axis=1)
    hi = np.stack([np.maximum.reduceat(x, starts), np.maximum.reduceat(y, starts)], axis=1)
    # A vertex equal to the one before it adds a zero-length edge, which fillPoly skips (it
    # draws no horizontal edge): dropping those leaves every filled pixel as it is, and a
    # resampled polygon of 1000 points on a small object is mostly such repeats.
    keep = np.ones(len(pts), dtype=bool)
    np.not_equal(x[1:], x[:-1], out=keep[1:])
    keep[1:] |= y[1:] != y[:-1]
    keep[starts] = True
    kept = np.zeros(len(pts) + 1, dtype=np.int64)
    np.cumsum(keep, out=kept[1:])
    bounds = kept[labels.offsets].tolist()
    pts = pts[keep]
    out = [empty] * n
    for j, i in enumerate(has.tolist()):
        out[i] = _window_mask(pts[bounds[i] : bounds[i + 1]], lo[j], hi[j], imgsz, ratio)
    return out


def render_masks(
    labels: Labels,
    imgsz: int,
    ratio: int,
    *,
    overlap: bool,
    out: np.ndarray | None = None,
    ultralytics_ties: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(masks, order): ``overlap``: the (M, M) plane, written into ``out`` (any integer dtype wide
    enough for len(labels); a new uint8/int32 array when None), and the int64 instance order
    (largest area first) the rows must follow; otherwise (n, M, M) uint8 planes in instance order
    and the identity order.

    ``ultralytics_ties``: order equal areas as Ultralytics' ``polygons2masks_overlap`` does
    (numpy's default ``argsort`` of the negated unsigned areas: ties not kept in instance order
    past 16 instances, empty masks first), so the plane and the rows are its own byte for byte;
    the rect validation route asks for it. The training route keeps the stable order."""
    side = imgsz // ratio
    n = len(labels)
    windows = _windows(labels, imgsz, ratio)
    if not overlap:
        planes = np.zeros((n, side, side), np.uint8)
        for i, (m, r, c) in enumerate(windows):
            planes[i, r : r + m.shape[0], c : c + m.shape[1]] = m
        return planes, np.arange(n, dtype=np.int64)
    if out is None:
        out = np.zeros((side, side), np.int32 if n > 255 else np.uint8)
    else:
        if out.shape != (side, side):
            raise ValueError(f"mask plane must be ({side}, {side}), got {out.shape}")
        if n > np.iinfo(out.dtype).max:
            raise ValueError(f"a {out.dtype} mask plane holds at most {np.iinfo(out.dtype).max} instances, got {n}")
        out[...] = 0
    areas = np.array([int(np.count_nonzero(m)) for m, _, _ in windows], dtype=np.int64)
    order = np.argsort(-areas.astype(np.uint64)) if ultralytics_ties else np.argsort(-areas, kind="stable")
    for rank, i in enumerate(order.tolist(), start=1):
        m, r, c = windows[i]
        if m.size:
            view = out[r : r + m.shape[0], c : c + m.shape[1]]
            view[m.astype(bool)] = rank
    return out, order.astype(np.int64)
