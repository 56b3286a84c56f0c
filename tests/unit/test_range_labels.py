"""``range_labels``: a range's labels computed at once are each sample's per-sample labels, byte
for byte (the render loop relies on it: a row's bytes must not depend on the rows around it)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.sources import ArraySource
from helpers.task_sources import TaskSource
from pixpool.server.augment import range_labels
from pixpool.server.augment.labels import Labels, corner_boxes, transformed_keypoints
from pixpool.server.augment.record import Reader
from pixpool.server.augment.sample import StageClock, draft, pre_labels
from pixpool.shared.stream.config import AugmentConfig, StreamSettings

S = 64
SHAPES = [(64, 48), (40, 64), (64, 64), (1, 64), (64, 3), (20, 64), (64, 1), (33, 64), (50, 50), (64, 20), (12, 64)]

ROUTES = {
    "default": {},
    "letterbox": {"mosaic": 0.0},
    "half": {"mosaic": 0.5, "degrees": 10.0, "shear": 5.0},
    "perspective": {"mosaic": 0.5, "perspective": 0.001, "degrees": 30.0, "scale": 0.9},
    "translate": {"translate": 0.5, "scale": 0.9},
}


def _same(a: Labels, b: Labels) -> None:
    for name in ("classes", "boxes", "points", "offsets"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
    assert (a.keypoints is None) == (b.keypoints is None)
    if a.keypoints is not None:
        assert a.keypoints.tobytes() == b.keypoints.tobytes()


def _source(kind: str):
    if kind in ("boxes", "polygons"):
        return ArraySource(SHAPES, S, seed=3, instances=6, polygons=kind == "polygons")
    return TaskSource(kind, SHAPES, S, seed=3, instances=6)


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("kind", ["boxes", "polygons", "pose", "segment", "obb"])
def test_a_range_of_pre_labels_is_each_samples(route, kind):
    source = _source(kind)
    reader = Reader.of(source)
    polygons = kind not in ("boxes", "pose")
    settings = StreamSettings(seed=5, batch_size=4, augment=AugmentConfig(imgsz=S, **ROUTES[route]))
    clock = StageClock(None)
    for epoch in range(3):
        drafts = [draft(reader, i % len(source), settings, epoch, clock) for i in range(2 * len(source))]
        # without polygons the range's gathered path, with them the per-sample one
        assert any(t.polygons for d in drafts for t, *_ in d.pre.placed) == polygons
        together = range_labels.pre_labels(drafts, S, reader.spec)
        assert len(together) == len(drafts)
        for d, got in zip(drafts, together):
            _same(got, pre_labels(d.pre, S, reader.spec))
        # any sub-range alike (a worker's part of a batch)
        for one, d in zip(range_labels.pre_labels(drafts[3:4], S, reader.spec), drafts[3:4]):
            _same(one, pre_labels(d.pre, S, reader.spec))
    assert range_labels.pre_labels([], S, reader.spec) == []


def test_a_matrix_per_row_is_each_rows_matrix():
    """``corner_boxes`` and ``transformed_keypoints`` with a matrix per row, affine and perspective
    rows mixed, give each row the bytes of its own matrix alone."""
    rng = np.random.default_rng(0)
    n, k = 40, 5
    boxes = np.sort(rng.uniform(-50, 700, (n, 2, 2)), axis=1).reshape(n, 4).astype(np.float32)
    keypoints = np.concatenate(
        [rng.uniform(-50, 700, (n, k, 2)), rng.choice([0.0, 1.0, 2.0], (n, k, 1))], axis=2
    ).astype(np.float32)
    matrices = []
    for i in range(n):
        m = np.array([[1.1, 0.2, -30.0], [-0.1, 0.9, 12.5], [0.0, 0.0, 1.0]]) * rng.uniform(0.5, 1.5)
        m[2] = (rng.uniform(-1e-3, 1e-3), rng.uniform(-1e-3, 1e-3), 1.0) if i % 3 == 0 else (0.0, 0.0, 1.0)
        matrices.append(m)
    perspective = np.array([bool(m[2, 0] or m[2, 1]) for m in matrices])
    rows = np.array(matrices).reshape(n, 9)
    entries = [rows[:, j : j + 1] for j in range(9)]
    together = corner_boxes(boxes, entries, perspective)
    moved = transformed_keypoints(keypoints, entries, perspective, 640)
    for i, m in enumerate(matrices):
        one = corner_boxes(boxes[i : i + 1], [v for r in m.tolist() for v in r], bool(perspective[i]))
        assert together[i].tobytes() == one[0].tobytes()
        alone = transformed_keypoints(
            keypoints[i : i + 1], [v for r in m.tolist() for v in r], bool(perspective[i]), 640
        )
        assert moved[i].tobytes() == alone[0].tobytes()
