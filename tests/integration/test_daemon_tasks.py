"""Each task's targets and masks through a real daemon: ring, workers, delivery, client, digest.

Integration tests (spawned daemon and workers) over the synthetic dataset's snapshot, served
as another task's source (``helpers.task_daemon``) with a stand-in route
(``helpers.task_renderer``) that writes rows of the task's width and, for segment, a mask
plane per sample. What a trainer gets must be exactly what that route made for the whole
batch in this process: in place and as frames, with 1 and 2 workers (a batch split between
them), and across a worker killed mid-part. The real route's bytes for each task are the
parity tests' (``test_parity.py``); this file holds the wire to the route's output.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from helpers import task_renderer
from helpers.daemon import WAIT_S, ask_status, wait_for
from helpers.task_daemon import task_daemon
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream import sampler
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.digest import batch_digest
from pixpool.shared.task import task_spec
from pixpool.shared.wire.trainer import DELIVERY_FRAMES, DELIVERY_SHM

IMGSZ = 64
RENDERER = "helpers.task_renderer"
POSE = {"kpt_shape": (5, 3), "flip_idx": (1, 0, 2, 4, 3)}


class _Expected:
    """The one thing the stand-in route reads of a source: its length, imgsz and task."""

    def __init__(self, records: int, task: str, kpt_shape=None, flip_idx=None):
        self.records, self.imgsz, self.task = records, IMGSZ, task
        self.kpt_shape, self.flip_idx = kpt_shape, flip_idx
        self.spec = task_spec(task, kpt_shape=kpt_shape, flip_idx=flip_idx)

    def __len__(self) -> int:
        return self.records


def _settings(seed: int, batch_size: int = 5, **augment) -> StreamSettings:
    return StreamSettings(seed=seed, batch_size=batch_size, augment=AugmentConfig(imgsz=IMGSZ, **augment))


def _check_epoch(client: Client, source: _Expected, settings: StreamSettings, epoch: int = 0) -> int:
    """Every batch of ``epoch`` equals the route's whole-batch render; returns the rows seen."""
    lay = client.layout
    rows = 0
    seen = []
    for b in client.epoch(epoch):
        images, targets, samples, masks = task_renderer.expected_batch(
            source, settings, epoch, b.batch, lay.mask_side, lay.mask_dtype
        )
        np.testing.assert_array_equal(b.samples, samples)
        np.testing.assert_array_equal(np.asarray(b.images), images)
        assert b.targets.shape == targets.shape and b.targets.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(b.targets), targets)
        if masks is None:
            assert b.masks is None
        else:
            assert b.masks.shape == masks.shape and b.masks.dtype == np.dtype(lay.mask_dtype)
            np.testing.assert_array_equal(np.asarray(b.masks), masks)
        rows += len(targets)
        seen.extend(b.samples.tolist())
    assert sorted(seen) == list(range(len(source)))  # each sample exactly once
    return rows


@pytest.fixture(scope="module")
def records(synthetic_data):
    from pixpool.server.readers import load_dataset

    return len(load_dataset(synthetic_data.coco_json))


@pytest.mark.parametrize("workers", [1, 2])
def test_segment_rows_and_mask_planes_arrive_as_rendered_in_place_and_as_frames(
    synthetic_data, records, workers, tmp_path
):
    s = _settings(3, mask_ratio=4)
    source = _Expected(records, "segment")
    with task_daemon(synthetic_data.coco_json, task="segment", workers=workers, renderer=RENDERER) as (_, d):
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as client:
            assert client.delivery == DELIVERY_SHM
            assert (client.task, client.kpt_shape, client.flip_idx) == ("segment", None, None)
            lay = client.layout
            assert (lay.target_width, lay.mask_side, lay.mask_dtype) == (6, IMGSZ // 4, "uint8")
            trainer = ask_status(d)["trainers"][0]
            assert trainer["ring_nbytes"] == lay.nbytes and trainer["ring_mask_nbytes"] == 3 * 5 * 16 * 16
            assert _check_epoch(client, source, s) > 0
        elsewhere = tmp_path / "not-the-store"
        elsewhere.mkdir()
        with Client.connect(
            s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False, store=elsewhere)
        ) as client:
            assert client.delivery == DELIVERY_FRAMES and client._ring is None
            _check_epoch(client, source, s, epoch=1)


@pytest.mark.parametrize("task, width", [("pose", 6 + 3 * 5), ("obb", 7)])
def test_pose_and_obb_rows_arrive_at_their_width_and_mask_settings_are_ignored(
    synthetic_data, records, task, width, tmp_path, capsys
):
    """A pose or obb daemon: rows of 21 / 7 columns, no mask planes (a stream asking for
    per-instance planes or another mask ratio is not refused: it has no masks)."""
    meta = POSE if task == "pose" else {}
    s = _settings(5, overlap_mask=False, mask_ratio=8)
    source = _Expected(records, task, **meta)
    with task_daemon(synthetic_data.coco_json, task=task, workers=2, renderer=RENDERER, **meta) as (_, d):
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as client:
            assert client.task == task
            assert (client.kpt_shape, client.flip_idx) == (meta.get("kpt_shape"), meta.get("flip_idx"))
            assert (client.layout.target_width, client.layout.mask_side) == (width, 0)
            assert ask_status(d)["trainers"][0]["ring_mask_nbytes"] == 0
            assert _check_epoch(client, source, s) > 0
        elsewhere = tmp_path / "not-the-store"
        elsewhere.mkdir()
        with Client.connect(
            s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False, store=elsewhere)
        ) as client:
            assert client.delivery == DELIVERY_FRAMES
            _check_epoch(client, source, s)
        # pixpool's own detector trains on 6-column rows: it points to Ultralytics instead.
        from pixpool.cli import main

        argv = ["train", "--socket-dir", d, "--imgsz", str(IMGSZ), "--batch-size", "5", "--max-steps", "1"]
        assert main([*argv, "--project", str(tmp_path / "run")]) == 1
        err = capsys.readouterr().err
        assert f"serves the {task} task (rows of {width})" in err and f"pixpool yolo train task={task}" in err


def test_segment_stream_without_overlap_mask_is_refused_at_attach(synthetic_data):
    with task_daemon(synthetic_data.coco_json, task="segment", workers=1, renderer=RENDERER) as (_, d):
        with pytest.raises(ConfigError) as info:
            Client.connect(_settings(1, overlap_mask=False), ClientOptions(socket_dir=d, timeout_s=WAIT_S))
        assert "overlap_mask" in str(info.value) and "one mask plane per image" in str(info.value)
        assert info.value.field == "overlap_mask"
        assert ask_status(d)["trainers"] == []  # nothing was attached


def test_int32_planes_where_a_sample_may_number_more_than_255_instances(synthetic_data, records, monkeypatch):
    """A per-sample bound over 255 makes the ring's planes int32, and values over 255 arrive."""
    monkeypatch.setenv("PIXPOOL_TEST_ROWS_BOUND", "300")
    monkeypatch.setenv("PIXPOOL_TEST_MASK_MAX", "1000")
    s = _settings(9, batch_size=4)
    source = _Expected(records, "segment")
    with (
        task_daemon(synthetic_data.coco_json, task="segment", workers=2, renderer=RENDERER) as (_, d),
        Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as client,
    ):
        assert client.layout.mask_dtype == "int32" and client.layout.per_sample == 300
        batches = client.epoch(0)  # held: the batch is a view of its slot while its iterator is
        b = next(batches)
        assert b.masks.dtype == np.int32 and int(b.masks.max()) > 255
        batches.close()
        _check_epoch(client, source, s)


@pytest.mark.parametrize("fault", ["killed", "straggler"])
def test_a_worker_lost_mid_part_is_rerun_and_the_epoch_arrives_exactly_once(
    synthetic_data, records, tmp_path, monkeypatch, fault
):
    """The worker rendering position 0 of batch 1 scribbles over its part of the slot's images
    (and the planes it was handed) and hangs: SIGKILLed by the test (``killed``), or given to
    the other worker as a straggler and killed by the daemon once that one's part is in
    (``straggler``). Either way the trainer gets exactly the route's batches, every sample of
    the epoch once."""
    marker = tmp_path / "hung-worker"
    monkeypatch.setenv("PIXPOOL_TEST_HANG_MARKER", str(marker))
    s = _settings(13)
    source = _Expected(records, "segment")
    options = {"straggler_min_s": 1.0} if fault == "straggler" else {"straggler_min_s": 600.0}
    with task_daemon(synthetic_data.coco_json, task="segment", workers=2, renderer=RENDERER, **options) as (_, d):
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as client:
            lay = client.layout
            seen = []
            for b in client.epoch(0):
                if b.batch == 0:  # batch 1 renders meanwhile into a free slot: its worker hangs
                    wait_for(marker.exists, what="a worker hung in batch 1")
                    if fault == "killed":
                        os.kill(int(marker.read_text()), signal.SIGKILL)
                images, targets, samples, masks = task_renderer.expected_batch(
                    source, s, 0, b.batch, lay.mask_side, lay.mask_dtype
                )
                np.testing.assert_array_equal(b.samples, samples)
                np.testing.assert_array_equal(b.images, images)
                np.testing.assert_array_equal(b.targets, targets)
                np.testing.assert_array_equal(b.masks, masks)
                seen.extend(b.samples.tolist())
        st = ask_status(d)
    assert sorted(seen) == list(range(records))
    assert st["daemon"]["worker_restarts"] == 1
    assert st["daemon"]["redispatched_jobs"] == (1 if fault == "straggler" else 0)
    assert sampler.num_batches(records, s, 0) >= 3


def test_digest_and_loader_of_a_segment_daemon(synthetic_data, records):
    """``pixpool digest``'s daemon path hashes the masks with the rows; ``attach()``'s batches
    carry the planes as ``masks`` (a view of the slot with ``zero_copy``, else their own),
    which survive a rebuild by type; the loader names the task."""
    torch = pytest.importorskip("torch")
    from pixpool.cli.digest import daemon_digests
    from pixpool.client import attach

    s = _settings(21)
    source = _Expected(records, "segment")
    with task_daemon(synthetic_data.coco_json, task="segment", workers=2, renderer=RENDERER) as (_, d):
        got = daemon_digests(s, 0, 2, ClientOptions(socket_dir=d, timeout_s=WAIT_S))
        want, without_masks = [], []
        for b in range(2):
            images, targets, _, masks = task_renderer.expected_batch(source, s, 0, b, 16)
            want.append(batch_digest(images, targets, masks))
            without_masks.append(batch_digest(images, targets))
        assert got == want
        assert not set(got) & set(without_masks)  # the planes are in the digest
        for zero_copy in (True, False):
            with attach(d, settings=s, timeout_s=WAIT_S, zero_copy=zero_copy) as loader:
                assert (loader.task, loader.kpt_shape, loader.flip_idx) == ("segment", None, None)
                batches = iter(loader)  # held: a zero-copy batch is valid while its iterator is
                b = next(batches)
                _, _, _, masks = task_renderer.expected_batch(source, s, b.epoch, b.batch, 16)
                assert isinstance(b.masks, torch.Tensor) and b.masks.shape == (5, 16, 16)
                assert torch.equal(b.masks, torch.from_numpy(masks))
                assert torch.equal(type(b)(*b).masks, b.masks)
                ring = loader.client._ring
                assert np.shares_memory(b.masks.numpy(), ring._buf) == zero_copy
