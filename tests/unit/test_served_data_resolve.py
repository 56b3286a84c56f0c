"""``served_data``: one dataset in any spelling resolves to one identity, another is refused by name.

Unit tests: files in a temporary folder, no process.
"""

from __future__ import annotations

import os

import pytest

from pixpool.shared.errors import DatasetMismatchError, MissingFileError
from pixpool.shared.stream import served_data


@pytest.fixture
def two_sets(tmp_path):
    """Two YOLO layouts a/ and b/ (images/train, labels/train) with a data.yaml each."""
    for name in ("a", "b"):
        (tmp_path / name / "images" / "train").mkdir(parents=True)
        (tmp_path / name / "labels" / "train").mkdir(parents=True)
        (tmp_path / name / "data.yaml").write_text("train: images/train\nval: images/train\nnames: [cat, dog]\n")
    return tmp_path


def _attached(described: dict, **extra) -> dict:
    return {"snapshot": {"served": described}, "names": ["cat", "dog"], "task": "detect", "num_records": 5,
            "daemon_pid": 7, "host": "h", **extra}  # fmt: skip


def test_one_split_in_every_spelling_has_one_identity(two_sets, tmp_path):
    a = two_sets / "a"
    (tmp_path / "link").symlink_to(a)
    (tmp_path / "rel.yaml").write_text("path: a\ntrain: images/train\nnames: {0: cat, 1: dog}\n")
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "retry.yaml").write_text("path: ..\ntrain: ../a/images/train\nnames: [cat, dog]\n")
    (tmp_path / "list.yaml").write_text(f"train: [{a / 'images' / 'train'}]\nnames: [cat, dog]\n")
    spellings = [a / "data.yaml", tmp_path / "link" / "data.yaml", tmp_path / "rel.yaml", tmp_path / "up" / "retry.yaml",
                 tmp_path / "list.yaml", a / "images" / "train", tmp_path / "link" / "images" / "train"]  # fmt: skip
    keys = {served_data.expect(s).files_key for s in spellings}
    assert len(keys) == 1
    assert (
        served_data.expect(a / "data.yaml").names == ("cat", "dog") == served_data.expect(tmp_path / "rel.yaml").names
    )
    assert served_data.expect(a / "images" / "train").names is None  # a folder names no classes
    entries = served_data.expect_entries([str(a / "images" / "train")], asked="data=x")
    assert entries.files_key in keys


def test_the_daemon_description_is_what_the_trainer_compares(two_sets):
    a, b = two_sets / "a", two_sets / "b"
    described = served_data.describe(a / "data.yaml", None, split="train", task="detect")
    assert described["sources"] == [os.path.realpath(a / "images" / "train")] and described["source_count"] == 1
    served_data.check_served(served_data.expect(a / "images" / "train"), _attached(described), where="D")
    with pytest.raises(DatasetMismatchError) as caught:
        served_data.check_served(served_data.expect(b / "data.yaml"), _attached(described), where="D")
    text = str(caught.value)
    assert str(b / "images" / "train") in text and str(a / "images" / "train") in text and "other image sources" in text
    assert "kill 7" in text and "socket" in text and caught.value.field == "data"


def test_other_classes_task_or_split_are_refused(two_sets):
    a = two_sets / "a"
    described = served_data.describe(a / "data.yaml", None, split="train", task="detect")
    same = served_data.expect(a / "data.yaml")
    with pytest.raises(DatasetMismatchError, match="other classes"):
        served_data.check_served(same, _attached(described, names=["dog", "cat"]), where="D")
    with pytest.raises(DatasetMismatchError, match="task pose asked, task detect served"):
        served_data.check_served(served_data.expect(a / "data.yaml", task="pose"), _attached(described), where="D")
    val = served_data.describe(a / "data.yaml", None, split="val", task="detect")
    with pytest.raises(DatasetMismatchError, match="its val split"):
        served_data.check_served(same, _attached(val), where="D")


def test_a_daemon_that_cannot_say_what_it_serves_is_refused(two_sets, tmp_path):
    gone = served_data.describe(tmp_path / "moved.yaml", None, split="train", task="detect")
    assert "error" in gone and "files_key" not in gone
    expected = served_data.expect(two_sets / "a" / "data.yaml")
    with pytest.raises(DatasetMismatchError, match="does not say which files it serves"):
        served_data.check_served(expected, _attached(gone), where="D")
    with pytest.raises(DatasetMismatchError, match="earlier pixpool release"):
        served_data.check_served(expected, {"snapshot": {"fingerprint": "f"}, "num_records": 1}, where="D")
    with pytest.raises(MissingFileError):
        served_data.expect(tmp_path / "typo.yaml")


def test_a_coco_json_is_named_with_its_images_folder(tmp_path):
    root = tmp_path / "coco"
    (root / "annotations").mkdir(parents=True)
    (root / "images" / "train").mkdir(parents=True)
    (root / "other").mkdir()
    js = root / "annotations" / "instances_train.json"
    js.write_text("{}")
    default = served_data.expect(js)
    assert default.files_key == served_data.expect(js, root / "images" / "train").files_key
    assert default.files_key != served_data.expect(js, root / "other").files_key


# -- a relabelled version that shares the pixels: its label files are what the reader reads -------
def _labelled_set(root, label_class: int, *, images_from=None, labels_from=None, list_from=None):
    """A YOLO set at ``root``: images/train/{a,b}.jpg (or a symlink ``images`` -> ``images_from``'s),
    labels/train/*.txt of class ``label_class`` (or a symlink ``labels`` -> ``labels_from``'s), a
    train.txt image list with relative lines (or a symlink to ``list_from``'s), and data.yaml
    (folder) and list.yaml (the .txt list) naming the same classes."""
    root.mkdir(parents=True)
    if images_from is None:
        (root / "images" / "train").mkdir(parents=True)
        for name in ("a", "b"):
            (root / "images" / "train" / f"{name}.jpg").write_bytes(b"\xff\xd8")
    else:
        (root / "images").symlink_to(images_from / "images")
    if labels_from is None:
        (root / "labels" / "train").mkdir(parents=True)
        for name in ("a", "b"):
            (root / "labels" / "train" / f"{name}.txt").write_text(f"{label_class} 0.5 0.5 0.2 0.2\n")
    else:
        (root / "labels").symlink_to(labels_from / "labels")
    if list_from is None:
        (root / "train.txt").write_text("images/train/a.jpg\nimages/train/b.jpg\n")
    else:
        (root / "train.txt").symlink_to(list_from / "train.txt")
    (root / "data.yaml").write_text("train: images/train\nnames: [cat, dog]\n")
    (root / "list.yaml").write_text("train: train.txt\nnames: [cat, dog]\n")
    return root


@pytest.mark.parametrize("spelling", ["data.yaml", "list.yaml", "images/train"])
def test_a_relabelled_set_whose_images_are_a_symlink_is_another_dataset(tmp_path, spelling):
    """v2's ``images`` is a symlink to v1's (no pixels copied), its labels its own: the reader
    finds each label beside the image path as named, so v2's batches carry v2's classes. A
    daemon serving v1 must not be taken for v2 (before: both resolved to v1's folder)."""
    v1 = _labelled_set(tmp_path / "v1", 0)
    v2 = _labelled_set(tmp_path / "v2", 1, images_from=v1, list_from=v1)
    served = served_data.describe(v1 / spelling, None, split="train", task="detect")
    with pytest.raises(DatasetMismatchError) as caught:
        served_data.check_served(served_data.expect(v2 / spelling), _attached(served), where="D")
    assert "label" in str(caught.value), str(caught.value)
    # Ultralytics' resolved entries (``pixpool yolo train data=``) name their files alike.
    entries = served_data.expect_entries([str(v2 / "images" / "train")], asked="data=v2")
    assert entries.files_key == served_data.expect(v2 / "images" / "train").files_key != served["files_key"]
    # Every file read the same (the labels a symlink to v1's too): the same dataset.
    v3 = _labelled_set(tmp_path / "v3", 1, images_from=v1, labels_from=v1, list_from=v1)
    served_data.check_served(served_data.expect(v3 / spelling), _attached(served), where="D")


def test_a_coco_json_is_named_by_the_files_it_reads(tmp_path):
    """COCO: the labels are the json, each image its ``file_name`` under the images folder. A v2
    with its own json over v1's images (a symlink) is another dataset; a v2 that links both is v1."""
    v1 = tmp_path / "v1"
    (v1 / "annotations").mkdir(parents=True)
    (v1 / "images" / "train").mkdir(parents=True)
    (v1 / "images" / "train" / "a.jpg").write_bytes(b"\xff\xd8")
    (v1 / "annotations" / "instances_train.json").write_text('{"images": [], "annotations": [], "categories": []}')
    v2, v3 = tmp_path / "v2", tmp_path / "v3"
    for v in (v2, v3):
        (v / "annotations").mkdir(parents=True)
        (v / "images").symlink_to(v1 / "images")
    (v2 / "annotations" / "instances_train.json").write_text('{"images": [], "annotations": [1], "categories": []}')
    (v3 / "annotations" / "instances_train.json").symlink_to(v1 / "annotations" / "instances_train.json")
    served = served_data.describe(v1 / "annotations" / "instances_train.json", None, split="train", task="detect")
    with pytest.raises(DatasetMismatchError):
        served_data.check_served(
            served_data.expect(v2 / "annotations" / "instances_train.json"), _attached(served), where="D"
        )
    served_data.check_served(
        served_data.expect(v3 / "annotations" / "instances_train.json"), _attached(served), where="D"
    )
