"""Ultralytics' hyper-parameters -> pixpool's stream, field by field; what is refused, by name.

The mapping is pure (``pixpool.integrations.ultralytics.hyp`` imports no Ultralytics code),
so these run in every venv. Ultralytics' own defaults are checked against it in
``integration/test_ultralytics.py`` where Ultralytics is installed.
"""

from __future__ import annotations

import sys

import pytest

from pixpool.cli import main
from pixpool.integrations.ultralytics import hyp
from pixpool.integrations.ultralytics.run import parse_pairs
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import AugmentConfig

# One non-default, in-range value per mapped key (each differs from AugmentConfig's default).
VALUES = {
    "imgsz": 320,
    "mosaic": 0.25,
    "degrees": 7.5,
    "translate": 0.2,
    "scale": 0.3,
    "shear": 2.0,
    "perspective": 0.0005,
    "flipud": 0.1,
    "fliplr": 0.2,
    "hsv_h": 0.02,
    "hsv_s": 0.5,
    "hsv_v": 0.3,
    "mixup": 0.15,
    "cutmix": 0.35,
    "copy_paste": 0.4,
    "copy_paste_mode": "mixup",
    "close_mosaic": 3,
    "epochs": 12,
}


def test_every_listed_key_is_mapped():
    assert set(VALUES) == set(hyp.AUGMENT_KEYS)
    defaults = AugmentConfig()
    for key, value in VALUES.items():
        assert getattr(defaults, hyp.AUGMENT_KEYS[key]) != value, key


@pytest.mark.parametrize("key", sorted(VALUES))
def test_each_augmentation_key_lands_in_its_field_alone(key):
    cfg = hyp.augment_config({key: VALUES[key]})
    field = hyp.AUGMENT_KEYS[key]
    assert getattr(cfg, field) == VALUES[key]
    # Nothing else moved.
    others = {f: v for f, v in cfg.to_dict().items() if f != field}
    assert others == {f: v for f, v in AugmentConfig().to_dict().items() if f != field}


def test_all_keys_together_and_the_stream_fields():
    settings = hyp.stream_settings(
        {**VALUES, "batch": 24, "seed": 7, "lr0": 0.02, "optimizer": "SGD"}, rank=1, world_size=2
    )
    for key, value in VALUES.items():
        assert getattr(settings.augment, hyp.AUGMENT_KEYS[key]) == value, key
    assert (settings.batch_size, settings.seed, settings.rank, settings.world_size, settings.shuffle) == (
        24,
        7,
        1,
        2,
        True,
    )
    assert settings.augment.train_route is True
    # Ultralytics gives each DDP rank batch // world_size.
    assert hyp.stream_settings({"batch": 24}, batch_size=12, rank=0, world_size=2).batch_size == 12


def test_close_mosaic_closes_on_the_epoch_ultralytics_closes():
    # Ultralytics' rule: close when epoch >= epochs - close_mosaic (engine/trainer.py).
    cfg = hyp.augment_config({"epochs": 10, "close_mosaic": 3})
    assert [cfg.mosaic_closed(e) for e in range(10)] == [e >= 10 - 3 for e in range(10)]
    assert not any(hyp.augment_config({"epochs": 10, "close_mosaic": 0}).mosaic_closed(e) for e in range(10))


@pytest.mark.parametrize(
    "key, value",
    [
        ("bgr", 0.1),
        ("task", "classify"),
        ("rect", True),
        ("fraction", 0.5),
        ("fraction", 64),
        ("fraction", [0.5, 1.0]),
        ("cache", "disk"),
        ("augmentations", ["blur"]),
        ("quantize", 8),
        ("batch", 0),
        ("batch", 2.5),
        ("scale", (0.5, 1.5)),
    ],
)
def test_unsupported_settings_are_refused_by_name(key, value):
    with pytest.raises(ConfigError) as info:
        hyp.stream_settings({key: value})
    assert info.value.field == key
    assert f"{key}={value!r}" in str(info.value)


@pytest.mark.parametrize(
    "key, value",
    [
        ("cutmix", 0.0),
        ("bgr", 0.0),
        ("copy_paste_mode", "flip"),
        ("task", "detect"),
        ("task", "segment"),
        ("task", "pose"),
        ("task", "obb"),
        ("rect", False),
        ("fraction", 1.0),
        ("classes", None),
        ("cache", False),
        ("cache", "ram"),
        ("time", None),
        ("augmentations", None),
        ("quantize", None),
        ("auto_augment", "randaugment"),
        ("erasing", 0.4),
        ("multi_scale", 0.5),
        ("single_cls", True),
        ("fraction", [1.0, 0.5]),  # the validation share is Ultralytics' own loader's
        ("fraction", 1),
        ("classes", [0, 2]),
        ("classes", 1),
        ("time", 1.5),  # without close_mosaic (pixpool's default 0)
    ],
)
def test_no_op_values_and_settings_outside_the_route_pass(key, value):
    hyp.stream_settings({key: value})


@pytest.mark.parametrize(
    "key, value", [("translate", 0.95), ("perspective", 0.01), ("mosaic", 1.5), ("imgsz", 16), ("batch", 5000)]
)
def test_out_of_range_values_name_the_ultralytics_key(key, value):
    with pytest.raises(ConfigError) as info:
        hyp.stream_settings({key: value})
    assert info.value.field == key
    assert f"{key}={value!r}" in str(info.value) and "out of range" in str(info.value)


SEGMENT_VALUES = {"mask_ratio": 2, "overlap_mask": True}


def test_mask_settings_land_in_their_fields_for_segment_only():
    assert set(SEGMENT_VALUES) == set(hyp.SEGMENT_KEYS)
    cfg = hyp.augment_config({"task": "segment", **SEGMENT_VALUES})
    assert (cfg.mask_ratio, cfg.overlap_mask) == (2, True)
    # Ultralytics' Format reads them only when it renders masks: other tasks keep the defaults.
    for task in ("detect", "pose", "obb"):
        cfg = hyp.augment_config({"task": task, "mask_ratio": 8, "overlap_mask": False})
        assert (cfg.mask_ratio, cfg.overlap_mask) == (AugmentConfig().mask_ratio, AugmentConfig().overlap_mask), task


def test_overlap_mask_false_is_refused_for_segment_by_name():
    with pytest.raises(ConfigError) as info:
        hyp.stream_settings({"task": "segment", "overlap_mask": False})
    assert info.value.field == "overlap_mask"
    assert "overlap_mask=False" in str(info.value) and "set overlap_mask=True" in str(info.value)


def test_mask_ratio_out_of_range_names_the_ultralytics_key():
    with pytest.raises(ConfigError) as info:
        hyp.stream_settings({"task": "segment", "mask_ratio": 64})
    assert info.value.field == "mask_ratio" and "mask_ratio=64" in str(info.value)


def test_pose_without_flip_idx_trains_without_flips_as_ultralytics_does():
    data = {"kpt_shape": [3, 3]}
    cfg = hyp.augment_config({"task": "pose", "fliplr": 0.5, "flipud": 0.2}, data=data)
    assert (cfg.fliplr, cfg.flipud) == (0.0, 0.0)
    cfg = hyp.augment_config({"task": "pose", "fliplr": 0.5, "flipud": 0.2}, data={**data, "flip_idx": [0, 2, 1]})
    assert (cfg.fliplr, cfg.flipud) == (0.5, 0.2)
    # Another task keeps its flips whatever the dataset says.
    assert hyp.augment_config({"task": "detect", "fliplr": 0.5}, data=data).fliplr == 0.5


def test_pose_flip_idx_of_the_wrong_length_is_refused():
    with pytest.raises(ConfigError) as info:
        hyp.augment_config({"task": "pose"}, data={"kpt_shape": [3, 3], "flip_idx": [1, 0]})
    assert info.value.field == "flip_idx"
    assert "flip_idx has 2 entries" in str(info.value) and "kpt_shape [3, 3] has 3 keypoints" in str(info.value)


def test_a_stream_of_another_task_is_refused_naming_both():
    with pytest.raises(ConfigError) as info:
        hyp.check_served(task="segment", data={}, served_task="detect", where="the pixpool daemon at /s")
    text = str(info.value)
    assert info.value.field == "task"
    assert "serves the 'detect' task but the model trains 'segment'" in text
    assert "pixpool serve --task segment" in text and text.startswith("the pixpool daemon at /s")
    with pytest.raises(ConfigError, match="serves the 'pose' task but the model trains 'detect'.*or give a pose model"):
        hyp.check_served(task="detect", data={}, served_task="pose")  # a detect model on a pose stream
    hyp.check_served(task="obb", data={}, served_task="obb")


def test_a_pose_stream_of_another_keypoint_layout_is_refused():
    data = {"kpt_shape": [17, 3], "flip_idx": list(range(17))}
    hyp.check_served(
        task="pose", data=data, served_task="pose", served_kpt_shape=(17, 3), served_flip_idx=tuple(range(17))
    )
    with pytest.raises(ConfigError) as info:
        hyp.check_served(task="pose", data=data, served_task="pose", served_kpt_shape=(5, 3), served_flip_idx=None)
    assert info.value.field == "kpt_shape" and "kpt_shape [5, 3]" in str(info.value) and "[17, 3]" in str(info.value)
    with pytest.raises(ConfigError) as info:
        hyp.check_served(task="pose", data=data, served_task="pose", served_kpt_shape=(17, 3), served_flip_idx=None)
    assert info.value.field == "flip_idx" and "flip_idx None" in str(info.value)


def test_key_value_pairs():
    assert parse_pairs(["epochs=3", "data=a.yaml"]) == {"epochs": "3", "data": "a.yaml"}
    with pytest.raises(ConfigError, match="'epochs' is not key=value"):
        parse_pairs(["epochs"])
    with pytest.raises(ConfigError, match="epochs= is given twice"):
        parse_pairs(["epochs=3", "epochs=4"])


def test_yolo_command_without_ultralytics_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ultralytics", None)  # import ultralytics -> ImportError
    assert main(["yolo", "train", "model=yolo11n.yaml", "data=x.yaml"]) == 1
    err = capsys.readouterr().err
    assert "pip install 'pixpool[ultralytics]'" in err and "pixpool yolo train" in err
