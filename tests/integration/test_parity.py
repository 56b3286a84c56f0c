"""Byte parity: the snapshot path and the reference path render the very same samples.

Snapshot path: ``prepare_snapshot`` then the route over its read-only shared-memory
views, for each snapshot dtype (uint8, the default, and float32). Reference path:
``ReferenceSource`` decodes, resizes and centres per call.
Compared: float image bytes before quantisation, packed targets, generator state.
"""

from __future__ import annotations

import numpy as np
import pytest

from pixpool.server.augment import render_batch, render_sample
from pixpool.server.augment.labels import pack
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
from pixpool.server.snapshot.reference import ReferenceSource
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.digest import batch_digest
from pixpool.shared.stream.sampler import num_batches

ROUTES = {
    "mosaic": {},
    "no_mosaic": {"mosaic": 0.0},
    "copy_paste": {"copy_paste": 0.5, "degrees": 5.0},
    "mixup_perspective": {"mixup": 0.5, "copy_paste": 1.0, "perspective": 0.0005, "flipud": 0.5},
}


DTYPES = ("uint8", "float32")  # every parity test runs on both snapshots


def _both_paths(dataset, imgsz: int, dtype: str):
    """(snapshot, reference) over ``dataset``; the snapshot is removed after if this made it."""
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=imgsz, processes=1, dtype=dtype))
    assert result.snapshot.dtype == dtype
    try:
        yield result.snapshot, ReferenceSource(dataset, imgsz)
    finally:
        result.snapshot.close()
        if not result.reused:
            result.snapshot.unlink()


@pytest.fixture(scope="module", params=DTYPES)
def synthetic(synthetic_data, request):
    yield from _both_paths(load_dataset(synthetic_data.coco_json), 128, request.param)


@pytest.fixture(scope="module", params=DTYPES)
def coco(coco128, request):
    yield from _both_paths(load_dataset(coco128 / "annotations" / "instances_train2017.json"), 288, request.param)


def _assert_same_sample(snap, ref, index: int, st: StreamSettings, epoch: int) -> None:
    f1, l1, g1 = render_sample(snap, index, st, epoch)
    f2, l2, g2 = render_sample(ref, index, st, epoch)
    assert f1.dtype == np.float32 and f1.shape == (st.augment.imgsz, st.augment.imgsz, 3)
    assert f1.tobytes() == f2.tobytes(), f"float image of record {index} differs"
    size = st.augment.imgsz
    assert pack(l1, size).tobytes() == pack(l2, size).tobytes(), f"targets of record {index} differ"
    assert [p.tobytes() for p in l1.polygons] == [p.tobytes() for p in l2.polygons]
    assert g1.state == g2.state


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_synthetic_parity_every_record(synthetic, name: str) -> None:
    snap, ref = synthetic
    st = StreamSettings(seed=7, batch_size=8, augment=AugmentConfig(imgsz=128, **ROUTES[name]))
    for index in range(len(snap)):
        _assert_same_sample(snap, ref, index, st, epoch=1)


def test_synthetic_batches_identical_and_snapshot_unchanged(synthetic) -> None:
    snap, ref = synthetic
    st = StreamSettings(seed=1, batch_size=8, augment=AugmentConfig(imgsz=128, copy_paste=0.5, mixup=0.2))
    before = snap.checksum()
    for b in range(num_batches(len(snap), st, 0)):  # one whole epoch
        a = render_batch(snap, st, 0, b)
        r = render_batch(ref, st, 0, b)
        assert batch_digest(a.images, a.targets) == batch_digest(r.images, r.targets)
        np.testing.assert_array_equal(a.samples, r.samples)
    assert snap.checksum() == before


def test_synthetic_validation_parity(synthetic) -> None:
    snap, ref = synthetic
    st = StreamSettings(batch_size=24, shuffle=False, augment=AugmentConfig(imgsz=128, train_route=False))
    a, r = render_batch(snap, st, 0, 0, keep_float=True), render_batch(ref, st, 0, 0, keep_float=True)
    assert [f.tobytes() for f in a.floats] == [f.tobytes() for f in r.floats]
    assert a.targets.tobytes() == r.targets.tobytes()


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_coco128_parity(coco, name: str) -> None:
    snap, ref = coco
    st = StreamSettings(seed=3, augment=AugmentConfig(imgsz=288, **ROUTES[name]))
    for index in (0, 17, 42, 127):
        _assert_same_sample(snap, ref, index, st, epoch=0)


def test_coco128_snapshot_unchanged_by_an_epoch(coco) -> None:
    snap, _ = coco
    st = StreamSettings(seed=3, batch_size=32, augment=AugmentConfig(imgsz=288, copy_paste=0.5))
    before = snap.checksum()
    for b in range(num_batches(len(snap), st, 0)):
        render_batch(snap, st, 0, b)
    assert snap.checksum() == before


def _digest_in_child(snapshot, settings_dict: dict, epoch: int, batch: int) -> str:
    from pixpool.server.augment import render_batch as render
    from pixpool.shared.stream.config import StreamSettings as Settings
    from pixpool.shared.stream.digest import batch_digest as digest

    r = render(snapshot, Settings.from_dict(settings_dict), epoch, batch)
    return digest(r.images, r.targets)


def test_spawned_process_renders_the_same_bytes(synthetic) -> None:
    # The snapshot travels as its name and re-attaches read-only in the child; the bytes
    # depend on (seed, epoch, index) only, not on the process that renders them.
    import concurrent.futures
    import multiprocessing

    snap, ref = synthetic
    st = StreamSettings(seed=9, batch_size=6, augment=AugmentConfig(imgsz=128, copy_paste=0.5, mixup=0.3))
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        futures = [pool.submit(_digest_in_child, snap, st.to_dict(), 2, b) for b in (2, 0)]
        child = [f.result(timeout=120) for f in futures]
    local = []
    for b in (2, 0):
        r = render_batch(ref, st, 2, b)
        local.append(batch_digest(r.images, r.targets))
    assert child == local
