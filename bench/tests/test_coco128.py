"""bench/coco128.py: from Ultralytics' zip and COCO's full json it rebuilds coco128 as the tests read
it (the json, the detect labels and the segment labels byte for byte), and it refuses inputs that
cannot give coco128, naming the file, without leaving anything behind.

The rebuild tests need coco128 (``PIXPOOL_COCO128``, else ../shared/data/coco128) and skip where it
is absent; they stand in for the downloads: the zip is coco128's images and labels in
Ultralytics' layout, the "full" json coco128's with other images and annotations added.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import coco128
import pytest
from _common import COCO128

needs_coco128 = pytest.mark.skipif(
    not (COCO128 / "annotations" / "instances_train2017.json").is_file(),
    reason=f"coco128 is not at {COCO128} (PIXPOOL_COCO128, default ../shared/data/coco128 beside the checkout)",
)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _full_json(ours: dict) -> dict:
    """coco128's json as a piece of a bigger one: COCO's key order, images out of id order, and
    other images' annotations before, between and after coco128's."""
    extra_images = [
        {"id": 900_000 + i, "file_name": f"{900_000 + i:012d}.jpg", "width": 640, "height": 480, "license": 1}
        for i in range(3)
    ]
    extra = [
        {
            "id": 5_000_000 + i,
            "image_id": 900_000 + i % 3,
            "category_id": 1,
            "iscrowd": 0,
            "bbox": [10.0, 20.0, 30.0, 40.0],
            "area": 1200.0,
            "segmentation": [[10.0, 20.0, 40.0, 20.0, 40.0, 60.0]],
        }
        for i in range(6)
    ]
    anns = ours["annotations"]
    half = len(anns) // 2
    return {
        "info": ours["info"],
        "licenses": ours["licenses"],
        "images": extra_images[:1] + ours["images"][::-1] + extra_images[1:],
        "annotations": extra[:2] + anns[:half] + extra[2:4] + anns[half:] + extra[4:],
        "categories": ours["categories"],
    }


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> dict[str, Path]:
    """Stand-ins for coco128.zip, instances_train2017.json and annotations_trainval2017.zip."""
    root = tmp_path_factory.mktemp("downloads")
    ours = json.loads((COCO128 / "annotations" / "instances_train2017.json").read_text())
    full = root / "instances_train2017.json"
    full.write_text(json.dumps(_full_json(ours)))
    with zipfile.ZipFile(root / "annotations_trainval2017.zip", "w") as z:
        z.write(full, "annotations/instances_train2017.json")
        z.writestr("annotations/captions_train2017.json", "{}")
    with zipfile.ZipFile(root / "coco128.zip", "w") as z:
        z.writestr("coco128/LICENSE", "AGPL-3.0")
        for kind, pattern in (("images", "*.jpg"), ("labels", "*.txt")):
            for p in sorted((COCO128 / kind / "train2017").glob(pattern)):
                z.write(p, f"coco128/{kind}/train2017/{p.name}")
    return {"zip": root / "coco128.zip", "json": full, "annotations_zip": root / "annotations_trainval2017.zip"}


@needs_coco128
@pytest.mark.parametrize("annotations", ["json", "annotations_zip"])
def test_the_zip_and_the_full_json_give_coco128_byte_for_byte(downloads, annotations, tmp_path):
    out = tmp_path / "coco128"
    argv = [str(out), "--images", str(downloads["zip"]), "--annotations", str(downloads[annotations])]
    assert coco128.main(argv) == 0
    ours_json = COCO128 / "annotations" / "instances_train2017.json"
    built_json = out / "annotations" / "instances_train2017.json"
    assert json.loads(built_json.read_text()) == json.loads(ours_json.read_text())
    assert built_json.read_bytes() == ours_json.read_bytes()
    for sub in ("images", "labels", "labels-seg"):
        assert _files(out / sub / "train2017") == _files(COCO128 / sub / "train2017"), sub
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coco128"], "no temporary folder is left"


@needs_coco128
def test_a_folder_of_images_gets_its_detect_labels_from_the_json(downloads, tmp_path):
    """Ultralytics' label files are what the json gives for every image that has a box (the zip
    also holds two label files without an image: those cannot come from the json)."""
    out = tmp_path / "coco128"
    argv = [str(out), "--images", str(COCO128 / "images" / "train2017"), "--annotations", str(downloads["json"])]
    assert coco128.main(argv) == 0
    stems = {p.stem for p in (COCO128 / "images" / "train2017").glob("*.jpg")}
    ours = {name: data for name, data in _files(COCO128 / "labels" / "train2017").items() if Path(name).stem in stems}
    assert _files(out / "labels" / "train2017") == ours
    assert _files(out / "labels-seg" / "train2017") == _files(COCO128 / "labels-seg" / "train2017")


# -- refusals: small made-up inputs, no coco128 needed -------------------------------------------
def _tiny(root: Path, names: list[str], in_json: list[str]) -> tuple[Path, Path]:
    """A folder of (header-only) JPEG files ``names`` and an instances json with ``in_json``."""
    images = root / "images"
    images.mkdir()
    for name in names:
        (images / name).write_bytes(b"\xff\xd8\xff\xd9")
    data = {
        "info": {},
        "licenses": [],
        "images": [{"id": i, "file_name": n, "width": 10, "height": 10} for i, n in enumerate(in_json)],
        "annotations": [],
        "categories": [{"id": i + 1, "name": f"c{i}"} for i in range(80)],
    }
    ann = root / "instances_train2017.json"
    ann.write_text(json.dumps(data))
    return images, ann


def _refused(argv: list[str], capsys) -> str:
    assert coco128.main(argv) == 1
    return capsys.readouterr().err


def test_a_json_without_the_images_is_refused_naming_them(tmp_path, capsys):
    images, ann = _tiny(tmp_path, ["a.jpg", "b.jpg"], ["a.jpg"])
    err = _refused([str(tmp_path / "out"), "--images", str(images), "--annotations", str(ann)], capsys)
    assert "b.jpg" in err and str(ann) in err and "instances_train2017.json" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "instances_train2017.json"]


def test_a_tiny_set_builds_with_empty_segment_files(tmp_path, capsys):
    images, ann = _tiny(tmp_path, ["a.jpg"], ["a.jpg", "z.jpg"])
    assert coco128.main([str(tmp_path / "out"), "--images", str(images), "--annotations", str(ann)]) == 0
    assert (tmp_path / "out" / "labels-seg" / "train2017" / "a.txt").read_text() == ""
    assert list((tmp_path / "out" / "labels" / "train2017").iterdir()) == []  # no box, no detect file
    built = json.loads((tmp_path / "out" / "annotations" / "instances_train2017.json").read_text())
    assert [img["file_name"] for img in built["images"]] == ["a.jpg"]


@pytest.mark.parametrize(
    "case, expect",
    [
        ("out_not_empty", "not an empty folder"),
        ("not_jpeg", "not a JPEG"),
        ("zip_without_images", "holds no images/train2017"),
        ("annotations_zip_without_json", "holds no annotations/instances_train2017.json"),
        ("keypoints_json", "not COCO's 80"),
        ("missing_annotations", "does not exist"),
    ],
)
def test_inputs_that_cannot_give_coco128_are_refused_and_nothing_is_written(tmp_path, capsys, case, expect):
    images, ann = _tiny(tmp_path, ["a.jpg"], ["a.jpg"])
    out = tmp_path / "out"
    if case == "out_not_empty":
        out.mkdir()
        (out / "keep").write_text("mine")
    elif case == "not_jpeg":
        (images / "a.jpg").write_bytes(b"<html>")
    elif case == "zip_without_images":
        images = tmp_path / "coco128.zip"
        with zipfile.ZipFile(images, "w") as z:
            z.writestr("coco128/labels/train2017/a.txt", "0 0.5 0.5 0.1 0.1\n")
    elif case == "annotations_zip_without_json":
        ann = tmp_path / "annotations_trainval2017.zip"
        with zipfile.ZipFile(ann, "w") as z:
            z.writestr("annotations/instances_val2017.json", "{}")
    elif case == "keypoints_json":
        data = json.loads(ann.read_text())
        data["categories"] = data["categories"][:1]
        ann.write_text(json.dumps(data))
    elif case == "missing_annotations":
        ann = tmp_path / "nowhere.json"
    before = sorted(p.name for p in tmp_path.iterdir())
    err = _refused([str(out), "--images", str(images), "--annotations", str(ann)], capsys)
    assert expect in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if case == "out_not_empty":
        assert [p.name for p in out.iterdir()] == ["keep"]


def test_urls_names_both_downloads(capsys):
    assert coco128.main(["--urls"]) == 0
    said = capsys.readouterr().out
    assert coco128.IMAGES_URL in said and coco128.ANNOTATIONS_URL in said
