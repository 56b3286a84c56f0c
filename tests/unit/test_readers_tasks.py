"""The readers per task (segment, pose, obb): what each label line becomes, and every line or
setting that does not fit the task refused with a DatasetError naming the file and the line."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from helpers.task_sets import KPT_FLIP, KPT_NAMES, coco_pose_set, label_path, yolo_set
from pixpool.server.readers import load_dataset, read_dataset
from pixpool.server.readers.coco import flip_idx_from_names
from pixpool.server.snapshot import layout
from pixpool.server.snapshot.fingerprint import fingerprint
from pixpool.shared.errors import ConfigError, DatasetError
from pixpool.shared.stream.records import Dataset, Record
from pixpool.shared.task import task_spec

ATOL = 1e-6  # float32 rounding of values <= 1


def _raises(data, task: str, *needles: str, path: Path | None = None, line: int | None = None):
    with pytest.raises(DatasetError) as info:
        load_dataset(data, task=task)
    text = str(info.value)
    for needle in needles:
        assert needle in text, text
    if path is not None:
        assert info.value.path == str(path), text
        assert text.startswith(f"{path}:{line}: " if line is not None else f"{path}: "), text
    return info.value


# ---- segment -------------------------------------------------------------------------------


def test_segment_lines_become_polygons_and_their_extent(tmp_path):
    data = yolo_set(tmp_path, ["1 0.1 0.2 0.5 0.2 0.3 0.6\n2 0.6 0.6 0.9 0.6 0.9 0.9 0.6 0.9\n", None])
    ds = load_dataset(data, task="segment", allow_unlabelled=True)
    assert (ds.task, ds.kpt_shape, ds.flip_idx) == ("segment", None, None)
    rec = ds.records[0]
    assert rec.classes.tolist() == [1, 2] and rec.keypoints is None
    np.testing.assert_allclose(rec.polygons[0], [[0.1, 0.2], [0.5, 0.2], [0.3, 0.6]], atol=ATOL)
    np.testing.assert_allclose(rec.boxes, [[0.1, 0.2, 0.5, 0.6], [0.6, 0.6, 0.9, 0.9]], atol=ATOL)
    assert ds.records[1].num_instances == 0


def test_segment_set_refuses_a_box_line_by_file_and_line(tmp_path):
    data = yolo_set(tmp_path, ["1 0.1 0.2 0.5 0.2 0.3 0.6\n\n0 0.5 0.5 0.2 0.2\n"])
    _raises(data, "segment", "box line", "5 fields", "--task detect", path=label_path(data, 0), line=3)
    # The same file is a valid detect set: detect reads boxes and polygons mixed, as before.
    assert load_dataset(data).records[0].num_instances == 2


def test_segment_set_refuses_an_odd_point_count(tmp_path):
    data = yolo_set(tmp_path, ["1 0.1 0.2 0.5 0.2 0.3 0.6 0.4\n"])
    _raises(data, "segment", "8 fields", "odd count >= 7", path=label_path(data, 0), line=1)


def test_coco128_labels_seg_reads_for_segment_as_for_detect(coco128, tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    (tmp_path / "images" / "train2017").symlink_to(coco128 / "images" / "train2017")
    (tmp_path / "labels" / "train2017").symlink_to(coco128 / "labels-seg" / "train2017")
    folder = tmp_path / "images" / "train2017"
    seg, stats = read_dataset(folder, task="segment")
    det = load_dataset(folder)
    assert seg.task == "segment" and len(seg) == 128 and stats.instances == 929
    for a, b in zip(seg.records, det.records):
        assert a.image_path == b.image_path and np.array_equal(a.classes, b.classes)
        assert np.array_equal(a.boxes, b.boxes)
        assert all(len(p) >= 3 and np.array_equal(p, q) for p, q in zip(a.polygons, b.polygons))


def test_coco_json_segment_refuses_an_instance_without_polygon(tmp_path):
    ann = {"image_id": 1, "bbox": [2, 2, 10, 10], "segmentation": {"counts": "abc", "size": [40, 60]}}
    path = coco_pose_set(tmp_path, [ann], kpt_names=None)
    _raises(path, "segment", "annotation id 1", "no polygon", "--task detect", path=path)
    assert load_dataset(path).records[0].num_instances == 1  # detect keeps the box, as before


def test_coco128_json_segment_equals_detect(coco128):
    json_path = coco128 / "annotations" / "instances_train2017.json"
    seg, det = load_dataset(json_path, task="segment"), load_dataset(json_path)
    assert seg.task == "segment" and det.task == "detect"
    for a, b in zip(seg.records, det.records):
        assert np.array_equal(a.boxes, b.boxes) and all(np.array_equal(p, q) for p, q in zip(a.polygons, b.polygons))


# ---- obb -----------------------------------------------------------------------------------


def test_obb_corners_are_the_polygon_and_their_extent_the_box(tmp_path):
    corners = [0.3, 0.1, 0.6, 0.3, 0.4, 0.6, 0.1, 0.4]
    data = yolo_set(tmp_path, ["2 " + " ".join(map(str, corners)) + "\n"])
    ds = load_dataset(data, task="obb")
    assert (ds.task, ds.kpt_shape, ds.flip_idx) == ("obb", None, None)
    rec = ds.records[0]
    assert rec.classes.tolist() == [2] and rec.polygons[0].shape == (4, 2) and rec.keypoints is None
    np.testing.assert_allclose(rec.polygons[0].reshape(-1), corners, atol=ATOL)
    np.testing.assert_allclose(rec.boxes[0], [0.1, 0.1, 0.6, 0.6], atol=ATOL)


def test_obb_corners_are_kept_as_written_within_the_tolerance(tmp_path):
    corners = [-0.005, 0.5, 0.5, -0.004, 1.006, 0.5, 0.5, 1.003]  # a square rotated 45 degrees, touching the edges
    data = yolo_set(tmp_path, ["0 " + " ".join(map(str, corners)) + "\n"])
    rec = load_dataset(data, task="obb").records[0]
    np.testing.assert_allclose(rec.polygons[0].reshape(-1), corners, atol=ATOL)  # not clipped: still a rectangle
    np.testing.assert_allclose(rec.boxes[0], [0.0, 0.0, 1.0, 1.0], atol=ATOL)  # the box is clipped, as every box


@pytest.mark.parametrize(
    "line, needles",
    [
        ("0 0.5 0.5 0.2 0.2", ("a box line", "5 fields", "9 fields", "--task detect")),
        ("0 0.1 0.1 0.2 0.1 0.2 0.2 0.1 0.2 0.15 0.25", ("a segment line of 11 fields", "--task segment")),
        ("0 0.1 0.1 0.2 0.1 0.2 0.2", ("7 fields", "'cls x1 y1 x2 y2 x3 y3 x4 y4'")),
    ],
)
def test_obb_set_refuses_other_lines(tmp_path, line, needles):
    data = yolo_set(tmp_path, ["1 0.1 0.1 0.2 0.1 0.2 0.2 0.1 0.2\n" + line + "\n"])
    _raises(data, "obb", *needles, path=label_path(data, 0), line=2)


def test_coco_json_refuses_obb(tmp_path):
    path = coco_pose_set(tmp_path, [], kpt_names=None)
    _raises(path, "obb", "oriented boxes", "YOLO OBB labels", path=path)


# ---- pose ----------------------------------------------------------------------------------


def _pose_line(cls, box, kpts) -> str:
    return " ".join(str(v) for v in (cls, *box, *np.asarray(kpts).reshape(-1))) + "\n"


def test_pose_three_dims_keeps_visibility_and_flip_idx(tmp_path):
    kpts = [[0.3, 0.3, 2], [0.35, 0.3, 1], [0.25, 0.3, 2], [0.0, 0.0, 0], [0.2, 0.31, 2]]
    data = yolo_set(
        tmp_path,
        [_pose_line(0, (0.3, 0.4, 0.2, 0.3), kpts), ""],
        names=("person",),
        kpt_shape=[5, 3],
        flip_idx=list(KPT_FLIP),
    )
    ds = load_dataset(data, task="pose")
    assert (ds.task, ds.kpt_shape, ds.flip_idx) == ("pose", (5, 3), KPT_FLIP)
    rec = ds.records[0]
    assert rec.keypoints.shape == (1, 5, 3) and rec.keypoints.dtype == np.float32
    assert not rec.keypoints.flags.writeable
    np.testing.assert_allclose(rec.keypoints[0], kpts, atol=ATOL)
    np.testing.assert_allclose(rec.boxes[0], [0.2, 0.25, 0.4, 0.55], atol=ATOL)
    assert rec.polygons[0].shape == (0, 2)
    assert ds.records[1].keypoints.shape == (0, 5, 3)  # background: no instance, same K


def test_pose_two_dims_gets_visibility_as_ultralytics_makes_it(tmp_path):
    # x or y below 0 (within the tolerance) -> visibility 0, else 1 (verify_image_label).
    kpts = [[0.3, 0.3], [-0.005, 0.3], [0.25, -0.001], [0.0, 0.0]]
    data = yolo_set(tmp_path, [_pose_line(1, (0.3, 0.4, 0.2, 0.3), kpts)], kpt_shape=[4, 2], flip_idx=[0, 1, 2, 3])
    rec = load_dataset(data, task="pose").records[0]
    assert rec.keypoints[0, :, 2].tolist() == [1.0, 0.0, 0.0, 1.0]
    np.testing.assert_allclose(rec.keypoints[0, :, :2], kpts, atol=ATOL)  # kept as written, not clipped


def test_pose_degenerate_box_drops_its_keypoints_too(tmp_path):
    lines = _pose_line(0, (0.5, 0.5, 0.0, 0.2), [[0.5, 0.5, 2]]) + _pose_line(1, (0.5, 0.5, 0.2, 0.2), [[0.4, 0.6, 1]])
    data = yolo_set(tmp_path, [lines], kpt_shape=[1, 3], flip_idx=[0])
    ds, stats = read_dataset(data, task="pose")
    rec = ds.records[0]
    assert stats.degenerate_skipped == 1 and rec.classes.tolist() == [1]
    np.testing.assert_allclose(rec.keypoints[0], [[0.4, 0.6, 1]], atol=ATOL)


@pytest.mark.parametrize(
    "line, needles",
    [
        ("0 0.5 0.5 0.2 0.2", ("a box line", "without keypoints", "5 + 2 x 3 = 11 fields")),
        ("0 0.5 0.5 0.2 0.2 0.5 0.5 2 0.4 0.4", ("10 fields", "kpt_shape [2, 3]", "= 11 fields")),
        ("0 0.5 0.5 0.2 0.2 0.5 0.5 2 0.4 1.3 1", ("coordinate 1.3 outside [0, 1]",)),
        ("0 0.5 0.5 0.2 0.2 0.5 0.5 -1 0.4 0.4 1", ("keypoint 0 has visibility -1",)),
        ("0 0.5 0.5 0.2 0.2 0.5 0.5 2 0.4 nan 1", ("field 10 is not finite",)),
    ],
)
def test_pose_set_refuses_lines_that_do_not_fit(tmp_path, line, needles):
    data = yolo_set(
        tmp_path, ["0 0.5 0.5 0.2 0.2 0.5 0.5 2 0.4 0.4 1\n" + line + "\n"], kpt_shape=[2, 3], flip_idx=[1, 0]
    )
    _raises(data, "pose", *needles, path=label_path(data, 0), line=2)


@pytest.mark.parametrize(
    "keys, needles",
    [
        ({}, ("the pose task needs 'kpt_shape: [K, D]'",)),
        ({"kpt_shape": [3, 4]}, ("'kpt_shape' is [3, 4]", "D = 2")),
        ({"kpt_shape": [0, 3]}, ("'kpt_shape' is [0, 3]",)),
        ({"kpt_shape": [3, 3], "flip_idx": [0, 2]}, ("'flip_idx' [0, 2] is not a permutation of 0..2",)),
        ({"kpt_shape": [3, 3], "flip_idx": [0, 1, 1]}, ("not a permutation of 0..2",)),
        ({"kpt_shape": [3, 3], "flip_idx": "012"}, ("'flip_idx' is '012'",)),
    ],
)
def test_pose_yaml_settings_are_checked(tmp_path, keys, needles):
    data = yolo_set(tmp_path, [""], **keys)
    _raises(data, "pose", *needles, path=data)


def test_pose_without_flip_idx_warns_and_has_none(tmp_path, caplog):
    data = yolo_set(tmp_path, [_pose_line(0, (0.5, 0.5, 0.2, 0.2), [[0.5, 0.5, 2]])], kpt_shape=[1, 3])
    with caplog.at_level(logging.WARNING, logger="pixpool.server.readers.yolo"):
        ds = load_dataset(data, task="pose")
    assert ds.flip_idx is None and ds.kpt_shape == (1, 3)
    assert "no 'flip_idx'" in caplog.text and "fliplr" in caplog.text


def test_pose_needs_a_yaml(tmp_path):
    data = yolo_set(tmp_path, [""])
    folder = data.parent / "images" / "train"
    _raises(folder, "pose", "cannot be read for the pose task", "pass a data.yaml", path=folder)


def test_detect_keeps_the_boxes_of_pose_lines_when_the_yaml_has_kpt_shape(tmp_path):
    line = _pose_line(0, (0.5, 0.5, 0.2, 0.2), [[0.5, 0.5], [0.45, 0.5]])  # 9 fields: not a polygon here
    data = yolo_set(tmp_path, [line], kpt_shape=[2, 2], flip_idx=[1, 0])
    ds = load_dataset(data)
    assert (ds.task, ds.kpt_shape, ds.flip_idx) == ("detect", None, None)
    rec = ds.records[0]
    assert rec.keypoints is None and rec.polygons[0].shape == (0, 2)
    np.testing.assert_allclose(rec.boxes[0], [0.4, 0.4, 0.6, 0.6], atol=ATOL)


def test_detect_refuses_a_pose_line_and_says_which_task(tmp_path):
    data = yolo_set(tmp_path, [_pose_line(0, (0.5, 0.5, 0.2, 0.2), [[0.5, 0.5, 2], [0.4, 0.4, 1], [0.3, 0.3, 2]])])
    _raises(data, "detect", "odd number of coordinates (13)", "--task pose", "K = 3", path=label_path(data, 0), line=1)


def test_read_dataset_refuses_an_unknown_task(tmp_path):
    data = yolo_set(tmp_path, [""])
    with pytest.raises(ConfigError, match="task"):
        load_dataset(data, task="classify")


# ---- COCO keypoints ------------------------------------------------------------------------


def _kpts_px(*xyv):
    return [float(v) for v in xyv]


def test_coco_pose_keypoints_normalised_and_flip_idx_from_names(tmp_path):
    k1 = _kpts_px(30, 10, 2, 33, 9, 2, 27, 9, 1, 0, 0, 0, 24, 10, 2)
    k2 = _kpts_px(40, 25, 2, 0, 0, 0, 0, 0, 0, 45, 22, 1, 35, 22, 1)
    anns = [
        {"image_id": 1, "bbox": [20, 5, 20, 30], "keypoints": k1, "segmentation": [[20, 5, 40, 5, 40, 35]]},
        {"image_id": 2, "bbox": [30, 20, 20, 20], "keypoints": k2},
    ]
    path = coco_pose_set(tmp_path, anns)
    ds = load_dataset(path, task="pose")
    assert (ds.task, ds.kpt_shape, ds.flip_idx) == ("pose", (5, 3), KPT_FLIP)
    first, second = ds.records
    np.testing.assert_allclose(first.keypoints[0], np.reshape(k1, (5, 3)) / [60, 40, 1], atol=ATOL)
    np.testing.assert_allclose(second.keypoints[0], np.reshape(k2, (5, 3)) / [80, 50, 1], atol=ATOL)
    assert first.polygons[0].shape == (0, 2)  # pose keeps no polygon, as a YOLO pose set has none


def test_coco_and_yolo_pose_give_the_same_records(tmp_path):
    k = _kpts_px(30, 10, 2, 33, 9, 2, 27, 9, 1, 0, 0, 0, 24, 10, 2)
    path = coco_pose_set(tmp_path / "coco", [{"image_id": 1, "bbox": [15, 5, 30, 30], "keypoints": k}])
    coco = load_dataset(path, task="pose")
    norm = np.reshape(k, (5, 3)) / [60, 40, 1]
    line = _pose_line(0, (0.5, 0.5, 0.5, 0.75), [f"{x:.6f} {y:.6f} {int(v)}" for x, y, v in norm])
    data = yolo_set(tmp_path / "yolo", [line, ""], names=("person",), kpt_shape=[5, 3], flip_idx=list(KPT_FLIP),
                    sizes_hw=[(40, 60), (50, 80)])  # fmt: skip
    yolo = load_dataset(data, task="pose")
    assert (coco.kpt_shape, coco.flip_idx) == (yolo.kpt_shape, yolo.flip_idx)
    for a, b in zip(coco.records, yolo.records):
        assert os.path.basename(a.image_path) == os.path.basename(b.image_path)
        np.testing.assert_allclose(a.boxes, b.boxes, atol=1e-6)
        np.testing.assert_allclose(a.keypoints, b.keypoints, atol=1e-6)


@pytest.mark.parametrize(
    "names, expected",
    [
        (KPT_NAMES, KPT_FLIP),
        (["eye_left", "eye_right", "head"], (1, 0, 2)),
        (["Left-Hand", "right-hand"], (1, 0)),
        (["leftover", "right_ear", "left_ear"], (0, 2, 1)),  # "leftover" is no left word
    ],
)
def test_flip_idx_from_names(names, expected):
    assert flip_idx_from_names(names, "x.json") == expected


@pytest.mark.parametrize(
    "change, needles",
    [
        (lambda d: d["categories"][0].update(keypoints=["left_hand", "head"]),
         ("keypoint 0 'left_hand' has no mirror 'right_hand'", "flip_idx")),
        (lambda d: d["categories"][0].pop("keypoints"), ("no category has 'keypoints'",)),
        (lambda d: d["annotations"][0].pop("keypoints"), ("annotation id 1 (image id 1)", "got nothing")),
        (lambda d: d["annotations"][0].update(keypoints=[1.0, 2.0, 2]), ("holds 3 numbers, expected 15",)),
        (lambda d: d["annotations"][0].update(keypoints=[1.0, 2.0, -1] * 5), ("negative visibility",)),
        (lambda d: d["categories"].append({"id": 2, "name": "dog", "keypoints": ["a", "b"]}),
         ("category id 2 names keypoints ['a', 'b']",)),
    ],
)  # fmt: skip
def test_coco_pose_refusals_name_the_json(tmp_path, change, needles):
    anns = [{"image_id": 1, "bbox": [20, 5, 20, 30], "keypoints": [10.0, 10.0, 2] * 5}]
    path = coco_pose_set(tmp_path, anns)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    _raises(path, "pose", *needles, path=path)


# ---- Dataset checks, snapshot layout and fingerprint (no shared memory) ---------------------


def _rec(keypoints=None, n=1):
    return Record(
        "/nonexistent.jpg", None, np.zeros(n, np.int32), np.tile(np.float32([0.1, 0.1, 0.5, 0.5]), (n, 1)),
        keypoints=keypoints,
    )  # fmt: skip


def test_dataset_checks_task_and_keypoints():
    kpts = np.zeros((1, 2, 3), np.float32)
    assert Dataset((_rec(kpts),), ("a",), (), spec=task_spec("pose", kpt_shape=(2, 3), flip_idx=(1, 0))).kpt_shape == (
        2,
        3,
    )
    with pytest.raises(ValueError, match="kpt_shape None"):
        Dataset((_rec(kpts),), ("a",), (), spec=task_spec("pose"))
    with pytest.raises(ValueError, match=r"keypoints \(1, 2, 3\), the pose dataset's are \(1, 3, 3\)"):
        Dataset((_rec(kpts),), ("a",), (), spec=task_spec("pose", kpt_shape=(3, 3)))
    with pytest.raises(ValueError, match="not a permutation"):
        Dataset((_rec(kpts),), ("a",), (), spec=task_spec("pose", kpt_shape=(2, 3), flip_idx=(0, 0)))
    with pytest.raises(ValueError, match="keypoints in a detect dataset"):
        Dataset((_rec(kpts),), ("a",), ())
    with pytest.raises(ValueError, match="belong to the pose task"):
        Dataset((_rec(),), ("a",), (), spec=task_spec("segment", kpt_shape=(2, 3)))
    with pytest.raises(ValueError, match="not one of"):
        Dataset((), ("a",), (), spec=task_spec("classify"))


def test_detect_target_sections_and_header_bytes_are_those_before_tasks():
    # Before tasks: four sections, the total aligned after the points; the header's tail zero.
    for inst, pts in ((0, 0), (3, 7), (1000, 12345)):
        old_total = layout._align(
            layout._align(layout._align(layout._align(4 * inst) + 16 * inst) + 8 * (inst + 1)) + 8 * pts
        )
        s = layout.target_sections(inst, pts)
        assert s.nbytes == old_total and s.keypoint_nbytes == 0
    header = layout.Header(
        magic=layout.MAGIC, layout_version=layout.LAYOUT_VERSION, complete=0, records=1, instances=2, points=3,
        max_instances=2, imgsz=64, dtype_code=1, fill=114.0, meta_nbytes=1, image_nbytes=2, target_nbytes=3,
        creator_pid=4, created_unix=5.0, fingerprint="f" * 64, persist=1, lineage="l" * 32,
    )  # fmt: skip
    packed = layout.pack_header(header)
    assert packed[204:] == bytes(52)  # detect: task code 0 and no keypoints, where padding was
    assert layout.unpack_header(packed) == header


def test_pose_sections_hold_keypoints_after_the_points():
    s = layout.target_sections(3, 7, kpt_count=5, flip_count=5)
    assert s.keypoints_offset % layout.SECTION_ALIGN == 0 and s.flip_offset % layout.SECTION_ALIGN == 0
    assert s.keypoints_offset >= s.points_offset + 8 * 7 and s.flip_offset >= s.keypoints_offset + 3 * 5 * 12
    assert s.nbytes >= s.flip_offset + 20 and s.keypoint_nbytes == 3 * 5 * 12 + 5 * 4
    buf = bytearray(s.nbytes)
    kpts, flip = layout.keypoint_views(buf, s)
    assert kpts.shape == (3, 5, 3) and flip.shape == (5,)
    recs = [_rec(np.full((2, 5, 3), 7, np.float32), n=2), _rec(np.zeros((0, 5, 3), np.float32), n=0),
            _rec(np.full((1, 5, 3), 9, np.float32))]  # fmt: skip
    layout.pack_keypoints(recs, kpts)
    assert kpts[:2].min() == 7 and kpts[2].min() == 9
    with pytest.raises(ValueError, match="the section holds 3"):
        layout.pack_keypoints(recs[:1], kpts)


def test_fingerprint_differs_by_task_kpt_shape_flip_idx_and_keypoints(tmp_path):
    lines = [_pose_line(0, (0.5, 0.5, 0.2, 0.2), [[0.5, 0.5, 2], [0.4, 0.4, 1]])]
    data = yolo_set(tmp_path, lines, kpt_shape=[2, 3], flip_idx=[1, 0])
    detect = load_dataset(data)
    pose = load_dataset(data, task="pose")
    fps = {fingerprint(detect, imgsz=64), fingerprint(pose, imgsz=64)}
    fps.add(
        fingerprint(
            Dataset(pose.records, pose.names, (), spec=task_spec("pose", kpt_shape=(2, 3), flip_idx=(0, 1))), imgsz=64
        )
    )
    fps.add(fingerprint(Dataset(pose.records, pose.names, (), spec=task_spec("pose", kpt_shape=(2, 3))), imgsz=64))
    moved = pose.records[0].keypoints.copy()
    moved[0, 0, 0] += 0.01
    rec = Record(pose.records[0].image_path, None, pose.records[0].classes, pose.records[0].boxes, keypoints=moved)
    fps.add(
        fingerprint(
            Dataset((rec,), pose.names, (), spec=task_spec("pose", kpt_shape=(2, 3), flip_idx=(1, 0))), imgsz=64
        )
    )
    assert len(fps) == 5
    plain = Dataset(detect.records, detect.names, ())
    for task in ("segment", "obb"):
        fps.add(fingerprint(Dataset(plain.records, plain.names, (), spec=task_spec(task)), imgsz=64))
    assert len(fps) == 7
    assert fingerprint(plain, imgsz=64) == fingerprint(detect, imgsz=64)  # detect hashes no task
