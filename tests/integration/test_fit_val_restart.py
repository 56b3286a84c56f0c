"""``fit``'s validation passes across a daemon restart: each pass attaches afresh, so it must wait
for a restarting daemon as the training stream does, and stay on the snapshot its first pass
read (as the training stream stays on its own).

Integration tests: the daemon is SIGKILLed after epoch 1 and started again in the same socket
directory; ``fit`` (or ``pixpool train`` through ``cli.main``) runs in this process on the CPU
with the "tiny" scale.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from contextlib import ExitStack

import psutil
import pytest

from helpers.daemon import WAIT_S, ask_status, real_daemon, short_socket_dir
from pixpool.client.options import ClientOptions
from pixpool.client.train import fit as fit_module
from pixpool.client.train.fit import FitConfig, fit
from pixpool.shared.errors import SnapshotChangedError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 64


def _split_set(root, synthetic_data):
    """The synthetic set with a val split of its own (a copy of the images and labels), so that
    its labels can change while the training split's stay."""
    for split in ("train", "val"):
        shutil.copytree(synthetic_data.images_dir, root / "images" / split)
        shutil.copytree(synthetic_data.labels_dir, root / "labels" / split)
    names = ", ".join(synthetic_data.names)
    (root / "data.yaml").write_text(f"train: images/train\nval: images/val\nnames: [{names}]\n")
    return root / "data.yaml"


def _kill(proc, socket_dir: str) -> None:
    """SIGKILL the daemon and wait for it and its workers to be gone."""
    workers = [psutil.Process(w["pid"]) for w in ask_status(socket_dir)["workers"]]
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(WAIT_S)
    psutil.wait_procs(workers, timeout=15)


def _snapshot_segments(status: dict) -> list[str]:
    return [n for split in status["splits"].values() for n in split["segments"]]


def _clean(names: list[str]) -> list[str]:
    """Remove what is left of the snapshots these segments belong to (a killed daemon removes
    nothing; a label index a later daemon added is named by its snapshot's prefix); what it removed."""
    from pixpool.cli import main

    prefixes = {n.rsplit("-", 1)[0] + "-" for n in names}
    present = [n for n in DEFAULT.segments() if any(n.startswith(p) for p in prefixes)]
    if present:
        main(["clean", *present])
    return present


def test_a_validation_pass_on_changed_val_labels_after_a_restart_is_refused(synthetic_data, tmp_path):
    """Epoch 1 validates on the val split; the daemon is then killed and restarted on the same
    paths with other val labels (every class moved by one). The training split is unchanged, so
    epoch 2 trains on; its validation pass must stop with SnapshotChangedError naming both
    snapshots, not report metrics measured on other labels."""
    data = _split_set(tmp_path / "ds", synthetic_data)
    config = FitConfig(
        epochs=2,
        scale="tiny",
        project=str(tmp_path / "run"),
        progress=False,
        val_batch_size=4,
        stream=StreamSettings(seed=5, batch_size=8, augment=AugmentConfig(imgsz=IMGSZ)),
    )
    d = short_socket_dir()
    leftovers: list[str] = []
    try:
        with ExitStack() as stack:
            proc_a, _ = stack.enter_context(real_daemon(data, imgsz=IMGSZ, workers=1, socket_dir=d))
            st_a = ask_status(d)
            leftovers += _snapshot_segments(st_a)

            def restart_on_new_val_labels(row):
                if row["epoch"] != 0:
                    return
                assert "mAP50" in row  # the first pass validated
                _kill(proc_a, d)
                for label in (tmp_path / "ds" / "labels" / "val").iterdir():
                    lines = [line.split() for line in label.read_text().splitlines() if line.strip()]
                    label.write_text("".join(f"{(int(c) + 1) % 8} {' '.join(rest)}\n" for c, *rest in lines))
                stack.enter_context(real_daemon(data, imgsz=IMGSZ, workers=1, socket_dir=d))
                st_b = ask_status(d)
                leftovers.extend(_snapshot_segments(st_b))
                assert st_b["splits"]["train"]["name"] == st_a["splits"]["train"]["name"]
                assert st_b["splits"]["val"]["name"] != st_a["splits"]["val"]["name"]

            with pytest.raises(SnapshotChangedError) as err:
                fit(config, ClientOptions(socket_dir=d, timeout_s=WAIT_S), on_epoch=restart_on_new_val_labels)
            text = str(err.value)
            assert "val" in text and st_a["splits"]["val"]["content"][:16] in text, text
            assert "follow_snapshot" in text, text
            assert not [t for t in ask_status(d)["trainers"] if t["split"] == "val"]  # the refused pass detached
    finally:
        _clean(leftovers)
        shutil.rmtree(d, ignore_errors=True)
    assert not set(leftovers) & set(DEFAULT.segments())


def test_pixpool_train_validates_through_a_daemon_restart_after_an_epoch(synthetic_data, tmp_path, monkeypatch):
    """The daemon is SIGKILLed right after epoch 1's training, before its validation pass
    attaches, and started again 6 s later: ``pixpool train --wait-s 60 --epochs 3`` waits for it
    as its training stream would, and ends with 3 validated epochs (before: "no pixpool daemon
    at ..." after 2 of 3 epochs)."""
    from pixpool.cli import main

    d = short_socket_dir()
    train_epoch = fit_module._train_epoch
    timers: list[threading.Timer] = []
    leftovers: list[str] = []
    try:
        with ExitStack() as stack:
            proc_a, _ = stack.enter_context(real_daemon(synthetic_data.data_yaml, imgsz=IMGSZ, workers=1, socket_dir=d))
            leftovers += _snapshot_segments(ask_status(d))

            def restart() -> None:
                stack.enter_context(
                    real_daemon(synthetic_data.data_yaml, imgsz=IMGSZ, workers=1, socket_dir=d, wait=False)
                )

            def epoch_then_kill(train, step, epoch, *args, **kwargs):
                row = train_epoch(train, step, epoch, *args, **kwargs)
                if epoch == 0:
                    _kill(proc_a, d)
                    timers.append(threading.Timer(6.0, restart))  # the fault: a restart 6 s after the kill
                    timers[-1].start()
                return row

            monkeypatch.setattr(fit_module, "_train_epoch", epoch_then_kill)
            argv = ["train", "--socket-dir", d, "--timeout-s", str(WAIT_S), "--wait-s", "60", "--epochs", "3"]
            argv += ["--no-progress", "--model", "tiny", "--imgsz", str(IMGSZ), "--batch-size", "8"]
            rc = main([*argv, "--project", str(tmp_path / "run"), "--json"])
            for timer in timers:
                timer.join(WAIT_S)
            assert rc == 0
            rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
            assert [(row["epoch"], "mAP50" in row) for row in rows] == [(0, True), (1, True), (2, True)]
    finally:
        for timer in timers:
            timer.cancel()
        _clean(leftovers)  # where the run failed before the restarted daemon re-attached them
        shutil.rmtree(d, ignore_errors=True)
