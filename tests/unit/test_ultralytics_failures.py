"""A refused ``pixpool yolo train`` says one line naming the key or file, and leaves no run folder.

Unit tests without Ultralytics: the texts below are the ones Ultralytics raises (8.4), given
to the shaping functions of ``integrations/ultralytics/failures.py``.
"""

from __future__ import annotations

import pytest

from pixpool.integrations.ultralytics.failures import cv2_problem, explain, remove_unused_run
from pixpool.shared.errors import ConfigError

VALID = {"epochs": 100, "data": None, "model": None, "imgsz": 640, "batch": 16}


def _line(exc: BaseException, **overrides) -> ConfigError:
    shaped = explain(exc, overrides=overrides, valid_keys=VALID)
    assert isinstance(shaped, ConfigError)
    assert "\n" not in str(shaped)
    return shaped


def test_a_mistyped_key_names_the_key_and_the_one_meant():
    exc = SyntaxError("'epoch' is not a valid YOLO argument. Similar arguments are i.e. ['epochs=100'].\n")
    shaped = _line(exc, epoch=3, model="yolo11n.yaml")
    assert str(shaped).startswith("epoch=3 is not an Ultralytics setting (did you mean epochs=?)")
    assert shaped.field == "epoch" and "yolo cfg" in str(shaped)
    two = SyntaxError(
        "'epoch' is not a valid YOLO argument. Similar arguments are i.e. ['epochs=100'].\n"
        "'imgszz' is not a valid YOLO argument. \n"
    )
    text = str(_line(two, epoch=3, imgszz=320))
    assert "epoch=3 is not" in text and "imgszz=320 is not an Ultralytics setting (did you mean imgsz=?)" in text


def test_a_missing_data_file_names_data_and_the_file():
    exc = RuntimeError("Dataset 'missing.yaml' error ❌ 'missing.yaml' does not exist")
    shaped = _line(exc, data="missing.yaml", model="yolo11n.yaml")
    assert str(shaped).startswith("data=missing.yaml: 'missing.yaml' does not exist; give the path of a data.yaml")
    assert shaped.field == "data" and "❌" not in str(shaped)


def test_an_offline_weights_download_names_model_and_what_to_do():
    url = "https://github.com/ultralytics/assets/releases/download/v8.4.0/yolo11n.pt"
    exc = ConnectionError(f"❌  Download failure for {url}. Environment may be offline.")
    shaped = _line(exc, model="yolo11n.pt", data="d.yaml")
    text = str(shaped)
    assert text.startswith(
        f"model=yolo11n.pt: the weights could not be downloaded from {url} (Environment may be offline)"
    )
    assert "model=PATH/yolo11n.pt" in text and "model=yolo11n.yaml" in text and shaped.field == "model"


def test_a_missing_model_file_names_model():
    shaped = _line(FileNotFoundError("'nets/mine.yaml' does not exist"), model="nets/mine.yaml", data="d.yaml")
    assert str(shaped) == "model=nets/mine.yaml: the file does not exist; check the path" and shaped.field == "model"


def test_other_failures_are_left_as_they_are():
    assert explain(RuntimeError("CUDA out of memory"), overrides={"model": "m.yaml"}) is None
    assert explain(ValueError("anything"), overrides={}) is None


def test_a_refused_run_leaves_no_folder_and_a_run_that_trained_keeps_its_own(tmp_path):
    refused = tmp_path / "train"
    (refused / "weights").mkdir(parents=True)
    (refused / "args.yaml").write_text("epochs: 3\n")
    assert remove_unused_run(refused) and not refused.exists()
    trained = tmp_path / "train2"
    (trained / "weights").mkdir(parents=True)
    (trained / "args.yaml").write_text("epochs: 3\n")
    (trained / "weights" / "last.pt").write_bytes(b"x")
    assert not remove_unused_run(trained) and (trained / "weights" / "last.pt").exists()
    logged = tmp_path / "train3"
    logged.mkdir()
    (logged / "results.csv").write_text("epoch\n")
    assert not remove_unused_run(logged) and logged.exists()
    assert not remove_unused_run(None) and not remove_unused_run(tmp_path / "never-made")


@pytest.mark.parametrize(
    "installed, imports, expected",
    [
        ({"opencv-python-headless": "5.0.0.93"}, True, None),
        # what `pip install 'pixpool[ultralytics]'` gives: both, one version, one cv2
        ({"opencv-python-headless": "5.0.0.93", "opencv-python": "5.0.0.93"}, True, None),
        (
            {"opencv-python-headless": "5.0.0.93", "opencv-python": "4.10.0.84"},
            True,
            "opencv-python 4.10.0.84, opencv-python-headless 5.0.0.93 are installed and all write the same cv2 files",
        ),
        ({"opencv-python": "5.0.0.93"}, False, "pip install --force-reinstall --no-deps opencv-python==5.0.0.93"),
    ],
)
def test_the_cv2_distributions(installed, imports, expected):
    problem = cv2_problem(installed, imports=imports)
    if expected is None:
        assert problem is None
    else:
        assert expected in problem
        if imports:
            assert problem.endswith("opencv-python==5.0.0.93 opencv-python-headless==5.0.0.93")
