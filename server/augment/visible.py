"""A transformed segment polygon's box: the extent of its part inside the output image.

Runs wherever a segment sample is rendered (workers, the reference pipeline, the digest command),
called by ``labels.transform_labels`` after the affine; reads the transformed points, returns new
arrays.

The definition is the behaviour of Ultralytics 8.4 (``utils/ops.py`` ``segment2box`` as
``RandomPerspective.apply_segments`` uses it; our own code): a polygon wholly inside keeps its
extent, one wholly outside gets a zero box, and one that crosses a border gets the extent of
its vertices inside, its edges' crossings of the four borders (the closing edge included) and
the image corners that lie in it (``cv2.pointPolygonTest`` >= 0, on the border included). Its
vertices are then clipped to that box, which is what its mask is drawn from.
"""

from __future__ import annotations

import numpy as np


def visible_boxes(points: np.ndarray, offsets: np.ndarray, imgsz: int) -> tuple[np.ndarray, np.ndarray]:
    """(float64 (n, 4) boxes, float32 points) of transformed segment polygons on an ``imgsz`` x ``imgsz``
    output, as Ultralytics 8.4 derives a segment's box after its affine: the extent of the part of
    the polygon inside the output (its vertices inside, the crossings of its edges, the closing
    one included, with the four borders, and the output's corners that lie in the polygon); zeros
    for a polygon wholly outside. Every vertex is then clipped to its own box.

    Clipping each vertex to the output instead (the detect route's box from polygons) grows the
    box of a polygon that crosses a border: a vertex far outside is pulled to the border at a
    height the polygon never reaches there. Most polygons lie inside: only those that cross a
    border or lie outside are computed further."""
    n = len(offsets) - 1
    boxes = np.zeros((n, 4), np.float64)
    counts = np.diff(offsets)
    has = np.flatnonzero(counts > 0)
    if not len(has):
        return boxes, points.astype(np.float32)
    starts = offsets[:-1][has]
    lo = np.minimum.reduceat(points, starts, axis=0)
    hi = np.maximum.reduceat(points, starts, axis=0)
    inside = (lo >= 0).all(1) & (hi <= imgsz).all(1)
    boxes[has[inside]] = np.concatenate([lo[inside], hi[inside]], axis=1)
    outside = (hi < 0).any(1) | (lo > imgsz).any(1)
    crossing = has[~inside & ~outside]
    if len(crossing):
        boxes[crossing] = _visible_extents(
            points, offsets, crossing, lo[~inside & ~outside], hi[~inside & ~outside], imgsz
        )
    clipped = points.astype(np.float32)  # a polygon inside keeps its vertices: its box is their extent
    moved = has[~inside]
    if len(moved):
        rows, _, lengths = polygon_rows(offsets, moved)
        box = np.repeat(boxes[moved], lengths, axis=0)
        clipped[rows, 0] = np.clip(points[rows, 0], box[:, 0], box[:, 2])
        clipped[rows, 1] = np.clip(points[rows, 1], box[:, 1], box[:, 3])
    return boxes, clipped


def polygon_rows(offsets: np.ndarray, which: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the point rows of polygons ``which`` of a set split by ``offsets``, one after another; where
    each polygon starts among those rows; how many rows each has)."""
    lengths = (offsets[which + 1] - offsets[which]).astype(np.int64)
    starts = np.zeros(len(which), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return np.repeat(offsets[which] - starts, lengths) + np.arange(int(lengths.sum())), starts, lengths


def closed_polygons(
    points: np.ndarray, offsets: np.ndarray, which: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(the points of polygons ``which``, their starts and lengths as ``polygon_rows`` gives them, and
    per point the row of the next one along its polygon, the last one's the first: its edges)."""
    rows, starts, lengths = polygon_rows(offsets, which)
    following = np.arange(1, len(rows) + 1)
    following[starts + lengths - 1] = starts  # each polygon's closing edge: last vertex to first
    return points[rows], starts, lengths, following


def _visible_extents(
    points: np.ndarray, offsets: np.ndarray, which: np.ndarray, lo: np.ndarray, hi: np.ndarray, imgsz: int
) -> np.ndarray:
    """x1, y1, x2, y2 of the part inside [0, imgsz]^2 of each polygon ``which`` (float64 ``points``
    split by ``offsets``; ``lo``/``hi`` their extents), zeros where none: the minima and maxima of
    every candidate point (a vertex inside, an edge's crossing of a border, the closing edge
    included) per polygon; the image corners tested only where a polygon's extent holds them.

    An edge's crossing of a border is computed only for the edges whose ends come near that border
    (within 1e-9 of the largest coordinate: an edge further off cannot meet it, however its
    quotient rounds), the same expression on the same values as for every edge, so the candidates
    are the same. Minima and maxima are exact in any order, except that a -0.0 and a 0.0 compare
    equal: where a vertex has a -0.0 coordinate the candidates are reduced in the order of the
    definition (per vertex: itself, then its edge's crossings of x = 0, x = S, y = 0, y = S)."""
    s = float(imgsz)
    poly, starts, lengths, following = closed_polygons(points, offsets, which)
    x, y = poly[:, 0], poly[:, 1]
    vertex = (x >= 0) & (y >= 0) & (x <= s) & (y <= s)
    scale = float(np.abs(poly).max()) if len(poly) else 0.0
    margin = 1e-9 * scale
    signed_zero = bool(np.any(np.signbit(poly) & (poly == 0)))
    in_order = signed_zero or not np.isfinite(scale)
    crossings = []  # (column, edges, their crossing's x, y) per border
    ends = {}  # per axis: each edge's smaller and larger coordinate
    for col, (axis, bound) in enumerate(((0, 0.0), (0, s), (1, 0.0), (1, s)), start=1):
        if in_order:
            edges = np.arange(len(poly))
        else:
            if axis not in ends:
                a, b = poly[:, axis], poly[following, axis]
                ends[axis] = (np.minimum(a, b), np.maximum(a, b))
            low, high = ends[axis]
            edges = np.flatnonzero((low <= bound + margin) & (high >= bound - margin))
        start, delta = poly[edges], poly[following[edges]] - poly[edges]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (bound - start[:, axis]) / delta[:, axis]
            other = start[:, 1 - axis] + t * delta[:, 1 - axis]
            hit = (t >= 0) & (t <= 1) & (other >= 0) & (other <= s)
        at = np.full(int(hit.sum()), bound)
        crossings.append((col, edges[hit], *((at, other[hit]) if axis == 0 else (other[hit], at))))
    if in_order:
        # candidates (5, m): the vertex itself, then its edge's crossings (rows of m: reducing over
        # the short axis 0 runs along contiguous rows, which numpy does fast)
        cx = np.full((5, len(poly)), np.nan)
        cy = np.full((5, len(poly)), np.nan)
        cx[0, vertex], cy[0, vertex] = x[vertex], y[vertex]
        for col, edges, ex, ey in crossings:
            cx[col, edges], cy[col, edges] = ex, ey
        with np.errstate(invalid="ignore"):
            low_x, low_y = np.fmin.reduce(cx, axis=0), np.fmin.reduce(cy, axis=0)
            out = _extents(low_x, low_y, np.fmax.reduce(cx, axis=0), np.fmax.reduce(cy, axis=0), starts)
    else:
        vx, vy = np.where(vertex, x, np.nan), np.where(vertex, y, np.nan)
        with np.errstate(invalid="ignore"):
            out = _extents(vx, vy, vx, vy, starts)
        owner = np.repeat(np.arange(len(which)), lengths)
        for _, edges, ex, ey in crossings:
            if len(edges):
                polygon = owner[edges]
                for column, values, ufunc in ((0, ex, np.fmin), (1, ey, np.fmin), (2, ex, np.fmax), (3, ey, np.fmax)):
                    ufunc.at(out[:, column], polygon, values)
    return _with_corners(out, poly, starts, lengths, lo, hi, s)


def _with_corners(
    out: np.ndarray, poly: np.ndarray, starts: np.ndarray, lengths: np.ndarray, lo: np.ndarray, hi: np.ndarray, s: float
) -> np.ndarray:
    """``out`` (k, 4, NaN where nothing was found) grown by each image corner that lies in polygon j
    (``poly``'s rows ``starts[j]`` on, ``lengths[j]`` of them; tested only where its extent ``lo``,
    ``hi`` holds the corner), NaN then 0."""
    import cv2  # here, as the route's other cv2 users: importing the route stays cheap

    for j in range(len(out)):
        corners = [
            (cxy, cyy)
            for cxy in (0.0, s)
            for cyy in (0.0, s)
            if lo[j, 0] <= cxy <= hi[j, 0] and lo[j, 1] <= cyy <= hi[j, 1]
        ]
        if not corners:
            continue
        contour = poly[starts[j] : starts[j] + lengths[j]].astype(np.float32)
        for cxy, cyy in corners:
            if cv2.pointPolygonTest(contour, (cxy, cyy), False) >= 0:  # NaN (nothing found yet) gives way
                out[j, :2] = np.fmin(out[j, :2], (cxy, cyy))
                out[j, 2:] = np.fmax(out[j, 2:], (cxy, cyy))
    return np.nan_to_num(out, nan=0.0)


def _extents(
    min_x: np.ndarray, min_y: np.ndarray, max_x: np.ndarray, max_y: np.ndarray, starts: np.ndarray
) -> np.ndarray:
    """(k, 4) per polygon starting at ``starts``: the NaN-ignoring minima of ``min_x``, ``min_y`` and
    maxima of ``max_x``, ``max_y`` over its rows."""
    return np.stack(
        [
            np.fmin.reduceat(min_x, starts),
            np.fmin.reduceat(min_y, starts),
            np.fmax.reduceat(max_x, starts),
            np.fmax.reduceat(max_y, starts),
        ],
        axis=1,
    )
