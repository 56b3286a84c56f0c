"""Ultralytics' hyper-parameters -> pixpool's stream, field by field; what is refused, by name.

The mapping is pure (``pixpool.integrations.ultralytics.hyp`` imports no Ultralytics code),
so these run in every venv. Ultralytics' own defaults are checked against it in
``integration/test_ultralytics.py`` where Ultralytics is installed.
"""

from __future__ import annotations

import sys

import pytest

from pixpool.integrations.ultralytics import hyp
from pixpool.integrations.ultralytics.command import parse_pairs
from pixpool.shared.cli import main
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
    "copy_paste": 0.4,
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
    assert settings.augment.augment is True
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
        ("cutmix", 0.5),
        ("bgr", 0.1),
        ("copy_paste_mode", "mixup"),
        ("task", "segment"),
        ("task", "pose"),
        ("rect", True),
        ("fraction", 0.5),
        ("classes", [0, 2]),
        ("cache", "disk"),
        ("time", 1.5),
        ("augmentations", ["blur"]),
        ("quantize", 8),
        ("batch", -1),
        ("batch", 0.7),
        ("scale", (0.5, 1.5)),
        ("imgsz", [320, 640]),
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
