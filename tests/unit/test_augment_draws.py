"""The route's cheaper scalar draws and label shortcuts give the very values of the calls they replace."""

from __future__ import annotations

import math

import numpy as np

from pixpool.server.augment.affine import uniform
from pixpool.server.augment.labels import Labels
from pixpool.shared.stream.records import Targets

RANGES = [
    (-0.5, 0.5),
    (0.0, 0.0),
    (-0.0, 0.0),
    (0, 0),
    (0.1, 0.9),
    (320.0, 960.0),
    (-10.0, 10.0),
    (0.5, 1.5),
    (1e-4, 2e-4),
]


def test_scalar_uniform_is_numpys_uniform_value_for_value_and_keeps_the_stream_position():
    ours, numpys = np.random.default_rng(11), np.random.default_rng(11)
    for low, high in RANGES:
        for _ in range(2000):
            a, b = uniform(ours, low, high), numpys.uniform(low, high)
            assert a == b and math.copysign(1.0, a) == math.copysign(1.0, b), (low, high, a, b)
    assert ours.bit_generator.state == numpys.bit_generator.state


def _targets(rng: np.random.Generator, n: int, *, polygons: bool) -> Targets:
    boxes = np.sort(rng.random((n, 4), dtype=np.float32).reshape(n, 2, 2), axis=1).reshape(n, 4)
    polys = tuple(rng.random((5, 2), dtype=np.float32) for _ in range(n)) if polygons else ()
    return Targets(rng.integers(0, 80, n).astype(np.int32), boxes, polys)


def test_a_mosaic_of_boxes_alone_equals_the_parts_placed_one_by_one():
    """The boxes-only shortcut of ``from_placed`` (detect records) against ``from_targets`` + ``concat``."""
    rng = np.random.default_rng(4)
    for counts in ([3, 0, 5, 1], [0, 0, 0, 0], [7], [0, 2]):
        placed = [
            (
                _targets(rng, n, polygons=False),
                int(rng.integers(20, 640)),
                int(rng.integers(20, 640)),
                float(x),
                float(y),
            )
            for n, x, y in zip(counts, rng.integers(-300, 900, len(counts)), rng.integers(-300, 900, len(counts)))
        ]
        got = Labels.from_placed(placed)
        want = Labels.concat([Labels.from_targets(t, w, h, px, py) for t, w, h, px, py in placed])
        for name in ("classes", "boxes", "points", "offsets"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (counts, name)
        assert got.keypoints is None and want.keypoints is None
