"""Ultralytics' data-path arguments that pixpool honours only in part, or refuses beside others.

Each is answered at start: honoured as Ultralytics' own loader and trainer make it work, or
refused naming the argument and what to do (docs/ultralytics.md, "Every data argument").
Pure: ``hyp`` and ``batches`` import no Ultralytics code. Where the answer has to agree with
Ultralytics' own code (its ``check_imgsz``, ``get_split_fraction``, ``update_labels``), the
Ultralytics venv compares them in ``integration/test_ultralytics_args.py``.
"""

from __future__ import annotations

import pytest
import torch

from pixpool.integrations.ultralytics import hyp
from pixpool.integrations.ultralytics.batches import ShapeCache, to_ultralytics
from pixpool.shared.errors import ConfigError


def _refused(args: dict, *, data: dict | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        hyp.stream_settings(args, data=data)
    return info.value


# -- time ---------------------------------------------------------------------------------
def test_time_passes_without_close_mosaic_and_is_refused_beside_it():
    assert hyp.stream_settings({"time": 0.5, "close_mosaic": 0}).augment.close_mosaic == 0
    err = _refused({"time": 0.5, "close_mosaic": 10, "epochs": 100})
    assert err.field == "time" and "time=0.5 with close_mosaic=10" in str(err)
    assert "set close_mosaic=0 with time=" in str(err) and "epochs=" in str(err)


# -- classes ------------------------------------------------------------------------------
def test_classes_are_read_as_ultralytics_takes_them():
    assert hyp.classes_of(None) is None and hyp.classes_of([]) is None
    assert hyp.classes_of(2) == (2,) and hyp.classes_of([0, 3.0]) == (0, 3)
    with pytest.raises(ConfigError) as info:
        hyp.classes_of(["person"])
    assert info.value.field == "classes" and "give class ids" in str(info.value)


@pytest.mark.parametrize("task", ["detect", "pose", "obb"])
def test_classes_pass_for_the_tasks_whose_rows_stand_alone(task):
    hyp.stream_settings({"task": task, "classes": [0], "copy_paste": 0.0})


def test_classes_are_refused_for_segment_and_beside_copy_paste():
    err = _refused({"task": "segment", "classes": [0]})
    assert err.field == "classes" and "not supported for segment" in str(err) and "mask plane" in str(err)
    err = _refused({"task": "obb", "classes": [0], "copy_paste": 0.3})
    assert err.field == "classes" and "classes=[0] with copy_paste=0.3" in str(err) and "set copy_paste=0" in str(err)


def _targets(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).reshape(-1, 6)


def test_classes_drop_the_other_rows_of_each_batch_in_order(tmp_path):
    from PIL import Image

    files = []
    for i in range(2):
        path = tmp_path / f"{i}.jpg"
        Image.new("RGB", (64, 48)).save(path)
        files.append(str(path))
    targets = _targets(
        [
            [0, 2, 0.5, 0.5, 0.1, 0.1],
            [0, 0, 0.4, 0.4, 0.2, 0.2],
            [1, 1, 0.3, 0.3, 0.1, 0.1],
            [1, 2, 0.6, 0.6, 0.3, 0.3],
        ]
    )
    images = torch.zeros((2, 3, 64, 64), dtype=torch.uint8)
    batch = to_ultralytics(images, targets, files, imgsz=64, shapes=ShapeCache(), classes=(2,))
    assert batch["cls"].flatten().tolist() == [2.0, 2.0]
    assert batch["batch_idx"].tolist() == [0.0, 1.0]  # both images kept, one row each
    assert batch["bboxes"].tolist() == targets[[0, 3], 2:6].tolist()
    # single_cls after the filter, as Ultralytics' update_labels orders them.
    batch = to_ultralytics(images, targets, files, imgsz=64, shapes=ShapeCache(), classes=(0, 1), single_cls=True)
    assert batch["cls"].flatten().tolist() == [0.0, 0.0] and batch["batch_idx"].tolist() == [0.0, 1.0]
    # A class no row has: an empty batch of targets, every image kept (background images).
    batch = to_ultralytics(images, targets, files, imgsz=64, shapes=ShapeCache(), classes=(7,))
    assert tuple(batch["cls"].shape) == (0, 1) and tuple(batch["img"].shape) == (2, 3, 64, 64)


# -- fraction -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, share", [(None, 1.0), (1, 1.0), (1.0, 1.0), (0.5, 0.5), (64, 64), ([0.2, 0.5], 0.2), ([], 1.0)]
)
def test_the_training_share_of_fraction(value, share):
    assert hyp.train_fraction(value) == share


def test_fraction_below_the_whole_training_split_is_refused_naming_what_to_do():
    err = _refused({"fraction": 0.25})
    assert err.field == "fraction" and "fraction=0.25" in str(err)
    assert "set fraction=1" in str(err) and "[1.0, val, test]" in str(err)


# -- imgsz, batch -------------------------------------------------------------------------
def test_an_imgsz_pair_trains_square_at_its_larger_side():
    assert hyp.augment_config({"imgsz": [320, 640]}).imgsz == 640
    assert hyp.augment_config({"imgsz": (640, 320)}).imgsz == 640
    assert hyp.augment_config({"imgsz": [320]}).imgsz == 320


@pytest.mark.parametrize("batch", [-1, 0.7])
def test_autobatch_passes_and_the_stream_takes_the_size_ultralytics_chose(batch):
    hyp.check_supported({"batch": batch})
    assert hyp.stream_settings({"batch": batch}, batch_size=24).batch_size == 24
    err = _refused({"batch": batch})  # unresolved: no size to attach with
    assert err.field == "batch" and "AutoBatch is resolved by Ultralytics' trainer" in str(err)


# -- channels -----------------------------------------------------------------------------
@pytest.mark.parametrize("channels", [1, 4])
def test_a_dataset_of_other_than_three_channels_is_refused(channels):
    err = _refused({}, data={"channels": channels, "names": {0: "a"}})
    assert err.field == "channels" and f"channels={channels}" in str(err)
    assert "3-channel RGB" in str(err) and "Ultralytics' own loader" in str(err)
    hyp.stream_settings({}, data={"channels": 3})
    hyp.stream_settings({}, data={"names": {0: "a"}})  # Ultralytics' default: 3
