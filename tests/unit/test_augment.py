"""The augmentation route on in-memory sources: determinism, geometry, fill, byte-neutral shortcuts."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from helpers.sources import ArraySource
from pixpool.server.augment import affine, hsv, max_targets, render_batch, render_sample
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import FILL_VALUE, AugmentConfig, StreamSettings
from pixpool.shared.stream.digest import batch_digest
from pixpool.shared.stream.rng import hsv_gains, sample_generator
from pixpool.shared.stream.sampler import batch_samples, epoch_indices, num_batches

S = 64
SHAPES = [(64, 48), (40, 64), (64, 64), (1, 64), (64, 3), (20, 64), (64, 1), (33, 64)]


@pytest.fixture(scope="module")
def source() -> ArraySource:
    return ArraySource(SHAPES, S, seed=1, instances=4)


def settings(**aug) -> StreamSettings:
    extra = {
        k: aug.pop(k)
        for k in ("seed", "batch_size", "rank", "world_size", "shuffle", "drop_last", "hsv_on_device")
        if k in aug
    }
    return StreamSettings(**{"batch_size": 4, **extra}, augment=AugmentConfig(imgsz=S, **aug))


ROUTES = {
    "default": {},
    "no_mosaic": {"mosaic": 0.0},
    "everything": {"degrees": 10.0, "shear": 5.0, "copy_paste": 1.0, "mixup": 1.0, "flipud": 0.5},
    "perspective": {"perspective": 0.001, "degrees": 20.0, "copy_paste": 0.5},
    "validation": {"train_route": False},
}


# -- sampler ------------------------------------------------------------------------------
@pytest.mark.parametrize("world,drop_last", [(1, False), (3, False), (3, True), (4, True), (20, False)])
def test_shards_cover_each_index_once_per_rank(world: int, drop_last: bool) -> None:
    n = 10
    shards = [
        epoch_indices(n, StreamSettings(seed=5, rank=r, world_size=world, drop_last=drop_last, batch_size=3), 2)
        for r in range(world)
    ]
    lengths = {len(s) for s in shards}
    assert len(lengths) == 1, "every rank delivers the same number of samples"
    union = np.concatenate(shards)
    if drop_last:
        assert len(union) == (n // world) * world and len(set(union.tolist())) == len(union)
    else:
        assert set(union.tolist()) == set(range(n)) and len(union) == -(-n // world) * world
    for r, shard in enumerate(shards):
        st = StreamSettings(seed=5, rank=r, world_size=world, drop_last=drop_last, batch_size=3)
        batches = [batch_samples(n, st, 2, b) for b in range(num_batches(n, st, 2))]
        joined = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        expect = shard[: (len(shard) // 3) * 3] if drop_last else shard
        np.testing.assert_array_equal(joined, expect)


def test_shuffle_depends_on_seed_and_epoch_only() -> None:
    a = epoch_indices(100, StreamSettings(seed=1), 0)
    assert np.array_equal(a, epoch_indices(100, StreamSettings(seed=1, batch_size=7), 0))
    assert not np.array_equal(a, epoch_indices(100, StreamSettings(seed=1), 1))
    assert not np.array_equal(a, epoch_indices(100, StreamSettings(seed=2), 0))
    assert sorted(a.tolist()) == list(range(100))
    np.testing.assert_array_equal(epoch_indices(5, StreamSettings(shuffle=False), 3), np.arange(5))


def test_batch_out_of_range_names_the_range() -> None:
    with pytest.raises(ConfigError, match="outside epoch 0's 3 batches"):
        batch_samples(10, StreamSettings(batch_size=4), 0, 3)


# -- determinism and the source contract ---------------------------------------------------
def _digests(source, st: StreamSettings, epoch: int, order: list[int]) -> dict[int, str]:
    out = {}
    for b in order:
        r = render_batch(source, st, epoch, b)
        out[b] = batch_digest(r.images, r.targets)
    return out


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_batches_do_not_depend_on_call_order(source: ArraySource, name: str) -> None:
    st = settings(**ROUTES[name])
    n = num_batches(len(source), st, 0)
    forward = _digests(source, st, 0, list(range(n)))
    backward = _digests(source, st, 0, list(reversed(range(n))))
    assert forward == backward
    if name != "validation":
        assert _digests(source, st, 1, list(range(n))) != forward, "a new epoch draws anew"


def test_source_arrays_are_never_written(source: ArraySource) -> None:
    before = hashlib.sha256(
        b"".join(np.ascontiguousarray(source.image(i)).tobytes() for i in range(len(source)))
    ).hexdigest()
    for name in ROUTES:
        st = settings(**ROUTES[name])
        for b in range(num_batches(len(source), st, 0)):
            render_batch(source, st, 0, b)
    after = hashlib.sha256(
        b"".join(np.ascontiguousarray(source.image(i)).tobytes() for i in range(len(source)))
    ).hexdigest()
    assert before == after
    assert not source.image(0).flags.writeable


def test_images_out_is_written_in_place(source: ArraySource) -> None:
    st = settings()
    slot = np.zeros((4, 3, S, S), np.uint8)
    r = render_batch(source, st, 0, 0, images_out=slot)
    assert np.shares_memory(r.images, slot)
    assert np.array_equal(render_batch(source, st, 0, 0).images, slot)
    with pytest.raises(ConfigError, match="images_out must be uint8"):
        render_batch(source, st, 0, 0, images_out=np.zeros((4, 3, S, S + 1), np.uint8))


# -- geometry of the targets ----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ROUTES))
def test_boxes_inside_image_and_not_degenerate(name: str) -> None:
    awkward = ArraySource(SHAPES + [(2, 64), (64, 2)], S, seed=7, instances=6)
    st = settings(seed=3, **ROUTES[name])
    total_rows = 0
    for epoch in range(3):
        for b in range(num_batches(len(awkward), st, epoch)):
            t = render_batch(awkward, st, epoch, b).targets
            total_rows += len(t)
            assert np.all(np.isfinite(t))
            cx, cy, w, h = t[:, 2], t[:, 3], t[:, 4], t[:, 5]
            eps = 1e-6
            assert np.all(cx - w / 2 >= -eps) and np.all(cx + w / 2 <= 1 + eps)
            assert np.all(cy - h / 2 >= -eps) and np.all(cy + h / 2 <= 1 + eps)
            if name == "validation":
                assert np.all(w > 0) and np.all(h > 0)
            else:
                assert np.all(w * S > 2) and np.all(h * S > 2)
                assert np.all(np.maximum(w / h, h / w) < 100)
    assert total_rows > 0


def test_images_without_labels() -> None:
    empty = ArraySource([(64, 64), (30, 64), (64, 20)], S, seed=2, instances=0)
    for name in ROUTES:
        r = render_batch(empty, settings(**ROUTES[name]), 0, 0)
        assert r.targets.shape == (0, 6) and r.images.shape == (3, 3, S, S)


def test_max_targets_bounds_every_batch(source: ArraySource) -> None:
    for name in ROUTES:
        st = settings(**ROUTES[name])
        bound = max_targets(4, st)
        for epoch in range(2):
            for b in range(num_batches(len(source), st, epoch)):
                assert len(render_batch(source, st, epoch, b).targets) <= bound


def test_closed_mosaic_epochs_use_one_record(source: ArraySource) -> None:
    st = settings(close_mosaic=2, epochs=5, copy_paste=1.0, mixup=1.0, scale=0.0, translate=0.0)
    for b in range(num_batches(len(source), st, 4)):
        r = render_batch(source, st, 4, b)
        for k, index in enumerate(r.samples):
            assert (r.targets[:, 0] == k).sum() <= len(source.targets(int(index)).classes)


def test_validation_is_a_plain_letterbox(source: ArraySource) -> None:
    st = settings(train_route=False)
    image, labels, gen = render_sample(source, 1, st, 0)  # (40, 64): 12 rows of padding above and below
    assert np.all(image[:12] == FILL_VALUE) and np.all(image[52:] == FILL_VALUE)
    np.testing.assert_array_equal(image[12:52], source.uint8[1].astype(np.float32))
    assert gen.state == sample_generator(0, 0, 1).state, "validation draws nothing"


# -- quantisation ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ROUTES))
def test_images_are_the_quantised_float_images(source: ArraySource, name: str) -> None:
    st = settings(**ROUTES[name])
    r = render_batch(source, st, 0, 1, keep_float=True)
    for k, (index, f) in enumerate(zip(r.samples.tolist(), r.floats)):
        u8 = np.clip(np.rint(f), 0, 255).astype(np.uint8)
        if st.augment.train_route:
            u8 = hsv.apply_hsv_bgr(u8, hsv_gains(st.seed, 0, index, 0.015, 0.7, 0.4))
        np.testing.assert_array_equal(r.images[k], u8[:, :, ::-1].transpose(2, 0, 1))


def test_hsv_on_device_leaves_cpu_images_unjittered(source: ArraySource) -> None:
    r = render_batch(source, settings(hsv_on_device=True), 0, 0, keep_float=True)
    for k, f in enumerate(r.floats):
        np.testing.assert_array_equal(
            r.images[k], np.clip(np.rint(f), 0, 255).astype(np.uint8)[:, :, ::-1].transpose(2, 0, 1)
        )


# -- fill restoration -------------------------------------------------------------------------
def test_exposed_padding_is_the_fill_identity(source: ArraySource) -> None:
    st = settings(mosaic=0.0, translate=0.0, scale=0.0, fliplr=0.0)
    image, _, _ = render_sample(source, 5, st, 0)  # (20, 64): rows 22..41 hold the image
    assert np.all(image[:22] == FILL_VALUE) and np.all(image[42:] == FILL_VALUE)
    np.testing.assert_array_equal(image[22:42], source.uint8[5].astype(np.float32))


@pytest.mark.parametrize(
    "aug",
    [
        {"scale": 0.5},
        {"translate": 0.3, "degrees": 30.0},
        {"shear": 10.0, "scale": 0.3},
        {"perspective": 0.001, "degrees": 10},
    ],
)
def test_exposed_padding_is_the_fill_non_identity(source: ArraySource, aug: dict) -> None:
    st = settings(mosaic=0.0, fliplr=0.0, **aug)
    checked = 0
    for index in (0, 1, 5, 7):
        image, _, _ = render_sample(source, index, st, 0)
        rng = sample_generator(st.seed, 0, index)
        matrix, _ = affine.draw_matrix(rng, st.augment, (S, S), S)
        h, w = SHAPES[index]
        top, left = (S - h) // 2, (S - w) // 2
        # Output pixels whose source point lies more than 1.5 px outside the image read only padding.
        ys, xs = np.mgrid[0:S, 0:S].astype(np.float64)
        pts = np.stack([xs.ravel(), ys.ravel(), np.ones(S * S)], axis=1) @ np.linalg.inv(matrix).T
        sx, sy = pts[:, 0] / pts[:, 2], pts[:, 1] / pts[:, 2]
        outside = (sx < left - 1.5) | (sx > left + w + 0.5) | (sy < top - 1.5) | (sy > top + h + 0.5)
        outside = outside.reshape(S, S)
        assert np.all(image[outside] == FILL_VALUE)
        checked += outside.sum()
    assert checked > 100


def test_standalone_identity_bypasses_the_resample_within_float32_eps() -> None:
    # An imgsz-square image with identity parameters: the matrix is exactly the identity,
    # the resample is skipped, and the float image is (pixel - 114) + 114 computed in
    # float32. Bound: absolute error <= float32 eps (1.19e-7) with zero relative
    # tolerance, in pixel units and in [0, 1] units. Both steps are exact for 8-bit
    # values (every integer below 2**24 is a float32), so the error is in fact 0; a
    # non-integer input could be off by at most half an ulp of 255, 2**-16 = 128 * eps.
    square = ArraySource([(S, S)] * 2, S, seed=4)
    st = settings(mosaic=0.0, translate=0.0, scale=0.0, fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    image, _, _ = render_sample(square, 0, st, 0)
    expected = square.uint8[0].astype(np.float32)
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(image, expected, rtol=0, atol=eps)
    np.testing.assert_allclose(image / np.float32(255), expected / np.float32(255), rtol=0, atol=eps)
    r = render_batch(square, st, 0, 0)
    assert np.array_equal(r.images[list(r.samples).index(0)], square.uint8[0][:, :, ::-1].transpose(2, 0, 1))


def test_segments_follow_target_rows(source: ArraySource) -> None:
    st = settings(copy_paste=1.0, mixup=0.5)
    r = render_batch(source, st, 0, 0)
    assert len(r.segments) == len(r.targets)
    for row, seg in zip(r.targets, r.segments):
        if len(seg):
            x1, y1, x2, y2 = seg[:, 0].min(), seg[:, 1].min(), seg[:, 0].max(), seg[:, 1].max()
            # a box from a polygon is the extent of its (clipped) vertices
            np.testing.assert_allclose([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], row[2:], atol=1e-5)


def test_short_last_batch_into_a_full_slot(source: ArraySource) -> None:
    st = settings(batch_size=3)  # 8 records: batches of 3, 3, 2
    slot = np.full((3, 3, S, S), 7, np.uint8)
    r = render_batch(source, st, 0, 2, images_out=slot)
    assert r.images.shape == (2, 3, S, S) and len(r.samples) == 2
    assert np.all(slot[2] == 7), "rows past the batch are left alone"


def test_labels_from_placed_equal_concatenated_parts() -> None:
    # The mosaic builds its four records' labels in one pass; the arrays must be those of
    # building each record's and concatenating (empty records, records whose polygon
    # count does not match, polygons under three vertices, one part, no parts).
    from pixpool.server.augment.labels import Labels
    from pixpool.shared.stream.records import Targets

    rng = np.random.default_rng(8)

    def record(n: int, mode: str) -> Targets:
        boxes = rng.uniform(0, 1, (n, 4)).astype(np.float32)
        polys = tuple(rng.uniform(0, 1, (int(rng.integers(0, 7)), 2)).astype(np.float32) for _ in range(n))
        if mode == "none":
            polys = ()
        elif mode == "mismatch" and n:
            polys = polys[:-1]
        return Targets(rng.integers(0, 80, n).astype(np.int32), boxes, polys)

    for trial in range(200):
        k = int(rng.integers(0, 5))
        placed = [
            (
                record(int(rng.integers(0, 6)), str(rng.choice(["poly", "none", "mismatch"]))),
                int(rng.integers(1, 700)),
                int(rng.integers(1, 700)),
                int(rng.integers(-600, 700)),
                int(rng.integers(-600, 700)),
            )
            for _ in range(k)
        ]
        want = Labels.concat([Labels.from_targets(*p) for p in placed])
        got = Labels.from_placed(placed)
        for name in ("classes", "boxes", "points", "offsets"):
            a, b = getattr(want, name), getattr(got, name)
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (trial, name)


@pytest.mark.parametrize("fill", [FILL_VALUE, 100.0])
def test_the_kernel_adds_back_the_fill_its_caller_passes(fill):
    """The fill is the caller's (the snapshot header's), not a literal in the kernel: exposed
    padding is that fill, a float32 tile's centred value v comes back as v + fill, and a uint8
    tile's pixel p as (p - fill) + fill = p exactly."""
    from pixpool.server.augment import kernel

    n = 16
    centred = np.full((n, n, 3), -14.0, np.float32)
    raw = np.arange(n * n * 3, dtype=np.uint8).reshape(n, n, 3)
    for tile, inside in ((centred, np.float32(-14.0) + np.float32(fill)), (raw, raw.astype(np.float32))):
        layer = kernel.Layer(kernel.IDENTITY, [(tile, (0, 0, n, n), (0, 0))])
        floats = np.empty((2 * n, 2 * n, 3), np.float32)
        kernel.render(2 * n, [layer], floats=floats, fill=fill)
        np.testing.assert_array_equal(floats[:n, :n], np.broadcast_to(inside, (n, n, 3)))
        assert np.all(floats[n:] == fill) and np.all(floats[:, n:] == fill)  # no tile there: the fill
