"""Faults: a worker SIGKILLed mid-part, the daemon stopped by signal or killed and restarted.

Integration tests over a real snapshot of the synthetic dataset; see test_daemon.py.
"""

from __future__ import annotations

import os
import shutil
import signal

import psutil
import pytest

from helpers.daemon import (
    WAIT_S,
    ask_status,
    digest_of,
    real_daemon,
    reference_stream,
    segments_of,
    short_socket_dir,
    wait_for,
)
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.errors import DaemonStopped, DaemonTimeout
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.names import user_prefix
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 160


def settings(seed: int, batch_size: int = 3) -> StreamSettings:
    return StreamSettings(seed=seed, batch_size=batch_size, augment=AugmentConfig(imgsz=IMGSZ))


@pytest.fixture(scope="module")
def dataset(synthetic_data):
    from pixpool.server.readers import load_dataset

    return load_dataset(synthetic_data.coco_json)


def _stop_busy_worker(socket_dir: str) -> int | None:
    """SIGSTOP a worker the daemon reports busy; keep it stopped only if it stays busy
    with no part finished (then its reply was never written: truly mid-job)."""
    st = ask_status(socket_dir)
    busy = [w for w in st["workers"] if w["state"] == "busy"]
    if not busy:
        return None
    w = busy[0]
    os.kill(w["pid"], signal.SIGSTOP)
    for _ in range(3):  # three status round trips span several daemon loop turns
        again = {x["pid"]: x for x in ask_status(socket_dir)["workers"]}
        if again.get(w["pid"], {}).get("state") != "busy" or again[w["pid"]]["parts_done"] != w["parts_done"]:
            os.kill(w["pid"], signal.SIGCONT)
            return None
    return w["pid"]


# Each worker count also serves one snapshot dtype: the rerun's bytes do not depend on it either.
@pytest.mark.parametrize(("workers", "dtype"), [(1, "float32"), (2, "uint8")])
def test_worker_killed_mid_batch_reruns_only_its_samples_stream_unchanged(synthetic_data, dataset, workers, dtype):
    """A worker SIGKILLed while it renders its part of a slot: only that part's samples are
    rendered again (by its replacement or the other worker), and the batch's bytes and the
    epoch's samples are the reference's. Each part takes at least 0.3 s (``helpers.slow_renderer``,
    the real route's bytes), so the status polls between batches find a worker mid-part
    however fast the kernel is."""
    s = settings(11, batch_size=5)  # 24 records: 5 batches, parts of 2 and 3 samples with 2 workers
    with real_daemon(
        synthetic_data.coco_json, imgsz=IMGSZ, workers=workers, renderer="helpers.slow_renderer", dtype=dtype
    ) as (_, d):
        got, samples, victim = [], [], None
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            for b in c.epoch(0):
                got.append(digest_of(b))
                samples.append(b.samples.tolist())
                for _ in range(20 if victim is None else 0):
                    victim = _stop_busy_worker(d)
                    if victim is not None:
                        os.kill(victim, signal.SIGKILL)
                        break
        assert victim is not None, "never caught the worker busy"
        st = ask_status(d)
    assert st["snapshot"]["dtype"] == dtype and st["daemon"]["worker_restarts"] == 1
    assert victim not in [w["pid"] for w in st["workers"]]
    # The killed part never reported; re-running the whole batch would render the other
    # parts' samples twice. Exactly the epoch's samples were rendered to completion.
    assert sum(w["samples_done"] for w in st["workers"]) == len(dataset)
    ref, ref_samples = reference_stream(dataset, s, 0)
    assert got == ref and samples == ref_samples
    flat = sorted(i for batch in samples for i in batch)
    assert flat == list(range(len(dataset)))  # nothing lost, nothing repeated


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_daemon_stop_signal_reaches_waiting_trainer_and_unlinks(synthetic_data, sig):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, wait=False) as (proc, d):
        # The trainer starts before the daemon is up and waits for it (wait_s: else it fails at once).
        with Client.connect(
            settings(12, batch_size=2), ClientOptions(socket_dir=d, timeout_s=WAIT_S, wait_s=WAIT_S, slots=2)
        ) as c:
            st = wait_for(lambda: (x := ask_status(d)) and all(w["pid"] for w in x["workers"]) and x, 30, "workers up")
            workers = [psutil.Process(w["pid"]) for w in st["workers"]]
            snap = st["snapshot"]
            it = c.epoch(0)
            next(it)
            assert segments_of(proc.pid)
            os.kill(proc.pid, sig)
            with pytest.raises(DaemonStopped, match="daemon stopped"):
                for _ in it:
                    pass
        proc.join(WAIT_S)
        assert proc.exitcode == 0
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive
        assert segments_of(proc.pid) == []
        if not snap["reused"]:
            assert not set(snap["segments"]) & set(DEFAULT.segments())


def test_no_daemon_times_out_with_clear_message():
    d = short_socket_dir()
    try:
        with pytest.raises(DaemonTimeout) as err:
            Client.connect(settings(1), ClientOptions(socket_dir=d, timeout_s=1.0))
        assert d in str(err.value) and "pixpool serve" in str(err.value)
    finally:
        os.rmdir(d)


def test_daemon_sigkill_restart_reattaches_then_clean_removes_all(synthetic_data, dataset):
    from pixpool.cli import main

    s = settings(13, batch_size=2)
    d = short_socket_dir()
    got, samples = [], []
    try:
        with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, socket_dir=d) as (proc_a, _):
            c = Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, slots=2))
            try:
                st_a = ask_status(d)
                workers_a = [psutil.Process(w["pid"]) for w in st_a["workers"]]
                it = c.epoch(0)
                for _ in range(3):
                    b = next(it)
                    got.append(digest_of(b)), samples.append(b.samples.tolist())
                c.data_wait.add(1000.0)  # as if it had waited long for daemon A's batches
                os.kill(proc_a.pid, signal.SIGKILL)
                proc_a.join(WAIT_S)
                _, alive = psutil.wait_procs(workers_a, timeout=15)
                assert not alive, "workers outlived their killed daemon"
                assert segments_of(proc_a.pid), "a killed daemon cannot unlink its rings"
                with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, socket_dir=d) as (proc_b, _):
                    st_b = ask_status(d)
                    assert st_b["snapshot"]["reused"] is True  # re-attached, not decoded again
                    assert st_b["snapshot"]["name"] == st_a["snapshot"]["name"]
                    for b in it:  # resumes at batch 3 on the new daemon
                        got.append(digest_of(b)), samples.append(b.samples.tolist())
                    assert c.reattaches == 1
                    # Daemon B hears the wait of B's attachment only: monitor's share (wait over the
                    # attachment's time) covers one span, never the 1000 s waited on A.
                    tr = wait_for(
                        lambda: next((t for t in ask_status(d)["trainers"] if t["data_wait_s"] > 0), None),
                        what="a heartbeat carrying the wait",
                    )
                    assert tr["data_wait_s"] <= tr["attached_s"] and c.data_wait_s > 1000.0, tr
                    c.close()
                    workers_b = [psutil.Process(w["pid"]) for w in ask_status(d)["workers"]]
                    os.kill(proc_b.pid, signal.SIGKILL)
                    proc_b.join(WAIT_S)
                    psutil.wait_procs(workers_b, timeout=15)
            finally:
                c.close()
        ref, ref_samples = reference_stream(dataset, s, 0)
        assert got == ref and samples == ref_samples
        leftovers = (
            segments_of(proc_a.pid)
            + segments_of(proc_b.pid)
            + [n for n in st_a["snapshot"]["segments"] if n in DEFAULT.segments()]
        )
        assert main(["clean", *leftovers]) == 0  # named: other runs on this machine keep theirs
        remaining = set(DEFAULT.segments())
        assert not remaining & set(leftovers), f"pixpool clean left {sorted(remaining & set(leftovers))}"
    finally:
        shutil.rmtree(d, ignore_errors=True)  # a killed daemon leaves its socket file


def test_serve_command_ctrl_c_exits_cleanly(synthetic_data):
    import subprocess
    import sys

    d = short_socket_dir()
    cmd = [
        sys.executable,
        "-m",
        "pixpool.cli",
        "serve",
        str(synthetic_data.coco_json),
        "--imgsz",
        str(IMGSZ),
        "--workers",
        "1",
        "--socket-dir",
        d,
        "--processes",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        st = wait_for(
            lambda: proc.poll() is None and os.path.exists(f"{d}/daemon.sock") and ask_status(d, 1.0),
            60,
            "pixpool serve up",
        )
        with Client.connect(settings(14), ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            next(c.epoch(0))
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=WAIT_S)
        assert proc.returncode == 0, out
        assert segments_of(proc.pid) == []
        if not st["snapshot"]["reused"]:
            assert not set(st["snapshot"]["segments"]) & set(DEFAULT.segments())
        assert not os.path.exists(f"{d}/daemon.sock")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=WAIT_S)
        shutil.rmtree(d, ignore_errors=True)


def test_serve_sigterm_while_preparing_leaves_nothing(coco128):
    """SIGTERM before the daemon serves: exit 143, every segment it created is gone."""
    import subprocess
    import sys

    d = short_socket_dir()
    before = set(DEFAULT.segments())
    # imgsz 608 keeps this snapshot apart from any other test's coco128 snapshot.
    cmd = [
        sys.executable,
        "-m",
        "pixpool.cli",
        "serve",
        str(coco128 / "annotations" / "instances_train2017.json"),
        "--imgsz",
        "608",
        "--workers",
        "1",
        "--socket-dir",
        d,
        "--processes",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(
            lambda: (
                proc.poll() is None
                and any(n.startswith(user_prefix() + "snap-") for n in set(DEFAULT.segments()) - before)
            ),
            60,
            "preparation under way",
        )
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=WAIT_S)
        # Almost always mid-preparation (143); a slow signal may land once it serves (0).
        assert proc.returncode in (143, 0), out
        if proc.returncode == 143:
            assert "no segment was left behind" in out
        assert set(DEFAULT.segments()) - before == set()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=WAIT_S)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("workers", [1, 2])
def test_wedged_worker_is_killed_and_its_part_rerun(synthetic_data, dataset, tmp_path, monkeypatch, workers):
    """The job timeout is per part: the wedged part (the first samples of batch 1) is killed
    and re-run, the other part of that slot is not rendered again."""
    monkeypatch.setenv("PIXPOOL_TEST_STUCK_MARKER", str(tmp_path / "stuck-once"))
    s = settings(17)
    expected, _ = reference_stream(dataset, s, 0)
    with real_daemon(
        synthetic_data.coco_json, imgsz=IMGSZ, workers=workers, job_timeout_s=2.0, renderer="helpers.stuck_renderer"
    ) as (proc, d):
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            got = [digest_of(b) for b in c.epoch(0)]
        assert (tmp_path / "stuck-once").exists(), "the wedge really happened"
        assert got == expected
        st = ask_status(d)
        assert st["daemon"]["worker_restarts"] == 1
        assert sum(w["samples_done"] for w in st["workers"]) == len(dataset)


def test_second_daemon_on_the_same_socket_dir_is_refused(synthetic_data):
    import pytest

    from pixpool.server.daemon.run import run_daemon
    from pixpool.shared.errors import ConfigError
    from pixpool.shared.stream.config import DaemonConfig

    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (proc, d):
        with pytest.raises(ConfigError, match="another pixpool daemon already serves"):
            run_daemon(
                DaemonConfig(data=str(synthetic_data.coco_json), imgsz=IMGSZ, workers=1, socket_dir=d, processes=1)
            )
        st = ask_status(d)
        assert st["daemon"]["pid"] == proc.pid, "the first daemon still owns its socket"
        # The refused one re-attached the snapshot the first one created, and left it alone.
        assert set(st["snapshot"]["segments"]) <= set(DEFAULT.segments())


def test_creator_daemon_leaves_a_snapshot_another_process_maps(synthetic_data):
    """The daemon that prepared a snapshot does not pull it from under another user of it."""
    from helpers.snapshot import remove_snapshot
    from pixpool.server.snapshot.handle import Snapshot

    with real_daemon(synthetic_data.coco_json, imgsz=192, workers=1) as (proc, d):
        st = ask_status(d)
        assert not st["snapshot"]["reused"], "this test needs the daemon to be the creator"
        other = Snapshot.attach(st["snapshot"]["name"])  # e.g. a second daemon re-attached it
    try:
        assert proc.exitcode == 0
        assert set(other.segment_names) <= set(DEFAULT.segments()), "kept: another process maps it"
        assert other.checksum()  # still readable
    finally:
        other.close()
        remove_snapshot(
            st["snapshot"]["name"]
        )  # the test is the last user: it removes the snapshot and its label index
    assert not set(other.segment_names) & set(DEFAULT.segments())


def _drop_images(coco_json, keep: int) -> int:
    """Rewrite the COCO json in place with its first ``keep`` images (a new dataset version)."""
    import json

    coco = json.loads(coco_json.read_text())
    coco["images"] = coco["images"][:keep]
    ids = {im["id"] for im in coco["images"]}
    coco["annotations"] = [a for a in coco["annotations"] if a["image_id"] in ids]
    coco_json.write_text(json.dumps(coco))
    return len(coco["images"])


# A uint8 snapshot's content fingerprint is computed, a float32 one's is its own: one case each.
@pytest.mark.parametrize(("follow", "dtype"), [(False, "uint8"), (True, "float32")])
def test_a_daemon_restarted_on_a_changed_dataset_stops_the_trainer_unless_it_follows(synthetic_copy, follow, dtype):
    """Fault class 6: the daemon is SIGKILLed and restarted in the same socket dir on a new
    version of the dataset (4 images fewer). The trainer must not go on silently on other
    images: it stops with SnapshotChangedError naming both snapshots, and its ring on the
    new daemon is gone; with ``follow_snapshot`` it goes on with the new snapshot."""
    from pixpool.cli import main
    from pixpool.server.readers import load_dataset
    from pixpool.shared.errors import SnapshotChangedError

    data = synthetic_copy / "annotations" / "instances_train.json"
    s = settings(21, batch_size=2)
    d = short_socket_dir()
    leftovers: list[str] = []
    try:
        with real_daemon(data, imgsz=IMGSZ, workers=1, socket_dir=d, dtype=dtype) as (proc_a, _):
            st_a = ask_status(d)
            assert st_a["snapshot"]["dtype"] == dtype
            leftovers += st_a["snapshot"]["segments"]
            c = Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, slots=2, follow_snapshot=follow))
            try:
                before = dict(c.snapshot)
                assert before["records"] == 24 and before["fingerprint"]
                it = c.epoch(0)
                for _ in range(2):
                    next(it)
                workers_a = [psutil.Process(w["pid"]) for w in st_a["workers"]]
                os.kill(proc_a.pid, signal.SIGKILL)
                proc_a.join(WAIT_S)
                psutil.wait_procs(workers_a, timeout=15)
                leftovers += segments_of(proc_a.pid)
                kept = _drop_images(data, 20)
                with real_daemon(data, imgsz=IMGSZ, workers=1, socket_dir=d, dtype=dtype) as (proc_b, _):
                    st_b = ask_status(d)
                    leftovers += st_b["snapshot"]["segments"]
                    assert st_b["snapshot"]["name"] != st_a["snapshot"]["name"]
                    if not follow:
                        with pytest.raises(SnapshotChangedError) as err:
                            next(it)
                        text = str(err.value)
                        for part in (before["fingerprint"][:16], "24 records", "20 records", "follow_snapshot"):
                            assert part in text, f"{part!r} missing from: {text}"
                        assert isinstance(err.value, RuntimeError)
                        assert err.value.before["records"] == 24 and err.value.after["records"] == kept
                        assert c.num_records == 24, "the trainer took the new snapshot's record count"
                        # The new daemon was told: the ring it made for this trainer is gone.
                        wait_for(
                            lambda: not segments_of(proc_b.pid) and not ask_status(d)["trainers"],
                            30,
                            "the refused ring removed",
                        )
                    else:
                        rest = [digest_of(b) for b in it]  # Client's batches are views: digest each in turn
                        assert c.reattaches == 1 and c.num_records == kept and c.snapshot["records"] == kept
                        assert c.snapshot["fingerprint"] != before["fingerprint"]
                        ref, ref_samples = reference_stream(load_dataset(data), s, 0)
                        # It went on at batch 2 of the new snapshot's epoch 0, with its bytes.
                        assert rest == ref[2:]
                    c.close()
                    workers_b = [psutil.Process(w["pid"]) for w in ask_status(d)["workers"]]
                    os.kill(proc_b.pid, signal.SIGKILL)
                    proc_b.join(WAIT_S)
                    psutil.wait_procs(workers_b, timeout=15)
                    leftovers += segments_of(proc_b.pid)
            finally:
                c.close()
    finally:
        present = [n for n in dict.fromkeys(leftovers) if n in DEFAULT.segments()]
        if present:
            main(["clean", *present])
        shutil.rmtree(d, ignore_errors=True)
    assert not set(leftovers) & set(DEFAULT.segments())
