"""Validation route: the record letterboxed onto an imgsz square with the fill, no randomness.

Runs wherever a validation sample is rendered. Reads the source view; the kernel renders it.
"""

from __future__ import annotations

from ...shared.stream.source import ImageSource
from .kernel import IDENTITY, Layer
from .labels import Labels
from .mosaic import letterbox_tile


def letterbox(source: ImageSource, index: int, imgsz: int) -> tuple[Layer, Labels]:
    """(the kernel layer: the record on the imgsz square through the identity map, labels in pixels).

    Through the identity the kernel's taps are the pixels themselves (weights 1 and 0),
    and adding the fill back is exact for 8-bit values, so the image equals the decoded
    pixels and the padding equals the fill.
    Degenerate boxes (zero width or height) are dropped; every other one is kept, since
    validation scores against all ground truth.
    """
    tiles, labels = letterbox_tile(source, index, imgsz)
    b = labels.boxes
    keep = ((b[:, 2] - b[:, 0]) > 0) & ((b[:, 3] - b[:, 1]) > 0)
    return Layer(IDENTITY, tiles, None), labels.select(keep)
