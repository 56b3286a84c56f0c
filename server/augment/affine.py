"""The geometric draws of a pre-transform: the mosaic's partners and centre (``draw_mosaic``),
then the random affine/perspective, the matrix (canvas -> output) the kernel resamples through.

Runs wherever a sample is rendered. Pure arithmetic on the draws; the kernel
(``kernel.py``) inverts the matrix and resamples; ``mosaic.py`` places the tiles.

The matrix is composed as centre -> perspective -> rotation+scale -> shear ->
translation (``M = T @ S @ R @ P @ C``), the customary YOLO order. ``C`` moves the
canvas centre to the origin; ``T`` moves it to a point drawn around the output centre.
Draws, always in this order and always all eight (so the stream's position never
depends on which options are zero): perspective x, y; angle; scale; shear x, y;
translation x, y.

Exposed output reads 0 (the source holds centred values, pixel - fill) and becomes
exactly the fill when the kernel adds it back.
"""

from __future__ import annotations

import math

import numpy as np

from ...shared.stream.config import AugmentConfig


def uniform(rng: np.random.Generator, low: float, high: float) -> float:
    """``rng.uniform(low, high)`` for one scalar, at half its call cost: numpy's uniform is
    ``low + (high - low) * next_double`` in double (one draw), which is this expression; the same
    value and the same stream position (tests/unit/test_augment_draws.py compares them)."""
    return low + (high - low) * rng.random()


def draw_mosaic(rng: np.random.Generator, num_records: int, imgsz: int) -> tuple[np.ndarray, int, int]:
    """(three partner record indices, centre x, centre y) drawn in that order."""
    partners = rng.integers(0, num_records, size=3)
    xc = int(uniform(rng, imgsz / 2, 3 * imgsz / 2))
    yc = int(uniform(rng, imgsz / 2, 3 * imgsz / 2))
    return partners, xc, yc


def draw_matrix(
    rng: np.random.Generator, cfg: AugmentConfig, canvas_hw: tuple[int, int], out_size: int
) -> tuple[np.ndarray, float]:
    """(3x3 float64 matrix canvas -> output, the drawn scale factor)."""
    height, width = canvas_hw
    # Each factor built from one nested list (np.eye plus item writes cost several times
    # more per sample); the same float64 values, multiplied by the same matmuls.
    c = np.array(((1.0, 0.0, -width / 2), (0.0, 1.0, -height / 2), (0.0, 0.0, 1.0)))
    px = uniform(rng, -cfg.perspective, cfg.perspective)
    py = uniform(rng, -cfg.perspective, cfg.perspective)
    p = np.array(((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (px, py, 1.0)))
    angle_deg = uniform(rng, -cfg.degrees, cfg.degrees)
    scale = uniform(rng, 1 - cfg.scale, 1 + cfg.scale)
    a = math.radians(angle_deg)
    cos_s, sin_s = math.cos(a) * scale, math.sin(a) * scale
    r = np.array(((cos_s, sin_s, 0.0), (-sin_s, cos_s, 0.0), (0.0, 0.0, 1.0)))
    shx = math.tan(math.radians(uniform(rng, -cfg.shear, cfg.shear)))
    shy = math.tan(math.radians(uniform(rng, -cfg.shear, cfg.shear)))
    s = np.array(((1.0, shx, 0.0), (shy, 1.0, 0.0), (0.0, 0.0, 1.0)))
    tx = uniform(rng, 0.5 - cfg.translate, 0.5 + cfg.translate) * out_size
    ty = uniform(rng, 0.5 - cfg.translate, 0.5 + cfg.translate) * out_size
    t = np.array(((1.0, 0.0, tx), (0.0, 1.0, ty), (0.0, 0.0, 1.0)))
    return t @ s @ r @ p @ c, scale


def is_perspective(matrix: np.ndarray) -> bool:
    return bool(matrix[2, 0] != 0 or matrix[2, 1] != 0)
