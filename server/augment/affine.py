"""Random affine/perspective: the matrix (canvas -> output) the kernel resamples through.

Runs wherever a sample is rendered. Pure arithmetic on the draws; the kernel
(``kernel.py``) inverts the matrix and resamples.

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


def draw_matrix(
    rng: np.random.Generator, cfg: AugmentConfig, canvas_hw: tuple[int, int], out_size: int
) -> tuple[np.ndarray, float]:
    """(3x3 float64 matrix canvas -> output, the drawn scale factor)."""
    height, width = canvas_hw
    c = np.eye(3)
    c[0, 2] = -width / 2
    c[1, 2] = -height / 2
    p = np.eye(3)
    p[2, 0] = rng.uniform(-cfg.perspective, cfg.perspective)
    p[2, 1] = rng.uniform(-cfg.perspective, cfg.perspective)
    angle_deg = rng.uniform(-cfg.degrees, cfg.degrees)
    scale = rng.uniform(1 - cfg.scale, 1 + cfg.scale)
    r = np.eye(3)
    a = math.radians(angle_deg)
    cos_s, sin_s = math.cos(a) * scale, math.sin(a) * scale
    r[0, 0], r[0, 1], r[1, 0], r[1, 1] = cos_s, sin_s, -sin_s, cos_s
    s = np.eye(3)
    s[0, 1] = math.tan(math.radians(rng.uniform(-cfg.shear, cfg.shear)))
    s[1, 0] = math.tan(math.radians(rng.uniform(-cfg.shear, cfg.shear)))
    t = np.eye(3)
    t[0, 2] = rng.uniform(0.5 - cfg.translate, 0.5 + cfg.translate) * out_size
    t[1, 2] = rng.uniform(0.5 - cfg.translate, 0.5 + cfg.translate) * out_size
    return t @ s @ r @ p @ c, scale


def is_perspective(matrix: np.ndarray) -> bool:
    return bool(matrix[2, 0] != 0 or matrix[2, 1] != 0)
