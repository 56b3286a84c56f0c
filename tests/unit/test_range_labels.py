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
from pixpool.server.augment.sample import Draft, Pre, StageClock, draft, pre_labels
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.records import Targets
from pixpool.shared.task import DETECT, task_spec

S = 64
SHAPES = [(64, 48), (40, 64), (64, 64), (1, 64), (64, 3), (20, 64), (64, 1), (33, 64), (50, 50), (64, 20), (12, 64)]

ROUTES = {
    "default": {},
    "letterbox": {"mosaic": 0.0},
    "half": {"mosaic": 0.5, "degrees": 10.0, "shear": 5.0},
    "perspective": {"mosaic": 0.5, "perspective": 0.001, "degrees": 30.0, "scale": 0.9},
    "translate": {"translate": 0.5, "scale": 0.9},
    # polygons wholly outside the output, crossing its borders, under perspective
    "far": {"translate": 0.9, "scale": 0.9, "degrees": 180.0, "shear": 30.0, "perspective": 0.001},
}


def _same(a: Labels, b: Labels) -> None:
    for name in ("classes", "boxes", "points", "offsets"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
    assert (a.keypoints is None) == (b.keypoints is None)
    if a.keypoints is not None:
        assert a.keypoints.tobytes() == b.keypoints.tobytes()


class _Sparse:
    """A source whose records' polygons are thinned out: some instances without one (an empty or
    a 2-vertex polygon, which counts as none), some records with none at all (no tuple), as
    records from a COCO json with crowd or missing segmentations are."""

    def __init__(self, source):
        self.source = source
        self.spec = source.spec
        self.imgsz = source.imgsz

    def __len__(self) -> int:
        return len(self.source)

    def image(self, index: int) -> np.ndarray:
        return self.source.image(index)

    def targets(self, index: int) -> Targets:
        t = self.source.targets(index)
        if index % 4 == 1:
            return Targets(t.classes, t.boxes, (), t.keypoints)
        polys = tuple(
            p if i % 3 else (np.zeros((0, 2), np.float32) if i % 2 else p[:2]) for i, p in enumerate(t.polygons)
        )
        return Targets(t.classes, t.boxes, polys, t.keypoints)


def _source(kind: str):
    if kind in ("boxes", "polygons"):
        return ArraySource(SHAPES, S, seed=3, instances=6, polygons=kind == "polygons")
    if kind.startswith("sparse-"):
        return _Sparse(_source(kind.removeprefix("sparse-")))
    return TaskSource(kind, SHAPES, S, seed=3, instances=6)


KINDS = ["boxes", "polygons", "pose", "segment", "obb", "sparse-polygons", "sparse-segment", "sparse-obb"]


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("kind", KINDS)
def test_a_range_of_pre_labels_is_each_samples(route, kind):
    source = _source(kind)
    reader = Reader.of(source)
    polygons = kind not in ("boxes", "pose")
    settings = StreamSettings(seed=5, batch_size=4, augment=AugmentConfig(imgsz=S, **ROUTES[route]))
    clock = StageClock(None)
    for epoch in range(3):
        drafts = [draft(reader, i % len(source), settings, epoch, clock) for i in range(2 * len(source))]
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


def _targets(rng: np.random.Generator, n: int, *, keypoints: bool, fewest: int = 3) -> Targets:
    """Random normalised targets: per instance a polygon of ``fewest``-12 vertices, an empty one or a
    2-vertex one (counting as none); a fifth of the records without any polygon tuple."""
    xy = np.sort(rng.uniform(-0.2, 1.2, (n, 2, 2)), axis=1)
    boxes = np.stack([xy[:, 0, 0], xy[:, 0, 1], xy[:, 1, 0], xy[:, 1, 1]], axis=1).astype(np.float32)
    polys = []
    for b in boxes:
        kind = rng.integers(0, 4)
        k = int(rng.integers(fewest, 13)) if kind < 2 else 0 if kind == 2 else 2
        t = np.sort(rng.uniform(0, 2 * np.pi, k))
        cx, cy, rx, ry = (b[0] + b[2]) / 2, (b[1] + b[3]) / 2, (b[2] - b[0]) / 2, (b[3] - b[1]) / 2
        polys.append(np.stack([cx + rx * np.cos(t), cy + ry * np.sin(t)], axis=1).astype(np.float32))
    kp = None
    if keypoints:
        kp = np.concatenate([rng.uniform(-0.1, 1.1, (n, 5, 2)), rng.choice([0.0, 1.0, 2.0], (n, 5, 1))], axis=2).astype(
            np.float32
        )
    classes = rng.integers(0, 5, n).astype(np.int32)
    return Targets(classes, boxes, () if rng.random() < 0.2 else tuple(polys), kp)


def _matrix(rng: np.random.Generator, side: int, imgsz: int, perspective: bool) -> np.ndarray:
    a = rng.uniform(-np.pi, np.pi)
    s = rng.uniform(0.3, 2.0)
    m = np.array(
        [
            [s * np.cos(a), -s * np.sin(a) + rng.uniform(-0.3, 0.3), 0.0],
            [s * np.sin(a), s * np.cos(a), 0.0],
            [0.0, 0.0, 1.0],
        ]
    )
    centre = np.array([[1.0, 0, -side / 2], [0, 1, -side / 2], [0, 0, 1]])
    shift = np.array([[1.0, 0, rng.uniform(-0.5, 1.5) * imgsz], [0, 1, rng.uniform(-0.5, 1.5) * imgsz], [0, 0, 1]])
    out = shift @ m @ centre
    if perspective:
        out[2, :2] = rng.uniform(-1e-3, 1e-3, 2)
    return out


@pytest.mark.parametrize("budget", [range_labels.POINTS_PER_GATHER, 40])
@pytest.mark.parametrize("task", ["detect", "segment", "obb", "pose"])
def test_random_ranges_with_polygons_are_each_samples(task, budget, monkeypatch):
    """Ranges drawn at random (placements, canvases, matrices with and without perspective, instances
    with and without polygons, polygons inside, crossing and wholly outside the output, samples
    without instances): each sample's labels from the range are its labels alone; gathered whole or
    in chunks of a few samples (``POINTS_PER_GATHER``)."""
    monkeypatch.setattr(range_labels, "POINTS_PER_GATHER", budget)
    spec = {"detect": DETECT, "pose": task_spec("pose", kpt_shape=(5, 3), flip_idx=(0, 2, 1, 4, 3))}.get(task)
    spec = spec or task_spec(task)
    rng = np.random.default_rng(11)
    imgsz = 96
    for _ in range(30):
        drafts = []
        for _ in range(int(rng.integers(1, 9))):
            mosaic = rng.random() < 0.6
            side = 2 * imgsz if mosaic else imgsz
            placed = []
            for _ in range(4 if mosaic else 1):
                n = int(rng.integers(0, 6)) if rng.random() < 0.8 else 0
                w, h = int(rng.integers(1, side)), int(rng.integers(1, side))
                pw, ph = int(rng.integers(-side // 2, side)), int(rng.integers(-side // 2, side))
                # an OBB polygon has 4 corners or more (the route resamples them to 100)
                targets = _targets(rng, n, keypoints=task == "pose", fewest=4 if task == "obb" else 3)
                placed.append((targets, w, h, pw, ph))
            matrix = _matrix(rng, side, imgsz, rng.random() < 0.4)
            pre = Pre([], placed, side, matrix, float(rng.uniform(0.3, 2.0)))
            drafts.append(Draft(np.random.default_rng(0), False, pre))
        together = range_labels.pre_labels(drafts, imgsz, spec)
        assert len(together) == len(drafts)
        for d, got in zip(drafts, together):
            _same(got, pre_labels(d.pre, imgsz, spec))
