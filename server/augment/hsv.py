"""HSV jitter on the CPU: three lookup tables over OpenCV's 8-bit HSV.

Runs in the augmentation workers (when the trainer did not ask for it on the device).

Per sample the gains come from ``pixpool.shared.rng.hsv_gains`` (the sample's own HSV
stream, so the trainer's torch version draws the same ones) and the tables from
``pixpool.shared.hsv_tables`` (the same ones on both sides), then back to colour.
Gains of exactly 1 leave the image unchanged and skip the work.

How the tables are applied (the bytes are those of split / three 8-bit ``cv2.LUT`` /
merge, which ``tests/test_augment_straightforward.py`` checks): each HSV plane is looked
up two bytes at a time, as 16-bit values through a 65536-entry "pair" table whose entry
for the byte pair (a, b) is the byte pair (t[a], t[b]). ``cv2.LUT`` costs about the same
per element at 8 and 16 bits, so this halves the lookups; the three pair tables take
~0.03 ms each to build. (One 3-channel 8-bit LUT on the interleaved image, or a
3-channel 16-bit one, measured slower than split / pair LUTs / merge.) The work arrays
are this thread's scratch buffers (``scratch.py``).
"""

from __future__ import annotations

import cv2
import numpy as np

from ...shared.hsv_tables import tables
from . import scratch

PAIR_ENTRIES = 1 << 16


def pair_table(table: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """uint16 (65536,): the 8-bit ``table`` applied to both bytes of a 16-bit value.

    Entry ``i = hi * 256 + lo`` is ``table[hi] * 256 + table[lo]``: whichever byte of a
    16-bit value sits first in memory, its looked-up byte sits first in the result, so
    the table is right on either byte order.
    """
    if out is None:
        out = np.empty(PAIR_ENTRIES, dtype=np.uint16)
    t16 = table.astype(np.uint16)
    np.bitwise_or(np.left_shift(t16, 8)[:, None], t16[None, :], out=out.reshape(256, 256))
    return out


def pair_tables(tables_u8: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """uint16 (k, 65536): ``pair_table`` of each row of the uint8 (k, 256) ``tables_u8``, in one pass."""
    k = tables_u8.shape[0]
    if out is None:
        out = np.empty((k, PAIR_ENTRIES), dtype=np.uint16)
    t16 = tables_u8.astype(np.uint16)
    np.bitwise_or(np.left_shift(t16, 8)[:, :, None], t16[:, None, :], out=out.reshape(k, 256, 256))
    return out


def lut_pairs(plane: np.ndarray, table: np.ndarray, pairs: np.ndarray) -> None:
    """``plane`` (C-contiguous uint8) := ``table[plane]``, in place, two bytes per lookup.

    ``pairs`` is ``pair_table(table)``. An odd last byte is looked up on its own.
    """
    flat = plane.reshape(-1)
    even = flat.size & ~1
    if even:
        view = flat[:even].view(np.uint16)
        cv2.LUT(view, pairs, dst=view)
    if flat.size & 1:
        flat[-1] = table[flat[-1]]


def apply_hsv_bgr(image: np.ndarray, gains: np.ndarray, *, to_rgb: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """uint8 (h, w, 3) BGR, or (h, w, 4) B G R + padding -> jittered (h, w, 3) BGR (or RGB
    with ``to_rgb``).

    Written into ``out`` (uint8 C-contiguous (h, w, 3); may be ``image`` itself when that
    has 3 channels) when given, else into a new array; returns it.
    """
    height, width, channels = image.shape
    if channels not in (3, 4):
        raise ValueError(f"image must have 3 or 4 channels, got {image.shape}")
    if out is not None and (out.shape != (height, width, 3) or out.dtype != np.uint8 or not out.flags.c_contiguous):
        raise ValueError(f"out must be C-contiguous uint8 {(height, width, 3)}, got {out.dtype} {out.shape}")
    if np.all(gains == 1.0):
        if to_rgb:
            return cv2.cvtColor(image, cv2.COLOR_BGR2RGB if channels == 3 else cv2.COLOR_BGRA2RGB, dst=out)
        if channels == 4:
            return cv2.cvtColor(image, cv2.COLOR_BGRA2BGR, dst=out)
        if out is None:
            return image.copy()
        np.copyto(out, image)
        return out
    image = np.ascontiguousarray(image)
    hsv = scratch.buffer("hsv", (height, width, 3), np.uint8)
    planes = [scratch.buffer(f"hsv_plane{c}", (height, width), np.uint8) for c in range(3)]
    pairs = scratch.buffer("hsv_pairs", (3, PAIR_ENTRIES), np.uint16)
    cv2.cvtColor(image, cv2.COLOR_BGR2HSV, dst=hsv)  # reads B G R of 3 or 4 channels
    cv2.split(hsv, planes)
    hsv_tables = tables(gains)
    pair_tables(hsv_tables, out=pairs)
    for c in range(3):
        lut_pairs(planes[c], hsv_tables[c], pairs[c])
    cv2.merge(planes, dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB if to_rgb else cv2.COLOR_HSV2BGR, dst=out)
