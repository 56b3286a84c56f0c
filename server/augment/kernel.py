"""The fused render kernel: the route's arithmetic, from source tiles to RGB CHW uint8, in one pass.

Runs wherever a sample is rendered (workers, reference pipeline, digest). Reads the
source's views (float32 centred or uint8 raw), writes only the caller's output arrays.
The C implementation is ``_kernel.c`` (built at install by ``setup.py``, flags pinned:
docs/kernel.md); ``tests/unit/test_augment_straightforward.py`` re-implements every step
below in plain numpy and must agree byte for byte.

**This docstring defines the route's bytes.** For an output pixel (x, y) of an S x S sample,
with F the fill the source was centred by (``FILL_VALUE``, 114: the caller passes the snapshot
header's, checked against it when the snapshot is attached; ``render(fill=...)``):

1. *Flips.* The pixel is the pre-flip pixel (x', y') with x' = S-1-x under ``fliplr``,
   y' = S-1-y under ``flipud`` (identity otherwise).
2. *Layers.* One layer, or two under mixup. A layer is (inverse matrix m, tiles, mask,
   pastes). With copy-paste the layer's mask (the union of the pasted polygons, rasterised by
   ``copy_paste.union_mask``) sends x' to S-1-x' where set (the mirrored image's pixel).
   Then each paste (mask, layer), in order: where its mask is set at (x', y'), the value s of
   step 5 is the pasted layer's own s at (x', y') (its steps 2-5, its own mask and pastes
   included). Copy-paste from a partner (``copy_paste_mode`` mixup) pastes the partner's
   layer under the union of its pasted polygons; cutmix pastes its partner's layer under a
   rectangle, into both layers under mixup (so there the value is (p + F) r + (p + F)(1 - r),
   the step-6 formula on the pasted value p).
3. *Map.* In float64, each operation rounded once in this order (x, y the integer column
   and row as doubles, m the row-major 3x3 inverse, canvas <- output)::

       u = (m0*x + (m1*y + m2)) / (m6*x + (m7*y + m8))
       v = (m3*x + (m4*y + m5)) / (m6*x + (m7*y + m8))

   An affine map has (m6, m7, m8) = (0, 0, 1) exactly (``inverse`` builds it so) and the
   division by 1 is skipped (exact). With m1 = m3 = 0 too (the default hyper-parameters:
   mosaic placement, scale and translation only) u depends on x alone and v on y alone,
   so the kernel caches them per column and per row; the values are the same.
   *Fixed point*: u and v are then rounded to the nearest 1/32, ties to even
   (u <- rint(32 u) / 32, exact in float64), so the weights below have 5 fractional bits per
   axis, as OpenCV's ``warpAffine`` (INTER_BITS = 5); every map, axis-aligned, general or
   perspective.
4. *Taps.* x0 = floor(u), y0 = floor(v); fx = float32(u - x0), fy = float32(v - y0) (the
   subtraction is exact); the tap value T(cx, cy) of canvas pixel (cx, cy) is the covering
   tile's pixel, as float32: a float32 source's value, or ``float32(p) - F`` for a
   uint8 pixel p (exact, so both give identical bytes), and 0 where no tile covers it
   (mosaic gaps, outside the canvas). Coordinates that no tap of any tile can reach give 0.
5. *Bilinear*, in float32, each operation rounded once in this order, per channel::

       top = T(x0, y0) * (1 - fx) + T(x0 + 1, y0) * fx
       bot = T(x0, y0 + 1) * (1 - fx) + T(x0 + 1, y0 + 1) * fx
       s   = top * (1 - fy) + bot * fy          (1 - f computed in float32)

   On the fixed-point grid (step 3) with integer taps (every uint8 source; a float32 source
   of whole values, as a snapshot is) every product and sum here is exact in float32, so s
   is the integer bilinear: with ax = 32 fx, ay = 32 fy and p the raw pixels (F where no
   tile covers a tap), s + F = (sum of p times (32 - ax | ax)(32 - ay | ay)) / 1024, the
   four weights summing to 1024, whatever the order of the operations. The kernel computes
   it in integers where it can (on 8-lane CPUs: an axis-aligned map's rows, uint8 tiles, one
   layer, nothing pasted, no float image asked for: int16 horizontal blends, 32-bit vertical
   ones, then step 7 on s' = 1024 (s + F), which is (s' + 511 + ((s' >> 10) & 1)) >> 10;
   and the general map's columns whose four taps lie in one uint8 tile, as s' / 1024 - F)
   and in float32 elsewhere: the same values.

6. *Fill and mixup.* f = s + F (one layer); with mixup and the float32 ratio r,
   f = (s1 + F) * r + (s2 + F) * (1 - r). f is the float image (``floats``).
7. *Quantise.* q = clip(rint(f), 0, 255), rint rounding half to even.
8. *HSV* (when tables are given), on the integer R, G, B of q, with the hue, saturation
   and value tables ``shared.stream.hsv_tables.tables(gains)`` (TH, TS, TV); all integers, ``//``
   floor division, ``rnd(a / b)`` = (2a + b) // (2b) (round half up; floor for a < 0 too)::

       V = max(R, G, B); D = V - min(R, G, B)
       S = rnd(255 D / V)                          (0 where V = 0)
       N = G - B (V == R), else B - R + 2D (V == G), else R - G + 4D
       H = rnd(30 N / D)                           (0 where D = 0)
       H += 180 if H < 0; H -= 180 if H >= 180     (OpenCV's hue units: 2 degrees, 0..179)
       H', S', V' = min(TH[H], 179), TS[S], TV[V]
       channel c = rnd(V' (7650 - S' W_c) / 7650)

   where W_c in 0..30 is, with K = (H' + 30 n_c) mod 180 and n = 5, 3, 1 for R, G, B,
   min(max(min(K, 120 - K), 0), 30): 0 for the hexcone sector's maximum channel, 30 for
   its minimum, H' mod 30 or 30 - that for the other one. This is the customary HSV
   hexcone in exact integers; it lies within a level or two of OpenCV's 8-bit conversion
   and of the trainer's device version (``client/hsv_torch.py``). The C kernel evaluates
   each rnd in float32 lanes (the quotients are correctly rounded and never within
   float32 error of a half; ``tests/unit/test_augment_straightforward.py`` checks every
   input exhaustively), 4 lanes (SSE2) or 8 (AVX2, picked at import, as for the other row loops): the same bytes. The
   last step is the truncated product of t = 2 V'(7650 - S'W) + 7650 with the rounded
   float32 reciprocal of 15300, which is t // 15300 for all 256 x 256 x 31 (V', S', W)
   (checked in that test). Tables that are a hue shift and two clipped gains (what
   ``tables`` builds) are evaluated without lookups: H' = (H + c) mod 180 joins each
   channel's 30 n, and S' = trunc(min(S g, 255)) in float32 with a gain g the kernel
   derives from the table; it checks all 180 + 2 x 256 entries per call and looks the
   tables up where any differs, so either way the values are the tables'.
9. *Write* R, G, B into planes 0, 1, 2 of the output at (x, y).

Nothing else is rounded, and no intermediate image exists: the C kernel keeps a strip of
16 float rows per layer in cache (the general map fills it in 64-column blocks, which
keeps a rotated read in cache; the axis-aligned map keeps the step-5 ``top``/``bot`` blend
of each canvas row, a function of that row and the column alone, for the output rows that
share it; the values do not depend on the order or on what is kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...shared.stream.config import FILL_VALUE
from . import _kernel


@dataclass
class Layer:
    """One resampled image of a sample: ``inverse`` (9 floats, canvas <- output), the
    tiles (image, (xa0, ya0, xa1, ya1) on the canvas, (xb0, yb0) in the image), the
    copy-paste mask (uint8 S x S, or None) and the pastes: (uint8 S x S mask, Layer) pairs,
    at most 4, each replacing this layer's values where its mask is set (step 2)."""

    inverse: tuple[float, ...]
    tiles: list
    mask: np.ndarray | None = None
    pastes: list = field(default_factory=list)

    def packed(self) -> tuple:
        tiles = tuple(
            (image, xa0 - xb0, ya0 - yb0, xa0, ya0, xa1, ya1) for image, (xa0, ya0, xa1, ya1), (xb0, yb0) in self.tiles
        )
        if not self.pastes:
            return (self.inverse, tiles, self.mask)
        return (self.inverse, tiles, self.mask, tuple((mask, layer.packed()) for mask, layer in self.pastes))


def inverse(matrix: np.ndarray | tuple[float, ...]) -> tuple[float, ...]:
    """The inverse of the 3x3 ``matrix`` (output <- canvas; or its nine row-major entries as a
    tuple of Python floats) as 9 Python floats, computed in IEEE double by explicit formulas (no
    LAPACK, so the same on every machine).

    An affine matrix (last row 0 0 1) gets the affine inverse with (0, 0, 1) exactly.
    """
    if isinstance(matrix, tuple):
        a, b, c, d, e, f, g, h, i = matrix
    else:
        a, b, c, d, e, f, g, h, i = np.asarray(matrix, dtype=np.float64).reshape(9).tolist()
    if g == 0.0 and h == 0.0 and i == 1.0:
        det = a * e - b * d
        ia, ib, id_, ie = e / det, -b / det, -d / det, a / det
        return (ia, ib, -(ia * c + ib * f), id_, ie, -(id_ * c + ie * f), 0.0, 0.0, 1.0)
    co = (
        e * i - f * h,
        -(d * i - f * g),
        d * h - e * g,
        -(b * i - c * h),
        a * i - c * g,
        -(a * h - b * g),
        b * f - c * e,
        -(a * f - c * d),
        a * e - b * d,
    )
    det = a * co[0] + b * co[1] + c * co[2]
    adj = (co[0], co[3], co[6], co[1], co[4], co[7], co[2], co[5], co[8])
    return tuple(v / det for v in adj)


IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)


def render(
    imgsz: int,
    layers: list[Layer],
    *,
    flip_ud: bool = False,
    flip_lr: bool = False,
    ratio: float = 0.0,
    tables: np.ndarray | bytes | None = None,
    out: np.ndarray | None = None,
    floats: np.ndarray | None = None,
    fill: float = FILL_VALUE,
) -> None:
    """Run the kernel: write the uint8 (3, S, S) RGB ``out`` and/or the float32 (S, S, 3)
    B G R float image ``floats`` (step 6) of the sample made of ``layers``, whose source was
    centred by ``fill`` (F above). ``tables``: uint8 (3, 256), or those bytes."""
    if tables is not None and not isinstance(tables, bytes):
        tables = np.ascontiguousarray(tables, dtype=np.uint8).tobytes()
    _kernel.render(
        int(imgsz),
        out,
        floats,
        tuple(layer.packed() for layer in layers),
        bool(flip_ud),
        bool(flip_lr),
        float(ratio),
        tables,
        float(fill),
    )


def apply_hsv_rgb(image: np.ndarray, tables: np.ndarray) -> np.ndarray:
    """Step 8 alone, in place on a C-contiguous uint8 (..., 3) RGB ``image``; returns it."""
    _kernel.hsv(image, np.ascontiguousarray(tables, dtype=np.uint8).tobytes())
    return image
