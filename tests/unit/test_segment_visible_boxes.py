"""A segment polygon's box after the affine is the extent of its part inside the image, as
Ultralytics 8.4's ``segment2box`` makes it (the fidelity row "mask IoU with its
own box" failed while pixpool clipped each vertex to the image instead)."""

from __future__ import annotations

import numpy as np

from pixpool.server.augment.labels import Labels, transform_labels
from pixpool.server.augment.visible import _visible_extents, _with_corners, closed_polygons, visible_boxes

S = 640


def _polygons(*polys):
    points = np.concatenate([np.asarray(p, np.float64) for p in polys])
    offsets = np.cumsum([0, *(len(p) for p in polys)]).astype(np.int64)
    return points, offsets


def test_a_polygon_crossing_a_border_gets_the_extent_of_its_visible_part():
    # A triangle with one vertex left of the image: its edges cross x = 0 at y = 125 and y = 175,
    # so nothing of it inside the image lies above y = 125 (clipping the vertex would say y = 50).
    points, offsets = _polygons([[-100, 50], [100, 200], [100, 300], [-100, 50]])
    boxes, clipped = visible_boxes(points, offsets, S)
    assert boxes.tolist() == [[0.0, 125.0, 100.0, 300.0]]
    assert clipped.dtype == np.float32
    assert clipped.tolist() == [[0, 125], [100, 200], [100, 300], [0, 125]]


def test_inside_outside_and_corner_covering_polygons():
    inside = [[10, 10], [50, 10], [50, 60], [10, 10]]
    outside = [[-50, 10], [-10, 10], [-10, 60], [-50, 10]]
    corner = [[-20, -20], [100, -20], [100, 100], [-20, 100], [-20, -20]]  # holds the image corner (0, 0)
    points, offsets = _polygons(inside, outside, corner)
    boxes, clipped = visible_boxes(points, offsets, S)
    assert boxes.tolist() == [[10, 10, 50, 60], [0, 0, 0, 0], [0, 0, 100, 100]]
    assert clipped[:4].tolist() == inside  # wholly inside: the vertices as they were


def test_a_polygon_around_the_whole_image_gets_the_whole_image():
    # no vertex inside and no edge crossing a border: only the four corners are found
    points, offsets = _polygons([[-10, -10], [700, -10], [700, 700], [-10, 700]])
    boxes, _ = visible_boxes(points, offsets, S)
    assert boxes.tolist() == [[0, 0, S, S]]


def test_segment_route_boxes_differ_from_the_detect_route_only_for_crossing_polygons():
    points, offsets = _polygons(
        [[-100, 50], [100, 200], [100, 300], [-100, 50]], [[300, 300], [400, 300], [400, 420], [300, 300]]
    )
    boxes = np.array([[-100, 50, 100, 300], [300, 300, 400, 420]], np.float32)
    labels = Labels(np.array([0, 1], np.int32), boxes, points.astype(np.float32), offsets)
    identity = np.eye(3)
    segment = transform_labels(labels, identity, S, 1.0, perspective=False, visible=True)
    detect = transform_labels(labels, identity, S, 1.0, perspective=False)
    assert segment.boxes.tolist() == [[0, 125, 100, 300], [300, 300, 400, 420]]
    assert detect.boxes.tolist() == [[0, 50, 100, 300], [300, 300, 400, 420]]  # vertices clipped to the image


def _every_edge(
    points: np.ndarray, offsets: np.ndarray, which: np.ndarray, lo: np.ndarray, hi: np.ndarray, imgsz: int
) -> np.ndarray:
    """The definition computed for every edge of every polygon, its candidates reduced in one
    order (per vertex: itself, then its edge's crossings of x = 0, x = S, y = 0, y = S): what
    ``visible._visible_extents`` computes for fewer edges."""
    s = float(imgsz)
    poly, starts, lengths, following = closed_polygons(points, offsets, which)
    delta = poly[following] - poly
    # candidates (5, m): the vertex itself, then its edge's crossing of x = 0, x = S, y = 0, y = S
    # (rows of m: reducing over the short axis 0 runs along contiguous rows, which numpy does fast)
    cx = np.full((5, len(poly)), np.nan)
    cy = np.full((5, len(poly)), np.nan)
    x, y = poly[:, 0], poly[:, 1]
    vertex = (x >= 0) & (y >= 0) & (x <= s) & (y <= s)
    cx[0, vertex], cy[0, vertex] = x[vertex], y[vertex]
    with np.errstate(divide="ignore", invalid="ignore"):
        for col, (axis, bound) in enumerate(((0, 0.0), (0, s), (1, 0.0), (1, s)), start=1):
            t = (bound - poly[:, axis]) / delta[:, axis]
            other = poly[:, 1 - axis] + t * delta[:, 1 - axis]
            hit = (t >= 0) & (t <= 1) & (other >= 0) & (other <= s)
            (cx if axis == 0 else cy)[col, hit] = bound
            (cy if axis == 0 else cx)[col, hit] = other[hit]
    with np.errstate(invalid="ignore"):
        out = np.stack(
            [
                np.fmin.reduceat(np.fmin.reduce(cx, axis=0), starts),
                np.fmin.reduceat(np.fmin.reduce(cy, axis=0), starts),
                np.fmax.reduceat(np.fmax.reduce(cx, axis=0), starts),
                np.fmax.reduceat(np.fmax.reduce(cy, axis=0), starts),
            ],
            axis=1,
        )
    return _with_corners(out, poly, starts, lengths, lo, hi, s)


def _random_polygons(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Polygons of 3-40 vertices around the image, some snapped to its borders and corners (vertices
    on a border, edges along one), some with -0.0 coordinates, one far out."""
    polys = []
    for k in range(count):
        n = int(rng.integers(3, 40))
        centre = rng.uniform(-200, S + 200, 2)
        p = centre + rng.normal(0, rng.uniform(5, 400), (n, 2))
        if k % 3 == 0:  # snap some coordinates to the borders
            snap = rng.random((n, 2)) < 0.3
            p[snap] = rng.choice([0.0, float(S)], int(snap.sum()))
        if k % 7 == 0:
            p[rng.random((n, 2)) < 0.2] = -0.0
        if k % 11 == 0:
            p *= 1e6
        polys.append(p)
    return _polygons(*polys)


def test_the_extents_of_the_edges_near_a_border_equal_those_of_every_edge():
    # Bit for bit (a -0.0 and a 0.0 differ here), crossing polygons only, as visible_boxes calls it.
    rng = np.random.default_rng(5)
    for trial in range(60):
        points, offsets = _random_polygons(rng, int(rng.integers(1, 30)))
        if trial % 2:  # no signed zero anywhere: the edges near a border only
            points = np.where(points == 0, 0.0, points)
        starts = offsets[:-1]
        lo, hi = np.minimum.reduceat(points, starts, axis=0), np.maximum.reduceat(points, starts, axis=0)
        inside = (lo >= 0).all(1) & (hi <= S).all(1)
        outside = (hi < 0).any(1) | (lo > S).any(1)
        which = np.flatnonzero(~inside & ~outside)
        if not len(which):
            continue
        got = _visible_extents(points, offsets, which, lo[which], hi[which], S)
        want = _every_edge(points, offsets, which, lo[which], hi[which], S)
        assert got.tobytes() == want.tobytes(), trial
