"""Snapshots per task: prepare -> attach -> targets equal to the reader's records (keypoints for
pose, polygons for segment and obb), the reference source equal to the snapshot, the task
settings in the header, another --task another snapshot, and the memory report's figures."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from helpers.snapshot import remove_snapshot
from helpers.task_sets import KPT_FLIP, coco_pose_set, yolo_set
from pixpool.cli import main
from pixpool.ops import accounting as accountant
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.fingerprint import lineage_of
from pixpool.server.snapshot.handle import Snapshot, read_header
from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
from pixpool.server.snapshot.reference import ReferenceSource
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import DEFAULT_SNAPSHOT_DTYPE
from pixpool.shared.task import task_spec
from pixpool.shared.transport.names import snapshot_parts
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 64


def _pose_set(root):
    lines = [
        (
            "0 0.5 0.5 0.4 0.4 0.5 0.4 2 0.55 0.38 2 0.45 0.38 1 0.6 0.4 0 0.4 0.41 2\n"
            "0 0.2 0.3 0.2 0.3 0.2 0.2 1 0.22 0.19 2 0.18 0.19 2 0 0 0 0.15 0.2 1\n"
        ),
        "",
        "0 0.7 0.7 0.2 0.2 0.7 0.65 2 0.72 0.64 2 0.68 0.64 2 0.75 0.66 1 0.65 0.66 1\n",
    ]
    return yolo_set(root, lines, names=("person",), kpt_shape=[5, 3], flip_idx=list(KPT_FLIP))


def _segment_set(root):
    lines = ["1 0.1 0.2 0.5 0.2 0.3 0.6\n2 0.6 0.6 0.9 0.6 0.9 0.9 0.6 0.9\n", "0 0.2 0.2 0.8 0.2 0.5 0.9 0.1 0.5\n"]
    return yolo_set(root, lines)


def _obb_set(root):
    lines = [
        "2 0.3 0.1 0.6 0.3 0.4 0.6 0.1 0.4\n0 0.5 0.5 0.9 0.5 0.9 0.7 0.5 0.7\n",
        "",
        "1 0.2 0.2 0.4 0.2 0.4 0.4 0.2 0.4\n",
    ]
    return yolo_set(root, lines)


SETS = {"pose": _pose_set, "segment": _segment_set, "obb": _obb_set}


def _assert_targets_equal(a, b):
    assert np.array_equal(a.classes, b.classes) and np.array_equal(a.boxes, b.boxes)
    assert len(a.polygons) == len(b.polygons)
    assert all(np.array_equal(p, q) and p.dtype == q.dtype for p, q in zip(a.polygons, b.polygons))
    if a.keypoints is None or b.keypoints is None:
        assert a.keypoints is None and b.keypoints is None
    else:
        assert a.keypoints.dtype == b.keypoints.dtype == np.float32 and np.array_equal(a.keypoints, b.keypoints)


@pytest.mark.parametrize("task", sorted(SETS))
def test_round_trip_per_task(task, tmp_path, prepared):
    dataset = load_dataset(SETS[task](tmp_path), task=task)
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, task=task, processes=1))
    prepared.append(result)
    assert result.task == task and result.as_dict()["task"] == task
    # A second handle attaches by name, read-only, as a worker does.
    with Snapshot.attach(result.snapshot.name) as snap:
        reference = ReferenceSource(dataset, IMGSZ)
        assert snap.task == reference.task == task
        assert snap.kpt_shape == reference.kpt_shape == ((5, 3) if task == "pose" else None)
        assert snap.flip_idx == reference.flip_idx == (KPT_FLIP if task == "pose" else None)
        for i, record in enumerate(dataset.records):
            targets = snap.targets(i)
            _assert_targets_equal(targets, reference.targets(i))
            _assert_targets_equal(targets, record_targets(record))
            assert snap.dtype == "uint8"  # the default: the pixel, which the reference centres
            assert np.array_equal(
                np.subtract(snap.image(i), np.float32(snap.fill), dtype=np.float32), reference.image(i)
            )
            if task == "pose":
                assert targets.keypoints.shape == (record.num_instances, 5, 3)
                with pytest.raises(ValueError):
                    targets.keypoints[...] = 0  # a read-only view of the mapping
            if task == "obb":
                assert all(p.shape == (4, 2) for p in targets.polygons)


def record_targets(record):
    from pixpool.shared.stream.records import Targets

    return Targets.from_record(record)


def test_another_task_is_another_snapshot_and_the_same_task_reuses(tmp_path, prepared):
    data = _pose_set(tmp_path)
    detect = prepare_snapshot(load_dataset(data), PrepareOptions(imgsz=IMGSZ, processes=1))
    prepared.append(detect)
    pose = prepare_snapshot(load_dataset(data, task="pose"), PrepareOptions(imgsz=IMGSZ, task="pose", processes=1))
    prepared.append(pose)
    assert detect.snapshot.name != pose.snapshot.name and not pose.reused
    assert (detect.snapshot.task, detect.snapshot.kpt_shape, detect.snapshot.flip_idx) == ("detect", None, None)
    assert detect.snapshot.targets(0).keypoints is None
    header = read_header(snapshot_parts(pose.snapshot.name)["meta"])
    assert (header.task_code, header.kpt_count, header.kpt_dims, header.flip_count) == (2, 5, 3, 5)
    again = prepare_snapshot(load_dataset(data, task="pose"), PrepareOptions(imgsz=IMGSZ, task="pose", processes=1))
    prepared.append(again)
    assert again.reused and again.snapshot.name == pose.snapshot.name


def test_a_snapshot_for_another_task_supersedes_nothing(tmp_path, prepared):
    """A detect and a pose snapshot of one data.yaml are two lineages: preparing one leaves the
    other (unmapped) in the store, as a newer snapshot of changed inputs would not."""
    data = _pose_set(tmp_path)
    assert lineage_of(data, None, IMGSZ) == lineage_of(data, None, IMGSZ, DEFAULT_SNAPSHOT_DTYPE, task_spec("detect"))
    assert lineage_of(data, None, IMGSZ, task=task_spec("pose")) != lineage_of(data, None, IMGSZ)
    detect = prepare_snapshot(
        load_dataset(data), PrepareOptions(imgsz=IMGSZ, processes=1), lineage=lineage_of(data, None, IMGSZ)
    )
    prepared.append(detect)
    detect.snapshot.close()  # nobody maps it now: a superseded one would be removed
    pose = prepare_snapshot(
        load_dataset(data, task="pose"),
        PrepareOptions(imgsz=IMGSZ, task="pose", processes=1),
        lineage=lineage_of(data, None, IMGSZ, task=task_spec("pose")),
    )
    prepared.append(pose)
    assert all(os.path.exists(DEFAULT.path(seg)) for seg in snapshot_parts(detect.snapshot.name).values())


def test_options_task_must_match_the_dataset(tmp_path):
    dataset = load_dataset(_segment_set(tmp_path), task="segment")
    with pytest.raises(
        ConfigError, match=r"field 'task' = 'detect' differs from the task the dataset was read for \('segment'\)"
    ):
        prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1))


def test_pose_without_flip_idx_and_two_dims(tmp_path, prepared):
    data = yolo_set(tmp_path, ["0 0.5 0.5 0.4 0.4 0.5 0.4 -0.005 0.3\n"], kpt_shape=[2, 2])
    dataset = load_dataset(data, task="pose")
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, task="pose", processes=1))
    prepared.append(result)
    snap = result.snapshot
    assert (snap.kpt_shape, snap.flip_idx) == ((2, 2), None)
    assert snap.targets(0).keypoints[0, :, 2].tolist() == [1.0, 0.0]


def test_coco_pose_snapshot_keeps_derived_flip_idx(tmp_path, prepared):
    anns = [
        {"image_id": 2, "bbox": [20, 5, 20, 30], "keypoints": [30.0, 10, 2, 33, 9, 2, 27, 9, 1, 0, 0, 0, 24, 10, 2]}
    ]
    dataset = load_dataset(coco_pose_set(tmp_path, anns), task="pose")
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, task="pose", processes=1))
    prepared.append(result)
    assert result.snapshot.flip_idx == KPT_FLIP and result.snapshot.kpt_shape == (5, 3)
    _assert_targets_equal(result.snapshot.targets(1), record_targets(dataset.records[1]))


def test_memory_report_counts_polygon_and_keypoint_bytes(tmp_path, prepared):
    dataset = load_dataset(_pose_set(tmp_path), task="pose")
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, task="pose", processes=1))
    prepared.append(result)
    snap = result.snapshot
    n = sum(r.num_instances for r in dataset.records)
    measured = accountant.snapshot_bytes(snap)
    assert measured["keypoint_bytes"] == result.keypoint_bytes == n * 5 * 3 * 4 + 5 * 4
    assert measured["polygon_bytes"] == result.polygon_bytes == 8 * (n + 1)  # offsets; pose has no points
    tgt_file = os.stat(DEFAULT.path(snapshot_parts(snap.name)["tgt"])).st_size
    # The measured targets segment holds them: they are in the figure every report shows.
    assert measured["target_bytes"] == tgt_file >= n * (4 + 16) + measured["polygon_bytes"] + measured["keypoint_bytes"]
    report = accountant.format_snapshot_report(measured)
    assert "of the targets: keypoints" in report and str(measured["keypoint_bytes"]) in report

    seg = load_dataset(_segment_set(tmp_path / "seg"), task="segment")
    seg_result = prepare_snapshot(seg, PrepareOptions(imgsz=IMGSZ, task="segment", processes=1))
    prepared.append(seg_result)
    points = sum(len(p) for r in seg.records for p in r.polygons)
    m = sum(r.num_instances for r in seg.records)
    assert (
        accountant.snapshot_bytes(seg_result.snapshot)["polygon_bytes"]
        == 8 * (m + 1) + 8 * points
        == 8 * (3 + 1) + 8 * 11
    )
    assert accountant.snapshot_bytes(seg_result.snapshot)["keypoint_bytes"] == 0


def test_prepare_cli_task(tmp_path, capsys):
    data = _pose_set(tmp_path)
    rc = main(["prepare", str(data), "--imgsz", str(IMGSZ), "--task", "pose", "--processes", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    try:
        assert rc == 0 and out["task"] == "pose" and out["keypoint_bytes"] == 3 * 5 * 3 * 4 + 5 * 4
        with Snapshot.attach(out["snapshot"]) as snap:
            assert snap.task == "pose" and snap.flip_idx == KPT_FLIP
        assert main(["ls", "--json"]) == 0
        (row,) = [r for r in json.loads(capsys.readouterr().out) if r.get("name") == out["snapshot"]]
        assert row["task"] == "pose"
    finally:
        remove_snapshot(out["snapshot"])
