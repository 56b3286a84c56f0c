"""Parity and determinism of the segment, pose and OBB streams with the real route.

Integration tests: the reference path (``ReferenceSource``, decode per call), float32 and uint8
snapshots rendered in this process, and real daemons (spawned, 1 to 3 workers, the real route)
must give the very same batches: images, target rows with their keypoint and angle columns, and
mask planes, byte for byte, with rotation, shear, perspective, copy-paste (both modes), mixup and
cutmix on. The sets are ``pixpool synth --task T`` (12 images) and, for segment, coco128's real
``labels-seg`` where ../shared is present. Beyond equality, what a trainer reads from a batch is
checked against the route's own per-instance masks: plane values, order, and the rows they number.
Every snapshot, ring and process made here is removed (``helpers.daemon``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import pickle
import signal
from pathlib import Path

import numpy as np
import pytest

from helpers.daemon import WAIT_S, ask_status, digest_of, real_daemon, reference_stream, wait_for
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.server.augment import render_batch
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
from pixpool.server.snapshot.reference import ReferenceSource
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.digest import batch_digest

IMGSZ = 160
SIDE = IMGSZ // 4  # mask_ratio 4, Ultralytics' default
RECORDS = 12  # 12 synthetic images, batches of 6: two batches per epoch
BATCH = 6
TASKS = ("segment", "pose", "obb")
MODES = ("flip", "mixup")  # copy_paste_mode
# Every geometric and mixing step of the route on, at rates that make them happen in two batches.
ROUTE = {
    "degrees": 10.0,
    "shear": 2.0,
    "perspective": 0.0005,
    "copy_paste": 0.5,
    "mixup": 0.3,
    "cutmix": 0.3,
    "flipud": 0.3,
}


def _settings(task: str, mode: str, *, seed: int = 5, batch_size: int = BATCH, **more) -> StreamSettings:
    return StreamSettings(
        seed=seed + TASKS.index(task),
        batch_size=batch_size,
        augment=AugmentConfig(imgsz=IMGSZ, copy_paste_mode=mode, **{**ROUTE, **more}),
    )


@pytest.fixture(scope="module")
def task_sets(tmp_path_factory) -> dict[str, Path]:
    """data.yaml of ``pixpool synth --task T`` per task, written once for this file."""
    from pixpool.server.synthetic import write_synthetic

    root = tmp_path_factory.mktemp("task-sets")
    return {t: Path(write_synthetic(root / t, num_images=RECORDS, seed=0, task=t).data_yaml) for t in TASKS}


@pytest.fixture(scope="module")
def datasets(task_sets):
    return {t: load_dataset(task_sets[t], task=t) for t in TASKS}


class _Snapshots:
    """One snapshot per (task, dtype), prepared on first use, held for the whole module (a daemon
    on the same set and dtype re-attaches it instead of decoding again) and removed at its end."""

    def __init__(self) -> None:
        self.made: dict[tuple[str, str], object] = {}

    def get(self, key: str, dataset, dtype: str):
        if (key, dtype) not in self.made:
            options = PrepareOptions(imgsz=IMGSZ, task=dataset.task, dtype=dtype, processes=1)
            result = prepare_snapshot(dataset, options)
            self.made[(key, dtype)] = (result.snapshot, result.reused)
        return self.made[(key, dtype)][0]

    def close(self) -> None:
        for snapshot, reused in self.made.values():
            snapshot.close()
            if not reused:
                snapshot.unlink()


@pytest.fixture(scope="module")
def snapshots():
    made = _Snapshots()
    yield made
    made.close()


@pytest.fixture(scope="module")
def reference(datasets):
    """``reference(task, mode)``: the reference path's batches of epoch 0 (cached)."""
    cache: dict[tuple[str, str], list] = {}

    def batches(task: str, mode: str) -> list:
        if (task, mode) not in cache:
            source = ReferenceSource(datasets[task], IMGSZ)
            s = _settings(task, mode)
            cache[(task, mode)] = [render_batch(source, s, 0, b) for b in range(RECORDS // BATCH)]
        return cache[(task, mode)]

    return batches


def _assert_same(got_images, got_targets, got_masks, want, task: str, what: str) -> None:
    """One delivered batch equals the reference's, column group by column group."""
    got_images, got_targets = np.asarray(got_images), np.asarray(got_targets)
    np.testing.assert_array_equal(got_images, want.images, err_msg=f"{what}: images")
    assert got_targets.dtype == np.float32 and got_targets.shape == want.targets.shape, what
    np.testing.assert_array_equal(got_targets[:, :6], want.targets[:, :6], err_msg=f"{what}: index, class, box")
    if task == "pose":
        np.testing.assert_array_equal(got_targets[:, 6:], want.targets[:, 6:], err_msg=f"{what}: keypoint columns")
    if task == "obb":
        np.testing.assert_array_equal(got_targets[:, 6], want.targets[:, 6], err_msg=f"{what}: angle column")
    if task == "segment":
        got_masks = np.asarray(got_masks)
        assert got_masks.shape == want.masks.shape == (len(want.samples), SIDE, SIDE), what
        np.testing.assert_array_equal(got_masks, want.masks, err_msg=f"{what}: mask planes")
    else:
        assert got_masks is None and want.masks is None, f"{what}: a {task} batch carries no masks"


# -- 1. reference == snapshots (float32, uint8) == daemons of 1, 2, 3 workers ------------------


@pytest.mark.parametrize("task", TASKS)
def test_reference_float32_and_uint8_snapshots_render_the_same_batches(task, datasets, snapshots, reference):
    for mode in MODES:
        want = reference(task, mode)
        s = _settings(task, mode)
        for dtype in ("float32", "uint8"):
            snap = snapshots.get(task, datasets[task], dtype)
            for b, w in enumerate(want):
                got = render_batch(snap, s, 0, b)
                _assert_same(got.images, got.targets, got.masks, w, task, f"{task} {mode} {dtype} batch {b}")
                np.testing.assert_array_equal(got.samples, w.samples)
    # Each mixing step really ran in these batches: the stream without it differs.
    source = ReferenceSource(datasets[task], IMGSZ)
    flip = [batch_digest(w.images, w.targets, w.masks) for w in reference(task, "flip")]
    steps = ("cutmix", "mixup", "copy_paste") if task != "pose" else ("cutmix", "mixup")  # pose has no polygons
    for step in steps:
        without = [render_batch(source, _settings(task, "flip", **{step: 0.0}), 0, b) for b in range(len(flip))]
        assert [batch_digest(w.images, w.targets, w.masks) for w in without] != flip, f"{step} changed nothing"


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("task", TASKS)
def test_daemon_delivers_the_reference_batches_for_any_worker_count(
    task, workers, task_sets, datasets, snapshots, reference
):
    """Both copy-paste modes through one daemon (3 workers: on a uint8 snapshot); the arrays
    compared, then their digests."""
    dtype = "uint8" if workers == 3 else "float32"  # the snapshot's dtype changes no byte either
    snapshots.get(task, datasets[task], dtype)  # the daemon re-attaches it
    with real_daemon(task_sets[task], imgsz=IMGSZ, workers=workers, task=task, dtype=dtype) as (_, d):
        for mode in MODES:
            s = _settings(task, mode)
            want = reference(task, mode)
            with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as c:
                assert c.task == task
                if task == "pose":
                    assert (c.kpt_shape, c.flip_idx) == ((5, 3), (0, 2, 1, 4, 3))
                seen = []
                for b in c.epoch(0):
                    w = want[b.batch]
                    _assert_same(b.images, b.targets, b.masks, w, task, f"{workers} workers, {mode}, batch {b.batch}")
                    assert digest_of(b) == batch_digest(w.images, w.targets, w.masks)
                    seen.extend(b.samples.tolist())
            assert sorted(seen) == list(range(RECORDS))  # each sample exactly once
        st = ask_status(d)
    assert sum(w["samples_done"] for w in st["workers"]) == 2 * RECORDS  # two streams, nothing rendered twice
    if workers > 1:
        assert all(w["samples_done"] > 0 for w in st["workers"]), "every worker rendered parts of the batches"


# -- coco128's real segment labels --------------------------------------------------------------


@pytest.fixture(scope="module")
def coco128_segment(coco128, tmp_path_factory) -> Path:
    """coco128's images with its ``labels-seg`` in the YOLO layout (symlinks: the copy is read-only)."""
    if not (coco128 / "labels-seg" / "train2017").is_dir():
        pytest.skip(f"coco128's segment labels not found at {coco128 / 'labels-seg'}")
    root = tmp_path_factory.mktemp("coco128-seg")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    (root / "images" / "train2017").symlink_to(coco128 / "images" / "train2017")
    (root / "labels" / "train2017").symlink_to(coco128 / "labels-seg" / "train2017")
    return root / "images" / "train2017"


def test_coco128_labels_seg_reference_snapshot_and_daemon_agree(coco128_segment, snapshots):
    """Real polygons (up to hundreds of vertices, many instances per image): two batches of 4 of
    each copy-paste mode, the same from the reference, the snapshot and a daemon of 2 workers."""
    dataset = load_dataset(coco128_segment, task="segment")
    snap = snapshots.get("coco128", dataset, "float32")
    ref = ReferenceSource(dataset, IMGSZ)
    streams = [_settings("segment", mode, batch_size=4) for mode in MODES]
    want = {m: [render_batch(ref, s, 0, b) for b in range(2)] for m, s in zip(MODES, streams)}
    for mode, s in zip(MODES, streams):
        for b in range(2):
            got = render_batch(snap, s, 0, b)
            _assert_same(got.images, got.targets, got.masks, want[mode][b], "segment", f"coco128 {mode} batch {b}")
            _check_segment_batch(got, ref, s, 0, b)
    assert max(int(w.masks.max()) for ws in want.values() for w in ws) > 10  # dense images really came by
    with real_daemon(coco128_segment, imgsz=IMGSZ, workers=2, task="segment") as (_, d):
        for mode, s in zip(MODES, streams):
            with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as c:
                batches = c.epoch(0)
                for b in range(2):
                    got = next(batches)
                    assert got.batch == b
                    _assert_same(got.images, got.targets, got.masks, want[mode][b], "segment", f"daemon {mode} {b}")
                batches.close()


# -- 2. what a trainer reads from a batch: masks against rows, keypoints, angles ----------------


def _check_segment_batch(batch, source, settings: StreamSettings, epoch: int, index: int) -> None:
    """The overlap planes number each image's rows 1..n: plane j is row j's instance where no
    later (smaller) instance covers it, rows in descending order of their full mask's area, each
    full mask within its row's box. The full masks are the route's own per-instance planes of
    the same batch (``overlap_mask=False``), matched to the rows by their values."""
    per = render_batch(source, dataclasses.replace(settings, augment=_no_overlap(settings.augment)), epoch, index)
    assert per.masks.shape == (len(per.targets), SIDE, SIDE) and per.masks.dtype == np.uint8
    assert per.targets.shape == batch.targets.shape
    for i in range(len(batch.samples)):
        rows = batch.targets[batch.targets[:, 0] == i]
        full = per.masks[per.targets[:, 0] == i]
        unmatched = {k: per.targets[per.targets[:, 0] == i][k].tobytes() for k in range(len(rows))}
        order = []
        for row in rows:  # the planes' rows are the per-instance rows reordered
            k = next(k for k, v in unmatched.items() if v == row.tobytes())
            order.append(k)
            del unmatched[k]
        plane = batch.masks[i]
        assert int(plane.max(initial=0)) <= len(rows), f"image {i}: a plane value over its {len(rows)} rows"
        areas = [int(np.count_nonzero(full[k])) for k in order]
        assert areas == sorted(areas, reverse=True), f"image {i}: instances not numbered by descending area"
        expect = np.zeros_like(plane)
        for j, k in enumerate(order, start=1):
            expect[full[k] > 0] = j
        np.testing.assert_array_equal(plane, expect, err_msg=f"batch {index} image {i}: plane vs instances")
        for j, row in enumerate(rows, start=1):
            ys, xs = np.nonzero(full[order[j - 1]])
            if not len(xs):
                continue
            cx, cy, w, h = (float(v) * SIDE for v in row[2:6])
            # one mask pixel of slack: the mask is drawn at 1/mask_ratio, the box at full size
            assert xs.min() >= cx - w / 2 - 1.5 and xs.max() <= cx + w / 2 + 1.5, f"image {i} row {j}: x outside box"
            assert ys.min() >= cy - h / 2 - 1.5 and ys.max() <= cy + h / 2 + 1.5, f"image {i} row {j}: y outside box"
        visible = [int(np.count_nonzero(plane == j)) for j in range(1, len(rows) + 1)]
        assert sum(v > 0 for v in visible) >= (len(rows) + 1) // 2, f"image {i}: most instances are covered"


def _no_overlap(cfg: AugmentConfig) -> AugmentConfig:
    return dataclasses.replace(cfg, overlap_mask=False)


@pytest.mark.parametrize("mode", MODES)
def test_segment_planes_number_the_rows_as_ultralytics_format_does(mode, datasets, reference):
    ref = ReferenceSource(datasets["segment"], IMGSZ)
    batches = reference("segment", mode)
    for b, batch in enumerate(batches):
        assert batch.masks.dtype == np.uint8
        _check_segment_batch(batch, ref, _settings("segment", mode), 0, b)
    assert sum(len(batch.targets) for batch in batches) > 2 * BATCH  # instances enough to overlap


@pytest.mark.parametrize("mode", MODES)
def test_pose_keypoint_columns_are_points_in_the_image_or_invisible(mode, reference):
    for batch in reference("pose", mode):
        t = batch.targets
        assert t.shape[1] == 6 + 5 * 3
        kpt = t[:, 6:].reshape(-1, 5, 3)
        assert set(np.unique(kpt[..., 2]).tolist()) <= {0.0, 1.0, 2.0}
        seen = kpt[..., 2] > 0
        assert seen.any() and (kpt[..., 2] == 0).any()
        inside = (kpt[..., 0] >= 0) & (kpt[..., 0] <= 1) & (kpt[..., 1] >= 0) & (kpt[..., 1] <= 1)
        assert inside[seen].all(), "a visible keypoint outside the image (Ultralytics makes it invisible)"


@pytest.mark.parametrize("mode", MODES)
def test_obb_angle_columns_are_radians_of_the_longer_side(mode, reference):
    for batch in reference("obb", mode):
        t = batch.targets
        assert t.shape[1] == 7 and len(t)
        angle = t[:, 6]
        assert np.all(angle >= -math.pi / 4) and np.all(angle < 3 * math.pi / 4)
        assert np.all(t[:, 4] >= t[:, 5]) and np.all(t[:, 5] > 0), "w is the longer side, h > 0"
        assert len(np.unique(np.round(angle, 3))) > len(t) // 2  # real angles, not one constant


# -- 3. a worker SIGKILLed mid-part ------------------------------------------------------------


@pytest.mark.parametrize("task", ["segment", "pose"])
def test_worker_killed_mid_part_still_delivers_the_reference_epoch_once(
    task, task_sets, datasets, snapshots, tmp_path, monkeypatch
):
    """The first worker to render position 0 of batch 1 hangs there (``helpers.stuck_renderer``:
    the real route otherwise) and is SIGKILLed by the test while batch 0 is held: its part is
    rendered again, the other worker's part is not, and every batch is the reference's."""
    marker = tmp_path / "stuck"
    monkeypatch.setenv("PIXPOOL_TEST_STUCK_MARKER", str(marker))
    s = _settings(task, "mixup", seed=31, batch_size=4)  # 3 batches, parts of 2 with 2 workers
    snapshots.get(task, datasets[task], "float32")
    ref, ref_samples = reference_stream(datasets[task], s, 0)
    options = {"job_timeout_s": 600.0, "straggler_min_s": 600.0}  # only the test's SIGKILL ends the hang
    with real_daemon(
        task_sets[task], imgsz=IMGSZ, workers=2, task=task, renderer="helpers.stuck_renderer", **options
    ) as (_, d):
        got, samples, victim = [], [], None
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as c:
            for b in c.epoch(0):
                got.append(digest_of(b))
                samples.append(b.samples.tolist())
                if victim is None:
                    victim = int(wait_for(lambda: marker.exists() and marker.read_text(), what="a worker stuck"))
                    os.kill(victim, signal.SIGKILL)
        st = ask_status(d)
    assert got == ref and samples == ref_samples
    assert st["daemon"]["worker_restarts"] == 1 and st["daemon"]["redispatched_jobs"] == 0
    assert victim not in [w["pid"] for w in st["workers"]]
    assert sum(w["samples_done"] for w in st["workers"]) == RECORDS, "only the killed part was rendered again"


# -- 4. pixpool digest --task on the wrong set ---------------------------------------------------


def test_digest_with_another_task_names_the_label_file_and_line(task_sets, tmp_path, capsys):
    """A segment set read as pose (its data.yaml given a kpt_shape): the reader refuses the first
    label line, naming the file, the line and what a pose line holds; no digest is printed."""
    import shutil

    from pixpool.cli import main

    root = tmp_path / "seg-as-pose"
    shutil.copytree(task_sets["segment"].parent, root)
    data = root / "data.yaml"
    data.write_text(data.read_text() + "\nkpt_shape: [5, 3]\nflip_idx: [0, 2, 1, 4, 3]\n")
    argv = ["digest", str(data), "--task", "pose", "--imgsz", str(IMGSZ), "--batch-size", "4", "--reference"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    first = min((root / "labels" / "train").iterdir())
    assert f"{first}:1:" in err and "pose lines have 5 + 5 x 3 = 20 fields" in err, err
    assert "--task segment" in err and out == ""
    assert main([*argv[:3], "segment", *argv[4:]]) == 0  # the right task digests the same files


# -- 5. attach()'s batches keep their masks through a DataLoader's utilities ----------------------


def test_attach_segment_batches_keep_masks_through_collection_utilities(task_sets, datasets, snapshots, reference):
    torch = pytest.importorskip("torch")
    from torch.utils.data._utils.collate import default_convert
    from torch.utils.data._utils.pin_memory import pin_memory

    from pixpool.client import attach
    from pixpool.client.batch import Batch

    snapshots.get("segment", datasets["segment"], "float32")
    s = _settings("segment", "flip")
    want = reference("segment", "flip")
    with real_daemon(task_sets["segment"], imgsz=IMGSZ, workers=1, task="segment") as (_, d):
        for zero_copy in (True, False):
            with attach(d, settings=s, timeout_s=WAIT_S, zero_copy=zero_copy) as loader:
                assert loader.task == "segment"
                batches = iter(loader)  # held: a zero-copy batch is valid while its iterator is
                b = next(batches)
                expect = torch.from_numpy(want[b.batch].masks)
                assert isinstance(b.masks, torch.Tensor) and torch.equal(b.masks, expect)
                rebuilt = {
                    "default_convert": default_convert(b),
                    "by type": type(b)(*b),
                    "_replace": b._replace(targets=b.targets * 1),
                    "copy": copy.copy(b),
                    "deepcopy": copy.deepcopy(b),
                    "pickle": pickle.loads(pickle.dumps(b)),
                    # pin_memory's rebuild (pinning itself needs CUDA): numpy elements are left as they are
                    "pin_memory": pin_memory(b._replace(images=b.images.numpy(), targets=b.targets.numpy())),
                }
                for how, r in rebuilt.items():
                    assert isinstance(r, Batch), how
                    assert torch.equal(torch.as_tensor(r.masks), expect), f"masks lost by {how}"
                    assert np.asarray(r.indices).tolist() == np.asarray(b.indices).tolist(), how
                    assert (r.epoch, r.batch) == (b.epoch, b.batch), how
                if torch.cuda.is_available():
                    assert torch.equal(pin_memory(b).masks, expect)
                batches.close()
