"""Sample-level jobs: every worker renders a part of the same ring slot.

Through a real daemon over the synthetic dataset (24 records): the bytes a trainer receives
are the reference pipeline's for 1, 2 and 3 workers and batch sizes that do and do not
divide by the worker count (a short last batch included), each sample once per epoch, and
a trainer's ring costs the service at most 3 batches of bytes plus 2 MiB.
"""

from __future__ import annotations

import os

import pytest

from helpers.daemon import WAIT_S, ask_status, digest_of, real_daemon, reference_stream
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.ring import DEFAULT_SLOTS, MAX_SLOTS
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 128
MIB = 1 << 20


@pytest.fixture(scope="module")
def dataset(synthetic_data):
    from pixpool.server.readers import load_dataset

    return load_dataset(synthetic_data.coco_json)


def _ring_bound(batch_size: int, imgsz: int) -> int:
    return 3 * batch_size * 3 * imgsz * imgsz + 2 * MIB


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_parity_and_exactly_once_for_any_worker_count(synthetic_data, dataset, workers):
    # 24 records: batch 5 ends with 4 (not divisible by 2 or 3), 7 with 3, 8 divides evenly.
    streams = [
        StreamSettings(seed=21, batch_size=b, augment=AugmentConfig(imgsz=IMGSZ, copy_paste=0.5, mixup=0.3))
        for b in (5, 7, 8)
    ]
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=workers) as (_, d):
        for s in streams:
            with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
                assert c.slots == DEFAULT_SLOTS == MAX_SLOTS == 3
                for epoch in (0, 1):
                    got, samples = [], []
                    for b in c.epoch(epoch):
                        got.append(digest_of(b))
                        samples.append(b.samples.tolist())
                        # Each target row's batch_index is its sample's position, rows in sample order.
                        idx = b.targets[:, 0].tolist()
                        assert idx == sorted(idx) and all(0 <= i < len(b.samples) for i in idx)
                    ref, ref_samples = reference_stream(dataset, s, epoch)
                    assert got == ref, (
                        f"batch bytes differ from the reference with {workers} workers, batch {s.batch_size}, epoch {epoch}"
                    )
                    assert samples == ref_samples
                    assert sorted(i for batch in samples for i in batch) == list(
                        range(len(dataset))
                    )  # each sample once
                if workers > 1:
                    st = ask_status(d)
                    # Every worker took parts of this trainer's batches (not one batch each).
                    assert all(w["samples_done"] > 0 for w in st["workers"])
        st = ask_status(d)
    delivered = 2 * 3 * len(dataset)  # three streams, two epochs each
    assert sum(w["samples_done"] for w in st["workers"]) == delivered, "a sample was rendered twice (or not at all)"
    assert (
        sum(w["parts_done"] for w in st["workers"]) > sum(2 * -(-len(dataset) // s.batch_size) for s in streams)
        or workers == 1
    )


def test_ring_per_trainer_is_three_batches_plus_2_mib(coco128):
    """The ring the daemon creates at batch 16 / 640 on coco128 (the densest image sizes the
    target rows), with every multiplier of target rows on: mosaic, copy-paste, mixup."""
    data = coco128 / "annotations" / "instances_train2017.json"
    s = StreamSettings(seed=0, batch_size=16, augment=AugmentConfig(imgsz=640, copy_paste=0.5, mixup=0.5))
    with (
        real_daemon(data, imgsz=640, workers=2) as (_, d),
        Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as one,
        Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as two,
    ):
        st = ask_status(d)
        rings = {t["ring"]: t["ring_nbytes"] for t in st["trainers"]}
        assert len(rings) == 2 and len({one.layout, two.layout}) == 1
        for name, nbytes in rings.items():
            assert os.stat(DEFAULT.path(name)).st_size == nbytes
            assert nbytes <= _ring_bound(16, 640), (
                f"ring {name} of {nbytes} bytes is over 3 batches + 2 MiB ({_ring_bound(16, 640)})"
            )
            assert nbytes >= 3 * 16 * 3 * 640 * 640  # it really holds three whole batches
        assert st["snapshot"]["max_instances"] > 10  # a real dataset's densest image sized the rows
        batch = next(one.epoch(0))
        assert len(batch.samples) == 16


def test_a_ring_of_more_than_three_slots_is_refused_by_name(synthetic_data):
    from pixpool.shared.errors import ConfigError

    s = StreamSettings(seed=1, batch_size=2, augment=AugmentConfig(imgsz=IMGSZ))
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        with pytest.raises(ConfigError, match="slots 4 is out of range; use 2 to 3") as err:
            Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, slots=4))
        assert err.value.field == "slots"
