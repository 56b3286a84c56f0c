"""A segment polygon's box after the affine is the extent of its part inside the image, as
Ultralytics 8.4's ``segment2box`` makes it (the fidelity row "mask IoU with its
own box" failed while pixpool clipped each vertex to the image instead)."""

from __future__ import annotations

import numpy as np

from pixpool.server.augment.labels import Labels, transform_labels
from pixpool.server.augment.visible import visible_boxes

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
