"""``pixpool plan`` and the daemon's check at start-up: what serving a dataset will hold, said
before anything is decoded, and a refusal before decoding when the store has no room.

Integration tests: a daemon in a spawned process (``real_daemon``), or ``pixpool serve`` as a
child process for the refusal, on a small tmpfs mounted for the test (root only: skipped with
the reason elsewhere; the mount is undone in ``finally``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from helpers.daemon import WAIT_S, ask_status, real_daemon
from pixpool.cli import main
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 96


def _plan(capsys, *argv: str) -> dict:
    rc = main(["plan", *argv, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == (0 if out["fits"] else 1)
    return out


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_plan_predicts_the_snapshot_and_the_ring_the_daemon_then_holds(synthetic_data, capsys, dtype):
    plan = _plan(capsys, str(synthetic_data.coco_json), "--imgsz", str(IMGSZ), "--dtype", dtype, "--batch-size", "4")
    train = plan["snapshots"]["train"]
    assert train["records"] == synthetic_data.num_images and train["dtype"] == dtype
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, dtype=dtype) as (_, d):
        snap = ask_status(d)["snapshot"]
        held = sum(snap[k] for k in ("image_bytes", "index_bytes", "target_bytes"))
        assert abs(plan["snapshot_bytes"] - held) <= 0.05 * held, (plan["snapshot_bytes"], held)
        assert train["decoded_bytes"] == snap["decoded_bytes"]
        settings = StreamSettings(seed=1, batch_size=4, augment=AugmentConfig(imgsz=IMGSZ))
        with Client.connect(settings, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as client:
            assert client.layout.nbytes == plan["ring_bytes"]
    assert plan["break_even_trainers"] is not None and plan["cache_bytes_per_trainer"] == train["decoded_bytes"]


def test_plan_says_a_store_without_room_and_the_flags_that_help(synthetic_data, capsys, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: the test mounts a small tmpfs (mount -t tmpfs)")
    small = tempfile.mkdtemp(prefix="pxplan-")
    try:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", small], check=False).returncode:
            pytest.skip("cannot mount a tmpfs here")
        plan = _plan(capsys, str(synthetic_data.coco_json), "--imgsz", "640", "--batch-size", "2", "--store", small)
        assert not plan["fits"] and plan["needed_bytes"] > plan["free_bytes"]
        assert any(s.startswith("--imgsz ") for s in plan["suggestions"])
        assert any(s.startswith("--store DIR") for s in plan["suggestions"])
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", small], check=False)
        os.rmdir(small)


def _two_split_set(synthetic_data, root) -> str:
    """A data.yaml whose val: is a copy of the training images in another folder: two snapshots
    of the same size, so a store can hold the first and not both."""
    for split in ("train", "val"):
        shutil.copytree(synthetic_data.images_dir, root / "images" / split)
        shutil.copytree(synthetic_data.labels_dir, root / "labels" / split)
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(synthetic_data.names))
    (root / "data.yaml").write_text(f"train: images/train\nval: images/val\nnames:\n{names}")
    return str(root / "data.yaml")


def test_serve_refuses_before_decoding_when_the_store_holds_the_training_snapshot_but_not_both(
    synthetic_data, capsys, tmp_path
):
    """The training snapshot alone fits the store, the validation one does not fit beside it: the
    daemon refuses at start, before decoding a byte (no snapshot is ever prepared), naming the
    store, the bytes needed and free, and the flags that help; nothing is left behind."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test mounts a small tmpfs (mount -t tmpfs)")
    data = _two_split_set(synthetic_data, tmp_path / "set")
    one = _plan(capsys, data, "--imgsz", "640")["snapshots"]["train"]["bytes"]
    size_kib = (one * 3 // 2) // 1024  # room for one snapshot and a half
    small = tempfile.mkdtemp(prefix="pxserve-")
    socket_dir = tempfile.mkdtemp(prefix="pxsock-")
    shm_before = set(DEFAULT.segments())
    try:
        mount = ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0700", "tmpfs", small]
        if subprocess.run(mount, check=False).returncode:
            pytest.skip("cannot mount a tmpfs here")
        serve = [sys.executable, "-m", "pixpool.cli", "serve", data, "--imgsz", "640", "--store", small]
        r = subprocess.run(
            [*serve, "--socket-dir", os.path.join(socket_dir, "s")], capture_output=True, text=True, timeout=120
        )
        text = r.stdout + r.stderr
        assert r.returncode == 1, text
        assert f"the store {small} has" in text and "nothing was decoded" in text, text
        assert "--store DIR" in text and "--no-val" in text, text
        assert "plan: snapshot train" in text, "the plan line is logged at start"
        assert not re.search(r"snapshot \S+ prepared", text), "a snapshot was prepared (decoded) before the refusal"
        assert os.listdir(small) == []
        assert set(DEFAULT.segments()) == shm_before
    finally:
        subprocess.run(["umount", small], check=False)
        os.rmdir(small)
        shutil.rmtree(socket_dir, ignore_errors=True)
