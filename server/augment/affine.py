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
from ...shared.stream.rng import Draws


def draw_mosaic(rng: Draws, num_records: int, imgsz: int) -> tuple[np.ndarray, int, int]:
    """(three partner record indices, centre x, centre y): ``mosaic_entries`` of the next five
    values of ``rng``, the partners as an array."""
    partners, xc, yc = mosaic_entries(rng.take(5), num_records, imgsz)
    return np.array(partners, dtype=np.int64), xc, yc


def mosaic_entries(values: list[float], num_records: int, imgsz: int) -> tuple[list[int], int, int]:
    """(three partner record indices, centre x, centre y) from five uniforms in [0, 1), drawn in
    that order: the partners as ``Draws.integers(0, num_records)`` each, the centre as
    ``uniform(imgsz / 2, 3 imgsz / 2)`` truncated."""
    low, high = imgsz / 2, 3 * imgsz / 2
    partners = [int(u * num_records) for u in values[:3]]
    return partners, int(low + (high - low) * values[3]), int(low + (high - low) * values[4])


def draw_matrix(rng: Draws, cfg: AugmentConfig, canvas_hw: tuple[int, int], out_size: int) -> tuple[np.ndarray, float]:
    """(3x3 float64 matrix canvas -> output, the drawn scale factor): ``matrix_entries`` of the
    next eight values of ``rng`` as an array."""
    entries, scale = matrix_entries([rng.random() for _ in range(8)], cfg, canvas_hw, out_size)
    return np.array(entries, dtype=np.float64).reshape(3, 3), scale


def matrix_entries(
    values: list[float], cfg: AugmentConfig, canvas_hw: tuple[int, int], out_size: int
) -> tuple[tuple[float, ...], float]:
    """(the matrix canvas -> output as nine row-major Python floats, the drawn scale factor), from
    the eight uniforms ``values`` in [0, 1), the draws in the module docstring's order, each
    ``uniform``'s expression.

    The product ``T @ S @ R @ P @ C`` written out entry by entry in Python floats (float64): the
    same matrix as the five factors multiplied, up to the rounding of the products' terms, at a
    fraction of the cost of five arrays and four matmuls."""
    height, width = canvas_hw
    u0, u1, u2, u3, u4, u5, u6, u7 = values
    p, d, g, sh, t = cfg.perspective, cfg.degrees, cfg.scale, cfg.shear, cfg.translate
    px = -p + (p - -p) * u0
    py = -p + (p - -p) * u1
    angle_deg = -d + (d - -d) * u2
    scale = (1 - g) + ((1 + g) - (1 - g)) * u3
    a = math.radians(angle_deg)
    cos_s, sin_s = math.cos(a) * scale, math.sin(a) * scale
    shx = math.tan(math.radians(-sh + (sh - -sh) * u4))
    shy = math.tan(math.radians(-sh + (sh - -sh) * u5))
    tx = ((0.5 - t) + ((0.5 + t) - (0.5 - t)) * u6) * out_size
    ty = ((0.5 - t) + ((0.5 + t) - (0.5 - t)) * u7) * out_size
    # S @ R (rotation+scale, then shear), upper-left 2x2; T adds (tx, ty) in the last column.
    a00, a01 = cos_s - shx * sin_s, sin_s + shx * cos_s
    a10, a11 = shy * cos_s - sin_s, shy * sin_s + cos_s
    # P @ C: the canvas centre to the origin, then the perspective row (px, py, p22).
    cx, cy = -width / 2, -height / 2
    p22 = px * cx + py * cy + 1.0
    entries = (
        a00 + tx * px,
        a01 + tx * py,
        a00 * cx + a01 * cy + tx * p22,
        a10 + ty * px,
        a11 + ty * py,
        a10 * cx + a11 * cy + ty * p22,
        px,
        py,
        p22,
    )
    return entries, scale


def is_perspective(matrix: np.ndarray | tuple[float, ...]) -> bool:
    """Whether a 3x3 matrix (or its nine row-major entries) divides by z: a perspective row."""
    if isinstance(matrix, tuple):
        return matrix[6] != 0 or matrix[7] != 0
    return bool(matrix[2, 0] != 0 or matrix[2, 1] != 0)
