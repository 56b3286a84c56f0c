"""The rect validation route: its plan, its shards, its settings and its rendered batches.

No processes, no Ultralytics: the plan and the shards against hand computations of
Ultralytics 8.4's ``set_rectangle`` and ``ContiguousDistributedSampler`` (the integration test
``test_ultralytics_val.py`` compares with Ultralytics itself), and the route on in-memory
sources (placement, fill, normalisation, masks, the ring slot side).
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.task_sources import TaskSource
from pixpool.server.augment.batch import render_batch, render_range
from pixpool.server.augment.masks import render_masks
from pixpool.server.augment.val_rect import crop, plan_of
from pixpool.server.daemon.admission import ring_side
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.rect_plan import contiguous_shard, rect_plan, slot_side
from pixpool.shared.stream.sampler import batch_samples, epoch_indices, num_batches

IMGSZ = 64


def _settings(batch_size: int = 2, stride: int = 32, **stream) -> StreamSettings:
    augment = AugmentConfig(imgsz=IMGSZ, train_route=False, rect_stride=stride)
    return StreamSettings(batch_size=batch_size, shuffle=False, split="val", augment=augment, **stream)


class RectSource(TaskSource):
    """A ``TaskSource`` whose records were decoded at twice their prepared size."""

    def original_shapes(self) -> np.ndarray:
        return np.array([im.shape[:2] for im in self._images], dtype=np.int64) * 2


# prepared sizes (long side IMGSZ): aspect ratios 0.5, 2, 1, 0.25, 1.25
SHAPES = [(32, 64), (64, 32), (64, 64), (16, 64), (64, 52)]


def test_plan_is_ultralytics_set_rectangle():
    shapes = np.array([(100, 200), (300, 100), (200, 200), (50, 200), (120, 100)])
    plan = rect_plan(shapes, 2, 320, 32)
    # ratios 0.5, 3, 1, 0.25, 1.2 sorted: records 3, 0 | 2, 4 | 1
    assert plan.order.tolist() == [3, 0, 2, 4, 1]
    # [maxi, 1] = [0.5, 1]: ceil(0.5 * 10 + 0.5) * 32 = 192, ceil(10.5) * 32 = 352; a mixed
    # batch is [1, 1]; [1, 1 / mini] = [1, 1/3]: ceil(10 / 3 + 0.5) * 32 = 128
    assert plan.shapes.tolist() == [[192, 352], [192, 352], [352, 352], [352, 352], [352, 128]]
    assert slot_side(320, 32) == 352 and slot_side(640, 32) == 672
    assert plan.shape_of(np.array([2, 3])) == (352, 352)
    with pytest.raises(ConfigError, match="span 2"):
        plan.shape_of(np.array([1, 2]))


@pytest.mark.parametrize(
    ("n", "batch", "world", "expected"),
    [
        (10, 3, 2, [(0, 6), (6, 10)]),  # 4 batches: 2 each
        (10, 3, 3, [(0, 6), (6, 9), (9, 10)]),  # the first rank takes the extra batch
        (5, 8, 2, [(0, 3), (3, 5)]),  # a batch spanning the set: single records
        (4, 2, 3, [(0, 2), (2, 4), (4, 4)]),  # more ranks than batches: an empty share
    ],
)
def test_contiguous_shard_is_ultralytics_sampler(n, batch, world, expected):
    for rank, (start, stop) in enumerate(expected):
        assert contiguous_shard(n, batch, world, rank).tolist() == list(range(start, stop))


def test_sampler_takes_whole_batches_in_order():
    settings = _settings(batch_size=3, rank=1, world_size=2)
    assert epoch_indices(10, settings, 0).tolist() == [6, 7, 8, 9]
    assert epoch_indices(10, settings, 5).tolist() == [6, 7, 8, 9]  # no epoch order
    assert num_batches(10, settings, 0) == 2
    assert batch_samples(10, settings, 0, 1).tolist() == [9]


def test_settings_refuse_rect_outside_validation():
    with pytest.raises(ConfigError) as exc:
        AugmentConfig(rect_stride=32)  # the training route
    assert exc.value.field == "rect_stride"
    with pytest.raises(ConfigError) as exc:
        StreamSettings(shuffle=True, augment=AugmentConfig(train_route=False, rect_stride=32))
    assert exc.value.field == "shuffle"
    with pytest.raises(ConfigError):
        AugmentConfig(train_route=False, rect_stride=-32)


def test_detect_batch_is_letterboxed_into_its_shape():
    source = RectSource("detect", SHAPES, IMGSZ)
    settings = _settings()
    plan = plan_of(source, settings)
    assert plan.order.tolist() == [3, 0, 2, 4, 1]
    side = slot_side(IMGSZ, 32)
    batch = render_batch(source, settings, 0, 0)
    assert batch.images.shape == (2, 3, side, side)
    assert batch.samples.tolist() == [3, 0]
    # ratios 0.25 and 0.5: [0.5, 1] -> (ceil(1.5) * 32, ceil(2.5) * 32) = (64, 96)
    images, masks = crop(batch.images, batch.masks, (64, 96), 4)
    assert masks is None
    for i, record in enumerate([3, 0]):
        h, w = SHAPES[record]
        top, left = (64 - h) // 2, (96 - w) // 2
        expected = np.full((3, 64, 96), 114, np.uint8)
        expected[:, top : top + h, left : left + w] = source.uint8[record].transpose(2, 0, 1)[::-1]
        np.testing.assert_array_equal(images[i], expected)
        assert (batch.images[i, :, 64:, :] == 114).all() and (batch.images[i, :, :, 96:] == 114).all()
        rows = batch.targets[batch.targets[:, 0] == i]
        t = source.targets(record)
        x1, y1, x2, y2 = (t.boxes * np.array([w, h, w, h], np.float32)).T
        np.testing.assert_allclose(rows[:, 2], ((x1 + left) + (x2 + left)) / 2 / 96, atol=1e-6)
        np.testing.assert_allclose(rows[:, 3], ((y1 + top) + (y2 + top)) / 2 / 64, atol=1e-6)
        np.testing.assert_allclose(rows[:, 4], (x2 - x1) / 96, atol=1e-6)
        np.testing.assert_allclose(rows[:, 5], (y2 - y1) / 64, atol=1e-6)
        np.testing.assert_array_equal(rows[:, 1], t.classes)


def test_parts_concatenate_to_the_batch():
    source = RectSource("pose", SHAPES, IMGSZ)
    settings = _settings(batch_size=3)
    whole = render_batch(source, settings, 0, 1)
    a = render_range(source, settings, 0, 1, 0, 1)
    b = render_range(source, settings, 0, 1, 1, 2)
    np.testing.assert_array_equal(np.concatenate([a.images, b.images]), whole.images)
    np.testing.assert_array_equal(np.concatenate([a.targets, b.targets]), whole.targets)
    assert whole.targets.shape[1] == 6 + 15
    assert (whole.targets[:, 6::3] <= 1).all() and (whole.targets[:, 7::3] <= 1).all()  # x, y normalised


def test_segment_masks_are_the_shapes_plane():
    source = RectSource("segment", SHAPES, IMGSZ)
    settings = _settings(batch_size=2)
    batch = render_batch(source, settings, 0, 2)  # record 1 alone: ratio 2 -> (96, ceil(1.5) * 32 = 64)
    assert batch.samples.tolist() == [1]
    images, masks = crop(batch.images, batch.masks, (96, 64), 4)
    assert masks.shape == (1, 24, 16)
    assert not batch.masks[0, 24:].any() and not batch.masks[0, :, 16:].any()
    # the plane Ultralytics' polygons2masks_overlap makes on the (96, 64) image (windowed here)
    rows = batch.targets
    assert len(rows) == int(masks.max())
    full = render_masks(_placed(source, 1, (96, 64)), 96, 4, overlap=True, ultralytics_ties=True)[0]
    np.testing.assert_array_equal(masks[0], full[:24, :16])


def _placed(source, record: int, shape: tuple[int, int]):
    from pixpool.server.augment.labels import Labels
    from pixpool.server.augment.resample import resampled_targets

    h, w = source.image(record).shape[:2]
    return Labels.from_targets(resampled_targets(source, record, 1000), w, h, (shape[1] - w) // 2, (shape[0] - h) // 2)


def test_ring_slot_holds_the_largest_shape():
    source = RectSource("detect", SHAPES, IMGSZ)
    assert ring_side(source, _settings()) == 96
    plain = StreamSettings(split="val", shuffle=False, augment=AugmentConfig(imgsz=IMGSZ, train_route=False))
    assert ring_side(source, plain) == IMGSZ


def test_a_source_without_sizes_is_refused():
    source = TaskSource("detect", SHAPES, IMGSZ)  # no original_shapes, no index
    with pytest.raises(ConfigError, match="decoded image sizes"):
        render_batch(source, _settings(), 0, 0)


def test_pixpool_train_validates_on_rect_batches():
    """``pixpool train`` attaches its validation stream with the model's stride (at least 32)."""
    from types import SimpleNamespace

    from pixpool.client.options import ClientOptions
    from pixpool.client.train.fit import _ValStream
    from pixpool.client.train.fit_config import FitConfig

    train = SimpleNamespace(settings=SimpleNamespace(rank=1, world_size=2))
    val = _ValStream(train, ClientOptions(timeout_s=10.0), FitConfig(), 320, 32, data=None)
    assert {k: val._kwargs[k] for k in ("split", "rect_stride", "rank", "world_size")} == {
        "split": "val",
        "rect_stride": 32,
        "rank": 1,
        "world_size": 2,
    }
