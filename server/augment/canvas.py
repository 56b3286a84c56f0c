"""The zero-filled canvas the affine resample reads: built only where the resample reads.

Runs in whichever process renders a sample; each thread keeps one scratch buffer per
canvas shape (never shared with the source, never returned to callers).

Why only part of it: the resample of an imgsz x imgsz output reads a parallelogram of
the canvas (the inverse image of the output square), often a quarter of a 2·imgsz mosaic
canvas. The value of every canvas pixel the resample reads is the same as on a canvas
built in full (zero where no tile lies, the tile's value where one does), and the matrix
is unchanged, so the output bytes are identical: pixels outside that region are left as
whatever an earlier sample wrote and are never read. (Shifting the matrix onto a smaller
array instead is *not* byte-identical: OpenCV >= 4.11 computes source coordinates in
float32, so a translated matrix rounds its weights differently.)

Four channels: the scratch canvas is float32 (h, w, 4), B G R and a padding channel.
OpenCV's float32 bilinear resample interpolates each channel on its own with the same
weights, and its 4-channel affine kernel is much faster than the 3-channel one
(~2.4 ms against ~3.8 ms per 640 x 640 output here): channels 0..2 of a 4-channel
resample are byte for byte the 3-channel resample (``tests/test_augment.py`` and the
straightforward-route test, which warps a 3-channel canvas, check it). Tiles go in with
``cv2.cvtColor(BGR2BGRA)`` (padding 1.0), uncovered bands are zeroed in all four
channels, so the padding is always finite where the resample reads; the route carries
the padded image to its 8-bit form, where the colour conversion or the final split
drops the padding (``batch.py``).

A uint8 source (a ``--dtype uint8`` snapshot) is converted where it is read, tile by tile:
``float32(pixel) - fill`` is exact, so the canvas holds the very values a float32 snapshot
gives and every later step, hence every batch byte, is the same.
"""

from __future__ import annotations

import math
import threading

import cv2
import numpy as np

from ...shared.config import FILL_VALUE

# Bilinear reads floor(x) and floor(x) + 1; OpenCV's float32 coordinates can differ from
# the float64 bounds computed here by far less than a pixel. Two pixels of margin cover both.
_MARGIN_PX = 2

_local = threading.local()
CHANNELS = 4  # B, G, R, padding
_FILL = np.float32(FILL_VALUE)


def scratch(height: int, width: int) -> np.ndarray:
    """This thread's reusable float32 (height, width, CHANNELS) buffer; contents unspecified."""
    cache = getattr(_local, "buffers", None)
    if cache is None:
        cache = _local.buffers = {}
    buf = cache.get((height, width))
    if buf is None:
        if len(cache) > 4:  # sizes vary only with imgsz; keep the footprint bounded
            cache.clear()
        buf = cache[(height, width)] = np.empty((height, width, CHANNELS), dtype=np.float32)
    return buf


def _centred_scratch(shape: tuple[int, ...]) -> np.ndarray:
    """This thread's reusable float32 buffer, as an array of ``shape`` (a uint8 tile's
    centred copy on its way into the 4-channel canvas; contents unspecified)."""
    n = math.prod(shape)
    flat = getattr(_local, "centred", None)
    if flat is None or flat.size < n:
        flat = _local.centred = np.empty(n, dtype=np.float32)
    return flat[:n].reshape(shape)


def read_region(inverse: np.ndarray, out_size: int, height: int, width: int, *, perspective: bool) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1): the part of a height x width canvas the resample can read.

    ``inverse`` maps output pixel coordinates to canvas coordinates (3x3). For an affine
    map the read set is the parallelogram spanned by the output's corners; under a
    perspective map straight lines stay straight, so the corners still bound it as long
    as the map does not cross its horizon (it cannot, with |perspective| <= 0.001 and
    the output inside the canvas); the whole canvas is used otherwise. Empty: x0 >= x1.
    """
    last = out_size - 1
    pts = np.array([[0, 0, 1], [last, 0, 1], [0, last, 1], [last, last, 1]], dtype=np.float64) @ inverse.T
    if perspective:
        if np.any(pts[:, 2] <= 0):
            return 0, 0, width, height
        pts = pts[:, :2] / pts[:, 2:]
    xs, ys = pts[:, 0], pts[:, 1]
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        return 0, 0, width, height
    x0 = max(0, math.floor(xs.min()) - _MARGIN_PX)
    y0 = max(0, math.floor(ys.min()) - _MARGIN_PX)
    x1 = min(width, math.ceil(xs.max()) + _MARGIN_PX + 1)
    y1 = min(height, math.ceil(ys.max()) + _MARGIN_PX + 1)
    return x0, y0, max(x0, x1), max(y0, y1)


def fill(canvas: np.ndarray, region: tuple[int, int, int, int], tiles: list[tuple[np.ndarray, tuple[int, int, int, int], tuple[int, int]]]) -> None:
    """Inside ``region`` of ``canvas``: zero, then each tile's pixels.

    ``tiles``: (image, (x1a, y1a, x2a, y2a) its rectangle on the canvas, (x1b, y1b) the
    matching top-left pixel of the image: float32 centred, or uint8 pixels, which are
    centred here). Tiles must not overlap (mosaic's never do).
    Only the uncovered bands are zeroed, so each canvas pixel in the region is written once.
    ``canvas`` has 3 channels (B, G, R) or 4 (B, G, R, padding; the tiles' padding is 1.0).
    """
    rx0, ry0, rx1, ry1 = region
    if rx0 >= rx1 or ry0 >= ry1:
        return
    clipped = []
    for image, (xa0, ya0, xa1, ya1), (xb0, yb0) in tiles:
        cx0, cy0, cx1, cy1 = max(xa0, rx0), max(ya0, ry0), min(xa1, rx1), min(ya1, ry1)
        if cx0 < cx1 and cy0 < cy1:
            clipped.append((image, (cx0, cy0, cx1, cy1), (xb0 + cx0 - xa0, yb0 + cy0 - ya0)))
    _zero_uncovered(canvas, region, [r for _, r, _ in clipped])
    for image, (cx0, cy0, cx1, cy1), (sx, sy) in clipped:
        src = image[sy : sy + cy1 - cy0, sx : sx + cx1 - cx0]
        dst = canvas[cy0:cy1, cx0:cx1]
        if src.dtype == np.uint8:
            # A uint8 snapshot holds the pixel itself: the route works on pixel - fill, which
            # float32 holds exactly, so this is the float32 snapshot's value to the bit.
            if canvas.shape[2] == 3:
                np.subtract(src, _FILL, out=dst, dtype=np.float32)
                continue
            src = np.subtract(src, _FILL, out=_centred_scratch(src.shape), dtype=np.float32)
        if canvas.shape[2] == 3:
            dst[...] = src
        elif cv2.cvtColor(src, cv2.COLOR_BGR2BGRA, dst=dst) is not dst:
            # OpenCV wrote a new array instead of the view (it never has for a
            # row-strided float32 view, but the bytes must not depend on it).
            dst[..., :3] = src
            dst[..., 3] = 1.0


def _zero_uncovered(canvas: np.ndarray, region: tuple[int, int, int, int], rects: list[tuple[int, int, int, int]]) -> None:
    """Zero the part of ``region`` no rectangle in ``rects`` covers (row bands x column runs)."""
    rx0, ry0, rx1, ry1 = region
    cuts = sorted({ry0, ry1, *[r[1] for r in rects], *[r[3] for r in rects]})
    cuts = [c for c in cuts if ry0 <= c <= ry1]
    for top, bottom in zip(cuts, cuts[1:]):
        if top >= bottom:
            continue
        spans = sorted((r[0], r[2]) for r in rects if r[1] <= top and r[3] >= bottom)
        x = rx0
        for a, b in spans:
            if a > x:
                canvas[top:bottom, x:a] = 0
            x = max(x, b)
        if x < rx1:
            canvas[top:bottom, x:rx1] = 0
