"""Every bad-input kind gets a DatasetError naming the offending file (and line for labels)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pixpool.cli import main
from pixpool.server.readers import load_dataset, read_dataset
from pixpool.shared.errors import DatasetError, MissingFileError


@pytest.fixture
def ds(synthetic_copy) -> Path:
    return synthetic_copy


def _json(ds: Path) -> Path:
    return ds / "annotations" / "instances_train.json"


def _edit_json(ds: Path, change) -> Path:
    path = _json(ds)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def _raises(data, match: str, *, error=DatasetError, images=None):
    with pytest.raises(error) as info:
        load_dataset(data, images=images)
    assert match in str(info.value), str(info.value)
    return info.value


def test_copy_reads_cleanly(ds):
    assert len(load_dataset(_json(ds))) == len(load_dataset(ds / "data.yaml")) == 24


# ---- COCO json -----------------------------------------------------------------------------


def test_missing_json(ds):
    _raises(ds / "annotations" / "nope.json", "nope.json", error=MissingFileError)


def test_non_json_file(ds):
    _json(ds).write_text("{ this is not json")
    err = _raises(_json(ds), "instances_train.json: not a valid json")
    assert err.path == str(_json(ds))


def test_binary_file(ds):
    _json(ds).write_bytes(b"\xff\xfe\x00\x01")
    _raises(_json(ds), "instances_train.json: not a valid json")


def test_json_not_an_object(ds):
    _json(ds).write_text("[1, 2]")
    _raises(_json(ds), "instances_train.json: top level is a list")


@pytest.mark.parametrize("key", ["images", "annotations", "categories"])
def test_json_missing_key(ds, key):
    path = _edit_json(ds, lambda d: d.pop(key))
    _raises(path, f"instances_train.json: missing or non-list key(s) ['{key}']")


def test_unknown_image_id(ds):
    path = _edit_json(ds, lambda d: d["annotations"][3].update(image_id=987654))
    _raises(path, "points at unknown image id 987654")
    _raises(path, str(path))


def test_unknown_category_id(ds):
    path = _edit_json(ds, lambda d: d["annotations"][0].update(category_id=2))  # ids are odd
    err = _raises(path, "unknown category id 2")
    assert str(path) in str(err) and "[1, 3, 5" in str(err)


def test_annotation_missing_bbox(ds):
    path = _edit_json(ds, lambda d: d["annotations"][0].pop("bbox"))
    _raises(path, "instances_train.json: annotations[0] needs keys")


def test_missing_image_file(ds):
    (ds / "images" / "train" / "synth_0005.jpg").unlink()
    err = _raises(_json(ds), "synth_0005.jpg", error=MissingFileError)
    assert "instances_train.json" in str(err)  # names both the image and the annotation file
    assert err.path.endswith("synth_0005.jpg")


@pytest.mark.parametrize("file_name", ["../../../etc/passwd", "/etc/passwd", "sub/../../outside.jpg", "..\\..\\x.jpg"])
def test_file_name_outside_the_images_folder_is_refused(ds, file_name):
    (ds / "outside.jpg").write_bytes((ds / "images" / "train" / "synth_0000.jpg").read_bytes())
    path = _edit_json(ds, lambda d: d["images"][2].update(file_name=file_name))
    err = _raises(
        path,
        f"images[2] (id {json.loads(path.read_text())['images'][2]['id']}): field 'file_name' {file_name!r} points outside the images folder",
    )
    assert err.path == str(path)


def test_deeply_nested_json_is_refused_by_name(ds):
    _json(ds).write_text("[" * 100000 + "]" * 100000)
    err = _raises(_json(ds), "nested deeper than the json parser's limit")
    assert err.path == str(_json(ds))


def test_images_folder_cannot_be_inferred(ds):
    moved = ds / "labels.json"  # not root/annotations/instances_NAME.json
    shutil.copy(_json(ds), moved)
    _raises(moved, "pass the images folder")
    assert len(load_dataset(moved, images=ds / "images" / "train")) == 24


def test_crowd_and_degenerate_annotations_are_left_out(ds):
    def change(d):
        d["annotations"][0]["iscrowd"] = 1
        d["annotations"][0]["segmentation"] = {"size": [10, 10], "counts": "abc"}
        d["annotations"][1]["bbox"][2] = 0

    path = _edit_json(ds, change)
    dataset, stats = read_dataset(path)
    assert stats.crowd_skipped == 1 and stats.degenerate_skipped == 1
    assert stats.instances == len(json.loads(path.read_text())["annotations"]) - 2
    assert sum(r.num_instances for r in dataset.records) == stats.instances


# ---- YOLO labels ---------------------------------------------------------------------------


def _label(ds: Path, text: str, name: str = "synth_0004.txt") -> Path:
    path = ds / "labels" / "train" / name
    path.write_text(path.read_text() + text)
    return path


@pytest.mark.parametrize(
    "line, match",
    [
        ("8 0.5 0.5 0.1 0.1", "class id 8 out of range"),
        ("-1 0.5 0.5 0.1 0.1", "not a non-negative integer"),
        ("1.5 0.5 0.5 0.1 0.1", "not a non-negative integer"),
        ("1 0.5 abc 0.1 0.1", "field 3 is not a number"),
        ("1 0.5 0.5 nan 0.1", "not finite"),
        ("1 0.5 0.5 0.1", "4 fields"),
        ("1 0.5 0.5 0.1 0.1 0.2", "odd number of coordinates (5)"),
        ("1 0.5", "2 fields"),
        ("1 0.1 0.1 0.2 0.1 0.2 0.2 0.3", "odd number of coordinates (7)"),
        ("1 0.5 0.5 1.2 0.1", "coordinate 1.2 outside [0, 1]"),
        ("1 0.1 0.1 0.2 0.1 0.2 -0.5", "coordinate -0.5 outside [0, 1]"),
    ],
)
def test_bad_label_line(ds, line, match):
    path = _label(ds, line + "\n")
    lineno = len(path.read_text().splitlines())
    err = _raises(ds / "data.yaml", match)
    assert f"synth_0004.txt:{lineno}: " in str(err)
    assert err.line == lineno and err.path == str(path)
    # The images-folder route reads the same labels; without names only the range check differs.
    if "out of range" not in match:
        _raises(ds / "images" / "train", f"synth_0004.txt:{lineno}: ")


def test_empty_and_missing_label_files_are_background(ds):
    (ds / "labels" / "train" / "synth_0004.txt").write_text("\n  \n")
    (ds / "labels" / "train" / "synth_0005.txt").unlink()
    records = {Path(r.image_path).name: r for r in load_dataset(ds / "data.yaml").records}
    assert records["synth_0004.jpg"].num_instances == 0
    assert records["synth_0005.jpg"].num_instances == 0


def test_non_utf8_label_file(ds):
    (ds / "labels" / "train" / "synth_0004.txt").write_bytes(b"\xff\xfe1 0.5")
    _raises(ds / "data.yaml", "synth_0004.txt: label file is not UTF-8")


# ---- data.yaml -----------------------------------------------------------------------------


def test_yaml_unreadable(ds):
    (ds / "data.yaml").write_text("train: [unclosed\nnames: {")
    _raises(ds / "data.yaml", "data.yaml: cannot read the yaml")


def test_yaml_missing(ds):
    _raises(ds / "other.yaml", "other.yaml", error=MissingFileError)


@pytest.mark.parametrize("key", ["train", "names"])
def test_yaml_missing_key(ds, key):
    lines = [line for line in (ds / "data.yaml").read_text().splitlines() if not line.startswith(key)]
    if key == "names":
        lines = [line for line in lines if not line.startswith("  ") and not line.startswith("nc")]
    (ds / "data.yaml").write_text("\n".join(lines) + "\n")
    _raises(ds / "data.yaml", f"data.yaml: missing '{key}'")


def test_yaml_train_folder_missing(ds):
    (ds / "data.yaml").write_text("train: images/val\nnames: [a, b]\n")
    _raises(ds / "data.yaml", "train entry 'images/val'", error=MissingFileError)


def test_yaml_nc_disagrees(ds):
    (ds / "data.yaml").write_text("train: images/train\nnc: 3\nnames: [a, b]\n")
    _raises(ds / "data.yaml", "data.yaml: 'nc' is 3")


def test_yaml_names_with_gap(ds):
    (ds / "data.yaml").write_text("train: images/train\nnames: {0: a, 2: b}\n")
    _raises(ds / "data.yaml", "data.yaml: 'names' ids must be 0..1")


def test_image_list_with_missing_image(ds):
    (ds / "list.txt").write_text("images/train/synth_0001.jpg\nimages/train/gone.jpg\n")
    (ds / "data.yaml").write_text("train: list.txt\nnames: [a, b, c, d, e, f, g, h]\n")
    err = _raises(ds / "data.yaml", "gone.jpg", error=MissingFileError)
    assert "list.txt line 2" in str(err)


def test_folder_without_images_component(ds, tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "x.jpg").symlink_to(ds / "images" / "train" / "synth_0000.jpg")
    _raises(flat, "no 'images' folder in the path")


def test_unknown_dataset_kind(ds):
    _raises(ds / "labels" / "train" / "synth_0000.txt", "unknown dataset kind")
    _raises(ds / "nothing-here", "does not exist", error=MissingFileError)
    _raises(ds / "data.yaml", "applies to a COCO json only", images=ds / "images" / "train")


def test_cli_synth_rejects_zero_images(tmp_path, capsys):
    assert main(["synth", str(tmp_path / "out"), "--num-images", "0"]) == 1
    assert "--num-images must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_coco_bbox_must_be_finite(ds, value):
    def change(data):
        data["annotations"][5]["bbox"][1] = value

    path = _edit_json(ds, change)
    ann = json.loads(path.read_text())["annotations"][5]
    err = _raises(path, f"annotations[5] (id {ann['id']}, image id {ann['image_id']}, ")
    assert err.path == str(path) and "not finite" in str(err) and "remove the annotation" in str(err)


def test_coco_polygon_must_be_finite(ds):
    def change(data):
        ann = next(a for a in data["annotations"] if isinstance(a.get("segmentation"), list) and a["segmentation"])
        ann["segmentation"][0][1] = float("nan")
        data["marked"] = ann["id"]

    path = _edit_json(ds, change)
    ann_id = json.loads(path.read_text())["marked"]
    _raises(path, f"annotation id {ann_id}: polygon holds a number that is not finite")
