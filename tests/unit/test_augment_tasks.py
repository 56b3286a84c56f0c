"""The route for the segment, pose and OBB tasks: labels, rows and determinism (in process).

What a user relies on: keypoints follow their image through every step and keep their meaning
(left and right swap on a mirror), points that leave the image are marked invisible, rotated
boxes keep their direction and come out as Ultralytics' xywhr, polygons are resampled as
Ultralytics' dataset does, and a task's batch is the same bytes however it is split.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from helpers.task_sources import FLIP_IDX, KPT_SHAPE, TaskSource
from pixpool.server.augment import render_batch, render_range
from pixpool.server.augment.labels import Labels, pack, transform_labels
from pixpool.server.augment.obb import clip_rotated, xywhr
from pixpool.server.augment.resample import resample_polygons
from pixpool.server.daemon.scheduler import split
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.records import Targets
from pixpool.shared.stream.sampler import num_batches
from pixpool.shared.task import task_spec

S = 64
SHAPES = [(64, 48), (40, 64), (64, 64), (20, 64), (64, 20), (50, 50), (33, 64)]
EVERYTHING = {"degrees": 10.0, "shear": 5.0, "perspective": 0.0005, "copy_paste": 1.0, "mixup": 1.0, "flipud": 0.5}


def _interp_reference(polygon: np.ndarray, count: int) -> np.ndarray:
    """Ultralytics' resampling written out plainly with np.interp, one polygon at a time."""
    s = np.concatenate([polygon, polygon[:1]])
    xp = np.arange(len(s))
    if len(s) < count:
        x = np.linspace(0, len(s) - 1, count - len(s))
        x = np.insert(x, np.searchsorted(x, xp), xp)
    else:
        x = np.linspace(0, len(s) - 1, count)
    return np.stack([np.interp(x, xp, s[:, 0]), np.interp(x, xp, s[:, 1])], axis=1).astype(np.float32)


def test_resampling_matches_the_plain_interpolation_and_keeps_every_vertex():
    rng = np.random.default_rng(0)
    polys = [rng.uniform(0, 1, (k, 2)).astype(np.float32) for k in (3, 4, 17, 999, 1000)]
    out = resample_polygons(polys, 1000)
    for p, q in zip(polys, out):
        want = p if len(p) == 1000 else _interp_reference(p, 1000)
        assert q.shape == (1000, 2) and q.dtype == np.float32
        np.testing.assert_array_equal(q, want)
        if len(p) < 1000:
            assert {tuple(v) for v in p} <= {tuple(v) for v in q}  # corners survive
    # a record with a polygon longer than the count: every polygon gets longest + 1 points
    longer = resample_polygons([polys[0], rng.uniform(0, 1, (1200, 2)).astype(np.float32)], 1000)
    assert [len(p) for p in longer] == [1201, 1201]
    # OBB: 4 corners to 100 points
    assert resample_polygons([polys[1]], 100)[0].shape == (100, 2)
    # fewer than 3 vertices: untouched (no polygon)
    assert resample_polygons([np.zeros((0, 2), np.float32), polys[0]], 1000)[0].shape == (0, 2)


def _pose_targets(n: int, k: int, seed: int) -> Targets:
    rng = np.random.default_rng(seed)
    boxes = np.sort(rng.uniform(0, 1, (n, 2, 2)), axis=1).transpose(0, 2, 1).reshape(n, 4)[:, [0, 2, 1, 3]]
    kp = np.concatenate([rng.uniform(0, 1, (n, k, 2)), rng.integers(0, 3, (n, k, 1))], axis=2).astype(np.float32)
    return Targets(rng.integers(0, 3, n).astype(np.int32), boxes.astype(np.float32), (), kp)


def test_keypoints_are_placed_the_same_way_one_record_at_a_time_and_in_a_mosaic():
    placed = [(_pose_targets(3, 5, s), 40 + s, 30 + 2 * s, 7.0 * s, 3.0 * s) for s in range(4)]
    one = Labels.concat([Labels.from_targets(t, w, h, pw, ph) for t, w, h, pw, ph in placed])
    both = Labels.from_placed(placed)
    assert both.keypoints.tobytes() == one.keypoints.tobytes()
    t = placed[1][0]
    np.testing.assert_allclose(one.keypoints[3:6, :, 0], t.keypoints[..., 0] * 41 + 7.0, rtol=1e-6)
    np.testing.assert_array_equal(one.keypoints[..., 2], np.concatenate([p[0].keypoints[..., 2] for p in placed]))


def test_either_mirror_swaps_left_and_right_keypoints_as_ultralytics_does():
    t = _pose_targets(2, 5, 1)
    labels = Labels.from_targets(t, 100, 80)
    lr = labels.flipped(100, 80, horizontal=True, flip_idx=FLIP_IDX)
    np.testing.assert_array_equal(lr.keypoints[:, :, 0], (100 - labels.keypoints[..., 0])[:, list(FLIP_IDX)])
    np.testing.assert_array_equal(lr.keypoints[:, :, 2], labels.keypoints[:, list(FLIP_IDX), 2])
    ud = labels.flipped(100, 80, horizontal=False, flip_idx=FLIP_IDX)
    # Ultralytics' RandomFlip renumbers by flip_idx on its vertical flip too.
    np.testing.assert_array_equal(ud.keypoints[..., 1], (80 - labels.keypoints[..., 1])[:, list(FLIP_IDX)])
    np.testing.assert_array_equal(ud.keypoints[..., 2], labels.keypoints[:, list(FLIP_IDX), 2])


def test_keypoints_that_leave_the_image_become_invisible_and_are_clamped():
    kp = np.array([[[-1, 5, 2], [5, 5, 2], [70, 5, 1], [5, 64, 2]]], np.float32)
    labels = Labels(
        np.zeros(1, np.int32),
        np.array([[1, 1, 60, 60]], np.float32),
        np.zeros((0, 2), np.float32),
        np.zeros(2, np.int64),
        kp,
    )
    c = labels.clip(64, 64)
    assert c.keypoints[0, :, 2].tolist() == [0, 2, 0, 2]  # on the border (64) is inside
    assert c.keypoints[0, :, 0].tolist() == [0, 5, 64, 5]
    # through a shift of +10, +0: x = 59 and 80 leave the 64 square
    shift = np.array([[1, 0, 10], [0, 1, 0], [0, 0, 1]], np.float64)
    moved = transform_labels(labels, shift, 64, 1.0, perspective=False)
    assert moved.keypoints[0, :, 0].tolist() == [9, 15, 64, 15]
    assert moved.keypoints[0, :, 2].tolist() == [2, 2, 0, 2]
    assert labels.keypoints[0, 0, 0] == -1  # the input is not written


def test_keypoints_through_a_perspective_matrix_match_the_plain_projection():
    t = _pose_targets(4, 5, 3)
    labels = Labels.from_targets(t, 64, 64)
    m = np.array([[1.1, 0.1, 2.0], [-0.05, 0.95, 1.0], [0.0004, -0.0003, 1.0]])
    out = transform_labels(labels, m, 64, 1.0, perspective=True)
    assert len(out) == len(labels)  # boxes large enough to survive
    xy = labels.keypoints[..., :2].reshape(-1, 2).astype(np.float64)
    h = np.c_[xy, np.ones(len(xy))] @ m.T
    want = (h[:, :2] / h[:, 2:]).astype(np.float32).reshape(4, 5, 2)
    inside = (want >= 0).all(-1) & (want <= 64).all(-1)
    np.testing.assert_allclose(out.keypoints[..., :2], np.clip(want, 0, 64), atol=1e-4)
    np.testing.assert_array_equal(out.keypoints[..., 2], np.where(inside, labels.keypoints[..., 2], 0))


def test_pose_rows_carry_each_keypoint_normalised_with_its_visibility():
    t = _pose_targets(2, 5, 4)
    labels = Labels.from_targets(t, 64, 64)
    rows = pack(labels, 64, task=task_spec("pose"), keypoints=5)
    assert rows.shape == (2, 5 + 15) and task_spec("pose").target_width((5, 3)) == 6 + 15
    kp = rows[:, 5:].reshape(2, 5, 3)
    np.testing.assert_allclose(kp[..., :2], t.keypoints[..., :2], rtol=1e-6)
    np.testing.assert_array_equal(kp[..., 2], t.keypoints[..., 2])


def _square(cx: float, cy: float, half: float, angle_deg: float) -> np.ndarray:
    a = math.radians(angle_deg)
    c, s = math.cos(a), math.sin(a)
    return np.array(
        [
            (cx + dx * c - dy * s, cy + dx * s + dy * c)
            for dx, dy in ((-2 * half, -half), (2 * half, -half), (2 * half, half), (-2 * half, half))
        ],
        np.float32,
    )


def test_obb_rows_are_ultralytics_xywhr_with_the_angle_in_its_range():
    for angle in (-80.0, -30.0, 0.0, 20.0, 45.0, 89.0, 120.0):
        corners = _square(30, 32, 6, angle)
        poly = resample_polygons([corners], 100)[0]
        x = xywhr(poly, np.array([0, 100]))[0]
        assert -math.pi / 4 <= x[4] < 3 * math.pi / 4
        assert x[2] >= x[3]
        np.testing.assert_allclose(x[:4], [30, 32, 24, 12], atol=0.05)
        # the same rectangle: its direction modulo pi
        d = (x[4] - math.radians(angle)) % math.pi
        assert min(d, math.pi - d) < 1e-3


def test_an_obb_clipped_at_the_border_keeps_its_direction():
    corners = _square(4, 32, 6, 30.0)  # reaches past x = 0
    poly = resample_polygons([corners], 100)[0]
    box = np.array([[corners[:, 0].min(), corners[:, 1].min(), corners[:, 0].max(), corners[:, 1].max()]], np.float32)
    boxes, points = clip_rotated(box, poly, np.array([0, 100]), 64, 64)
    assert points.shape == (100, 2) and boxes[0, 0] == 0
    hull_area, visible = cv2.intersectConvexConvex(
        cv2.convexHull(poly), np.array([[0, 0], [64, 0], [64, 64], [0, 64]], np.float32)
    )
    np.testing.assert_allclose(boxes[0], [*visible.reshape(-1, 2).min(0), *visible.reshape(-1, 2).max(0)], atol=1e-4)
    x = xywhr(points, np.array([0, 100]))[0]
    d = (x[4] - math.radians(30.0)) % math.pi
    assert min(d, math.pi - d) < 1e-3  # clamping the vertices would have turned it
    # the rectangle bounds the visible part: shorter than the whole along its length, as tall
    assert hull_area <= x[2] * x[3] + 1e-3 and x[2] < 24 - 1 and abs(x[3] - 12) < 0.05
    # wholly outside: zeros
    gone, _ = clip_rotated(box - 100, poly - 100, np.array([0, 100]), 64, 64)
    assert gone.tolist() == [[0, 0, 0, 0]]


@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
@pytest.mark.parametrize("route", ["default", "everything", "validation"])
def test_a_task_batch_split_into_ranges_is_the_whole_batch(task, route):
    source = TaskSource(task, SHAPES, S, seed=4, instances=4)
    cfg = {"default": {}, "everything": EVERYTHING, "validation": {"train_route": False}}[route]
    st = StreamSettings(seed=9, batch_size=4, augment=AugmentConfig(imgsz=S, **cfg))
    width = task_spec(task).target_width(KPT_SHAPE if task == "pose" else None)
    for b in range(num_batches(len(source), st, 1)):
        whole = render_batch(source, st, 1, b)
        assert whole.targets.shape[1] == width
        assert (whole.masks is not None) == (task == "segment")
        for parts in (2, 3):
            pieces = [render_range(source, st, 1, b, a, z) for a, z in split(len(whole.samples), parts)]
            assert np.concatenate([p.images for p in pieces]).tobytes() == whole.images.tobytes()
            assert np.concatenate([p.targets for p in pieces]).tobytes() == whole.targets.tobytes()
            if task == "segment":
                assert np.concatenate([p.masks for p in pieces]).tobytes() == whole.masks.tobytes()
        again = render_batch(TaskSource(task, SHAPES, S, seed=4, instances=4), st, 1, b)
        assert again.targets.tobytes() == whole.targets.tobytes() and again.images.tobytes() == whole.images.tobytes()


def test_pose_targets_keep_visibility_values_and_stay_inside_the_image():
    source = TaskSource("pose", SHAPES, S, seed=5, instances=4)
    st = StreamSettings(seed=2, batch_size=7, augment=AugmentConfig(imgsz=S, **EVERYTHING))
    t = render_batch(source, st, 0, 0).targets
    assert len(t)
    kp = t[:, 6:].reshape(len(t), *KPT_SHAPE)
    assert set(np.unique(kp[..., 2]).tolist()) <= {0.0, 1.0, 2.0}
    assert (kp[..., :2] >= 0).all() and (kp[..., :2] <= 1).all()


def test_a_pose_source_without_flip_idx_is_never_flipped():
    source = TaskSource("pose", SHAPES, S, seed=5, instances=2)
    source.spec = source.spec.with_keypoints(source.kpt_shape, None)
    st = StreamSettings(
        seed=2, batch_size=7, augment=AugmentConfig(imgsz=S, mosaic=0.0, scale=0.0, translate=0.0, fliplr=1.0)
    )
    plain = StreamSettings(
        seed=2, batch_size=7, augment=AugmentConfig(imgsz=S, mosaic=0.0, scale=0.0, translate=0.0, fliplr=0.0)
    )
    assert render_batch(source, st, 0, 0).images.tobytes() == render_batch(source, plain, 0, 0).images.tobytes()


def test_detect_rows_are_unchanged_by_the_task_columns():
    """A detect source still gets 6 columns and no masks."""
    source = TaskSource("detect", SHAPES, S, seed=4)
    b = render_batch(source, StreamSettings(seed=1, batch_size=3, augment=AugmentConfig(imgsz=S)), 0, 0)
    assert b.targets.shape[1] == 6 and b.masks is None


def test_a_records_resampled_polygons_are_kept_for_reuse_and_equal_a_fresh_resampling():
    from pixpool.server.augment.resample import resampled_targets

    source = TaskSource("segment", SHAPES, S, seed=8, instances=3)
    first = resampled_targets(source, 2, 1000)
    again = resampled_targets(source, 2, 1000)
    assert again is first  # the second use is the cached one
    fresh = resample_polygons(source.targets(2).polygons, 1000)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first.polygons, fresh))
    assert all(not p.flags.writeable for p in first.polygons)
    plain = resampled_targets(source, 2, 0)  # detect/pose: the targets as they are, kept too
    assert resampled_targets(source, 2, 0) is plain
    raw = source.targets(2)
    assert plain.classes.tobytes() == np.asarray(raw.classes, np.int32).tobytes()
    assert plain.boxes.tobytes() == np.asarray(raw.boxes, np.float32).tobytes()
    assert all(a.tobytes() == np.asarray(b, np.float32).tobytes() for a, b in zip(plain.polygons, raw.polygons))
    assert not plain.boxes.flags.writeable and not np.shares_memory(plain.boxes, raw.boxes)


def test_a_cached_record_is_a_private_copy_of_the_snapshots_views(tmp_path):
    """The record cache never keeps a view of the snapshot's shared memory (which would keep
    it mapped after the snapshot is let go): every cached array owns its data."""
    from pixpool.server.augment.resample import resampled_targets

    source = TaskSource("pose", SHAPES, S, seed=3, instances=2)
    for points in (0, 100):
        got = resampled_targets(source, 1, points)
        raw = source.targets(1)
        assert not np.shares_memory(got.boxes, raw.boxes) and not np.shares_memory(got.classes, raw.classes)
        assert not any(np.shares_memory(a, b) for a in got.polygons for b in raw.polygons)
        if raw.keypoints is not None:
            assert got.keypoints.tobytes() == np.asarray(raw.keypoints, np.float32).tobytes()


def test_the_cache_of_records_that_are_not_resampled_keeps_to_its_smaller_bound(monkeypatch):
    """Every worker keeps its own record cache: for detect and pose records (nothing resampled,
    a miss costs one fetch) it holds at most ``PLAIN_CACHE_BYTES``, so a COCO-sized set does not
    cost each worker the resampled tasks' larger bound."""
    from pixpool.server.augment import resample

    monkeypatch.setattr(resample, "PLAIN_CACHE_BYTES", 3000)
    source = TaskSource("pose", SHAPES, S, seed=5, instances=2)
    for i in range(len(SHAPES)):
        resample.resampled_targets(source, i, 0)
    plain = resample._caches[source][0]
    assert plain.limit == 3000 and 0 < plain.nbytes <= 3000
    assert len(plain.entries) < len(SHAPES)  # the least recently used were dropped
    assert resample._caches[source].get(100) is None or resample._caches[source][100].limit == resample.CACHE_BYTES
