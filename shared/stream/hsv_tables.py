"""The HSV jitter's lookup tables: numpy only, so both sides build the very same ones.

Code both sides import: the augmentation workers apply the tables on the CPU
(``pixpool.server.augment.hsv``), a trainer with ``hsv_on_device`` applies them on its
device (``pixpool.client.hsv_torch``). The gains of a sample come from
``pixpool.shared.stream.rng.hsv_gains_for`` (a range's at once).

On OpenCV's 8-bit HSV (hue 0..179, saturation and value 0..255), for gains
``g = (gh, gs, gv)``::

    hue' = floor((hue + (gh - 1) * 180) mod 180)
    sat' = floor(clip(sat * gs, 0, 255))
    val' = floor(clip(val * gv, 0, 255))

The hue is shifted, not scaled: a draw moves every hue by the same number of levels, as
Ultralytics' loader does since 8.3.79 (before, it scaled the hue, which left reds nearly
unmoved; ``bench/vs_ultralytics.py --what fidelity`` measured that difference). The sum and the modulo run in
float64 on exact levels, then the floor, so the tables are the same on every machine.
"""

from __future__ import annotations

import numpy as np

_LEVELS = np.arange(256, dtype=np.float64)


def tables(gains: np.ndarray) -> np.ndarray:
    """uint8 (3, 256): the hue, saturation and value tables for ``gains`` (one pass each)."""
    gains = np.asarray(gains, dtype=np.float64)[:3]
    out = np.empty((3, 256), dtype=np.uint8)
    out[0] = np.floor(np.mod(_LEVELS + (gains[0] - 1.0) * 180.0, 180.0))
    out[1:] = np.floor(np.clip(_LEVELS[None, :] * gains[1:, None], 0, 255))
    return out


def tables_for(gains: np.ndarray) -> np.ndarray:
    """uint8 (n, 3, 256): ``tables`` of each row of float64 (n, 3) ``gains``, in one pass per
    channel for all rows, with the very same per-element arithmetic."""
    gains = np.asarray(gains, dtype=np.float64).reshape(-1, 3)
    out = np.empty((len(gains), 3, 256), dtype=np.uint8)
    out[:, 0] = np.floor(_mod180(_LEVELS[None, :] + ((gains[:, 0] - 1.0) * 180.0)[:, None]))
    out[:, 1:] = np.floor((_LEVELS[None, None, :] * gains[:, 1:, None]).clip(0, 255))  # ``np.clip``'s call
    return out


def _mod180(x: np.ndarray) -> np.ndarray:
    """``np.mod(x, 180.0)`` on float64 (n, 256) rows of ascending levels, up to the sign of a zero
    (which the floor and the uint8 cast drop). Where every value lies in [-180, 360) that mod is
    x + 180 below 0 (numpy adds the divisor to the negative remainder, a rounded addition) and
    x - 180 from 180 (exact there), which costs a fraction of numpy's remainder."""
    if not len(x) or min(x[:, 0].tolist()) < -180.0 or max(x[:, -1].tolist()) >= 360.0:
        return np.mod(x, 180.0)
    return x + ((x < 0.0) * 180.0 - (x >= 180.0) * 180.0)


def luts(gains: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three uint8 (256,) tables for ``gains``."""
    hue, sat, val = tables(gains)
    return hue, sat, val
