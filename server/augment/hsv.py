"""HSV jitter on the CPU, as a standalone step: the kernel's integer HSV (``kernel.py`` step 8).

Runs in the tests and wherever an 8-bit image needs the jitter outside the route (the route
applies it inside the fused kernel pass). Per sample the gains come from
``pixpool.shared.stream.rng.hsv_gains`` and the tables from ``pixpool.shared.stream.hsv_tables``, the
same ones the trainer's device version uses. Gains of exactly 1 leave the image unchanged.
"""

from __future__ import annotations

import numpy as np

from ...shared.stream.hsv_tables import tables
from . import kernel


def apply_hsv_bgr(image: np.ndarray, gains: np.ndarray, *, to_rgb: bool = False) -> np.ndarray:
    """uint8 (h, w, 3) BGR -> a new jittered (h, w, 3) BGR (or RGB with ``to_rgb``) array."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be uint8 (h, w, 3), got {image.dtype} {image.shape}")
    rgb = np.ascontiguousarray(image[:, :, ::-1])
    if not np.all(np.asarray(gains) == 1.0):
        kernel.apply_hsv_rgb(rgb, tables(gains))
    return rgb if to_rgb else np.ascontiguousarray(rgb[:, :, ::-1])
