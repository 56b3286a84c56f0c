"""Copy-paste: the union path is byte-identical to pasting instance by instance."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.sources import ArraySource
from pixpool.server.augment import copy_paste as cp_mod
from pixpool.server.augment import render_batch, render_sample
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.digest import batch_digest
from pixpool.shared.stream.sampler import num_batches

S = 64


def paste_instance_by_instance(dest: np.ndarray, source: np.ndarray, polygons: list[np.ndarray]) -> np.ndarray:
    """The straightforward version (test only): one rasterisation and one copy per instance."""
    out = dest.copy()
    for polygon in polygons:
        mask = np.zeros(dest.shape[:2], dtype=np.uint8)
        cp_mod.rasterise(mask, polygon)
        where = mask.astype(bool)
        out[where] = source[where]
    return out


def union_mask_instance_by_instance(shape_hw: tuple[int, int], polygons: list[np.ndarray]):
    """The route's mask step done the straightforward way: one mask per instance, then their union."""
    calls.append(len(polygons))
    mask = np.zeros(shape_hw, dtype=np.uint8)
    for polygon in polygons:
        own = np.zeros(shape_hw, dtype=np.uint8)
        cp_mod.rasterise(own, polygon)
        mask |= own
    ys, xs = np.nonzero(mask)
    return mask, ((int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1) if len(xs) else None)


calls: list[int] = []


def _random_polygons(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    return [rng.uniform(-5, S + 5, (int(rng.integers(3, 9)), 2)).astype(np.float32) for _ in range(n)]


def test_union_equals_instance_by_instance_with_overlap_and_duplicates() -> None:
    rng = np.random.default_rng(0)
    for _trial in range(25):
        dest = rng.normal(0, 60, (S, S, 3)).astype(np.float32)
        source = rng.normal(0, 60, (S, S, 3)).astype(np.float32)
        polys = _random_polygons(rng, 6)
        # Overlapping (random polygons across the whole image) plus exact duplicates.
        selection = polys + [polys[0], polys[3], polys[3]]
        union = cp_mod.paste_union(dest, source, selection)
        single = paste_instance_by_instance(dest, source, selection)
        assert union.tobytes() == single.tobytes()
        assert not np.shares_memory(union, dest), "a fresh clone of the destination"
    # And it really pastes something.
    assert not np.array_equal(union, dest)


@pytest.mark.parametrize("fraction,mosaic", [(1.0, 1.0), (0.5, 1.0), (1.0, 0.0)])
def test_route_union_equals_instance_by_instance(
    fraction: float, mosaic: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Large, overlapping instances so selections overlap; mixup adds a second copy-paste.
    src = ArraySource([(64, 48), (40, 64), (64, 64), (50, 60), (64, 30), (64, 64)], S, seed=11, instances=5)
    st = StreamSettings(
        batch_size=3, seed=2, augment=AugmentConfig(imgsz=S, copy_paste=fraction, mosaic=mosaic, mixup=0.5, scale=0.2)
    )
    runs = []
    for patched in (False, True):
        if patched:
            calls.clear()
            monkeypatch.setattr(cp_mod, "union_mask", union_mask_instance_by_instance)
        out = []
        for epoch in range(3):
            for b in range(num_batches(len(src), st, epoch)):
                r = render_batch(src, st, epoch, b, keep_float=True)
                states = [render_sample(src, int(i), st, epoch)[2].state for i in r.samples]
                out.append(
                    (batch_digest(r.images, r.targets), r.targets.tobytes(), [f.tobytes() for f in r.floats], states)
                )
        runs.append(out)
    # The swapped step really ran, with overlapping selections of several instances. (The
    # kernel's in-pass paste against pasting each instance from the mirrored image is
    # test_augment_straightforward's copy-paste routes.)
    assert calls and max(calls) > 1
    assert runs[0] == runs[1]


def test_copy_paste_appends_mirrored_instances_in_order() -> None:
    src = ArraySource([(64, 64)] * 3, S, seed=5, instances=3)
    base = StreamSettings(
        batch_size=1, augment=AugmentConfig(imgsz=S, mosaic=0.0, fliplr=0.0, scale=0.0, translate=0.0)
    )
    with_cp = StreamSettings(
        batch_size=1, augment=AugmentConfig(imgsz=S, mosaic=0.0, fliplr=0.0, scale=0.0, translate=0.0, copy_paste=1.0)
    )
    pasted_any = False
    for index in range(3):
        _, plain, _ = render_sample(src, index, base, 0)
        image, labels, _ = render_sample(src, index, with_cp, 0)
        n = len(plain)
        np.testing.assert_array_equal(labels.boxes[:n], plain.boxes)  # originals first, unchanged
        extra = labels.boxes[n:]
        if len(extra):
            pasted_any = True
            # Each appended box is an original mirrored left-right.
            mirrored = np.stack([S - plain.boxes[:, 2], plain.boxes[:, 1], S - plain.boxes[:, 0], plain.boxes[:, 3]], 1)
            for box in extra:
                assert np.any(np.all(np.isclose(mirrored, box, atol=1e-4), axis=1))
    assert pasted_any


def test_copy_paste_in_place_equals_into_a_clone() -> None:
    # The route pastes into its own resample output; the bytes must be those of pasting
    # into a clone, although the mirrored window overlaps the pasted area.
    from pixpool.server.augment.labels import Labels
    from pixpool.shared.stream.records import Targets

    rng = np.random.default_rng(4)
    pasted = 0
    for trial in range(30):
        n = 4
        xy = np.sort(rng.uniform(0, 1, (n, 2, 2)), axis=1).astype(np.float32)
        boxes = np.stack([xy[:, 0, 0], xy[:, 0, 1], xy[:, 1, 0], xy[:, 1, 1]], 1)
        polys = tuple(np.stack([b[[0, 2, 2, 0]], b[[1, 1, 3, 3]]], 1).astype(np.float32) for b in boxes)
        labels = Labels.from_targets(Targets(np.arange(n, dtype=np.int32), boxes, polys), S, S)
        image = rng.normal(0, 60, (S, S, 4)).astype(np.float32)
        clone_in = image.copy()
        want, want_labels = cp_mod.copy_paste(clone_in, labels, 1.0, np.random.default_rng(trial))
        assert np.array_equal(clone_in, image), "not in place: the input is left alone"
        got, got_labels = cp_mod.copy_paste(image, labels, 1.0, np.random.default_rng(trial), in_place=True)
        assert got.tobytes() == want.tobytes() and got_labels.boxes.tobytes() == want_labels.boxes.tobytes()
        if len(got_labels) > n:
            pasted += 1
            assert got is image
    assert pasted > 5
