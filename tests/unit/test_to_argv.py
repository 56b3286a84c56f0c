"""``to_argv`` is the parser's inverse: a configuration written as arguments parses back equal.

Unit tests: argparse and the dataclasses only; no process is started.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings
from pixpool.shared.stream.flags import add_fields, from_args, to_argv

# Every field away from its default (a test below checks that none is left at it).
AUGMENT = AugmentConfig(
    imgsz=416, mosaic=0.25, degrees=12.5, translate=0.3, scale=0.75, shear=3.0, perspective=0.0007, copy_paste=0.4,
    mixup=0.15, cutmix=0.35, copy_paste_mode="mixup", mask_ratio=2, overlap_mask=False, fliplr=0.1, flipud=0.9,
    hsv_h=0.1, hsv_s=0.33, hsv_v=0.2, close_mosaic=3, epochs=40, train_route=False, rect_stride=64,
)  # fmt: skip
STREAM = StreamSettings(
    seed=(1 << 62) + 7, batch_size=24, rank=2, world_size=3, shuffle=False, drop_last=True, start_epoch=5,
    hsv_on_device=True, split="val", augment=AUGMENT,
)  # fmt: skip
DAEMON = DaemonConfig(
    data="data/coco.json", images="imgs dir", val="val.json", val_images="val imgs", no_val=True, imgsz=320,
    task="pose", processes=7, dtype="float32", max_instances_per_image=77, allow_unlabelled=True, max_classes=321,
    prepare_wait_s=12.25, workers=5,
    store="/mnt/store", socket_dir="/run/px", tcp="0.0.0.0:5555", keys_dir="/etc/px-keys", keep_snapshot=True,
    heartbeat_timeout_s=3.5, job_timeout_s=99.0, straggler_factor=2.5, straggler_min_s=0.75, max_ring_nbytes=(1 << 30) + 3,
    max_total_ring_nbytes=5 << 30, max_trainers=9, max_trainers_per_client=4, memory_budget_nbytes=(8 << 30) + 1,
    store_warn_free_nbytes=123456789, metrics_port=9100, metrics_host="0.0.0.0",
)  # fmt: skip


def _parse_daemon(argv: list[str]) -> DaemonConfig:
    parser = argparse.ArgumentParser()
    add_fields(parser, DaemonConfig)
    return from_args(DaemonConfig, parser.parse_args(argv))


def _parse_stream(argv: list[str]) -> StreamSettings:
    parser = argparse.ArgumentParser()
    add_fields(parser, StreamSettings)
    add_fields(parser, AugmentConfig, prefix="aug_")
    args = parser.parse_args(argv)
    return from_args(StreamSettings, args, augment=from_args(AugmentConfig, args, prefix="aug_"))


def _parse_augment(argv: list[str]) -> AugmentConfig:
    parser = argparse.ArgumentParser()
    add_fields(parser, AugmentConfig)
    return from_args(AugmentConfig, parser.parse_args(argv))


@pytest.mark.parametrize("config", [DAEMON, STREAM, AUGMENT], ids=lambda c: type(c).__name__)
def test_the_examples_leave_no_field_at_its_default(config):
    for f in dataclasses.fields(config):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert getattr(config, f.name) != default, f"{type(config).__name__}.{f.name} is at its default"


@pytest.mark.parametrize(
    "config, parse",
    [(DAEMON, _parse_daemon), (STREAM, _parse_stream), (AUGMENT, _parse_augment)],
    ids=["DaemonConfig", "StreamSettings", "AugmentConfig"],
)
def test_every_field_round_trips(config, parse):
    assert parse(to_argv(config)) == config


@pytest.mark.parametrize(
    "config, parse",
    [
        (DaemonConfig(data="d.yaml"), _parse_daemon),
        (StreamSettings(), _parse_stream),
        (AugmentConfig(), _parse_augment),
    ],
    ids=["DaemonConfig", "StreamSettings", "AugmentConfig"],
)
def test_defaults_are_left_out(config, parse):
    argv = to_argv(config)
    assert argv == (["d.yaml"] if isinstance(config, DaemonConfig) else [])
    assert parse(argv) == config


def test_the_spellings_a_reader_sees():
    argv = to_argv(
        DaemonConfig(
            data="d.yaml", imgsz=320, keep_snapshot=True, memory_budget_nbytes=8 << 30, keys_dir="k", tcp="h:1"
        )
    )
    assert argv[0] == "d.yaml"  # positionals first
    pairs = dict(zip(argv[1::2], argv[2::2]))
    assert pairs == {
        "--imgsz": "320",
        "--keep-snapshot": "1",  # bools as 0/1
        "--memory-budget": str(8 << 30),  # sizes as bytes, under the field's own flag
        "--keys": "k",
        "--tcp": "h:1",
    }
    assert to_argv(StreamSettings(shuffle=False)) == ["--shuffle", "0"]
    assert to_argv(AugmentConfig(perspective=1e-4)) == ["--perspective", "0.0001"]


def test_what_no_flag_can_say_is_refused():
    with pytest.raises(ConfigError, match="field 'data' = '-x.json' starts with '-'"):
        to_argv(DaemonConfig(data="-x.json"))
    with pytest.raises(TypeError, match="instance"):
        to_argv(DaemonConfig)
