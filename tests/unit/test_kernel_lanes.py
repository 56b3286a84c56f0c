"""The kernel's 4-lane (SSE2), 8-lane (AVX2) and 16-lane (AVX-512F) loops give the same
bytes, in one process.

Every x86-64 CPU runs the 4-lane loops; CPUs with AVX2 run the 8-lane ones (the axis map's
row blend two columns a vector, the general map's coordinates and bilinear across columns,
the fill/quantise/HSV rows eight pixels a step, and the direct path where one axis-aligned
layer is blended straight into the output row); CPUs with AVX-512F also run the fill/
quantise/HSV rows with HSV on the CPU sixteen pixels a step. A user's batches must not
depend on which CPU rendered them: ``_kernel.set_lanes`` switches the loops, and each route
configuration is rendered with 4 lanes and with each wider width the CPU has, with and
without the float image (the float image takes the strip path, the route's own call the
direct one), on float32 and uint8 sources; the kernel alone at sizes that are not a multiple
of the 8- and 16-pixel groups (the route's imgsz is a multiple of 32); HSV on every RGB triple.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.sources import ArraySource
from pixpool.server.augment import _kernel, kernel, render_batch
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.hsv_tables import tables
from pixpool.shared.stream.sampler import num_batches

ROUTES = {
    "default": {},
    "no_mosaic": {"mosaic": 0.0, "scale": 0.9},
    "rotate_shear": {"degrees": 10.0, "shear": 2.0},
    "perspective": {"perspective": 0.001, "shear": 5.0},
    "copy_paste_mixup_rotated": {"copy_paste": 0.7, "mixup": 0.6, "degrees": 15.0, "flipud": 0.5},
    "axis_copy_paste_mixup": {"copy_paste": 1.0, "mixup": 1.0, "fliplr": 0.5},
    "axis_copy_paste": {"copy_paste": 1.0, "fliplr": 0.5},
    "hsv_off": {"hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0},
    "validation": {"train_route": False},
}
SHAPES = [(64, 48), (40, 64), (61, 61), (1, 64), (64, 30), (50, 60), (67, 71)]


class _RawSource(ArraySource):
    """The same records as raw uint8 pixels, as a uint8 snapshot holds them."""

    def image(self, index: int) -> np.ndarray:
        return self.uint8[index]


WIDE = {8: "AVX2", 16: "AVX-512F"}


@pytest.fixture(params=sorted(WIDE))
def lanes(request):
    """(switch, wide): switches the kernel's loops for the test, and the wide width to compare
    with 4; restores the width in use before."""
    before = _kernel.simd()
    try:
        _kernel.set_lanes(request.param)
    except ValueError:
        pytest.skip(f"this CPU has no {WIDE[request.param]}: no {request.param}-lane loops to compare")
    yield _kernel.set_lanes, request.param
    _kernel.set_lanes(before)


def _render(src, st: StreamSettings, keep_float: bool) -> list[bytes]:
    out = []
    for epoch in (0, 1):
        for b in range(num_batches(len(src), st, epoch)):
            r = render_batch(src, st, epoch, b, keep_float=keep_float)
            out.append(r.images.tobytes())
            if keep_float:
                out.extend(f.tobytes() for f in r.floats)
    return out


@pytest.mark.parametrize("size", [64, 96])
@pytest.mark.parametrize("dtype", ["float32", "uint8"])
@pytest.mark.parametrize("name", sorted(ROUTES))
def test_four_and_wider_lanes_give_the_same_bytes(lanes, name: str, dtype: str, size: int) -> None:
    switch, wide = lanes
    cls = ArraySource if dtype == "float32" else _RawSource
    src = cls(SHAPES, size, seed=5, instances=4)
    for hsv_on_device in (False, True):
        st = StreamSettings(
            seed=3, batch_size=4, hsv_on_device=hsv_on_device, augment=AugmentConfig(imgsz=size, **ROUTES[name])
        )
        for keep_float in (False, True):
            switch(4)
            want = _render(src, st, keep_float)
            switch(wide)
            got = _render(src, st, keep_float)
            differ = [i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b]
            assert not differ, (
                f"{name}, {dtype}, size {size}, keep_float {keep_float}, {wide} lanes: arrays {differ} differ"
            )


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
@pytest.mark.parametrize("size", [61, 130])
def test_kernel_at_sizes_off_the_pixel_groups_gives_the_same_bytes_in_every_width(lanes, size: int, dtype: str) -> None:
    switch, wide = lanes
    rng = np.random.default_rng(size)
    images = [rng.integers(0, 256, (size + 7, size - 3, 3), dtype=np.uint8) for _ in range(2)]
    if dtype == "float32":
        images = [(im.astype(np.float32) - np.float32(114)) for im in images]
    half = size // 2
    tiles = [
        (images[0], (0, 0, size - 3, half + 1), (0, 0)),
        (images[1], (3, half + 1, size, size + 5), (0, 2)),
    ]  # two tiles with a gap, read past their edges by the maps below
    c, s_ = np.cos(0.3), np.sin(0.3)
    maps = {
        "axis": np.array([[0.83, 0.0, 2.5], [0.0, 1.21, -1.75], [0.0, 0.0, 1.0]]),
        "rotate": np.array([[c, -s_, 0.4 * size], [s_, c, -0.1 * size], [0.0, 0.0, 1.0]]),
        "perspective": np.array([[0.9, 0.1, 1.0], [-0.05, 1.1, 2.0], [0.0004, -0.0003, 1.0]]),
    }
    table = tables(np.array([1.2, 0.6, 1.3]))
    for name, matrix in maps.items():
        layer = kernel.Layer(tuple(float(v) for v in np.linalg.inv(matrix).reshape(9)), tiles)
        for hsv in (None, table):
            results = {}
            for width in (4, wide):
                switch(width)
                out, floats, alone = (
                    np.zeros((3, size, size), np.uint8),
                    np.zeros((size, size, 3), np.float32),
                    np.zeros((3, size, size), np.uint8),
                )
                kernel.render(size, [layer], tables=hsv, out=out, floats=floats, flip_lr=True)
                kernel.render(size, [layer], tables=hsv, out=alone, flip_lr=True)
                results[width] = (out.tobytes(), floats.tobytes(), alone.tobytes())
            assert results[4] == results[wide], f"{name}, HSV {hsv is not None}: the 4- and {wide}-lane bytes differ"
            assert results[wide][0] == results[wide][2], f"{name}: the output differs with and without the float image"


def test_set_lanes_refuses_a_width_it_has_no_loops_for() -> None:
    with pytest.raises(ValueError, match="4 lanes"):
        _kernel.set_lanes(32)


def test_hsv_of_every_rgb_triple_is_the_same_in_every_width(lanes) -> None:
    # The 8-lane HSV selects with blends and packs the three planes together, the 16-lane one
    # selects with mask registers: every one of the 2^24 colours, with tables the rows
    # evaluate without lookups and with tables they must look up.
    switch, wide = lanes
    v = np.arange(256, dtype=np.uint8)
    every = np.stack(np.meshgrid(v, v, v, indexing="ij"), -1).reshape(4096, 4096, 3)
    other = np.random.default_rng(2).integers(0, 256, (3, 256), dtype=np.uint8)
    for tabs in (tables(np.array([0.99, 1.5, 0.7])), tables(np.array([1.3, 0.2, 1.6])), other):
        out = {}
        for width in (4, wide):
            switch(width)
            out[width] = kernel.apply_hsv_rgb(every.copy(), tabs)
        differ = np.flatnonzero((out[4] != out[wide]).any(axis=-1).reshape(-1))
        assert not len(differ), f"{len(differ)} colours differ, e.g. RGB {every.reshape(-1, 3)[differ[0]].tolist()}"
