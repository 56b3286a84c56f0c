"""What a new user reads: one default per flag and one way to say a bool in ``--help``, help
that says which defaults are not Ultralytics', "did you mean" for a mistyped flag or
``attach()`` keyword, refusals that name the flag and the cheaper option, an honest wait
share, and one numbering of trainers.

Unit tests: argparse, pure functions and the views; no process is started.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pixpool.cli.main import COMMANDS, main
from pixpool.client.loader import stream_settings
from pixpool.ops.view import trainers_table
from pixpool.shared.errors import CapacityError, ConfigError
from pixpool.shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings
from pixpool.shared.stream.flags import flag_of
from pixpool.shared.task import DETECT
from pixpool.shared.wire.status import Status

# Ultralytics 8.4's cfg/default.yaml for AugmentConfig's fields, used where Ultralytics is
# not installed (the dev venv); with it installed, its own file is read.
ULTRALYTICS_8_4 = {
    "imgsz": 640, "mosaic": 1.0, "degrees": 0.0, "translate": 0.1, "scale": 0.5, "shear": 0.0, "perspective": 0.0,
    "copy_paste": 0.0, "mixup": 0.0, "cutmix": 0.0, "copy_paste_mode": "flip", "fliplr": 0.5, "flipud": 0.0,
    "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4, "close_mosaic": 10, "epochs": 100, "mask_ratio": 4,
    "overlap_mask": True,
}  # fmt: skip


def _help(capsys, monkeypatch, command: str) -> str:
    monkeypatch.setenv("COLUMNS", "200")  # one flag per line start, whatever the terminal
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def _entries(text: str) -> dict[str, str]:
    """``--flag METAVAR`` -> its whole help text, from argparse's option list."""
    out: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"^  (-\S.*?)(?:\s{2,}(.*))?$", line)
        if head:
            current = head.group(1)
            out[current] = head.group(2) or ""
        elif current is not None and line.startswith("   "):
            out[current] += " " + line.strip()
        else:
            current = None
    return out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_shows_one_default_per_flag_and_one_way_per_bool(capsys, monkeypatch, command):
    entries = _entries(_help(capsys, monkeypatch, command))
    for flag, text in entries.items():
        assert len(re.findall(r"\bdefault\b", text)) <= 1, f"pixpool {command}: {flag} says its default twice: {text}"
    names = {entry.split()[0].rstrip(",") for entry in entries}
    bools = {entry.split()[0] for entry in entries if entry.endswith("[BOOL]")}
    for flag in bools:
        negative = "--no-" + flag.removeprefix("--")
        assert negative not in names, f"pixpool {command} --help lists both {flag} [BOOL] and {negative}"


def test_the_older_no_progress_spelling_still_parses(capsys, monkeypatch):
    import argparse

    from pixpool.cli import prepare, train

    for module, dest in ((train, "run_progress"), (prepare, "progress")):
        parser = argparse.ArgumentParser()
        module.configure(parser, "x")
        argv = ["data.yaml"] if module is prepare else []
        assert getattr(parser.parse_args([*argv, "--no-progress"]), dest) is False
        assert getattr(parser.parse_args([*argv, "--progress", "0"]), dest) is False


def _ultralytics_defaults() -> dict:
    spec = importlib.util.find_spec("ultralytics")  # found, not imported: its import takes seconds
    if spec is None or spec.origin is None:
        return ULTRALYTICS_8_4
    config = yaml.safe_load((Path(spec.origin).parent / "cfg" / "default.yaml").read_text())
    return {name: config[name] for name in ULTRALYTICS_8_4}


@pytest.mark.parametrize("command", ["train", "digest"])
def test_the_help_names_every_default_that_is_not_ultralytics(capsys, monkeypatch, command):
    text = " ".join(_help(capsys, monkeypatch, command).split())
    assert "defaults are YOLO's" not in text
    assert "Defaults are Ultralytics' (its cfg/default.yaml) except" in text
    theirs = _ultralytics_defaults()
    fields = {f.name: f for f in dataclasses.fields(AugmentConfig)}
    for name, value in theirs.items():
        if command == "train" and name == "epochs":
            continue  # the run's --epochs (FitConfig), not an augmentation flag there
        ours = fields[name].default
        claim = f"{flag_of(fields[name])} {'none' if ours is None else ours} (Ultralytics {value})"
        if ours == value:
            assert f"(Ultralytics {value})" not in text or claim not in text, f"{name}: named as differing, but equal"
        else:
            assert claim in text, f"`pixpool {command} --help` does not say that {name} differs: {claim}"


def _error_line(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_a_mistyped_flag_gets_one_line_naming_the_flag_meant(capsys):
    err = _error_line(capsys, ["train", "--batchsize", "16"])
    assert "unrecognized arguments: --batchsize 16; did you mean --batch-size?" in err
    assert "--help" in err
    err = _error_line(capsys, ["train", "--mosiac=0.5", "--no-val"])
    assert "did you mean --mosaic, --val 0?" in err  # a bool is said one way: --val 0
    assert "did you mean --max-total-ring-nbytes?" in _error_line(capsys, ["serve", "x", "--max-totl-ring-nbytes", "1"])
    assert "did you mean 'train'?" in _error_line(capsys, ["trian"])
    assert "did you mean" not in _error_line(capsys, ["serve", "x", "--zzzz"])


def test_a_mistyped_attach_keyword_gets_the_field_meant(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError) as info:
        stream_settings(mosiac=1.0, timeout=3)
    text = str(info.value)
    assert "did you mean 'mosaic', 'timeout_s'?" in text and "AugmentConfig fields" not in text
    assert info.value.field == "mosiac"
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['zzzqq'\].*AugmentConfig fields: .*'mosaic'"):
        stream_settings(zzzqq=1)  # nothing close: the fields are listed


def test_the_wait_share_covers_one_span_and_never_passes_100():
    from pixpool.client.heartbeat import WaitCount

    count = WaitCount()
    count.add(30.0)  # waited on a daemon that then restarted
    count.attached()  # the new attachment
    count.add(2.0)
    assert (count.total_s, count.since_attach_s()) == (32.0, 2.0)
    tr = {
        "trainer_id": 1,
        "pid": 1,
        "settings": {"seed": 0, "batch_size": 2, "rank": 0, "world_size": 1},
        "epoch": 0,
        "next_batch": 1,
        "num_batches": 4,
        "img_per_s": 1.0,
        "ring_nbytes": 1,
        "attached_s": 12.0,
        "data_wait_s": 30.4,  # an older trainer's whole-run count over a new attachment: was 253 %
    }
    from rich.console import Console

    def shown(entry: dict) -> str:
        console = Console(width=120, record=True)
        console.print(trainers_table(Status.from_wire({"trainers": [entry]})))
        return console.export_text()

    assert "100%" in shown(tr) and "253%" not in shown(tr)
    assert "25%" in shown({**tr, "data_wait_s": 3.0})


def test_a_full_store_names_uint8_and_the_store_flag(tmp_path):
    from pixpool.server.snapshot.prepare import check_budget, check_capacity

    with pytest.raises(CapacityError) as info:
        check_capacity(1 << 60, imgsz=640, dtype="float32", store="/dev/shm")
    text = str(info.value)
    assert "--dtype uint8" in text and "--store DIR" in text and "--imgsz (now 640)" in text
    with pytest.raises(CapacityError) as info:
        check_capacity(1 << 60, imgsz=640, dtype="uint8", store=str(tmp_path))
    assert "--dtype" not in str(info.value) and "--store" in str(info.value)  # already the cheaper one
    with pytest.raises(CapacityError, match=r"--dtype uint8 .*\(--memory-budget"):
        check_budget(10, 5, what="the snapshot", imgsz=320, dtype="float32")


def _ring_refusal(**config) -> str:
    from pixpool.server.daemon.admission import ring_for

    source = SimpleNamespace(max_instances=3, imgsz=64, spec=DETECT)
    settings = StreamSettings(batch_size=2, augment=AugmentConfig(imgsz=64))
    with pytest.raises(CapacityError) as info:
        ring_for(
            {"slots": 3, "delivery": "shm"},
            settings,
            source=source,
            renderer=SimpleNamespace(max_targets=lambda n, s: n),
            config=DaemonConfig(data="x.json", **config),
            rings_nbytes=0,
            ring_budget_nbytes=config.get("max_total_ring_nbytes") or 1 << 40,
            trainers=1,
            snapshot_nbytes=0,
        )
    return str(info.value)


def test_a_daemon_limit_is_named_by_the_flag_that_raises_it():
    assert "raise max_total_ring_nbytes (pixpool serve --max-total-ring-nbytes)" in _ring_refusal(
        max_total_ring_nbytes=1
    )
    assert "raise max_ring_nbytes (pixpool serve --max-ring-nbytes)" in _ring_refusal(max_ring_nbytes=1)
    assert "raise max_trainers (pixpool serve --max-trainers)" in _ring_refusal(max_trainers=1)


def test_every_view_numbers_a_trainer_by_its_training_stream():
    from pixpool.cli.demo import trainer_name
    from pixpool.ops.memory_report import _roles, trainer_ids
    from pixpool.shared.wire.status import TrainerStatus

    def stream(trainer_id: int, pid: int, split: str) -> dict:
        return {"trainer_id": trainer_id, "pid": pid, "split": split}

    # Each process attaches its training stream, then its validation stream (ids 2 and 4).
    streams = [stream(1, 100, "train"), stream(2, 100, "val"), stream(3, 200, "train"), stream(4, 200, "val")]
    ids = trainer_ids([TrainerStatus.from_wire(s) for s in streams])
    assert ids == {100: 1, 200: 3} == trainer_ids([TrainerStatus.from_wire(s) for s in reversed(streams)])
    assert trainer_name(ids, 200, seed=1) == "trainer 3 (seed 1)"
    status = {"daemon": {"pid": 1}, "workers": [], "trainers": [{**s, "delivery": "shm"} for s in streams]}
    assert _roles(Status.from_wire(status))[200] == ("trainer", 3)  # `pixpool memory`'s process table: the same number
