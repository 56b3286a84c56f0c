"""``fit``'s validation stream and its Ctrl-C: the val split's ring exists only while a pass
reads it, it is counted as validation (never as a trainer), the pass shows a progress bar, and
Ctrl-C names the checkpoint and the resume line, or leaves no empty run folder.

Integration tests: a spawned daemon over the synthetic set; ``fit`` runs in this process on
the CPU with the "tiny" scale, ``pixpool train`` in a subprocess for the SIGINT.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from helpers.daemon import WAIT_S, real_daemon
from pixpool.client.options import ClientOptions
from pixpool.client.train import fit as fit_module
from pixpool.client.train.fit import FitConfig, fit
from pixpool.ops.memory_report import memory_report
from pixpool.ops.status_client import format_status, query_health, query_status
from pixpool.ops.view import trainers_table
from pixpool.server.daemon.metrics import Metrics, _Collector
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.names import ring_prefix
from pixpool.shared.transport.store import Store
from pixpool.shared.wire.status import Status

IMGSZ = 64


def _rings(status: Status) -> list[str]:
    """The ring segments of the daemon in its store, as the store lists them."""
    prefix = ring_prefix(status.daemon.pid)
    return sorted(n for n in Store.of(status.daemon.store).segments() if n.startswith(prefix))


def _gauges(status: Status) -> dict[str, float]:
    """The daemon's Prometheus gauges of trainers and validation passes for ``status``."""
    metrics = Metrics("127.0.0.1", 0)  # never started: its collector reads what is published
    metrics.publish(status)
    wanted = ("pixpool_trainers", "pixpool_validation_streams")
    return {f.name: f.samples[0].value for f in _Collector(metrics).collect() if f.name in wanted}


def _config(tmp_path, *, epochs: int, **extra) -> FitConfig:
    """A validating run of the tiny detector, validation batches of 4, progress bars on."""
    return FitConfig(
        epochs=epochs,
        scale="tiny",
        project=str(tmp_path / "run"),
        progress=True,
        val_batch_size=4,
        stream=StreamSettings(seed=5, batch_size=8, augment=AugmentConfig(imgsz=IMGSZ)),
        **extra,
    )


def test_the_validation_ring_exists_only_during_a_pass_and_is_no_trainer(synthetic_data, tmp_path, monkeypatch):
    config = _config(tmp_path, epochs=2, log_every=1)
    during, between, health = [], [], []
    validate = fit_module._validate

    with real_daemon(synthetic_data.data_yaml, imgsz=IMGSZ, workers=1) as (_, d):

        def watched(*args, **kwargs):
            status = query_status(d)
            during.append((status, memory_report(status), _rings(status)))
            health.append(query_health(d).trainers)
            return validate(*args, **kwargs)

        def after_epoch(row):
            status = query_status(d)
            between.append((status, memory_report(status), _rings(status)))

        monkeypatch.setattr(fit_module, "_validate", watched)
        report = fit(config, ClientOptions(socket_dir=d, timeout_s=WAIT_S), on_epoch=after_epoch)
    assert [("mAP50" in row and row["val_time_s"] > 0) for row in report["history"]] == [True, True]
    assert len(during) == len(between) == 2 and health == [1, 1]
    for status, mem, rings in during:
        # The pass's session is there, on the val split, with its own ring...
        splits = sorted(t.split for t in status.trainers)
        assert splits == ["train", "val"] and len(rings) == 2
        train_ring = next(t for t in status.trainers if t.split == "train").ring_nbytes
        val_ring = next(t for t in status.trainers if t.split == "val").ring_nbytes
        # ...but one trainer, costing its training ring; the validation ring is named apart.
        assert mem["trainers"] == 1 and mem["ring_bytes_per_trainer"] == train_ring
        assert mem["validation_ring_bytes"] == val_ring and mem["ring_bytes"] == train_ring + val_ring
        assert [r["validation"] for r in sorted(mem["rings"], key=lambda r: r["validation"])] == [False, True]
        train_id = next(t for t in status.trainers if t.split == "train").trainer_id
        labels = [row for row in trainers_table(status).columns[0].cells]
        assert sorted(labels) == sorted([str(train_id), f"{train_id} val"])
        # `pixpool status` names it alike: the trainer's validation pass, no epoch of its own.
        text = format_status(status)
        assert f"{train_id} val" in text and "-1:" not in text
        assert _gauges(status) == {"pixpool_trainers": 1, "pixpool_validation_streams": 1}
    for status, mem, rings in between:
        # Between passes: the training stream alone, one ring in the store.
        assert [t.split for t in status.trainers] == ["train"] and len(rings) == 1
        assert mem["trainers"] == 1 and mem["validation_ring_bytes"] == 0
        assert _gauges(status) == {"pixpool_trainers": 1, "pixpool_validation_streams": 0}


def _unreadable_images(monkeypatch) -> None:
    """This trainer cannot open or read any image file (as one attached over TCP from another machine)."""
    from pixpool.client import rect_view

    def unreadable(path, *args, **kwargs):
        raise FileNotFoundError(path)

    monkeypatch.setattr(rect_view.Image, "open", unreadable)
    monkeypatch.setattr(fit_module.os, "access", lambda path, mode: False)


def test_a_trainer_that_cannot_read_the_val_images_still_validates_on_rect_batches(
    synthetic_data, tmp_path, monkeypatch, caplog
):
    """The rect batches are planned from the decoded sizes the daemon sends with the records'
    names, so a trainer that cannot read the images validates as Ultralytics does (before: the
    first validation pass died opening a file)."""
    _unreadable_images(monkeypatch)
    with real_daemon(synthetic_data.data_yaml, imgsz=IMGSZ, workers=1) as (_, d):
        report = fit(_config(tmp_path, epochs=1, log_every=1), ClientOptions(socket_dir=d, timeout_s=WAIT_S))
    assert "mAP50" in report["history"][0] and report["history"][0]["val_time_s"] > 0
    assert not any("square letterbox" in r.getMessage() for r in caplog.records), caplog.text


def test_without_the_daemons_sizes_an_unreadable_val_set_validates_on_the_square(
    synthetic_data, tmp_path, monkeypatch, caplog
):
    """A daemon that sends no sizes (a release before them) leaves the plan to the images'
    headers; a trainer that cannot read them validates on the square letterbox, saying so."""
    from pixpool.client.record_files import RecordFiles

    _unreadable_images(monkeypatch)
    monkeypatch.setattr(RecordFiles, "sizes", lambda self: None)
    with real_daemon(synthetic_data.data_yaml, imgsz=IMGSZ, workers=1) as (_, d):
        report = fit(_config(tmp_path, epochs=1, log_every=1), ClientOptions(socket_dir=d, timeout_s=WAIT_S))
    assert "mAP50" in report["history"][0] and report["history"][0]["val_time_s"] > 0
    assert any("validation on the square letterbox" in r.getMessage() for r in caplog.records), caplog.text


def test_validation_shows_a_progress_bar(synthetic_data, tmp_path, capsys, monkeypatch):
    import tqdm

    bars = []

    class Recorded(tqdm.tqdm):  # tqdm's own bar, remembered: what it counted up to by its close
        def close(self):
            bars.append((self.desc, self.total, self.n))
            super().close()

    monkeypatch.setattr(tqdm, "tqdm", Recorded)
    with real_daemon(synthetic_data.data_yaml, imgsz=IMGSZ, workers=1) as (_, d):
        fit(_config(tmp_path, epochs=1), ClientOptions(socket_dir=d, timeout_s=WAIT_S))
        val_records = query_status(d).splits["val"].records
    passes = -(-val_records // 4)
    # A bar with a total (so tqdm shows the ETA) that counted every validation batch, and was drawn.
    assert ("val 1/1", passes, passes) in bars, bars
    assert re.search(rf"val 1/1: +0%.*0/{passes} \[00:00<\?", capsys.readouterr().err)


def _train_process(d: str, project, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "pixpool.cli", "train", "--socket-dir", d, "--model", "tiny", "--imgsz", str(IMGSZ)]
    argv += ["--batch-size", "4", "--epochs", "500", "--val", "0", "--progress", "0", "--project", str(project)]
    # A background job may inherit SIGINT ignored; Ctrl-C's signal must reach the trainer as in a terminal.
    return subprocess.Popen(
        [*argv, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _interrupt_when(proc: subprocess.Popen, d: str, reached, what: str) -> tuple[str, str]:
    """SIGINT ``proc`` once the daemon's status shows ``reached(trainer)`` of its training stream."""
    deadline = time.monotonic() + WAIT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"pixpool train ended before {what}: {proc.communicate()}")
            ours = [t for t in query_status(d).trainers if t.pid == proc.pid and t.split == "train"]
            if ours and reached(ours[0]):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"pixpool train did not reach {what} within {WAIT_S} s")
            time.sleep(0.05)  # polling the daemon's status, not synchronising on time
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_names_the_checkpoint_and_the_resume_line(synthetic_data, tmp_path):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        # In epoch 1, after its first batches: nothing saved, so no run folder is left behind.
        proc = _train_process(d, tmp_path / "first")
        out, err = _interrupt_when(proc, d, lambda t: t.batches_delivered >= 2, "its first batches")
        assert proc.returncode == 130, (out, err)
        assert "interrupted in epoch 1 before any checkpoint; removed the empty run folder" in err, err
        assert "run the same command again" in err and "Traceback" not in err
        assert not (tmp_path / "first").exists()

        # In epoch 2: epoch 1's last.pt is named with the exact line that resumes it.
        proc = _train_process(d, tmp_path / "second")
        out, err = _interrupt_when(proc, d, lambda t: t.epoch >= 1 and t.batches_delivered >= 2, "epoch 2")
        assert proc.returncode == 130, (out, err)
        last = tmp_path / "second" / "last.pt"
        assert f"the run's last checkpoint is {last}" in err and "Traceback" not in err, err
        line = re.search(r"resume with: (.*)", err).group(1)
        assert line == f"pixpool train --resume {last} --socket-dir {d}"
        # The line, run with a step limit, continues the run from epoch 2.
        resumed = subprocess.run(
            [sys.executable, "-m", "pixpool.cli", *line.split()[1:], "--max-steps", "1", "--json"],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            env={**os.environ},
        )
        assert resumed.returncode == 0, resumed.stderr
        assert '"start_epoch": 1' in resumed.stdout and str(tmp_path / "second") in resumed.stdout


def test_a_run_folder_with_something_else_in_it_is_kept(tmp_path):
    from pixpool.client.train import run_dir

    empty = run_dir.claim(tmp_path / "a")
    (empty / "last.pt.tmp").write_bytes(b"half")
    assert run_dir.release(empty) and not empty.exists()
    kept = run_dir.claim(tmp_path / "b")
    (kept / "notes.txt").write_text("mine")
    assert not run_dir.release(kept) and (kept / "notes.txt").is_file()
