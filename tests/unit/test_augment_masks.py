"""Segment masks: the windowed renderer equals the full-size definition, the plane numbers
instances by area as Ultralytics' trainer expects, and the rows follow that order."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from helpers.task_sources import TaskSource
from pixpool.server.augment import render_batch, render_range
from pixpool.server.augment.labels import Labels
from pixpool.server.augment.masks import render_masks
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings


def _full_size(polygons: list[np.ndarray], size: int, ratio: int) -> tuple[np.ndarray, np.ndarray]:
    """The definition, straightforwardly: every instance filled at S, resized whole, sorted by
    area (stable), numbered in that order with later ones on top."""
    side = size // ratio
    ms = []
    for p in polygons:
        full = np.zeros((size, size), np.uint8)
        if len(p):
            cv2.fillPoly(full, [np.asarray(p, np.float32).astype(np.int32)], 1)
        ms.append(cv2.resize(full, (side, side), interpolation=cv2.INTER_LINEAR))
    areas = np.array([int(m.sum()) for m in ms], np.int64)  # signed: -area of an unsigned sum would wrap
    order = np.argsort(-areas, kind="stable")
    plane = np.zeros((side, side), np.int32)
    for rank, i in enumerate(order, start=1):
        np.maximum(plane, ms[i].astype(np.int32) * rank, out=plane)
    return plane, order


def _labels(polygons: list[np.ndarray]) -> Labels:
    n = len(polygons)
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = np.cumsum([len(p) for p in polygons])
    pts = np.concatenate(polygons).astype(np.float32) if n else np.zeros((0, 2), np.float32)
    return Labels(np.arange(n, dtype=np.int32), np.zeros((n, 4), np.float32), pts, offsets)


def _random_polygons(rng: np.random.Generator, size: int, n: int) -> list[np.ndarray]:
    out = []
    for _ in range(n):
        c = rng.uniform(0, size, 2)
        r = rng.uniform(0.5, size / 3)
        k = int(rng.integers(3, 60))
        t = np.sort(rng.uniform(0, 2 * np.pi, k))
        rad = r * rng.uniform(0.3, 1.0, k)
        p = np.stack([c[0] + rad * np.cos(t), c[1] + rad * np.sin(t)], 1)
        out.append(np.clip(p, 0, size).astype(np.float32))  # the route clips vertices to [0, S]
    return out


@pytest.mark.parametrize("size,ratio", [(640, 4), (64, 4), (96, 2), (96, 3), (64, 1), (100, 8), (70, 4)])
def test_windowed_masks_equal_the_full_size_definition(size, ratio):
    rng = np.random.default_rng(size * 31 + ratio)
    for trial in range(12):
        polygons = _random_polygons(rng, size, int(rng.integers(0, 14)))
        plane, order = render_masks(_labels(polygons), size, ratio, overlap=True)
        want, want_order = _full_size(polygons, size, ratio)
        assert plane.dtype == np.uint8 and plane.shape == (size // ratio, size // ratio)
        assert plane.tobytes() == want.astype(np.uint8).tobytes(), (size, ratio, trial)
        assert order.tolist() == want_order.tolist()
        per, ident = render_masks(_labels(polygons), size, ratio, overlap=False)
        assert per.shape == (len(polygons), size // ratio, size // ratio) and ident.tolist() == list(
            range(len(polygons))
        )
        for i, p in enumerate(polygons):
            full = np.zeros((size, size), np.uint8)
            cv2.fillPoly(full, [p.astype(np.int32)], 1)
            assert per[i].tobytes() == cv2.resize(full, (size // ratio,) * 2, interpolation=cv2.INTER_LINEAR).tobytes()


def test_resampled_polygons_with_repeated_pixels_give_the_full_size_masks():
    """1000 points on small and large outlines: most truncate to a pixel the previous one had."""
    from pixpool.server.augment.resample import resample_polygons

    rng = np.random.default_rng(5)
    for _trial in range(6):
        polygons = resample_polygons(_random_polygons(rng, 640, 12), 1000)
        polygons = [np.clip(p * np.float32(rng.uniform(0.05, 1.0)), 0, 640) for p in polygons]
        plane, order = render_masks(_labels(polygons), 640, 4, overlap=True)
        want, want_order = _full_size(polygons, 640, 4)
        assert plane.tobytes() == want.astype(np.uint8).tobytes() and order.tolist() == want_order.tolist()


def test_the_largest_instance_is_one_and_a_small_one_lies_on_top():
    big = np.array([[0, 0], [60, 0], [60, 60], [0, 60]], np.float32)
    small = np.array([[20, 20], [30, 20], [30, 30], [20, 30]], np.float32)
    plane, order = render_masks(_labels([small, big]), 64, 4, overlap=True)
    assert order.tolist() == [1, 0]  # rows must follow: the big one first
    assert plane[1, 1] == 1 and plane[6, 6] == 2


def test_more_than_255_instances_need_an_int32_plane():
    polys = [
        np.array([[i % 64, i // 64], [i % 64 + 1, i // 64], [i % 64 + 1, i // 64 + 1]], np.float32) for i in range(300)
    ]
    plane, _ = render_masks(_labels(polys), 64, 1, overlap=True)
    assert plane.dtype == np.int32
    with pytest.raises(ValueError, match="uint8 mask plane holds at most 255 instances, got 300"):
        render_masks(_labels(polys), 64, 1, overlap=True, out=np.zeros((64, 64), np.uint8))


S = 64
SHAPES = [(64, 48), (40, 64), (64, 64), (20, 64), (64, 20), (50, 50)]


def _segment_settings(**over) -> StreamSettings:
    return StreamSettings(seed=3, batch_size=6, augment=AugmentConfig(imgsz=S, **over))


def test_segment_batches_carry_a_mask_per_image_numbered_by_its_rows():
    source = TaskSource("segment", SHAPES, S, seed=1, instances=5)
    b = render_batch(source, _segment_settings(degrees=10.0, copy_paste=0.5, mixup=0.5), 0, 0)
    assert b.masks.shape == (6, S // 4, S // 4) and b.masks.dtype == np.uint8
    for i in range(6):
        rows = b.targets[b.targets[:, 0] == i]
        assert b.masks[i].max() <= len(rows)
        # each row's polygon, rendered alone, has the area its number covers or more (smaller ones lie on top)
        areas = [np.count_nonzero(b.masks[i] == j + 1) for j in range(len(rows))]
        assert sum(areas) == np.count_nonzero(b.masks[i])
    # the segments follow the rows' order: segment j is row j's polygon
    segs = b.segments
    for row, seg in zip(b.targets, segs):
        if len(seg):
            cx, cy = (seg[:, 0].min() + seg[:, 0].max()) / 2, (seg[:, 1].min() + seg[:, 1].max()) / 2
            assert abs(cx - row[2]) < 1e-5 and abs(cy - row[3]) < 1e-5


def test_masks_go_into_the_given_planes_in_place_and_per_instance_planes_are_refused_there():
    source = TaskSource("segment", SHAPES, S, seed=1, instances=5)
    st = _segment_settings()
    whole = render_batch(source, st, 0, 0)
    for dtype in (np.uint8, np.int32):
        out = np.full((6, S // 4, S // 4), 9, dtype)
        part = render_range(source, st, 0, 0, 2, 5, masks_out=out[2:5])
        assert np.shares_memory(part.masks, out) and part.masks.dtype == dtype
        assert np.array_equal(out[2:5], whole.masks[2:5]) and (out[:2] == 9).all()
    with pytest.raises(ConfigError, match="overlap_mask=False"):
        render_range(source, _segment_settings(overlap_mask=False), 0, 0, 0, 2, masks_out=out[:2])
    with pytest.raises(ConfigError, match=r"masks_out must be uint8 or int32 \(>= 2, 16, 16\)"):
        render_range(source, st, 0, 0, 0, 2, masks_out=np.zeros((2, 8, 8), np.uint8))
    per = render_batch(source, _segment_settings(overlap_mask=False), 0, 0)
    assert per.masks.shape == (len(per.targets), S // 4, S // 4)
    assert per.masks.max() <= 1


def test_mask_ratio_sets_the_plane_side():
    source = TaskSource("segment", SHAPES, S, seed=1, instances=2)
    assert render_batch(source, _segment_settings(mask_ratio=2), 0, 0).masks.shape == (6, 32, 32)
