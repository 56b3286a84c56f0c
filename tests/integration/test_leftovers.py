"""Nothing left behind: the last daemon out removes a shared snapshot, a changed dataset
supersedes its kept snapshot, and a restarted daemon sweeps what its killed predecessor left."""

from __future__ import annotations

import json
import os
import shutil
import signal

import psutil

from helpers.daemon import WAIT_S, ask_status, real_daemon, short_socket_dir
from helpers.snapshot import remove_snapshot
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.store import DEFAULT
from pixpool.shared.wire.trainer import decode, encode

IMGSZ = 224  # a multiple of 32 no other module prepares


def _exists(names) -> list[bool]:
    return [os.path.exists(DEFAULT.path(n)) for n in names]


def test_two_daemons_sharing_a_snapshot_the_last_out_removes_it(synthetic_copy):
    data = synthetic_copy / "annotations" / "instances_train.json"
    with real_daemon(data, imgsz=IMGSZ, workers=1) as (proc_a, d_a):
        st_a = ask_status(d_a)
        assert not st_a["snapshot"]["reused"]
        segments = st_a["snapshot"]["segments"]
        with real_daemon(data, imgsz=IMGSZ, workers=1) as (proc_b, d_b):
            assert ask_status(d_b)["snapshot"]["reused"] is True
            os.kill(proc_a.pid, signal.SIGTERM)  # the creator leaves first
            proc_a.join(WAIT_S)
            assert proc_a.exitcode == 0
            assert all(_exists(segments)), "removed while the other daemon serves it"
        assert proc_b.exitcode == 0
    assert not any(_exists(segments)), "the last daemon out left the shared snapshot behind"


def test_keep_snapshot_with_a_changed_dataset_replaces_the_old_one(synthetic_copy):
    data = synthetic_copy / "annotations" / "instances_train.json"
    with real_daemon(data, imgsz=IMGSZ, workers=1, keep_snapshot=True) as (_, d):
        old = ask_status(d)["snapshot"]["segments"]
    new = []
    try:
        assert all(_exists(old)), "--keep-snapshot keeps it"
        coco = json.loads(data.read_text())
        coco["annotations"][0]["bbox"][0] += 1.0  # the dataset changed
        data.write_text(json.dumps(coco))
        with real_daemon(data, imgsz=IMGSZ, workers=1, keep_snapshot=True) as (_, d):
            st = ask_status(d)
            new = st["snapshot"]["segments"]
            assert new != old and st["snapshot"]["reused"] is False
            assert not any(_exists(old)), "the superseded snapshot is still in /dev/shm"
        assert all(_exists(new))
    finally:
        for names in (old, new):
            if names:
                remove_snapshot(names[0].rpartition("-")[0])


def test_a_restarted_daemon_sweeps_the_rings_its_killed_predecessor_left(synthetic_data, dealer):
    d = short_socket_dir()
    try:
        with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, socket_dir=d) as (proc, _):
            sock = dealer(f"ipc://{d}/daemon.sock")
            s = StreamSettings(seed=1, batch_size=2, augment=AugmentConfig(imgsz=IMGSZ))
            sock.send(
                encode("attach", settings=s.to_dict(), pid=os.getpid(), host="elsewhere", slots=2, delivery="shm")
            )
            assert sock.poll(WAIT_S * 1000)
            ring = decode(sock.recv(), reply=True)["ring"]
            workers = psutil.Process(proc.pid).children()
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(WAIT_S)
            psutil.wait_procs(workers, timeout=15)
            assert os.path.exists(DEFAULT.path(ring)), (
                "a killed daemon cannot remove its ring (the test needs a leftover)"
            )
            with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, socket_dir=d):
                assert not os.path.exists(DEFAULT.path(ring)), "the successor left its predecessor's ring"
                assert ring not in DEFAULT.segments()
    finally:
        shutil.rmtree(d, ignore_errors=True)
