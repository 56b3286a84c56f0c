"""HSV jitter on the CPU: three lookup tables over OpenCV's 8-bit HSV.

Runs in the augmentation workers (when the trainer did not ask for it on the device).

Per sample the gains ``g = (gh, gs, gv)`` come from ``rng.hsv_gains`` (the sample's own
HSV stream, so the trainer's torch version draws the same ones). On OpenCV's 8-bit HSV
(hue 0..179, saturation and value 0..255):

    hue' = floor(hue * gh) mod 180
    sat' = floor(clip(sat * gs, 0, 255))
    val' = floor(clip(val * gv, 0, 255))

then back to colour. Gains of exactly 1 leave the image unchanged and skip the work.
"""

from __future__ import annotations

import cv2
import numpy as np

_LEVELS = np.arange(256, dtype=np.float64)


def luts(gains: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three uint8 (256,) tables for ``gains``."""
    hue = (np.floor(_LEVELS * gains[0]) % 180).astype(np.uint8)
    sat = np.floor(np.clip(_LEVELS * gains[1], 0, 255)).astype(np.uint8)
    val = np.floor(np.clip(_LEVELS * gains[2], 0, 255)).astype(np.uint8)
    return hue, sat, val


def apply_hsv_bgr(image: np.ndarray, gains: np.ndarray, *, to_rgb: bool = False) -> np.ndarray:
    """uint8 (h, w, 3) BGR -> jittered BGR (or RGB with ``to_rgb``), a new array.

    The three tables go through one 3-channel ``cv2.LUT`` (each channel its own table),
    in place on the HSV image: the same bytes as split / three LUTs / merge, with two
    fewer passes.
    """
    if np.all(gains == 1.0):
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if to_rgb else image.copy()
    table = np.stack(luts(gains), axis=1).reshape(256, 1, 3)
    hsv = cv2.cvtColor(image, cv2.COLOR_BGR2HSV)
    cv2.LUT(hsv, table, dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB if to_rgb else cv2.COLOR_HSV2BGR)
