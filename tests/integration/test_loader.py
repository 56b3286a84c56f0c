"""``attach()``: code written against a DataLoader runs unchanged; ranks get disjoint shards.

Integration tests: a spawned daemon over the synthetic set; the two-rank test runs each rank
in a spawned process with ``RANK``/``WORLD_SIZE`` set, as ``torchrun`` would.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from helpers.daemon import WAIT_S, ask_status, real_daemon, reference_stream
from pixpool.client import attach
from pixpool.client.loader import distributed_rank
from pixpool.server.readers import load_dataset
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.digest import batch_digest

IMGSZ = 96


def fit(loader, sampler, epochs: int) -> list[tuple[int, int, int]]:
    """A plain loop as written against torch's DataLoader: len, set_epoch, tuple unpacking."""
    seen = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        n = 0
        for images, targets in loader:
            assert images.dtype == torch.uint8 and images.dim() == 4 and images.shape[1] == 3
            assert targets.dtype == torch.float32 and targets.shape[1] == 6
            n += 1
        assert n == len(loader)
        seen.append((epoch, n, images.shape[0]))
    return seen


class _Tiny(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.zeros(3, IMGSZ, IMGSZ, dtype=torch.uint8), torch.zeros(1, 6)


def _collate(items):
    return torch.stack([a for a, _ in items]), torch.cat([b for _, b in items])


def test_a_dataloader_loop_runs_unchanged(synthetic_data):
    sampler = DistributedSampler(_Tiny(), num_replicas=1, rank=0)
    torch_seen = fit(DataLoader(_Tiny(), batch_size=8, sampler=sampler, collate_fn=_collate), sampler, 2)
    dataset = load_dataset(synthetic_data.coco_json)
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        with attach(d, batch_size=8, seed=3, imgsz=IMGSZ, mosaic=0.5, timeout_s=WAIT_S) as loader:
            assert loader.names == list(dataset.names) and loader.num_classes == len(dataset.names)
            assert (loader.rank, loader.world_size) == (0, 1)
            assert fit(loader, loader, 2) == torch_seen  # same loop, same counts and shapes
            loader.set_epoch(1)
            batches = list(loader)
            files = [r.image_path for r in dataset.records]
            assert all(b.files == [files[i] for i in b.indices.tolist()] and b.epoch == 1 for b in batches)
            digests = [batch_digest(b.images.numpy(), b.targets.numpy()) for b in batches]
            again = [batch_digest(b.images.numpy(), b.targets.numpy()) for b in loader]  # no set_epoch: the next epoch
    s = StreamSettings(seed=3, batch_size=8, augment=AugmentConfig(imgsz=IMGSZ, mosaic=0.5))
    assert digests == reference_stream(dataset, s, 1)[0]
    assert again == reference_stream(dataset, s, 2)[0]


def _rank(rank: int, socket_dir: str, queue) -> None:
    import os

    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), "2"
    try:
        with attach(socket_dir, batch_size=5, seed=11, imgsz=IMGSZ, timeout_s=WAIT_S) as loader:
            loader.set_epoch(0)
            queue.put(
                (rank, loader.rank, loader.world_size, len(loader), [i for b in loader for i in b.indices.tolist()])
            )
    except Exception as exc:  # reported to the test
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}", 0, []))


def _run_ranks(target, args_of) -> list:
    """Run ``target(*args_of(rank), queue)`` for ranks 0 and 1 in spawned processes; their reports, sorted."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(r), queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        return sorted(queue.get(timeout=WAIT_S) for _ in procs)
    finally:
        for p in procs:
            p.join(WAIT_S)


def test_two_ranks_from_the_environment_get_disjoint_shards_covering_the_epoch(synthetic_data):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=2) as (_, d):
        got = _run_ranks(_rank, lambda r: (r, d))
    assert [g[1:3] for g in got] == [(0, 2), (1, 2)], got
    shards = [set(g[4]) for g in got]
    assert all(len(g[4]) == 12 and g[3] == 3 for g in got)  # 24 records, 2 ranks: 12 each in batches of 5
    assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(24))


def test_rank_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed_rank() == (3, 4)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match="RANK='x'"):
        distributed_rank()
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert distributed_rank() == (0, 1)


def test_an_unknown_augmentation_setting_is_named(synthetic_data):
    with pytest.raises(ConfigError, match="unknown field.*'mosiac'"):
        attach("/nonexistent", imgsz=IMGSZ, mosiac=1.0)


def test_a_data_yaml_daemon_serves_its_val_split(synthetic_data):
    # The synthetic data.yaml names val: (the same images): one snapshot serves both splits.
    dataset = load_dataset(synthetic_data.data_yaml, split="val")
    with real_daemon(synthetic_data.data_yaml, imgsz=IMGSZ, workers=1) as (_, d):
        st = ask_status(d)
        assert set(st["splits"]) == {"train", "val"} and st["splits"]["val"]["name"] == st["splits"]["train"]["name"]
        with attach(d, batch_size=8, imgsz=IMGSZ, split="val", timeout_s=WAIT_S) as val:
            assert len(val) == 3
            got = [batch_digest(b.images.numpy(), b.targets.numpy()) for b in val]
            order = [i for b in val for i in b.indices.tolist()]
    s = StreamSettings(batch_size=8, shuffle=False, split="val", augment=AugmentConfig(imgsz=IMGSZ, train_route=False))
    assert got == reference_stream(dataset, s, 0)[0]  # the letterboxed validation route, in dataset order
    assert order == list(range(24))


def test_a_val_split_must_be_served_to_be_asked_for(synthetic_data):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        assert set(ask_status(d)["splits"]) == {"train"}
        with pytest.raises(ConfigError, match="serves no 'val' split.*--val"):
            attach(d, imgsz=IMGSZ, split="val", timeout_s=WAIT_S)
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, val=str(synthetic_data.coco_json)) as (_, d):
        with attach(d, batch_size=12, imgsz=IMGSZ, split="val", timeout_s=WAIT_S) as val:
            assert sum(len(b.indices) for b in val) == 24


def _dist_rank(rank: int, port: int, socket_dir: str, queue) -> None:
    import datetime
    import os

    import torch.distributed as dist

    for name in ("RANK", "WORLD_SIZE"):  # only the initialised group may tell the rank here
        os.environ.pop(name, None)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
    )
    try:
        with attach(socket_dir, batch_size=6, seed=2, imgsz=IMGSZ, timeout_s=WAIT_S) as loader:
            queue.put((loader.rank, loader.world_size, [i for b in loader for i in b.indices.tolist()]))
    except Exception as exc:  # reported to the test
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


def test_ranks_from_an_initialised_torch_distributed_group(synthetic_data):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        got = _run_ranks(_dist_rank, lambda r: (r, port, d))
    assert [g[:2] for g in got] == [(0, 2), (1, 2)], got
    assert not set(got[0][2]) & set(got[1][2]) and set(got[0][2]) | set(got[1][2]) == set(range(24))


def _ring_span(loader) -> tuple[int, int]:
    """[start, end) addresses of the trainer's mapped ring."""
    buf = loader.client._ring._buf  # the whole segment, as one uint8 array
    return buf.ctypes.data, buf.ctypes.data + buf.nbytes


def test_batches_a_user_keeps_stay_valid(synthetic_data):
    """Fault class 9: ``list(loader)`` over an epoch (12 batches through a ring of 3 slots)
    equals the batches got one by one and the reference, byte for byte, and a batch kept
    from ``next(iter(loader))`` across a whole epoch's loop is unchanged at the end."""
    dataset = load_dataset(synthetic_data.coco_json)
    s = StreamSettings(seed=5, batch_size=2, augment=AugmentConfig(imgsz=IMGSZ, mosaic=0.5))
    ref = {e: reference_stream(dataset, s, e) for e in (0, 1)}
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        with attach(d, batch_size=2, seed=5, imgsz=IMGSZ, mosaic=0.5, timeout_s=WAIT_S, slots=3) as loader:
            loader.set_epoch(0)
            one_by_one = [(batch_digest(b.images.numpy(), b.targets.numpy()), b.indices.tolist()) for b in loader]
            loader.set_epoch(0)
            kept = list(loader)
            loader.set_epoch(1)
            images, targets = first = next(iter(loader))
            first_bytes = (images.numpy().tobytes(), targets.numpy().tobytes(), first.indices.tolist())
            loader.set_epoch(1)
            through = [batch_digest(b.images.numpy(), b.targets.numpy()) for b in loader]
            lo, hi = _ring_span(loader)
            in_ring = [lo <= b.images.data_ptr() < hi for b in kept]
    assert len(kept) == 12 == len(one_by_one)
    assert [(batch_digest(b.images.numpy(), b.targets.numpy()), b.indices.tolist()) for b in kept] == one_by_one
    assert [dg for dg, _ in one_by_one] == ref[0][0] and [ix for _, ix in one_by_one] == ref[0][1]
    assert (images.numpy().tobytes(), targets.numpy().tobytes(), first.indices.tolist()) == first_bytes
    assert batch_digest(images.numpy(), targets.numpy()) == ref[1][0][0] == through[0]
    assert through == ref[1][0]
    # Kept batches are the user's whatever their memory: the first two are lent ring slots
    # (client/flow.py: at most slots - 1 out at once, so the workers keep one), the rest copies.
    assert in_ring == [True, True] + [False] * 10, "at most slots - 1 kept batches may be lent slots"


def test_a_loop_gets_lent_slots_and_a_derived_tensor_keeps_its_slot(synthetic_data):
    """A plain ``for batch in loader`` loop gets every batch as a lent ring slot (no copy), with
    the reference's bytes; a tensor derived from the first batch (``images[0]``), kept after the
    batch itself is dropped, keeps that slot out of the workers' reach: unchanged after the epoch."""
    dataset = load_dataset(synthetic_data.coco_json)
    s = StreamSettings(seed=6, batch_size=2, augment=AugmentConfig(imgsz=IMGSZ))
    ref = reference_stream(dataset, s, 0)
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        with attach(d, batch_size=2, seed=6, imgsz=IMGSZ, timeout_s=WAIT_S) as loader:
            lo, hi = _ring_span(loader)
            got, in_ring = [], []
            for b in loader:
                got.append((batch_digest(b.images.numpy(), b.targets.numpy()), b.indices.tolist()))
                in_ring.append(lo <= b.images.data_ptr() < hi)
            loader.set_epoch(0)
            again, row = [], None
            for b in loader:
                again.append((batch_digest(b.images.numpy(), b.targets.numpy()), b.indices.tolist()))
                if row is None:
                    row = b.images[0]
                    row_bytes = row.numpy().tobytes()
            assert lo <= row.data_ptr() < hi
            assert row.numpy().tobytes() == row_bytes
    assert [dg for dg, _ in got] == ref[0] and [ix for _, ix in got] == ref[1]
    assert again == got
    assert all(in_ring), "a loop that drops each batch gets lent slots, not copies"


def test_the_zero_copy_opt_in_yields_ring_views_valid_until_the_next_batch(synthetic_data):
    """``attach(zero_copy=True)``: each batch is a view of a ring slot (no copy), with the
    reference's bytes while it is the current batch."""
    dataset = load_dataset(synthetic_data.coco_json)
    s = StreamSettings(seed=6, batch_size=2, augment=AugmentConfig(imgsz=IMGSZ))
    ref = reference_stream(dataset, s, 0)
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        with attach(d, batch_size=2, seed=6, imgsz=IMGSZ, timeout_s=WAIT_S, zero_copy=True) as loader:
            lo, hi = _ring_span(loader)
            got, in_ring = [], []
            for b in loader:
                got.append((batch_digest(b.images.numpy(), b.targets.numpy()), b.indices.tolist()))
                in_ring.append(lo <= b.images.data_ptr() < hi)
    assert [dg for dg, _ in got] == ref[0] and [ix for _, ix in got] == ref[1]
    assert all(in_ring), "zero_copy=True must hand out the slot itself"
