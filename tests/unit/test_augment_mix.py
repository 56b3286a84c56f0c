"""CutMix and copy-paste from a partner (``copy_paste_mode="mixup"``): the kernel's pastes, the
label steps, and the route's determinism for every task."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.task_sources import TaskSource
from pixpool.server.augment import kernel, render_batch, render_range
from pixpool.server.augment.copy_paste import select_partner
from pixpool.server.augment.cutmix import CANDIDATES, clip_to_rectangle, cut_labels, draw_rectangles, rectangle_mask
from pixpool.server.augment.kernel import IDENTITY, Layer
from pixpool.server.augment.labels import Labels
from pixpool.server.daemon.scheduler import split
from pixpool.shared.stream.config import FILL_VALUE, AugmentConfig, StreamSettings
from pixpool.shared.stream.sampler import num_batches
from pixpool.shared.task import task_spec

S = 64


def _layer(seed: int, *, turned: bool = False) -> Layer:
    img = np.random.default_rng(seed).uniform(-114, 141, (S, S, 3)).astype(np.float32)
    inv = IDENTITY
    if turned:  # a small rotation: the general map path
        c, s = np.cos(0.1), np.sin(0.1)
        inv = kernel.inverse(np.array([[c, s, -2.0], [-s, c, 3.0], [0, 0, 1.0]]))
    return Layer(inv, [(img, (0, 0, S, S), (0, 0))], None)


def _floats(layers: list[Layer], ratio: float = 0.0) -> np.ndarray:
    out = np.empty((S, S, 3), np.float32)
    kernel.render(S, layers, ratio=ratio, floats=out)
    return out


@pytest.mark.parametrize("turned", [False, True])
def test_a_pasted_layer_replaces_the_values_exactly_under_its_mask(turned):
    a, b = _layer(1, turned=turned), _layer(2, turned=not turned)
    mask = np.zeros((S, S), np.uint8)
    mask[5:20, 7:31] = 1
    mask[40, 3] = 1
    pasted = Layer(a.inverse, a.tiles, None, [(mask, b)])
    got, want_a, want_b = _floats([pasted]), _floats([a]), _floats([b])
    on = mask.astype(bool)
    assert got[on].tobytes() == want_b[on].tobytes()
    assert got[~on].tobytes() == want_a[~on].tobytes()
    # quantised output agrees with the floats' quantisation
    out = np.empty((3, S, S), np.uint8)
    kernel.render(S, [pasted], out=out)
    q = np.clip(np.rint(got), 0, 255).astype(np.uint8)
    assert out.tobytes() == np.ascontiguousarray(q[..., ::-1].transpose(2, 0, 1)).tobytes()


def test_pastes_apply_after_the_mirror_mask_and_in_order_and_under_mixup_in_both_layers():
    a, b, c = _layer(1), _layer(2), _layer(3)
    mirror = np.zeros((S, S), np.uint8)
    mirror[:, :10] = 1
    first = np.zeros((S, S), np.uint8)
    first[0:30, 0:30] = 1
    second = np.zeros((S, S), np.uint8)
    second[20:40, 20:40] = 1
    layer = Layer(a.inverse, a.tiles, mirror, [(first, b), (second, c)])
    got = _floats([layer])
    mirrored = _floats([Layer(a.inverse, a.tiles, mirror)])
    want = np.where(second[..., None] == 1, _floats([c]), np.where(first[..., None] == 1, _floats([b]), mirrored))
    assert got.tobytes() == want.tobytes()
    # mixup with a cut pasted into both layers: the step-6 blend of the pasted value with itself
    r = float(np.float32(0.4))
    both = _floats([Layer(a.inverse, a.tiles, None, [(second, c)]), Layer(b.inverse, b.tiles, None, [(second, c)])], r)
    p = _floats([c]) - np.float32(FILL_VALUE)
    blend = (p + np.float32(FILL_VALUE)) * np.float32(r) + (p + np.float32(FILL_VALUE)) * (
        np.float32(1) - np.float32(r)
    )
    on = second.astype(bool)
    assert both[on].tobytes() == blend[on].tobytes()


def test_cutmix_rectangles_are_drawn_as_ultralytics_draws_them():
    rng = np.random.default_rng(7)
    rects = draw_rectangles(rng, 640)
    assert rects.shape == (CANDIDATES, 4)
    again = np.random.default_rng(7)
    for x1, y1, x2, y2 in rects:
        cut = int(640 * np.sqrt(1.0 - again.beta(1.0, 1.0)))
        cx, cy = int(again.integers(0, 640)), int(again.integers(0, 640))
        assert (x1, y1, x2, y2) == tuple(
            float(np.clip(v, 0, 640)) for v in (cx - cut // 2, cy - cut // 2, cx + cut // 2, cy + cut // 2)
        )


def _box_labels(boxes, polygons: bool = True) -> Labels:
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    n = len(boxes)
    pts = (
        np.concatenate([b[[0, 1, 2, 1, 2, 3, 0, 3]].reshape(4, 2) for b in boxes])
        if polygons and n
        else np.zeros((0, 2), np.float32)
    )
    offsets = np.arange(n + 1, dtype=np.int64) * (4 if polygons else 0)
    return Labels(np.arange(n, dtype=np.int32), boxes, pts.astype(np.float32), offsets)


def test_cutmix_takes_a_rectangle_clear_of_the_sample_and_the_partner_instances_inside_it_clipped():
    own = _box_labels([[0, 0, 4, 4]])
    partner = _box_labels([[10, 10, 40, 40], [44, 44, 47, 47], [0, 0, 3, 3]])
    for seed in range(40):
        labels, rect = cut_labels(own, partner, S, task_spec("segment"), np.random.default_rng(seed))
        if rect is None:
            assert len(labels) == 1
            continue
        x1, y1, x2, y2 = rect
        assert not (x1 < 4 and y1 < 4 and x2 > 0 and y2 > 0)  # clear of the sample's box
        added = labels.select(np.arange(1, len(labels)))
        assert len(added) >= 1
        assert (added.boxes[:, [0, 2]] >= x1).all() and (added.boxes[:, [0, 2]] <= x2).all()
        assert (added.points[:, 1] >= y1).all() and (added.points[:, 1] <= y2).all()
    # every candidate overlaps the sample's box: nothing is pasted
    everywhere = _box_labels([[0, 0, S, S]])
    labels, rect = cut_labels(everywhere, partner, S, task_spec("segment"), np.random.default_rng(0))
    assert rect is None and len(labels) == 1


def test_cutmix_keypoints_outside_the_rectangle_become_invisible():
    lab = _box_labels([[5, 5, 30, 30]], polygons=False)
    lab.keypoints = np.array([[[6, 6, 2], [25, 25, 2], [29, 8, 1]]], np.float32)
    out = clip_to_rectangle(lab, 0, 0, 20, 20, task_spec("pose"))
    assert out.keypoints[0, :, 2].tolist() == [2, 0, 0]
    assert out.boxes.tolist() == [[5, 5, 20, 20]]
    assert rectangle_mask(8, (1, 2, 3, 5)).sum() == 2 * 3


def test_partner_instances_are_pasted_where_they_overlap_the_sample_least():
    own = _box_labels([[0, 0, 20, 20]])
    partner = _box_labels([[0, 0, 10, 10], [15, 15, 30, 30], [30, 30, 40, 40], [35, 0, 45, 8]])
    # over own box area 400: 100/400 = 0.25, 25/400 = 0.06, 0, 0 -> all eligible, least overlap first
    assert select_partner(own, partner, 1.0).tolist() == [2, 3, 1, 0]
    assert select_partner(own, partner, 0.5).tolist() == [2, 3]
    # a partner instance covering 30 % or more of any own box is not pasted (over the own box's area)
    big = _box_labels([[0, 0, 30, 30], [50, 50, 52, 52]])
    assert select_partner(own, big, 1.0).tolist() == [1]
    assert select_partner(own, _box_labels([[0, 0, 9, 9]], polygons=False), 1.0).tolist() == []  # no polygon


MIXES = {
    "cutmix": {"cutmix": 1.0},
    "cutmix_mixup": {"cutmix": 1.0, "mixup": 1.0, "degrees": 5.0},
    "copy_paste_mixup": {"copy_paste": 1.0, "copy_paste_mode": "mixup"},
    "all": {"copy_paste": 0.5, "copy_paste_mode": "mixup", "cutmix": 0.5, "mixup": 0.5, "shear": 3.0},
}


@pytest.mark.parametrize("task", ["detect", "segment", "pose", "obb"])
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_mixed_batches_are_deterministic_and_split_into_ranges_byte_for_byte(task, mix):
    shapes = [(64, 40), (40, 64), (64, 64), (20, 64), (64, 20), (33, 64), (64, 30)]
    source = TaskSource(task, shapes, S, seed=6, instances=3)
    st = StreamSettings(seed=4, batch_size=4, augment=AugmentConfig(imgsz=S, **MIXES[mix]))
    width = task_spec(task).target_width(source.kpt_shape)
    for b in range(num_batches(len(source), st, 2)):
        whole = render_batch(source, st, 2, b)
        assert whole.targets.shape[1] == width
        pieces = [render_range(source, st, 2, b, a, z) for a, z in split(len(whole.samples), 3)]
        assert np.concatenate([p.images for p in pieces]).tobytes() == whole.images.tobytes()
        assert np.concatenate([p.targets for p in pieces]).tobytes() == whole.targets.tobytes()
        if whole.masks is not None:
            assert np.concatenate([p.masks for p in pieces]).tobytes() == whole.masks.tobytes()
        again = render_batch(TaskSource(task, shapes, S, seed=6, instances=3), st, 2, b)
        assert again.images.tobytes() == whole.images.tobytes() and again.targets.tobytes() == whole.targets.tobytes()


def test_cutmix_changes_the_stream_only_when_it_is_on():
    source = TaskSource("segment", [(64, 40), (40, 64), (64, 64), (20, 64)], S, seed=6, instances=3)
    off = render_batch(source, StreamSettings(seed=4, batch_size=4, augment=AugmentConfig(imgsz=S)), 0, 0)
    on = render_batch(source, StreamSettings(seed=4, batch_size=4, augment=AugmentConfig(imgsz=S, cutmix=1.0)), 0, 0)
    assert off.images.tobytes() != on.images.tobytes()
