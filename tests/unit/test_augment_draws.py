"""The route's cheaper scalar draws and label shortcuts give the very values of the calls they replace."""

from __future__ import annotations

import math

import numpy as np

from pixpool.server.augment.affine import draw_matrix, draw_mosaic
from pixpool.server.augment.labels import Labels
from pixpool.shared.stream.config import AugmentConfig
from pixpool.shared.stream.records import Targets
from pixpool.shared.stream.rng import sample_generator


def test_mosaic_draws_are_the_streams_integers_and_uniforms_in_order():
    # draw_mosaic (and the range's drafts, through mosaic_entries) take five values: three
    # partners as Draws.integers(0, n), then the centre's x and y as low + (high - low) u.
    for index in range(300):
        n = 1 + index % 7 if index % 3 else 128
        d = sample_generator(5, 1, index)
        partners, xc, yc = draw_mosaic(d, n, 64)
        same = sample_generator(5, 1, index)
        assert partners.tolist() == [same.integers(0, n) for _ in range(3)]
        assert (xc, yc) == tuple(int(32 + (96 - 32) * same.random()) for _ in range(2))
        assert d.state[1] == same.state[1] == 5 and all(0 <= p < n for p in partners)
        assert 32 <= xc < 96 and 32 <= yc < 96


def _factors(u: list[float], cfg: AugmentConfig, side: int, out: int) -> np.ndarray:
    """The matrix as the five factors of the module docstring, multiplied."""
    px, py, angle, scale, shx, shy, tx, ty = (lo + (hi - lo) * v for (lo, hi), v in zip(_bounds(cfg), u))
    c = np.array([[1, 0, -side / 2], [0, 1, -side / 2], [0, 0, 1]])
    p = np.array([[1, 0, 0], [0, 1, 0], [px, py, 1]])
    a = math.radians(angle)
    r = np.array(
        [[math.cos(a) * scale, math.sin(a) * scale, 0], [-math.sin(a) * scale, math.cos(a) * scale, 0], [0, 0, 1]]
    )
    s = np.array([[1, math.tan(math.radians(shx)), 0], [math.tan(math.radians(shy)), 1, 0], [0, 0, 1]])
    t = np.array([[1, 0, tx * out], [0, 1, ty * out], [0, 0, 1]])
    return t @ s @ r @ p @ c


def _bounds(cfg: AugmentConfig) -> list[tuple[float, float]]:
    p, d, sc, sh, t = cfg.perspective, cfg.degrees, cfg.scale, cfg.shear, cfg.translate
    return [(-p, p), (-p, p), (-d, d), (1 - sc, 1 + sc), (-sh, sh), (-sh, sh), (0.5 - t, 0.5 + t), (0.5 - t, 0.5 + t)]


def test_closed_form_matrix_is_the_product_of_the_factors():
    cfg = AugmentConfig(imgsz=64, degrees=30.0, shear=8.0, perspective=0.001, scale=0.5, translate=0.2)
    for index in range(200):
        side = 128 if index % 2 else 64
        matrix, scale = draw_matrix(sample_generator(1, 0, index), cfg, (side, side), 64)
        u = sample_generator(1, 0, index).random(8).tolist()
        assert matrix.dtype == np.float64 and matrix.shape == (3, 3)
        np.testing.assert_allclose(matrix, _factors(u, cfg, side, 64), rtol=1e-12, atol=1e-12)
        assert scale == (1 - cfg.scale) + ((1 + cfg.scale) - (1 - cfg.scale)) * u[3]


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
