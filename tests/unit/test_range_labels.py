"""``range_labels``: a range's labels computed at once are each sample's per-sample labels, byte
for byte (the render loop relies on it: a row's bytes must not depend on the rows around it)."""

from __future__ import annotations

import pytest

from helpers.sources import ArraySource
from helpers.task_sources import TaskSource
from pixpool.server.augment import range_labels
from pixpool.server.augment.labels import Labels
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
