"""Configuration reaches the command line whole, and errors speak the caller's language.

Unit tests: argparse and the dataclasses only; no process is started (the commands below
fail while their settings are built, before anything is read or decoded).
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from pixpool.cli import digest as digest_args
from pixpool.cli.main import COMMANDS, main
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings
from pixpool.shared.stream.flags import flag_of


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "command, classes, skip",
    [
        ("serve", (DaemonConfig,), {"data"}),
        ("train", (AugmentConfig,), {"epochs"}),  # AugmentConfig.epochs is the run's --epochs
        ("digest", (StreamSettings, AugmentConfig), {"augment"}),
    ],
)
def test_every_setting_is_a_flag_with_its_default(capsys, command, classes, skip):
    text = " ".join(_help(capsys, command).split())  # argparse wraps help lines
    for cls in classes:
        for f in dataclasses.fields(cls):
            if f.name in skip:
                continue
            assert flag_of(f) in text, f"{cls.__name__}.{f.name} has no flag in `pixpool {command} --help`"
    if command == "train":
        for flag in (
            "--epochs",
            "--batch-size",
            "--seed",
            "--lr",
            "--optimizer",
            "--project",
            "--resume",
            "--device",
            "--val",
            "--hsv-on-device",
        ):
            assert flag in text
    if command == "serve":
        for name in ("job-timeout-s", "max-ring-nbytes", "max-total-ring-nbytes", "heartbeat-timeout-s"):
            assert f"--{name}" in text
        assert "(default 300.0)" in text and f"(default {2 << 30})" in text


def test_python_names_the_field_and_the_cli_names_the_flag(capsys, tmp_path):
    with pytest.raises(ConfigError, match=r"field 'workers' = 0 is out of range"):
        DaemonConfig(data="x.json", workers=0)
    assert main(["serve", str(tmp_path / "x.json"), "--workers", "0"]) == 1
    err = capsys.readouterr().err
    assert "--workers 0 is out of range" in err and "(field 'workers')" in err
    # A message about one field that names another: each side shows its own spelling.
    with pytest.raises(ConfigError, match="set keys_dir"):
        DaemonConfig(data="x.json", tcp="127.0.0.1:5555")
    assert main(["serve", str(tmp_path / "x.json"), "--tcp", "127.0.0.1:5555"]) == 1
    err = capsys.readouterr().err
    assert "--tcp '127.0.0.1:5555' requires CURVE keys" in err and "set --keys" in err


def test_bool_flags_alone_or_with_a_value(capsys):
    parser = argparse.ArgumentParser()
    digest_args.configure(parser)
    args = parser.parse_args(["data.json", "--shuffle", "0", "--hsv-on-device"])
    settings = digest_args.settings_from(args)
    assert settings.shuffle is False and settings.hsv_on_device is True
    with pytest.raises(SystemExit):
        parser.parse_args(["data.json", "--shuffle", "maybe"])
    assert "expected 0/1 or true/false" in capsys.readouterr().err


def test_one_range_check_for_imgsz(capsys):
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot

    for make in (
        lambda: AugmentConfig(imgsz=16),
        lambda: DaemonConfig(data="x", imgsz=16),
        lambda: prepare_snapshot(None, PrepareOptions(imgsz=16)),
    ):
        with pytest.raises(ConfigError, match=r"field 'imgsz' = 16 is out of range; use 32 to 8192"):
            make()


@pytest.mark.parametrize("value, nearest", [(300, "288 or 320"), (33, "32 or 64"), (8191, "8160 or 8192")])
def test_imgsz_is_a_multiple_of_32_for_the_daemon_and_the_trainer_alike(capsys, tmp_path, value, nearest):
    # One rule, one message: `serve --imgsz 300` is refused as `train --imgsz 300` is.
    for make in (lambda: AugmentConfig(imgsz=value), lambda: DaemonConfig(data="x", imgsz=value)):
        with pytest.raises(ConfigError, match=rf"field 'imgsz' = {value} is not a multiple of 32; use {nearest}$"):
            make()
    for command in ("serve", "prepare", "train", "digest"):
        data = [] if command == "train" else [str(tmp_path / "x.json")]  # refused before the file is looked for
        assert main([command, *data, "--imgsz", str(value)]) == 1
        err = capsys.readouterr().err
        assert f"--imgsz {value} is not a multiple of 32; use {nearest} (field 'imgsz')" in err, (command, err)


def test_a_trainer_without_imgsz_takes_the_daemons_and_another_is_refused():
    settings = StreamSettings(seed=3)
    assert settings.augment.imgsz is None
    at = settings.for_imgsz(320)
    assert at.augment.imgsz == 320 and at.seed == 3 and at.for_imgsz(320) is at
    with pytest.raises(ConfigError, match=r"asks for imgsz 640 but the daemon serves imgsz 320") as err:
        StreamSettings(augment=AugmentConfig(imgsz=640)).for_imgsz(320)
    assert err.value.field == "imgsz"


def test_dispatcher_sides():
    # Every command is a module of pixpool.cli, and each one imports.
    import importlib

    assert set(COMMANDS) == {
        "synth", "prepare", "ls", "clean", "digest", "plan", "serve", "status", "keys",
        "memory", "monitor", "plot", "train", "demo", "yolo",
    }  # fmt: skip
    for command in COMMANDS.values():
        module = importlib.import_module(f"pixpool.cli.{command.module}")
        assert callable(module.configure) and callable(module.run)


@pytest.mark.parametrize("command", ["prepare", "serve", "digest"])
def test_every_preparing_command_has_the_dtype_flag_with_its_choices(capsys, command):
    text = " ".join(_help(capsys, command).split())
    help_text = text.rsplit("--dtype float32|uint8", 1)[1][:400]
    assert "(default uint8)" in help_text and "float32 (" in help_text and "parity" in help_text, help_text
    assert DaemonConfig(data="x").dtype == "uint8" and DaemonConfig(data="x", dtype="float32").dtype == "float32"


def test_preparation_options_are_the_daemons_fields_declared_once():
    from pixpool.shared.stream.config import PrepareOptions

    daemon = {f.name: f for f in dataclasses.fields(DaemonConfig)}
    for f in dataclasses.fields(PrepareOptions):
        assert f.name in daemon, f"PrepareOptions.{f.name} is no DaemonConfig field"
        assert (f.default, dict(f.metadata)) == (daemon[f.name].default, dict(daemon[f.name].metadata))
    config = DaemonConfig(data="d.yaml", imgsz=320, dtype="uint8", processes=3, memory_budget_nbytes=1 << 30)
    options = config.prepare_options(keep_snapshot=True)
    assert (options.imgsz, options.dtype, options.processes, options.memory_budget_nbytes) == (320, "uint8", 3, 1 << 30)
    assert options.keep_snapshot and not config.keep_snapshot
    with pytest.raises(ConfigError, match="field 'prepare_wait_s' = -1.0 is out of range"):
        config.prepare_options(prepare_wait_s=-1.0)


def _serve_args(*argv: str) -> argparse.Namespace:
    from pixpool.cli import serve

    parser = argparse.ArgumentParser(prog="pixpool serve")
    serve.configure(parser, "serve")
    return parser.parse_args(["data.yaml", *argv])


def test_store_warn_free_is_the_flag(capsys):
    from pixpool.shared.stream.flags import from_args

    text = " ".join(_help(capsys, "serve").split())
    assert "--store-warn-free SIZE" in text
    new = from_args(DaemonConfig, _serve_args("--store-warn-free", "2G"))
    assert new.store_warn_free_nbytes == 2 << 30
    # Unset, it leaves the default (a tenth of the store), and a bad size names the flag.
    assert from_args(DaemonConfig, _serve_args()).store_warn_free_nbytes is None
    with pytest.raises(SystemExit):
        _serve_args("--store-warn-free", "lots")
    assert "--store-warn-free: expected a size" in capsys.readouterr().err
