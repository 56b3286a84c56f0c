"""Trainer-side settings declared once: ``attach``'s overrides, ``pixpool train``'s generated flags,
the run folder's next free name, and the resume rule (restore, refuse naming field and values)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import pickle
from pathlib import Path

import pytest

from pixpool.cli import train as train_cmd
from pixpool.client.loader import attach, stream_settings
from pixpool.client.train.checkpoint import resumed_config
from pixpool.client.train.fit_config import DETECTOR_SCALES, FitConfig, explicit_settings, flat_settings
from pixpool.client.train.run_dir import claim
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings


# -- attach(settings=None, **overrides) --------------------------------------------------------
def test_attach_declares_no_stream_or_augmentation_field_again():
    params = set(inspect.signature(attach).parameters)
    declared = {f.name for f in dataclasses.fields(StreamSettings)} | {
        f.name for f in dataclasses.fields(AugmentConfig)
    }
    assert params & declared == set(), params & declared
    assert {"settings", "overrides", "endpoint", "keys_dir", "device", "timeout_s", "slots", "store"} <= params
    assert {"zero_copy", "follow_snapshot"} <= params


def test_an_unknown_override_is_named_with_the_known_fields(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    # A name close to none (a close one gets "did you mean": test_cli_words.py).
    with pytest.raises(
        ConfigError,
        match=r"unknown field\(s\) \['xyzzy'\].*StreamSettings fields: .*'seed'.*AugmentConfig fields: .*'mosaic'",
    ) as info:
        stream_settings(xyzzy=1.0)
    assert info.value.field == "xyzzy"
    with pytest.raises(ConfigError, match="'mosaic' = 2.0 is out of range"):
        stream_settings(mosaic=2.0)  # checked by AugmentConfig, as any of its fields


def test_overrides_apply_to_the_settings_given(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    # Existing callers: flat keywords, rank and world size from the environment.
    s = stream_settings(batch_size=4, seed=3, imgsz=96, mosaic=0.5, copy_paste=0.25)
    assert (s.batch_size, s.seed, s.rank, s.world_size) == (4, 3, 1, 2)
    assert (s.augment.imgsz, s.augment.mosaic, s.augment.copy_paste) == (96, 0.5, 0.25)
    # A StreamSettings is taken as given (its rank too); overrides change only what they name.
    base = StreamSettings(seed=9, batch_size=2, augment=AugmentConfig(imgsz=64, degrees=5.0))
    s = stream_settings(base, mosaic=0.0, drop_last=True)
    assert s == dataclasses.replace(base, drop_last=True, augment=dataclasses.replace(base.augment, mosaic=0.0)) and (
        s.rank,
        s.world_size,
    ) == (0, 1)
    assert stream_settings(base, augment=AugmentConfig(imgsz=32)).augment == AugmentConfig(imgsz=32)
    assert stream_settings(base) is not None and stream_settings(base).augment.train_route is True


def test_the_val_split_defaults_to_the_validation_route_in_order(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    s = stream_settings(split="val", batch_size=8)
    assert s.augment.train_route is False and s.shuffle is False and (s.rank, s.world_size) == (0, 1)
    s = stream_settings(split="val", train_route=True, shuffle=True, rank=None)
    assert s.augment.train_route is True and s.shuffle is True
    t = stream_settings()
    assert t.augment.train_route is True and t.shuffle is True


# -- pixpool train's flags, generated from the fields ---------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    train_cmd.configure(parser, "train")
    return parser


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_every_fitconfig_field_has_a_flag_with_its_default():
    parser = _parser()
    flags = _flags(parser)
    for f in dataclasses.fields(FitConfig):
        if f.name == "stream":
            continue
        assert "help" in f.metadata, f.name
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        assert flag in flags, flag
    # Nothing given: every setting at the dataclasses' defaults, and nothing counts as given.
    args = parser.parse_args([])
    assert train_cmd.config_from_args(args) == FitConfig() and train_cmd.given(args) == set()
    # The stream's and augmentation's flags, except what fit sets itself (epochs of AugmentConfig).
    dests = {a.dest for a in parser._actions}
    for f in dataclasses.fields(AugmentConfig):
        assert (f"aug_{f.name}" in dests) == (f.name != "epochs"), f.name
    assert {"--seed", "--batch-size", "--shuffle", "--hsv-on-device"} <= flags
    assert not {"--rank", "--world-size", "--drop-last", "--start-epoch", "--split"} & flags


def test_existing_flag_spellings_keep_working():
    parser = _parser()
    argv = ["--socket-dir", "/s", "--endpoint", "tcp://h:1", "--keys", "/k", "--timeout-s", "5", "--json"]
    argv += ["--model", "tiny", "--val", "0", "--no-progress", "--follow-snapshot", "--epochs", "3", "--lr", "0.02"]
    argv += ["--batch-size", "4", "--seed", "7", "--hsv-on-device", "--imgsz", "96", "--scale", "0.25"]
    argv += ["--resume", "r/last.pt", "--max-steps", "9", "--device", "cpu", "--warmup-epochs", "0.5"]
    argv += ["--optimizer", "AdamW", "--project", "runs/x"]
    args = parser.parse_args(argv)
    c = train_cmd.config_from_args(args)
    assert (args.socket_dir, args.endpoint, args.keys, args.timeout_s, args.json) == (
        "/s",
        "tcp://h:1",
        "/k",
        5.0,
        True,
    )
    assert (c.scale, c.validate, c.progress, c.follow_snapshot, c.epochs, c.lr) == ("tiny", False, False, True, 3, 0.02)
    assert (c.stream.batch_size, c.stream.seed, c.stream.hsv_on_device) == (4, 7, True)
    assert (c.stream.augment.imgsz, c.stream.augment.scale) == (96, 0.25)  # --scale is augmentation, --model the size
    assert (c.resume, c.max_steps, c.device, c.warmup_epochs, c.optimizer, c.project) == (
        "r/last.pt",
        9,
        "cpu",
        0.5,
        "AdamW",
        "runs/x",
    )
    assert {"scale", "validate", "stream.seed", "stream.augment.scale", "stream.augment.imgsz"} <= train_cmd.given(args)


def test_a_flag_given_equal_to_its_default_counts_as_given():
    args = _parser().parse_args(["--seed", "0", "--epochs", "10"])
    assert train_cmd.given(args) == {"stream.seed", "epochs"}


def test_fitconfig_refuses_bad_values_naming_field_and_flag():
    with pytest.raises(ConfigError, match=r"'scale' \(--model\) = 'huge' is not one of"):
        FitConfig(scale="huge")
    with pytest.raises(ConfigError, match=r"'epochs' \(--epochs\) = 0 is below 1"):
        FitConfig(epochs=0)
    with pytest.raises(ConfigError, match=r"'optimizer' \(--optimizer\)"):
        FitConfig(optimizer="Adam")
    with pytest.raises(ConfigError, match="must be a StreamSettings"):
        FitConfig(stream={"seed": 1})


def test_detector_scales_match_the_model():
    pytest.importorskip("torch")
    from pixpool.client.train.detect.model import SCALES

    assert set(DETECTOR_SCALES) == set(SCALES)


def test_fitconfig_crosses_a_spawn_as_a_dataclass():
    config = FitConfig(epochs=3, scale="tiny", stream=StreamSettings(seed=2, augment=AugmentConfig(imgsz=64)))
    assert pickle.loads(pickle.dumps(config)) == config
    from pixpool.client.train.fit import fit_process

    assert next(iter(inspect.signature(fit_process).parameters)) == "config"
    assert inspect.signature(fit_process).parameters["config"].annotation in (FitConfig, "FitConfig")


# -- the run folder: next free name ----------------------------------------------------------------
def test_a_new_run_takes_the_next_free_folder(tmp_path):
    project = tmp_path / "runs" / "train"
    assert claim(project) == project and project.is_dir()
    (project / "results.jsonl").write_text("old\n")
    assert claim(project) == tmp_path / "runs" / "train2"
    assert claim(project) == tmp_path / "runs" / "train3"
    assert (project / "results.jsonl").read_text() == "old\n"
    assert claim(project, exist_ok=True) == project  # reused as it is
    (tmp_path / "runs" / "exp").write_text("a file")
    assert claim(tmp_path / "runs" / "exp") == tmp_path / "runs" / "exp2"
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        claim(tmp_path / "runs" / "exp", exist_ok=True)


# -- resume: restore, refuse what differs ---------------------------------------------------------
def _saved(**fields) -> dict:
    run = FitConfig(
        epochs=4,
        scale="tiny",
        lr=0.02,
        stream=StreamSettings(seed=5, batch_size=8, augment=AugmentConfig(imgsz=64, mosaic=0.5)),
        **fields,
    )
    return {"settings": flat_settings(run), "next_epoch": 2}


def test_resume_alone_restores_every_setting_and_the_folder(tmp_path):
    ckpt = _saved()
    last = str(tmp_path / "runs" / "a" / "last.pt")
    config = FitConfig(resume=last, device="cpu", max_steps=3)
    got = resumed_config(config, ckpt, given=explicit_settings(config))
    assert flat_settings(got) == ckpt["settings"]
    assert (got.project, got.device, got.max_steps, got.resume) == (str(Path(last).parent), "cpu", 3, last)


def test_a_differing_setting_is_refused_naming_field_flag_and_both_values(tmp_path):
    last = str(tmp_path / "a" / "last.pt")
    config = FitConfig(resume=last, lr=0.05, stream=StreamSettings(seed=6, batch_size=8))
    with pytest.raises(ConfigError) as info:
        resumed_config(config, _saved(), given={"lr", "stream.seed", "stream.batch_size"})
    text = str(info.value)
    assert "--lr 0.05 (field 'lr'; the checkpoint has 0.02)" in text
    assert "--seed 6 (field 'stream.seed'; the checkpoint has 5)" in text
    assert "batch" not in text  # given equal: fine
    assert info.value.field == "lr"
    # The same values, given: accepted.
    same = FitConfig(resume=last, lr=0.02, stream=StreamSettings(seed=5, batch_size=8))
    assert resumed_config(same, _saved(), given={"lr", "stream.seed"}).lr == 0.02
    # Another folder than the checkpoint's.
    with pytest.raises(ConfigError, match=r"--project 'elsewhere' \(field 'project'"):
        resumed_config(FitConfig(resume=last, project="elsewhere"), _saved(), given={"project"})


def test_more_epochs_on_resume_need_extend(tmp_path):
    last = str(tmp_path / "a" / "last.pt")
    with pytest.raises(ConfigError, match=r"--epochs 6 \(field 'epochs'\) differs from the checkpoint's 4.*--extend"):
        resumed_config(FitConfig(resume=last, epochs=6), _saved(), given={"epochs"})
    got = resumed_config(FitConfig(resume=last, epochs=6, extend=True), _saved(), given={"epochs", "extend"})
    assert got.epochs == 6 and got.stream.seed == 5
    with pytest.raises(ConfigError, match="can only grow"):
        resumed_config(FitConfig(resume=last, epochs=3, extend=True), _saved(), given={"epochs", "extend"})
    with pytest.raises(ConfigError, match="--extend needs --epochs larger than the checkpoint's 4"):
        resumed_config(FitConfig(resume=last, extend=True), _saved(), given={"extend"})
    finished = {**_saved(), "next_epoch": 4}
    with pytest.raises(ConfigError, match="already finished epoch 4 of 4"):
        resumed_config(FitConfig(resume=last), finished, given=set())
    # The same epochs, given: an exact continuation, no --extend needed.
    assert resumed_config(FitConfig(resume=last, epochs=4), _saved(), given={"epochs"}).epochs == 4


def test_run_only_flags_may_change_on_resume_and_model_flags_may_not(tmp_path):
    last = str(tmp_path / "a" / "last.pt")
    ckpt = _saved(validate=True, val_batch_size=16)
    # --val 0, another validation batch, device, threads and progress: accepted, and they hold.
    config = FitConfig(resume=last, validate=False, val_batch_size=4, device="cpu", threads=1, progress=False)
    got = resumed_config(config, ckpt, given={"validate", "val_batch_size", "device", "threads", "progress"})
    assert (got.validate, got.val_batch_size, got.device, got.threads, got.progress) == (False, 4, "cpu", 1, False)
    assert got.stream.seed == 5 and got.lr == 0.02 and got.scale == "tiny"
    # Not given: the saved value comes back (a run saved with --val 0 stays without validation).
    assert resumed_config(FitConfig(resume=last), _saved(validate=False), given=set()).validate is False
    # Data and model flags still may not change.
    refused = [
        ("scale", "--model", FitConfig(resume=last, validate=False, scale="n")),
        ("stream.seed", "--seed", FitConfig(resume=last, validate=False, stream=StreamSettings(seed=9))),
        (
            "stream.augment.mosaic",
            "--mosaic",
            FitConfig(resume=last, validate=False, stream=StreamSettings(augment=AugmentConfig(mosaic=1.0))),
        ),
    ]
    for field, flag, changed in refused:
        with pytest.raises(ConfigError, match=f"{flag} .*field '{field}'") as info:
            resumed_config(changed, ckpt, given={"validate", field})
        assert info.value.field == field and "--val" not in str(info.value)
