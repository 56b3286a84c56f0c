"""The whole route against a plain numpy implementation of the kernel's arithmetic.

The numpy version follows ``pixpool.server.augment.kernel``'s definition step by step and
the straightforward way: it builds the full zero canvas with the tiles, maps every output
pixel in float64 and rounds it to the 1/32 grid, gathers the four taps from the (zero-padded)
canvas, blends them in integers (5-bit weights per axis), pastes copy-paste instance by instance from the mirrored image, mixes, flips with
numpy, quantises with ``np.rint`` and does the integer HSV with numpy arrays and tables of
its own. It shares only the draws and the label geometry with the route. Equal bytes on
every configuration prove the kernel's row caching, run splitting, per-tap tile lookup,
in-pass copy-paste, mixup, flips and HSV, and its uint8 taps, change nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.sources import ArraySource
from pixpool.server.augment import affine, render_batch
from pixpool.server.augment import copy_paste as cp_mod
from pixpool.server.augment.labels import Labels, pack, transform_labels
from pixpool.server.augment.mosaic import letterbox_tile, mosaic_tiles
from pixpool.server.augment.record import Reader
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.hsv_tables import tables
from pixpool.shared.stream.rng import hsv_gains, sample_generator
from pixpool.shared.stream.sampler import num_batches

S = 64
FILL = np.float32(114.0)


class RawSource(ArraySource):
    """The same records as raw read-only uint8 pixels (centred + 114), as a uint8 snapshot holds them."""

    def image(self, index: int) -> np.ndarray:
        view = self.uint8[index].view()
        view.flags.writeable = False
        return view


def _inverse(matrix: np.ndarray) -> np.ndarray:
    """The 3x3 inverse by the same explicit double formulas the kernel documents."""
    from pixpool.server.augment.kernel import inverse

    return np.array(inverse(matrix), dtype=np.float64).reshape(3, 3)


def _resample(tiles, hw: tuple[int, int], matrix: np.ndarray) -> np.ndarray:
    """Kernel steps 3-5: float32 (S, S, 3) centred image, from a full zero canvas."""
    canvas = np.zeros((hw[0] + 4, hw[1] + 4, 3), np.float32)  # 2 px of zero border each side
    for image, (xa0, ya0, xa1, ya1), (xb0, yb0) in tiles:
        canvas[2 + ya0 : 2 + ya1, 2 + xa0 : 2 + xa1] = image[yb0 : yb0 + ya1 - ya0, xb0 : xb0 + xa1 - xa0].astype(
            np.float32
        ) - (FILL if image.dtype == np.uint8 else 0)
    m = _inverse(matrix)
    ys, xs = np.mgrid[0:S, 0:S].astype(np.float64)
    w = m[2, 0] * xs + (m[2, 1] * ys + m[2, 2])
    u = (m[0, 0] * xs + (m[0, 1] * ys + m[0, 2])) / w
    v = (m[1, 0] * xs + (m[1, 1] * ys + m[1, 2])) / w
    return _resample_fixed(canvas, hw, u, v)


def _resample_fixed(canvas: np.ndarray, hw: tuple[int, int], u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Steps 3-5 after the map, in integers: coordinates in 1/32 (rounded to nearest, ties
    to even), 5-bit weights per axis whose products sum to 1024, the exact sum of the four
    weighted taps; the value is that sum / 1024 (exact in float32)."""
    taps = canvas.astype(np.int64)
    assert np.array_equal(taps, canvas), "the sources here hold integer pixels"
    # Far-off coordinates are zeros anyway; the clip only keeps the integers small.
    cu = np.rint(np.clip(u, -8, hw[1] + 8) * 32).astype(np.int64)
    cv = np.rint(np.clip(v, -8, hw[0] + 8) * 32).astype(np.int64)
    x0, ax = cu >> 5, (cu & 31)[..., None]
    y0, ay = cv >> 5, (cv & 31)[..., None]
    xi, yi = np.clip(x0, -2, hw[1] + 1) + 2, np.clip(y0, -2, hw[0] + 1) + 2
    far = (x0 < -1) | (x0 > hw[1]) | (y0 < -1) | (y0 > hw[0])
    xj, yj = np.minimum(xi + 1, hw[1] + 3), np.minimum(yi + 1, hw[0] + 3)
    total = (
        taps[yi, xi] * ((32 - ax) * (32 - ay))
        + taps[yi, xj] * (ax * (32 - ay))
        + taps[yj, xi] * ((32 - ax) * ay)
        + taps[yj, xj] * (ax * ay)
    )
    out = (total / 1024).astype(np.float32)
    out[far] = 0.0
    return out


def _hsv(u8_bgr: np.ndarray, gains: np.ndarray | None, tabs: np.ndarray | None = None) -> np.ndarray:
    """Kernel step 8 on a uint8 (S, S, 3) BGR image, returning RGB: the tables of ``gains``,
    or the uint8 (3, 256) ``tabs`` as given."""
    rgb = u8_bgr[:, :, ::-1].astype(np.int64)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    v = rgb.max(axis=-1)
    d = v - rgb.min(axis=-1)
    s = (510 * d + v) // np.maximum(2 * v, 1)  # floor(255 D / V + 1/2), 0 where V = 0
    n = np.where(v == r, g - b, np.where(v == g, b - r + 2 * d, r - g + 4 * d))
    h = (60 * n + d) // np.maximum(2 * d, 1)  # floor(30 N / D + 1/2), floor division (N < 0 too)
    h = np.where(h < 0, h + 180, h)
    h = np.where(h >= 180, h - 180, h)
    th, ts, tv = (tables(gains) if tabs is None else tabs).astype(np.int64)
    h2, s2, v2 = np.minimum(th[h], 179), ts[s], tv[v]
    k, f = h2 // 30, h2 % 30
    weights = {  # (R, G, B) weights per sector
        0: (0, 30 - f, 30),
        1: (f, 0, 30),
        2: (30, 0, 30 - f),
        3: (30, f, 0),
        4: (30 - f, 30, 0),
        5: (0, 30, f),
    }
    out = np.empty_like(rgb)
    for c in range(3):
        wc = np.select([k == j for j in range(6)], [np.broadcast_to(weights[j][c], k.shape) for j in range(6)])
        out[..., c] = (v2 * (7650 - s2 * wc) + 3825) // 7650
    return out.astype(np.uint8)


def _pre(source, index: int, cfg: AugmentConfig, closed: bool, rng) -> tuple[np.ndarray, Labels]:
    if not closed and cfg.mosaic > 0 and rng.random() < cfg.mosaic:
        partners, xc, yc = affine.draw_mosaic(rng, len(source), S)
        reader = Reader.of(source)
        records = [reader.read(i) for i in (index, *partners.tolist())]
        tiles, labels = mosaic_tiles(records, S, xc, yc, rotated=reader.spec.rotated)
        hw = (2 * S, 2 * S)
    else:
        reader = Reader.of(source)
        tiles, labels = letterbox_tile(reader.read(index), S, rotated=reader.spec.rotated)
        hw = (S, S)
    matrix, scale = affine.draw_matrix(rng, cfg, hw, S)
    image = _resample(tiles, hw, matrix)
    labels = transform_labels(labels, matrix, S, scale, perspective=affine.is_perspective(matrix))
    if not closed and cfg.copy_paste > 0 and len(labels):
        flipped = labels.flipped(S, S, horizontal=True)
        chosen = cp_mod.select(labels, flipped, cfg.copy_paste, rng)
        if len(chosen):
            pasted = flipped.select(chosen)
            mirror = image[:, ::-1]
            out = image.copy()
            for polygon in pasted.polygons:
                mask = np.zeros((S, S), np.uint8)
                cp_mod.rasterise(mask, polygon)
                out[mask.astype(bool)] = mirror[mask.astype(bool)]
            image, labels = out, Labels.concat([labels, pasted])
    return image, labels


def straightforward(source, index: int, st: StreamSettings, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(uint8 3 x S x S RGB, packed targets, float image) of one sample."""
    cfg = st.augment
    rng = sample_generator(st.seed, epoch, index)
    if not cfg.train_route:
        reader = Reader.of(source)
        tiles, labels = letterbox_tile(reader.read(index), S, rotated=reader.spec.rotated)
        image = _resample(tiles, (S, S), np.eye(3)) + FILL
        b = labels.boxes
        labels = labels.select(((b[:, 2] - b[:, 0]) > 0) & ((b[:, 3] - b[:, 1]) > 0))
        u8 = np.clip(np.rint(image), 0, 255).astype(np.uint8)
        return np.ascontiguousarray(u8[:, :, ::-1].transpose(2, 0, 1)), pack(labels, S), image
    closed = cfg.mosaic_closed(epoch)
    image, labels = _pre(source, index, cfg, closed, rng)
    image = image + FILL
    if not closed and cfg.mixup > 0 and rng.random() < cfg.mixup:
        partner = int(rng.integers(0, len(source)))
        image2, labels2 = _pre(source, partner, cfg, closed, rng)
        ratio = np.float32(rng.beta(32.0, 32.0))
        image = image * ratio + (image2 + FILL) * (np.float32(1) - ratio)
        labels = Labels.concat([labels, labels2])
    if rng.random() < cfg.flipud:
        image, labels = image[::-1], labels.flipped(S, S, horizontal=False)
    if rng.random() < cfg.fliplr:
        image, labels = image[:, ::-1], labels.flipped(S, S, horizontal=True)
    image = np.ascontiguousarray(image)
    u8 = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    gains = hsv_gains(st.seed, epoch, index, cfg.hsv_h, cfg.hsv_s, cfg.hsv_v)
    if st.hsv_on_device or np.all(gains == 1):
        rgb = u8[:, :, ::-1]
    else:
        rgb = _hsv(u8, gains)
    return np.ascontiguousarray(rgb.transpose(2, 0, 1)), pack(labels, S), image


ROUTES = {
    "default": {},
    "no_mosaic": {"mosaic": 0.0},
    "identity": {"mosaic": 0.0, "translate": 0.0, "scale": 0.0},
    "flips_both": {"flipud": 0.5, "fliplr": 0.5, "scale": 0.9},
    "copy_paste_mixup": {"copy_paste": 0.7, "mixup": 0.6, "degrees": 15.0, "flipud": 0.5},
    "axis_copy_paste_mixup": {"copy_paste": 1.0, "mixup": 1.0},
    "axis_copy_paste": {"copy_paste": 1.0, "fliplr": 0.5},
    "general_affine": {"degrees": 30.0, "shear": 8.0, "scale": 0.7},
    "perspective": {"perspective": 0.001, "shear": 5.0, "copy_paste": 1.0},
    "closed": {"close_mosaic": 1, "epochs": 2, "copy_paste": 1.0, "mixup": 1.0},
    "hsv_off": {"hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "mixup": 0.5},
    "validation": {"train_route": False},
}
SHAPES = [(64, 48), (40, 64), (64, 64), (1, 64), (64, 30), (50, 60), (64, 64)]


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
@pytest.mark.parametrize("name", sorted(ROUTES))
def test_route_equals_straightforward_version(name: str, dtype: str) -> None:
    cls = ArraySource if dtype == "float32" else RawSource
    src = cls(SHAPES, S, seed=21, instances=5)
    st = StreamSettings(seed=6, batch_size=4, augment=AugmentConfig(imgsz=S, **ROUTES[name]))
    for epoch in (0, 1):
        for b in range(num_batches(len(src), st, epoch)):
            r = render_batch(src, st, epoch, b, keep_float=True)
            rows = []
            for k, index in enumerate(r.samples.tolist()):
                image, packed, floats = straightforward(src, index, st, epoch)
                assert r.floats[k].tobytes() == floats.tobytes()
                assert r.images[k].tobytes() == image.tobytes()
                rows.append(np.concatenate([np.full((len(packed), 1), k, np.float32), packed], axis=1))
            assert r.targets.tobytes() == np.concatenate(rows).tobytes()


@pytest.mark.parametrize("name", ["default", "no_mosaic", "flips_both", "hsv_off", "general_affine"])
def test_route_without_the_float_image_equals_straightforward_version(name: str) -> None:
    # The route's own call asks for the uint8 image alone, which on an axis-aligned map with
    # one layer and nothing pasted takes the kernel's direct path (no float strip).
    src = RawSource(SHAPES, S, seed=5, instances=5)
    st = StreamSettings(seed=9, batch_size=4, augment=AugmentConfig(imgsz=S, **ROUTES[name]))
    for epoch in (0, 1):
        for b in range(num_batches(len(src), st, epoch)):
            r = render_batch(src, st, epoch, b)
            for k, index in enumerate(r.samples.tolist()):
                assert r.images[k].tobytes() == straightforward(src, index, st, epoch)[0].tobytes()


def test_hsv_on_device_route_equals_straightforward_version() -> None:
    src = ArraySource(SHAPES, S, seed=3, instances=4)
    st = StreamSettings(seed=2, batch_size=4, hsv_on_device=True, augment=AugmentConfig(imgsz=S, mixup=0.5))
    r = render_batch(src, st, 0, 0)
    for k, index in enumerate(r.samples.tolist()):
        assert r.images[k].tobytes() == straightforward(src, index, st, 0)[0].tobytes()


def test_float32_and_uint8_sources_give_identical_batches() -> None:
    st = StreamSettings(
        seed=4, batch_size=7, augment=AugmentConfig(imgsz=S, degrees=10.0, copy_paste=0.5, mixup=0.5, flipud=0.5)
    )
    a, b = ArraySource(SHAPES, S, seed=8), RawSource(SHAPES, S, seed=8)
    for epoch in range(3):
        ra, rb = render_batch(a, st, epoch, 0), render_batch(b, st, epoch, 0)
        assert ra.images.tobytes() == rb.images.tobytes() and ra.targets.tobytes() == rb.targets.tobytes()


def test_hsv_tables_of_identity_gains_round_trip_most_pixels() -> None:
    # The integer HSV is the hexcone in integers: with identity tables it returns the pixel
    # on most colours and is never more than a few levels off (a check on the formulation).
    rng = np.random.default_rng(0)
    u8 = rng.integers(0, 256, (S, S, 3), dtype=np.uint8)
    back = _hsv(u8, np.ones(3) + 1e-12)[:, :, ::-1].astype(np.int16)
    diff = np.abs(back - u8.astype(np.int16))
    assert diff.max() <= 4 and (diff == 0).mean() > 0.5


def test_standalone_hsv_equals_the_numpy_integer_hsv() -> None:
    # Every odd size (lane tails), greys, saturated colours, all hue sectors and random gains,
    # including gains that push the tables to their clips.
    from pixpool.server.augment.hsv import apply_hsv_bgr

    rng = np.random.default_rng(7)
    levels = np.array([0, 1, 2, 127, 128, 254, 255], np.uint8)
    corners = np.stack(np.meshgrid(levels, levels, levels), -1).reshape(1, -1, 3)
    for shape in ((1, 1), (3, 5), (17, 33), (64, 64), (1, 1029)):
        image = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
        for gains in (
            rng.uniform(-1, 1, 3) * [0.015, 0.7, 0.4] + 1,
            np.array([1.3, 2.0, 0.1]),
            np.array([0.5, 0.0, 3.0]),
        ):
            for im in (image, corners):
                assert np.array_equal(apply_hsv_bgr(im, gains, to_rgb=True), _hsv(im, gains)), (shape, gains)


def test_hsv_with_and_without_table_lookups_equals_the_numpy_integer_hsv() -> None:
    # The rows skip the lookups when the tables are a hue shift and two clipped gains (what
    # shared.stream.hsv_tables builds; the kernel checks every entry per call) and look up any
    # other tables. Both on a grid of colours that meets every hue sector, grey and clip.
    from pixpool.server.augment import _kernel
    from pixpool.server.augment.kernel import apply_hsv_rgb

    levels = np.unique(np.r_[np.arange(0, 256, 5), [1, 2, 127, 128, 253, 254, 255]]).astype(np.uint8)
    rgb = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(1, -1, 3)
    rng = np.random.default_rng(11)
    drawn = [tables(hsv_gains(3, 0, i, 0.015, 0.7, 0.4)) for i in range(4)]
    edge = [tables(np.array(g)) for g in ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [2.0, 1.7, 0.3], [0.985, 255.0, 1e-3])]
    other = [rng.integers(0, 256, (3, 256), dtype=np.uint8), np.roll(tables(np.array([1.0, 1.2, 0.9])), 1, axis=1)]
    for tabs in drawn + edge + other:
        want = _kernel.hsv_lookup_free(tabs.tobytes())
        assert want == any(tabs is t for t in drawn + edge), tabs
        out = apply_hsv_rgb(rgb.copy(), tabs)
        assert np.array_equal(out, _hsv(rgb[:, :, ::-1], None, tabs))


def test_float_lanes_compute_the_integer_hsv_exactly() -> None:
    # The kernel evaluates step 8's rounded quotients in float32 lanes; this checks, for
    # every input the step can meet, that those float32 operations (same IEEE operations in
    # numpy) equal the integer definition.
    f = np.float32
    v = np.arange(256, dtype=f)[:, None, None]
    s = np.arange(256, dtype=f)[None, :, None]
    w = np.arange(31, dtype=f)[None, None, :]
    # The last step: floor(t / 15300) as the truncated product with the rounded reciprocal
    # (no correction), for all 256 x 256 x 31 (V', S', W); t = base + slope D with D = 60 - W,
    # in the kernel's order (every term an integer below 2^23 in magnitude, so exact).
    v2 = v + v
    t = (v2 * (f(7650) - f(60) * s) + f(7650)) + (v2 * s) * (f(60) - w)
    assert np.array_equal(t, (v2 * (f(7650) - s * w) + f(7650)))
    q = np.trunc(t * (f(1) / f(15300)))
    exact = (v.astype(np.int64) * (7650 - s.astype(np.int64) * w.astype(np.int64)) + 3825) // 7650
    assert np.array_equal(q.astype(np.int64), np.broadcast_to(exact, q.shape))
    big_v, d = np.arange(256, dtype=f)[:, None], np.arange(256, dtype=f)[None, :]
    ok = d <= big_v
    sat = np.trunc(f(255) * d / np.maximum(big_v, f(1)) + f(0.5))
    assert np.array_equal(
        sat[ok].astype(np.int64),
        ((510 * d.astype(np.int64) + big_v.astype(np.int64)) // np.maximum(2 * big_v.astype(np.int64), 1))[ok],
    )
    # W of channel c (30 n_c, n = 5, 3, 1) from the hue h, reduced (0..179, after a lookup) or
    # not (the forward conversion's 150..210): 60 - clamp(||h + off| - 90|, 30, 60) with the
    # offsets hsv_offsets gives, for every table hue shift.
    for unreduced, hs in ((0, np.arange(180)), (1, np.arange(150, 211))):
        for hue in range(180):
            for c in range(3):
                k = hue + 150 - 60 * c + 30
                off = (k + 330) % 180 - 330 if unreduced else k % 180 - 180
                kk = (hs % 180 + hue + 150 - 60 * c) % 180
                e = hs.astype(f) + f(off)
                assert e.min() >= -180 and e.max() <= 180
                d = np.clip(np.abs(np.abs(e) - f(90)), f(30), f(60))
                assert np.array_equal(f(60) - d, np.clip(np.minimum(kk, 120 - kk), 0, 30)), (unreduced, hue, c)
    dd, n = np.arange(256, dtype=f)[:, None], np.arange(-255, 5 * 255 + 1, dtype=f)[None, :]
    ok = (n >= -dd) & (n <= 5 * dd)
    hue = np.trunc(f(30) * n / np.maximum(dd, f(1)) + f(180.5)) - f(180)
    assert np.array_equal(
        hue[ok].astype(np.int64),
        ((60 * n.astype(np.int64) + dd.astype(np.int64)) // np.maximum(2 * dd.astype(np.int64), 1))[ok],
    )
