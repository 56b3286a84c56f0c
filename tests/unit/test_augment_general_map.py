"""The kernel's general map (rotation, shear, perspective) against a numpy twin, pixel for pixel.

The kernel decides whole row segments from their two ends (one tile, or nothing) and
classifies the other columns one by one; these tests aim maps at exactly what that has to
get right: tile edges crossing a segment, mosaic gaps, the image's last pixel (where the
vector reads would leave the buffer), maps that leave the canvas, near-singular and
perspective maps whose w falls to 0. The twin builds the full zero canvas and applies the
definition of ``kernel.py`` steps 3 to 5 in float64 / float32 numpy (coordinates on the 1/32
grid); nothing is shared with the kernel but the inverse (explicit double formulas, also in
the route's own test).
"""

from __future__ import annotations

import numpy as np
import pytest

from pixpool.server.augment import kernel

FILL = np.float32(114.0)


def _twin(tiles, canvas_hw: tuple[int, int], inv: tuple[float, ...], size: int) -> np.ndarray:
    """Steps 3-5 over a full zero canvas: float32 (size, size, 3) centred values."""
    h, w = canvas_hw
    canvas = np.zeros((h + 4, w + 4, 3), np.float32)  # 2 px of zero border each side
    for image, (xa0, ya0, xa1, ya1), (xb0, yb0) in tiles:
        part = image[yb0 : yb0 + ya1 - ya0, xb0 : xb0 + xa1 - xa0].astype(np.float32)
        canvas[2 + ya0 : 2 + ya1, 2 + xa0 : 2 + xa1] = part - (FILL if image.dtype == np.uint8 else 0)
    m = np.array(inv, np.float64).reshape(3, 3)
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if m[2, 0] == 0.0 and m[2, 1] == 0.0 and m[2, 2] == 1.0:
            u = m[0, 0] * xs + (m[0, 1] * ys + m[0, 2])
            v = m[1, 0] * xs + (m[1, 1] * ys + m[1, 2])
        else:
            wv = m[2, 0] * xs + (m[2, 1] * ys + m[2, 2])
            u = (m[0, 0] * xs + (m[0, 1] * ys + m[0, 2])) / wv
            v = (m[1, 0] * xs + (m[1, 1] * ys + m[1, 2])) / wv
        u, v = np.rint(u * 32) / 32, np.rint(v * 32) / 32  # step 3's 1/32 grid, ties to even
        ok = np.isfinite(u) & np.isfinite(v) & (u > -1e9) & (u < 1e9) & (v > -1e9) & (v < 1e9)
        u, v = np.where(ok, u, -10.0), np.where(ok, v, -10.0)
        x0, y0 = np.floor(u), np.floor(v)
    fx, fy = (u - x0).astype(np.float32)[..., None], (v - y0).astype(np.float32)[..., None]
    far = (x0 < -1) | (x0 > w) | (y0 < -1) | (y0 > h)
    xi = np.clip(x0, -2, w + 1).astype(np.int64) + 2
    yi = np.clip(y0, -2, h + 1).astype(np.int64) + 2
    xj, yj = np.minimum(xi + 1, w + 3), np.minimum(yi + 1, h + 3)
    one = np.float32(1.0)
    top = canvas[yi, xi] * (one - fx) + canvas[yi, xj] * fx
    bot = canvas[yj, xi] * (one - fx) + canvas[yj, xj] * fx
    out = top * (one - fy) + bot * fy
    out[far] = 0.0
    return out


def _mosaic(rng: np.random.Generator, size: int, dtype: str):
    """Four tiles around a centre (xc, yc) on a 2 size canvas, images of odd shapes, gaps between them."""
    xc, yc = (int(v) for v in rng.integers(size // 2, 3 * size // 2, 2))
    tiles = []
    for k in range(4):
        ih, iw = (int(v) for v in rng.integers(size // 3, size + 7, 2))
        image = rng.integers(0, 256, (ih, iw, 3)).astype(np.uint8)
        if dtype == "float32":
            image = image.astype(np.float32) - FILL
        image.flags.writeable = False
        if k == 0:
            xa0, ya0, xa1, ya1 = max(xc - iw, 0), max(yc - ih, 0), xc, yc
            xb0, yb0 = iw - (xa1 - xa0), ih - (ya1 - ya0)
        elif k == 1:
            xa0, ya0, xa1, ya1 = xc, max(yc - ih, 0), min(xc + iw, 2 * size), yc
            xb0, yb0 = 0, ih - (ya1 - ya0)
        elif k == 2:
            xa0, ya0, xa1, ya1 = max(xc - iw, 0), yc, xc, min(2 * size, yc + ih)
            xb0, yb0 = iw - (xa1 - xa0), 0
        else:
            xa0, ya0, xa1, ya1 = xc, yc, min(xc + iw, 2 * size), min(2 * size, yc + ih)
            xb0, yb0 = 0, 0
        tiles.append((image, (xa0, ya0, xa1, ya1), (xb0, yb0)))
    return tiles, (2 * size, 2 * size)


def _matrix(rng: np.random.Generator, size: int, *, degrees: float, shear: float, perspective: float, scale: float):
    """output <- canvas, as the route composes it: centre, perspective, rotation + scale, shear, translation."""
    c = np.eye(3)
    c[0, 2], c[1, 2] = -size, -size  # the 2 size canvas's centre to the origin
    p = np.eye(3)
    p[2, 0], p[2, 1] = rng.uniform(-perspective, perspective, 2)
    a = np.deg2rad(rng.uniform(-degrees, degrees))
    s = rng.uniform(1 - scale, 1 + scale)
    r = np.array([[np.cos(a) * s, np.sin(a) * s, 0], [-np.sin(a) * s, np.cos(a) * s, 0], [0, 0, 1]])
    sh = np.eye(3)
    sh[0, 1], sh[1, 0] = np.tan(np.deg2rad(rng.uniform(-shear, shear, 2)))
    t = np.eye(3)
    t[0, 2], t[1, 2] = rng.uniform(0.3, 0.7, 2) * size
    return t @ sh @ r @ p @ c


def _kernel_floats(size: int, tiles, inv) -> np.ndarray:
    """The kernel's float image f = s + 114 (step 6) of one layer."""
    floats = np.empty((size, size, 3), np.float32)
    kernel.render(size, [kernel.Layer(inv, tiles)], floats=floats)
    return floats


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
@pytest.mark.parametrize(
    "settings",
    [
        {"degrees": 10.0, "shear": 2.0, "perspective": 0.0, "scale": 0.5},
        {"degrees": 10.0, "shear": 2.0, "perspective": 0.0005, "scale": 0.5},
        {"degrees": 180.0, "shear": 20.0, "perspective": 0.002, "scale": 0.9},
        {"degrees": 0.5, "shear": 0.0, "perspective": 0.0, "scale": 0.05},
    ],
    ids=["rotate_shear", "rotate_shear_perspective", "wild", "nearly_axis"],
)
def test_general_map_over_mosaic_tiles_equals_the_numpy_twin(settings: dict, dtype: str) -> None:
    rng = np.random.default_rng(19)
    for size in (96, 130):  # a size not a multiple of the 64-column segments
        for _ in range(6):
            tiles, hw = _mosaic(rng, size, dtype)
            inv = kernel.inverse(_matrix(rng, size, **settings))
            got = _kernel_floats(size, tiles, inv)
            want = _twin(tiles, hw, inv, size) + FILL
            bad = np.argwhere((got != want).any(axis=-1))
            assert got.tobytes() == want.tobytes(), (
                f"size {size}: {len(bad)} pixels differ, first (y, x) {bad[:3].tolist()}"
            )


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_maps_onto_the_last_pixel_and_off_the_canvas_equal_the_numpy_twin(dtype: str) -> None:
    """One tile filling its image: maps that read the image's last row and column (where the
    kernel's vector reads would pass the buffer's end), that leave the canvas on every side,
    and perspective maps whose w reaches 0 inside the output."""
    size = 80
    image = np.random.default_rng(3).integers(0, 256, (size, size, 3)).astype(np.uint8)
    if dtype == "float32":
        image = image.astype(np.float32) - FILL
    tiles = [(image, (0, 0, size, size), (0, 0))]
    maps = []
    for a in (0.2, 3.0, 45.0, 91.0, -30.0):
        ca, sa = np.cos(np.deg2rad(a)), np.sin(np.deg2rad(a))
        for tx, ty in (
            (0.0, 0.0),
            (size - 2.0, size - 2.0),
            (size - 1.0, 0.5),
            (-size / 2, size / 3),
            (1.5 * size, -0.5),
        ):
            maps.append(np.array([[ca, -sa, tx], [sa, ca, ty], [0, 0, 1]]))  # canvas <- output, as the inverse is
    maps.append(np.array([[1.0, 0.01, 0.0], [0.02, 1.0, 0.0], [0.0125, 0.0, -0.5]]))  # w = 0 at x = 40
    maps.append(np.array([[0.7, 0.2, 5.0], [-0.1, 0.9, 3.0], [0.0004, -0.0003, 1.0]]))
    for inv_matrix in maps:
        inv = tuple(float(v) for v in inv_matrix.reshape(9))
        got = _kernel_floats(size, tiles, inv)
        want = _twin(tiles, (size, size), inv, size) + FILL
        assert got.tobytes() == want.tobytes(), f"map {inv}: {int((got != want).any(axis=-1).sum())} pixels differ"


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_rows_cut_into_spans_equal_the_numpy_twin(dtype: str) -> None:
    """An affine row is cut once into spans (one tile, zeros, the columns between) from the
    exact map: maps along which u or v is constant (quarter turns: m0 or m3 exactly 0), mirrored
    maps (u decreasing along the row), and tile edges that fall at every column offset of the
    64-column blocks, including the segment's first and last columns."""
    rng = np.random.default_rng(1919)
    for size in (70, 131):
        for _ in range(3):
            tiles, hw = _mosaic(rng, size, dtype)
            xc, yc = tiles[0][1][2], tiles[0][1][3]  # the mosaic's centre
            for m in (
                [0.0, 1.0, xc - 40.5, 1.0, 0.0, yc - 33.25],  # a quarter turn: u constant along a row
                [0.0, -1.0, xc + 40.0, -1.0, 0.0, yc + 20.0],
                [-1.0, 0.0, xc + size / 2, 0.0, 1.0, yc - size / 2],  # mirrored: u decreasing
                [-0.93, 0.21, xc + 50.3, -0.17, -1.02, yc + 45.7],
                [1.0, 0.001, xc - 63.0, 0.0, 1.0, yc - 9.0],  # the centre line near column 63, then 4 and 8 on
            ):
                for shift in range(0, 9, 4):
                    inv = (m[0], m[1], m[2] + shift, m[3], m[4], m[5] + shift / 3, 0.0, 0.0, 1.0)
                    got = _kernel_floats(size, tiles, inv)
                    want = _twin(tiles, hw, inv, size) + FILL
                    bad = np.argwhere((got != want).any(axis=-1))
                    assert got.tobytes() == want.tobytes(), (
                        f"size {size}, map {inv}: {len(bad)} pixels differ, first (y, x) {bad[:3].tolist()}"
                    )
