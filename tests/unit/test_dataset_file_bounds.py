"""Every value a data.yaml or a COCO json gives is type-checked and bounded before the readers
use or print it, and a value past its bound is refused naming the file and the field (the
label file and line for a label value). The cases that would cost much memory unbounded
(a kpt_shape of 10^8, an alias bomb, millions of categories) run in a memory-limited child in
``integration/test_dataset_file_bounds_memory.py``; these are the cheap ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.task_sets import coco_pose_set, label_path, yolo_set
from pixpool.server.readers import load_dataset
from pixpool.server.readers.coco import MAX_JSON_ENV
from pixpool.shared.errors import DatasetError
from pixpool.shared.stream.served_data import split_sources
from pixpool.shared.stream.yolo_yaml import MAX_YAML_BYTES, MAX_YAML_DEPTH


def _refused(data, *needles: str, task: str = "detect", path: Path | None = None, line: int | None = None, **kw):
    with pytest.raises(DatasetError) as info:
        load_dataset(data, task=task, **kw)
    text = str(info.value)
    where = path if path is not None else data
    assert text.startswith(f"{where}:{line}: " if line is not None else f"{where}: "), text
    for needle in needles:
        assert needle in text, text
    return text


def _pose_line(*kpt: float) -> str:
    return "0 0.5 0.5 0.2 0.2 " + " ".join(str(v) for v in kpt) + "\n"


# ---- label values --------------------------------------------------------------------------


def test_a_yolo_visibility_over_2_is_refused_by_label_file_and_line(tmp_path):
    data = yolo_set(tmp_path, [_pose_line(0.5, 0.5, 2) + _pose_line(0.5, 0.5, 1e30)], kpt_shape=[1, 3], flip_idx=[0])
    _refused(data, "keypoint 0 has visibility 1e+30", "2 (visible)", task="pose", path=label_path(data, 0), line=2)


def test_a_coco_visibility_over_2_is_refused_naming_the_annotation(tmp_path):
    path = coco_pose_set(tmp_path, [{"image_id": 1, "bbox": [20, 5, 20, 30], "keypoints": [10.0, 10.0, 1e30] * 5}])
    _refused(path, "annotation id 1 (image id 1)", "'keypoints'", "over 2", task="pose")


# ---- data.yaml -----------------------------------------------------------------------------


def test_a_kpt_shape_over_the_wire_bound_is_refused_by_field(tmp_path):
    data = yolo_set(tmp_path, [""], kpt_shape=[1025, 3], flip_idx=[0])
    _refused(data, "'kpt_shape' is [1025, 3]", "1 <= K <= 1024", task="pose")


def test_a_yaml_alias_is_refused_with_its_line(tmp_path):
    data = yolo_set(tmp_path, [""])
    data.write_text("path: &root .\ntrain: images/train\nnames: [a, b]\nval: *root\n")
    _refused(data, "YAML alias *root refused", "write the value out in full", line=4)


def test_the_trainer_side_refuses_a_yaml_alias_too(tmp_path):
    data = yolo_set(tmp_path, [""])
    data.write_text("path: .\ntrain: &t images/train\nnames: [a, b]\nval: *t\n")
    with pytest.raises(DatasetError, match="YAML alias"):
        split_sources(data)


def test_a_yaml_over_the_size_bound_is_refused_unread(tmp_path):
    data = yolo_set(tmp_path, [""])
    with open(data, "a") as f:
        f.write(("# padding\n" * 1000) * (MAX_YAML_BYTES // 10_000 + 1))
    _refused(data, f"over {MAX_YAML_BYTES} bytes", "a data.yaml is a few KB")


def test_a_yaml_nested_past_the_bound_is_refused(tmp_path):
    data = yolo_set(tmp_path, [""])
    deep = "[" * (MAX_YAML_DEPTH + 1) + "a" + "]" * (MAX_YAML_DEPTH + 1)
    data.write_text(f"path: .\ntrain: images/train\nnames: [a, b]\nextra: {deep}\n")
    _refused(data, f"nested more than {MAX_YAML_DEPTH} levels", line=4)


@pytest.mark.parametrize(
    "line, needles",
    [
        ("path: [a, b]", ("'path' is ['a', 'b'] (list)", "root folder, a string")),
        ("names: [a, [b, c]]", ("'names' entry 1 is ['b', 'c'] (list)",)),
        ("names: {0: a, 1.5: b}", ("'names' key 1.5 is not an integer class id",)),
        ("nc: " + "7" * 5000, ("cannot read the yaml", "4300")),
    ],
)
def test_yaml_fields_of_the_wrong_type_are_refused_by_field(tmp_path, line, needles):
    data = yolo_set(tmp_path, ["0 0.5 0.5 0.2 0.2\n"])
    key = line.split(":")[0]
    rest = [k for k in data.read_text().splitlines() if not k.startswith(f"{key}:") and not k.startswith("- ")]
    if key != "names":
        rest.append("names: [a, b, c]")
    data.write_text("\n".join([*rest, line]) + "\n")
    _refused(data, *needles)


# ---- COCO json -----------------------------------------------------------------------------


def _coco(tmp_path, change) -> Path:
    path = coco_pose_set(tmp_path, [{"image_id": 1, "bbox": [20, 5, 20, 30]}], kpt_names=None)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def test_a_json_over_the_size_bound_is_refused_naming_the_variable(tmp_path, monkeypatch):
    path = _coco(tmp_path, lambda d: None)
    monkeypatch.setenv(MAX_JSON_ENV, "100")
    _refused(path, "over 100 bytes", f"set {MAX_JSON_ENV}", "448 MB")
    monkeypatch.setenv(MAX_JSON_ENV, str(path.stat().st_size))
    assert len(load_dataset(path)) == 2


def test_categories_past_max_classes_are_refused_by_field(tmp_path):
    path = _coco(tmp_path, lambda d: d["categories"].extend({"id": i, "name": f"c{i}"} for i in range(2, 12)))
    _refused(path, "'categories' holds at least 11 classes, over the limit of 10", "--max-classes", max_classes=10)
    assert len(load_dataset(path, max_classes=11).names) == 11


@pytest.mark.parametrize(
    "change, needles",
    [
        (lambda d: d["categories"][0].update(id=[1]), ("categories[0]: field 'id' is [1]",)),
        (lambda d: d["categories"][0].update(name={"a": 1}), ("categories[0] (id 1): field 'name' is {'a': 1}",)),
        (lambda d: d["images"][0].update(id=[1]), ("images[0]: field 'id' is [1]",)),
        (lambda d: d["images"][0].update(id="x" * 1000), ("images[0]: field 'id' is 'xxx", "at most 256")),
        (lambda d: d["annotations"][0].update(image_id={"x": 1}), ("annotations[0]: field 'image_id'",)),
        (lambda d: d["annotations"][0].update(bbox=[1, 1, 10**400, 1]), ("bbox holds a number that is not finite",)),
        (lambda d: d["images"][0].update(file_name="a" * 5000), ("'file_name' must be a non-empty string of at most",)),
    ],
)  # fmt: skip
def test_coco_fields_of_the_wrong_type_are_refused_by_field(tmp_path, change, needles):
    _refused(_coco(tmp_path, change), *needles)


def test_a_coco_integer_past_python_s_digit_limit_is_refused_by_file(tmp_path):
    path = _coco(tmp_path, lambda d: None)
    path.write_text(path.read_text().replace('"width": 60', '"width": ' + "9" * 5000))
    _refused(path, "not a valid json file", "4300")


def test_coco_keypoint_names_over_the_wire_bound_are_refused(tmp_path):
    names = [f"k{i}" for i in range(1025)]
    path = _coco(tmp_path, lambda d: d["categories"][0].update(keypoints=names))
    _refused(path, "categories[0] (id 1): 'keypoints' names 1025 keypoints, over the limit of 1024", task="pose")
