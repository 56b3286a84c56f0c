"""Validation route: the record letterboxed onto an imgsz square with the fill, no randomness.

Runs wherever a validation sample is rendered, on a record already read (``record.py``); the kernel
renders it.
"""

from __future__ import annotations

from .kernel import IDENTITY, Layer
from .labels import Labels
from .mosaic import letterbox_tile
from .record import RecordView


def letterbox(record: RecordView, imgsz: int, *, rotated: bool = False) -> tuple[Layer, Labels]:
    """(the kernel layer: the record on the imgsz square through the identity map, labels in pixels).

    Through the identity the kernel's taps are the pixels themselves (weights 1 and 0),
    and adding the fill back is exact for 8-bit values, so the image equals the decoded
    pixels and the padding equals the fill.
    Degenerate boxes (zero width or height) are dropped; every other one is kept, since
    validation scores against all ground truth.
    """
    tiles, labels = letterbox_tile(record, imgsz, rotated=rotated)
    b = labels.boxes
    keep = ((b[:, 2] - b[:, 0]) > 0) & ((b[:, 3] - b[:, 1]) > 0)
    return Layer(IDENTITY, tiles, None), labels.select(keep)
