"""``pixpool train`` remembers its run: ``--resume`` alone restores the settings and the folder,
a differing flag is refused by name, more epochs need ``--extend``, a new run takes the next
free folder, and a daemon serving another snapshot is refused.

Integration tests: a spawned daemon over the synthetic set; ``pixpool train`` runs in this
process (``main``) on the CPU with the "tiny" scale.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from helpers.daemon import WAIT_S, real_daemon
from pixpool.cli import main

IMGSZ = 64


def _train(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main(["train", "--timeout-s", str(WAIT_S), "--json", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out.strip().splitlines()[-1]) if code == 0 else None), err


def _settings(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)["settings"]


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_resume_restores_the_run_and_refuses_what_differs(synthetic_data, tmp_path, capsys):
    runs = tmp_path / "runs"
    first_run = ["--model", "tiny", "--imgsz", str(IMGSZ), "--batch-size", "4", "--seed", "7", "--val", "0"]
    first_run += ["--mosaic", "0.25", "--lr", "0.02", "--optimizer", "AdamW", "--epochs", "1", "--max-steps", "2"]
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        code, first, err = _train(capsys, "--socket-dir", d, *first_run, "--project", str(runs / "train"))
        assert code == 0, err
        assert first["run_dir"] == str(runs / "train") and first["steps"] == 2
        last_pt = runs / "train" / "last.pt"
        before = (_sha(last_pt), (runs / "train" / "results.jsonl").read_text())

        # A new run into the same project: the next free folder; the first run's files untouched.
        code, second, err = _train(
            capsys, "--socket-dir", d, *first_run, "--max-steps", "1", "--project", str(runs / "train")
        )
        assert code == 0, err
        assert second["run_dir"] == str(runs / "train2")
        assert (_sha(last_pt), (runs / "train" / "results.jsonl").read_text()) == before

        # More epochs without --extend: refused (the schedule would change), naming the flag, both values and
        # the way on; no folder is made for the refused run.
        code, _, err = _train(capsys, "--socket-dir", d, "--resume", str(last_pt), "--epochs", "2")
        assert code == 1 and "--epochs 2 (field 'epochs') differs from the checkpoint's 1" in err and "--extend" in err
        # A flag that differs from the checkpoint: refused, naming field, flag and both values.
        code, _, err = _train(capsys, "--socket-dir", d, "--resume", str(last_pt), "--seed", "8", "--mosaic", "0.25")
        assert code == 1 and "--seed 8 (field 'stream.seed'; the checkpoint has 7)" in err and "mosaic" not in err
        assert sorted(p.name for p in runs.iterdir()) == ["train", "train2"]

        # --resume, --epochs and --extend only (a flag given equal is fine): every setting comes back, same folder.
        code, resumed, err = _train(
            capsys, "--socket-dir", d, "--resume", str(last_pt), "--epochs", "2", "--extend", "--seed", "7"
        )
        assert code == 0, err
        assert resumed["run_dir"] == str(runs / "train") and resumed["start_epoch"] == 1 and resumed["epochs"] == 2
        assert resumed["images"] == 24  # a whole epoch of batch 4 (the first run's --max-steps is not restored)

        # --exist-ok: a new run in the same folder, with its own results.jsonl.
        code, reused, err = _train(
            capsys, "--socket-dir", d, *first_run, "--project", str(runs / "train2"), "--exist-ok"
        )
        assert code == 0, err
        assert reused["run_dir"] == str(runs / "train2")
    saved = _settings(last_pt)
    assert saved["stream.seed"] == 7 and saved["stream.batch_size"] == 4 and saved["scale"] == "tiny"
    assert saved["stream.augment.mosaic"] == 0.25 and saved["stream.augment.imgsz"] == IMGSZ
    assert saved["lr"] == 0.02 and saved["optimizer"] == "AdamW" and saved["epochs"] == 2 and not saved["validate"]
    rows = [json.loads(line) for line in (runs / "train" / "results.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1]
    assert [json.loads(line)["epoch"] for line in (runs / "train2" / "results.jsonl").read_text().splitlines()] == [0]
    assert sorted(p.name for p in runs.iterdir()) == ["train", "train2"]


def test_resume_onto_another_snapshot_is_refused(synthetic_data, tmp_path, capsys):
    from pixpool.server.synthetic import write_synthetic

    run = tmp_path / "run"
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        argv = ["--model", "tiny", "--imgsz", str(IMGSZ), "--batch-size", "4", "--val", "0", "--epochs", "2"]
        code, _, err = _train(capsys, "--socket-dir", d, *argv, "--max-steps", "1", "--project", str(run))
        assert code == 0, err
    other = write_synthetic(tmp_path / "other", num_images=16, seed=3)
    with real_daemon(other.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        code, _, err = _train(capsys, "--socket-dir", d, "--resume", str(run / "last.pt"))
        assert code == 1 and "was trained on" in err and "--follow-snapshot" in err and "8 records fewer" in err
        code, resumed, err = _train(
            capsys, "--socket-dir", d, "--resume", str(run / "last.pt"), "--follow-snapshot", "--max-steps", "1"
        )
        assert code == 0, err
    assert resumed["run_dir"] == str(run) and resumed["start_epoch"] == 1
    # The checkpoint now records the snapshot the run went on with.
    assert torch.load(run / "last.pt", map_location="cpu", weights_only=False)["snapshot"]["records"] == 16


@pytest.fixture(autouse=True)
def _no_rank(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
