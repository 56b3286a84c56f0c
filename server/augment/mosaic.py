"""Mosaic of four records and the single-image letterbox placement, as canvas tiles; the square
validation route (``letterbox``: a record letterboxed onto the imgsz square, no randomness).

Runs wherever a sample is rendered. Only computes where each record's image goes on the
canvas and the matching labels, from records already read (``record.RecordView``); the kernel
writes the pixels (reading the images' read-only views, never writing them). OBB polygons are
clipped to the canvas keeping their direction (``Labels.clip(rotated=True)``).
"""

from __future__ import annotations

import numpy as np

from ...shared.stream.records import Targets
from .kernel import IDENTITY, Layer
from .labels import Labels
from .record import RecordView

Tile = tuple[np.ndarray, tuple[int, int, int, int], tuple[int, int]]


Placed = tuple[Targets, int, int, float, float]  # a record's targets, its (w, h) and offset on the canvas


def mosaic_placement(records: list[RecordView], imgsz: int, xc: int, yc: int) -> tuple[list[Tile], list[Placed]]:
    """Four records around the centre (xc, yc) of a 2·imgsz canvas: top-left, top-right,
    bottom-left, bottom-right; (their tiles, where their targets go on the canvas)."""
    canvas = 2 * imgsz  # the mosaic canvas side
    if len(records) == 4:
        return _four(records, canvas, xc, yc)
    tiles: list[Tile] = []
    placed: list[Placed] = []
    for k, record in enumerate(records):
        image = record.image
        h, w = image.shape[:2]
        if k == 0:
            xa0, ya0, xa1, ya1 = max(xc - w, 0), max(yc - h, 0), xc, yc
            xb0, yb0 = w - (xa1 - xa0), h - (ya1 - ya0)
        elif k == 1:
            xa0, ya0, xa1, ya1 = xc, max(yc - h, 0), min(xc + w, canvas), yc
            xb0, yb0 = 0, h - (ya1 - ya0)
        elif k == 2:
            xa0, ya0, xa1, ya1 = max(xc - w, 0), yc, xc, min(canvas, yc + h)
            xb0, yb0 = w - (xa1 - xa0), 0
        else:
            xa0, ya0, xa1, ya1 = xc, yc, min(xc + w, canvas), min(canvas, yc + h)
            xb0, yb0 = 0, 0
        tiles.append((image, (xa0, ya0, xa1, ya1), (xb0, yb0)))
        placed.append((record.targets, w, h, xa0 - xb0, ya0 - yb0))
    return tiles, placed


def _four(records: list[RecordView], canvas: int, xc: int, yc: int) -> tuple[list[Tile], list[Placed]]:
    """``mosaic_placement``'s loop written out for its four records (the hot path: one per sample)."""
    (i0, t0), (i1, t1), (i2, t2), (i3, t3) = records
    h0, w0 = i0.shape[:2]
    h1, w1 = i1.shape[:2]
    h2, w2 = i2.shape[:2]
    h3, w3 = i3.shape[:2]
    # top-left: (max(xc - w, 0), max(yc - h, 0)) .. (xc, yc), its image's bottom-right corner
    ax0, ay0 = (xc - w0 if xc > w0 else 0), (yc - h0 if yc > h0 else 0)
    bx0, by0 = w0 - (xc - ax0), h0 - (yc - ay0)
    # top-right: (xc, max(yc - h, 0)) .. (min(xc + w, canvas), yc), its image's bottom-left corner
    ay1, ax1 = (yc - h1 if yc > h1 else 0), (xc + w1 if xc + w1 < canvas else canvas)
    by1 = h1 - (yc - ay1)
    # bottom-left: (max(xc - w, 0), yc) .. (xc, min(canvas, yc + h)), its image's top-right corner
    ax2, ay2 = (xc - w2 if xc > w2 else 0), (yc + h2 if yc + h2 < canvas else canvas)
    bx2 = w2 - (xc - ax2)
    # bottom-right: (xc, yc) .. (min(xc + w, canvas), min(canvas, yc + h)), its image's top-left corner
    ax3, ay3 = (xc + w3 if xc + w3 < canvas else canvas), (yc + h3 if yc + h3 < canvas else canvas)
    tiles = [
        (i0, (ax0, ay0, xc, yc), (bx0, by0)),
        (i1, (xc, ay1, ax1, yc), (0, by1)),
        (i2, (ax2, yc, xc, ay2), (bx2, 0)),
        (i3, (xc, yc, ax3, ay3), (0, 0)),
    ]
    placed = [
        (t0, w0, h0, ax0 - bx0, ay0 - by0),
        (t1, w1, h1, xc, ay1 - by1),
        (t2, w2, h2, ax2 - bx2, yc),
        (t3, w3, h3, xc, yc),
    ]
    return tiles, placed


def letterbox_placement(record: RecordView, imgsz: int) -> tuple[list[Tile], list[Placed]]:
    """One record centred on an imgsz square canvas (long side already imgsz): (its tile, where its
    targets go)."""
    image = record.image
    h, w = image.shape[:2]
    top, left = (imgsz - h) // 2, (imgsz - w) // 2
    return [(image, (left, top, left + w, top + h), (0, 0))], [(record.targets, w, h, left, top)]


def placed_labels(placed: list[Placed], canvas: int, *, rotated: bool = False) -> Labels:
    """The placed records' labels in pixels of the ``canvas`` square, clipped to it (``rotated``: OBB)."""
    if len(placed) == 1:
        labels = Labels.from_targets(*placed[0])
    else:
        labels = Labels.from_placed(placed)
    return labels.clip(canvas, canvas, rotated=rotated)


def mosaic_tiles(
    records: list[RecordView], imgsz: int, xc: int, yc: int, *, rotated: bool = False
) -> tuple[list[Tile], Labels]:
    """``mosaic_placement`` with the labels shifted and clipped to the canvas (``rotated``: OBB)."""
    tiles, placed = mosaic_placement(records, imgsz, xc, yc)
    return tiles, placed_labels(placed, 2 * imgsz, rotated=rotated)


def letterbox_tile(record: RecordView, imgsz: int, *, rotated: bool = False) -> tuple[list[Tile], Labels]:
    """``letterbox_placement`` with the labels clipped to the canvas."""
    tiles, placed = letterbox_placement(record, imgsz)
    return tiles, placed_labels(placed, imgsz, rotated=rotated)


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
