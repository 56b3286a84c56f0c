"""Both readers agree: COCO json and YOLO labels (detection and segment) on coco128 and on
the synthetic set give the same images, classes, boxes and polygons."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import cv2
import numpy as np
import pytest

from pixpool.server.readers import load_dataset, read_dataset
from pixpool.server.readers._common import main_part
from pixpool.server.synthetic import CATEGORY_IDS, CLASS_NAMES

# YOLO labels carry 6 decimals: each printed value is off by <= 5e-7. A detection box edge
# is cx -/+ w/2, so <= 5e-7 + 2.5e-7 = 7.5e-7, plus float32 rounding of values <= 1
# (half an ulp, <= 6e-8 each): 1e-6 bounds it. Polygon points: 5e-7 + 6e-8 < 1e-6.
COCO128_ATOL = 1e-6
SYNTH_ATOL = 1e-5


def _by_name(dataset):
    return {os.path.basename(r.image_path): r for r in dataset.records}


def _seg_tree(coco128: Path, tmp_path: Path) -> Path:
    """A YOLO layout whose labels are coco128's labels-seg (the shared copy is read-only)."""
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    (tmp_path / "images" / "train2017").symlink_to(coco128 / "images" / "train2017")
    (tmp_path / "labels" / "train2017").symlink_to(coco128 / "labels-seg" / "train2017")
    return tmp_path / "images" / "train2017"


@pytest.fixture(scope="module")
def coco128_json(coco128):
    return read_dataset(coco128 / "annotations" / "instances_train2017.json")


@pytest.fixture(scope="module")
def coco128_raw(coco128):
    return json.loads((coco128 / "annotations" / "instances_train2017.json").read_text())


def test_coco128_json_reader(coco128, coco128_json, coco128_raw):
    dataset, stats = coco128_json
    assert len(dataset) == 128
    assert len(dataset.names) == 80 and dataset.names[0] == "person" and dataset.names[-1] == "toothbrush"
    assert dataset.source_files == (str(coco128 / "annotations" / "instances_train2017.json"),)
    crowd = sum(a["iscrowd"] for a in coco128_raw["annotations"])
    assert crowd == 10 and stats.crowd_skipped == crowd
    assert stats.instances == len(coco128_raw["annotations"]) - crowd
    paths = [r.image_path for r in dataset.records]
    assert paths == sorted(paths)
    sizes = {img["file_name"]: (img["height"], img["width"]) for img in coco128_raw["images"]}
    for record in dataset.records[:8]:
        assert record.size_hw == sizes[os.path.basename(record.image_path)]
        assert cv2.imread(record.image_path).shape[:2] == record.size_hw
    # Images whose only annotations are missing (250, 508) are background records.
    names = _by_name(dataset)
    assert names["000000000250.jpg"].num_instances == 0 and names["000000000508.jpg"].num_instances == 0
    for record in dataset.records:
        assert record.classes.dtype == np.int32 and record.boxes.dtype == np.float32
        assert ((record.boxes >= 0) & (record.boxes <= 1)).all()
        assert (record.boxes[:, 2] > record.boxes[:, 0]).all() and (record.boxes[:, 3] > record.boxes[:, 1]).all()


def test_coco128_detection_labels_match_json(coco128, coco128_json):
    """labels/ holds no crowd boxes (941 lines = 929 non-crowd + 12 in two label files
    without an image, 656 and 659, which must not be read); 250 and 508 have no file."""
    json_ds, _ = coco128_json
    yolo_ds, stats = read_dataset(coco128 / "images" / "train2017")
    assert [r.image_path for r in yolo_ds.records] == [r.image_path for r in json_ds.records]
    assert stats.instances == sum(r.num_instances for r in json_ds.records)
    assert len(yolo_ds.source_files) == 126
    assert not any(os.path.basename(f) in ("000000000656.txt", "000000000659.txt") for f in yolo_ds.source_files)
    for a, b in zip(json_ds.records, yolo_ds.records):
        assert b.size_hw is None
        np.testing.assert_array_equal(a.classes, b.classes, err_msg=a.image_path)
        np.testing.assert_allclose(b.boxes, a.boxes, rtol=0, atol=COCO128_ATOL, err_msg=a.image_path)
        assert all(p.shape == (0, 2) for p in b.polygons)


def test_coco128_segment_labels_match_json(coco128, coco128_json, coco128_raw, tmp_path):
    json_ds, _ = coco128_json
    seg_ds, _ = read_dataset(_seg_tree(coco128, tmp_path))
    multi_part = sum(1 for a in coco128_raw["annotations"] if not a["iscrowd"] and len(a["segmentation"]) > 1)
    assert multi_part == 82
    seg = _by_name(seg_ds)
    assert sorted(seg) == sorted(_by_name(json_ds))
    box_differs = 0
    for a in json_ds.records:
        b = seg[os.path.basename(a.image_path)]
        np.testing.assert_array_equal(a.classes, b.classes, err_msg=a.image_path)
        for i in range(a.num_instances):
            assert a.polygons[i].shape == b.polygons[i].shape, (a.image_path, i)
            np.testing.assert_allclose(b.polygons[i], a.polygons[i], rtol=0, atol=COCO128_ATOL)
            extents = np.concatenate([a.polygons[i].min(axis=0), a.polygons[i].max(axis=0)])
            np.testing.assert_allclose(b.boxes[i], extents, rtol=0, atol=COCO128_ATOL)
            # A segment box spans the kept part only; the json bbox spans every part.
            inner, outer = b.boxes[i], a.boxes[i]
            assert (inner[:2] >= outer[:2] - COCO128_ATOL).all() and (inner[2:] <= outer[2:] + COCO128_ATOL).all()
            box_differs += bool(np.abs(inner - outer).max() > COCO128_ATOL)
    assert 0 < box_differs <= multi_part


def test_multi_part_keeps_the_part_with_most_points():
    square = np.array([[0, 0], [10, 0], [10, 10], [0, 10]], dtype=np.float64)  # area 100, 4 points
    thin = np.array([[0, 0], [1, 0], [2, 0.1], [3, 0], [3, 1], [0, 1]], dtype=np.float64)  # area ~3, 6 points
    assert main_part([square, thin]) is thin
    assert main_part([square, square.copy()]) is square  # the first of equals
    assert main_part([square[:2]]).shape == (0, 2)


def test_coco_multi_part_instance(synthetic_data, tmp_path):
    data = json.loads(synthetic_data.coco_json.read_text())
    ann = data["annotations"][0]
    extra = [1.0, 1.0, 3.0, 1.0, 3.0, 2.0, 2.0, 3.0, 1.0, 2.0]  # 5 points: more than a rectangle's 4
    ann["segmentation"] = [[1.0, 1.0, 2.0, 1.0, 2.0, 2.0], extra]
    path = tmp_path / "multi.json"
    path.write_text(json.dumps(data))
    record = next(r for r in load_dataset(path, images=synthetic_data.images_dir).records if r.num_instances)
    w, h = next((i["width"], i["height"]) for i in data["images"] if i["id"] == ann["image_id"])
    np.testing.assert_allclose(record.polygons[0], np.array(extra).reshape(-1, 2) / [w, h], atol=1e-7)


def test_synthetic_json_and_yolo_agree(synthetic_data):
    json_ds = load_dataset(synthetic_data.coco_json)
    yaml_ds = load_dataset(synthetic_data.data_yaml)
    folder_ds = load_dataset(synthetic_data.images_dir)
    assert json_ds.names == yaml_ds.names == CLASS_NAMES
    assert folder_ds.names == tuple(str(i) for i in range(len(CLASS_NAMES)))
    assert len(json_ds) == len(yaml_ds) == len(folder_ds) == synthetic_data.num_images
    for a, b, c in zip(json_ds.records, yaml_ds.records, folder_ds.records):
        assert a.image_path == b.image_path == c.image_path
        assert a.size_hw is not None and b.size_hw is None
        np.testing.assert_array_equal(a.classes, b.classes)
        np.testing.assert_array_equal(b.classes, c.classes)
        np.testing.assert_allclose(b.boxes, a.boxes, rtol=0, atol=SYNTH_ATOL)
        np.testing.assert_array_equal(b.boxes, c.boxes)
        for pa, pb in zip(a.polygons, b.polygons):
            assert pa.shape == pb.shape and len(pa) >= 3
            np.testing.assert_allclose(pb, pa, rtol=0, atol=SYNTH_ATOL)
    assert json_ds.source_files == (str(synthetic_data.coco_json),)
    assert str(synthetic_data.data_yaml) in yaml_ds.source_files
    assert len(yaml_ds.source_files) == 1 + synthetic_data.num_images - 1  # one background has no label file


def test_coco_category_ids_are_mapped_in_sorted_order(synthetic_data):
    raw = json.loads(synthetic_data.coco_json.read_text())
    assert [c["id"] for c in raw["categories"]] == list(CATEGORY_IDS) != list(range(1, len(CATEGORY_IDS) + 1))
    expected = sorted(CATEGORY_IDS).index
    files = {img["id"]: img["file_name"] for img in raw["images"]}
    per_image: dict[str, list[int]] = {}
    for ann in raw["annotations"]:
        per_image.setdefault(files[ann["image_id"]], []).append(expected(ann["category_id"]))
    for record in load_dataset(synthetic_data.coco_json).records:
        assert record.classes.tolist() == per_image.get(os.path.basename(record.image_path), [])


def test_records_are_read_only(synthetic_data):
    record = next(r for r in load_dataset(synthetic_data.data_yaml).records if r.num_instances)
    with pytest.raises(ValueError):
        record.boxes[0, 0] = 0.5


def test_yaml_list_names_txt_list_and_path_key(synthetic_data, tmp_path):
    (tmp_path / "ds").symlink_to(synthetic_data.root)
    images = sorted(p.name for p in synthetic_data.images_dir.glob("*.jpg"))
    listing = tmp_path / "subset.txt"  # relative lines resolve against the list's folder
    listing.write_text("".join(f"./ds/images/train/{name}\n" for name in images[:5]))
    (tmp_path / "cfg").mkdir()
    yaml_path = tmp_path / "cfg" / "elsewhere.yaml"  # 'path' points at the dataset root from elsewhere
    yaml_path.write_text(f"path: {tmp_path}\ntrain: [subset.txt, ds/images/train]\nnames: {list(CLASS_NAMES)}\n")
    dataset = load_dataset(yaml_path)
    assert dataset.names == CLASS_NAMES
    # Duplicates are kept: the first five images come twice, sorted next to each other.
    assert len(dataset) == len(images) + 5
    first = [str(tmp_path / "ds" / "images" / "train" / name) for name in images[:2]]
    assert [r.image_path for r in dataset.records[:4]] == [first[0]] * 2 + [first[1]] * 2
    assert dataset.records[0].num_instances > 0  # labels found beside the path as given (through the link)
    assert str(listing) in dataset.source_files and str(yaml_path) in dataset.source_files


def test_yolo_detection_lines_and_tolerance(synthetic_data, tmp_path):
    root = tmp_path / "ds"
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    image = synthetic_data.images_dir / "synth_0000.jpg"
    (root / "images" / "a.JPG").symlink_to(image)
    (root / "labels" / "a.txt").write_text("1 0.5 0.5 0.2 0.4\n\n3 0.2 0.3 0.4 0.3 1.005 0.9 -0.004 0.8\n")
    record = load_dataset(root / "images").records[0]
    assert record.classes.tolist() == [1, 3]
    np.testing.assert_allclose(record.boxes, [[0.4, 0.3, 0.6, 0.7], [0.0, 0.3, 1.0, 0.9]], atol=1e-7)
    assert record.polygons[0].shape == (0, 2) and record.polygons[1].shape == (4, 2)
    assert record.polygons[1].max() <= 1.0 and record.polygons[1].min() >= 0.0


def test_coco_reader_prints_nothing(synthetic_data, capsys):
    """pycocotools prints progress to stdout; `pixpool prepare --json` output must stay one object."""
    load_dataset(synthetic_data.coco_json)
    assert capsys.readouterr().out == ""


def _read_splits(config) -> dict:
    """Every split the daemon would serve, read in full as it reads them (no snapshot)."""
    from pixpool.server.snapshot.load import read_split, splits

    warned: set = set()
    out = {}
    for split, request in splits(config).items():
        out[split] = read_split(request, config.prepare_options(), warned=warned)
    return out


def _undeclare_background(yaml_path) -> None:
    """Drop the synthetic data.yaml's line that declares its unlabelled image a background by
    design (which is said at info level): here it stands for an image whose labels are missing."""
    from pixpool.server.readers import DECLARED_BACKGROUND_KEY

    lines = yaml_path.read_text().splitlines(keepends=True)
    yaml_path.write_text("".join(line for line in lines if not line.startswith(DECLARED_BACKGROUND_KEY)))


def _label_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no label file" in r.getMessage()]


def test_images_without_labels_are_warned_once_when_val_is_the_train_folder(synthetic_copy, caplog):
    # The synthetic data.yaml (the demo's) serves its train: folder as val: too; image 9 has no label file.
    from pixpool.shared.stream.config import DaemonConfig

    _undeclare_background(synthetic_copy / "data.yaml")
    caplog.set_level(logging.WARNING, logger="pixpool.server.readers")
    assert set(_read_splits(DaemonConfig(data=str(synthetic_copy / "data.yaml")))) == {"train", "val"}
    warned = _label_warnings(caplog)
    assert len(warned) == 1, warned
    assert "1 of 24 images have no label file" in warned[0] and "labels/train/synth_0009.txt" in warned[0]


def test_a_val_folder_missing_other_labels_is_warned_about_too(synthetic_copy, caplog):
    import shutil

    from pixpool.shared.stream.config import DaemonConfig

    shutil.copytree(synthetic_copy / "images" / "train", synthetic_copy / "images" / "val")
    shutil.copytree(synthetic_copy / "labels" / "train", synthetic_copy / "labels" / "val")
    (synthetic_copy / "labels" / "val" / "synth_0005.txt").unlink()
    yaml_path = synthetic_copy / "data.yaml"
    _undeclare_background(yaml_path)
    yaml_path.write_text(yaml_path.read_text().replace("val: images/train", "val: images/val"))
    caplog.set_level(logging.WARNING, logger="pixpool.server.readers")
    _read_splits(DaemonConfig(data=str(yaml_path)))
    warned = _label_warnings(caplog)
    assert len(warned) == 2, warned
    assert "1 of 24" in warned[0] and "labels/train/synth_0009.txt" in warned[0]
    assert "2 of 24" in warned[1] and "labels/val/synth_0005.txt" in warned[1]


def test_a_validation_set_of_other_classes_is_refused_naming_both_sets(synthetic_copy):
    from pixpool.server.snapshot.load import SplitClasses, read_split, splits
    from pixpool.shared.errors import ConfigError
    from pixpool.shared.stream.config import DaemonConfig

    config = DaemonConfig(data=str(synthetic_copy / "data.yaml"))
    requests, options = splits(config), config.prepare_options()
    train, _ = read_split(requests["train"], options, warned=set())
    read_split(requests["val"], options, warned=set(), train=SplitClasses(config.data, tuple(train.names)))
    other = SplitClasses("/data/other.yaml", tuple(reversed(train.names)))
    with pytest.raises(ConfigError, match="same classes in the same order") as refused:
        read_split(requests["val"], options, warned=set(), train=other)
    assert str(synthetic_copy / "data.yaml") in str(refused.value) and "/data/other.yaml" in str(refused.value)
    assert refused.value.field == "val"
