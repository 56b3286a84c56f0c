"""Validation route: the record letterboxed onto an imgsz square with the fill, no randomness.

Runs wherever a validation sample is rendered. Reads the source view, returns a new array.
"""

from __future__ import annotations

import numpy as np

from ...shared.config import FILL_VALUE
from ...shared.source import ImageSource
from . import canvas as _canvas
from .labels import Labels
from .mosaic import letterbox_tile


def letterbox(source: ImageSource, index: int, imgsz: int) -> tuple[np.ndarray, Labels]:
    """(float32 imgsz x imgsz x 3 BGR with the fill restored, labels in pixels).

    Centring then adding the fill back is exact for 8-bit values (both steps are exact
    in float32), so the image equals the decoded pixels and the padding equals the fill.
    Degenerate boxes (zero width or height) are dropped; every other one is kept, since
    validation scores against all ground truth.
    """
    tiles, labels = letterbox_tile(source, index, imgsz)
    out = np.empty((imgsz, imgsz, 3), dtype=np.float32)
    _canvas.fill(out, (0, 0, imgsz, imgsz), tiles)
    out += np.float32(FILL_VALUE)
    b = labels.boxes
    keep = ((b[:, 2] - b[:, 0]) > 0) & ((b[:, 3] - b[:, 1]) > 0)
    return out, labels.select(keep)
