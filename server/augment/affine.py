"""Random affine/perspective: the matrix, and the float32 resample with border value 0.

Runs wherever a sample is rendered. Reads the canvas, writes a new output array.

The matrix is composed as centre -> perspective -> rotation+scale -> shear ->
translation (``M = T @ S @ R @ P @ C``), the customary YOLO order. ``C`` moves the
canvas centre to the origin; ``T`` moves it to a point drawn around the output centre.
Draws, always in this order and always all eight (so the stream's position never
depends on which options are zero): perspective x, y; angle; scale; shear x, y;
translation x, y.

The border value is 0 because the canvas holds centred values (pixel - fill): exposed
output is 0 and becomes exactly the fill when the route adds it back.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from ...shared.config import AugmentConfig
from . import canvas as _canvas


def draw_matrix(rng: np.random.Generator, cfg: AugmentConfig, canvas_hw: tuple[int, int], out_size: int) -> tuple[np.ndarray, float]:
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


def inverse(matrix: np.ndarray) -> np.ndarray:
    return np.linalg.inv(matrix)


def warp(canvas: np.ndarray, matrix: np.ndarray, out_size: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """float32 (out_size, out_size, C): ``canvas`` (C channels) resampled through ``matrix``, border 0.

    Where the matrix is the identity and the canvas is already out_size square, the
    resample is bypassed (a copy), as the customary route does.
    """
    if canvas.shape[:2] == (out_size, out_size) and np.array_equal(matrix, np.eye(3)):
        if out is None:
            return canvas.copy()
        np.copyto(out, canvas)
        return out
    dsize = (out_size, out_size)
    if is_perspective(matrix):
        return cv2.warpPerspective(canvas, matrix, dsize, dst=out, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0, 0))
    return cv2.warpAffine(canvas, matrix[:2], dsize, dst=out, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0, 0))


def build_canvas(
    tiles: list[tuple[np.ndarray, tuple[int, int, int, int], tuple[int, int]]],
    canvas_hw: tuple[int, int],
    matrix: np.ndarray,
    out_size: int,
    *,
    full_canvas: bool = False,
) -> np.ndarray:
    """The zero canvas with ``tiles``, written only where ``warp`` will read it.

    Returns this thread's scratch buffer (valid until the next call), with a padding
    channel (``canvas.py``). ``full_canvas=True`` builds a fresh, complete 3-channel
    canvas instead: the straightforward version, kept for the tests that prove both give
    the same output bytes.
    """
    height, width = canvas_hw
    if full_canvas:
        buf = np.zeros((height, width, 3), dtype=np.float32)
        region = (0, 0, width, height)
    else:
        buf = _canvas.scratch(height, width)
        if canvas_hw == (out_size, out_size) and np.array_equal(matrix, np.eye(3)):
            region = (0, 0, width, height)  # the bypass copies the whole canvas
        else:
            region = _canvas.read_region(inverse(matrix), out_size, height, width, perspective=is_perspective(matrix))
    _canvas.fill(buf, region, tiles)
    return buf


def place_and_warp(tiles, canvas_hw: tuple[int, int], matrix: np.ndarray, out_size: int, *, full_canvas: bool = False) -> np.ndarray:
    """``warp(build_canvas(...))`` as a new float32 (out_size, out_size, 3) B G R array."""
    image = warp(build_canvas(tiles, canvas_hw, matrix, out_size, full_canvas=full_canvas), matrix, out_size)
    return np.ascontiguousarray(image[:, :, :3])
