"""``served_data``: one dataset in any spelling resolves to one identity, another is refused by name.

Unit tests: files in a temporary folder, no process (issue 26, fault class 7).
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
    keys = {served_data.expect(s).source_key for s in spellings}
    assert len(keys) == 1
    assert (
        served_data.expect(a / "data.yaml").names == ("cat", "dog") == served_data.expect(tmp_path / "rel.yaml").names
    )
    assert served_data.expect(a / "images" / "train").names is None  # a folder names no classes
    entries = served_data.expect_entries([str(a / "images" / "train")], asked="data=x")
    assert entries.source_key in keys


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
    assert "error" in gone and "source_key" not in gone
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
    assert default.source_key == served_data.expect(js, root / "images" / "train").source_key
    assert default.source_key != served_data.expect(js, root / "other").source_key
