"""Across PID namespaces: "in use" and "alive" come from the store, never from a pid.

Integration tests (root: ``unshare --pid --fork --mount-proc``, skipped with the reason
elsewhere). A daemon on the host and a ``pixpool clean`` or a daemon in a PID namespace of
its own share /dev/shm and a socket directory, as containers that mount them do; a daemon
in a namespace is PID 1 there, after every restart. Each test reproduces a fault once seen:
a snapshot or ring removed while served from another namespace, a killed daemon's ring left
behind after its trainer moved on, a dead PID-1 daemon's ring kept as live, rings missing
from ``pixpool ls``; and a host trainer waits for a starting PID-1 daemon.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import psutil
import pytest

from helpers.daemon import WAIT_S, ask_status, digest_of, real_daemon, reference_stream, short_socket_dir, wait_for
from helpers.pidns import ns_daemon, pixpool_in_pid_namespace, require_pid_namespaces
from helpers.snapshot import remove_snapshot
from pixpool.cli import main
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.server.readers import load_dataset
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.names import parse
from pixpool.shared.transport.store import DEFAULT
from pixpool.shared.wire.trainer import DELIVERY_SHM, decode, encode

IMGSZ = 96


@pytest.fixture(autouse=True)
def _namespaces():
    require_pid_namespaces()


@pytest.fixture(scope="module")
def dataset(synthetic_data):
    return load_dataset(synthetic_data.coco_json)


def _settings(seed: int) -> StreamSettings:
    return StreamSettings(seed=seed, batch_size=4, augment=AugmentConfig(imgsz=IMGSZ))


def _exists(names) -> list[bool]:
    return [os.path.exists(DEFAULT.path(n)) for n in names]


def _raw_attach(dealer, socket_dir: str, seed: int) -> str:
    """Attach a trainer that never maps its ring (raw protocol); the ring's name."""
    sock = dealer(f"ipc://{socket_dir}/daemon.sock")
    settings = _settings(seed).to_dict()
    sock.send(encode("attach", settings=settings, pid=os.getpid(), host="elsewhere", slots=2, delivery="shm"))
    assert sock.poll(WAIT_S * 1000), "no reply to attach"
    return decode(sock.recv(), reply=True)["ring"]


def _kill_host_daemon(proc) -> None:
    workers = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(WAIT_S)
    psutil.wait_procs(workers, timeout=15)


def _ls_rows(capsys) -> dict:
    assert main(["ls", "--json"]) == 0
    return {r["name"]: r for r in json.loads(capsys.readouterr().out)}


def test_clean_in_another_pid_namespace_keeps_what_a_daemon_serves_and_removes_it_once_unheld(
    synthetic_data, dataset, dealer
):
    s = _settings(11)
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as c:
            it = c.epoch(0)
            got = [digest_of(next(it))]
            snapshot, ring = ask_status(d)["snapshot"]["segments"], c._ring.name
            # Named, so that this clean touches nothing else of the machine's.
            r = pixpool_in_pid_namespace(["clean", "--all", *snapshot, ring])
            assert r.returncode == 0, r.stderr
            assert all(_exists([*snapshot, ring])), r.stdout
            assert "removed" not in r.stdout and "another PID namespace" in r.stdout, r.stdout
            got += [digest_of(b) for b in it]
        assert got == reference_stream(dataset, s, 0)[0]
    # Once nothing holds them (a SIGKILLed daemon, a trainer that never mapped its ring),
    # the same clean from the other namespace removes them.
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (proc, d):
        ring = _raw_attach(dealer, d, 12)
        snapshot = ask_status(d)["snapshot"]["segments"]
        try:
            _kill_host_daemon(proc)
            assert all(_exists([*snapshot, ring])), "a killed daemon cannot remove anything (the test needs leftovers)"
            r = pixpool_in_pid_namespace(["clean", *snapshot, ring])
            assert r.returncode == 0, r.stderr
            assert not any(_exists([*snapshot, ring])), r.stdout
            assert f"removed {ring}" in r.stdout and f"removed {snapshot[0]}" in r.stdout
        finally:
            remove_snapshot(snapshot[0].rpartition("-")[0])


def test_a_pid1_daemon_stopping_cleanly_leaves_the_snapshot_a_host_daemon_serves(synthetic_data, dataset):
    s = _settings(13)
    d2 = short_socket_dir()
    try:
        with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
            snapshot = ask_status(d)["snapshot"]["segments"]
            with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as c:
                it = c.epoch(0)
                got = [digest_of(next(it))]
                with ns_daemon(synthetic_data.coco_json, d2, imgsz=IMGSZ) as other:
                    st = ask_status(d2)
                    assert st["daemon"]["pid"] == 1 and st["snapshot"]["reused"] is True
                    other.signal(signal.SIGTERM)
                    assert other.wait() == 0, other.output()[-3000:]
                assert all(_exists(snapshot)), "the namespaced daemon removed the snapshot the host daemon serves"
                got += [digest_of(b) for b in it]  # the host daemon serves on
            assert got == reference_stream(dataset, s, 0)[0]
            assert ask_status(d) is not None
        assert not any(_exists(snapshot)), "the last daemon out left the snapshot behind"
    finally:
        shutil.rmtree(d2, ignore_errors=True)


def test_a_killed_pid1_daemons_ring_goes_once_its_trainer_moved_to_the_restarted_one(synthetic_data, dataset):
    s = _settings(14)
    d = short_socket_dir()
    try:
        with ns_daemon(synthetic_data.coco_json, d, imgsz=IMGSZ) as first:
            snapshot = ask_status(d)["snapshot"]["segments"]
            c = Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False))
            try:
                it = c.epoch(0)
                got = [digest_of(next(it))]
                old = c._ring.name
                assert parse(old).daemon_pid == 1
                first.signal(signal.SIGKILL)
                first.wait()
                assert all(_exists([old, *snapshot])), "a killed daemon cannot remove anything (the test needs them)"
                with ns_daemon(synthetic_data.coco_json, d, imgsz=IMGSZ) as second:
                    got += [digest_of(b) for b in it]
                    assert c.reattaches == 1 and c._ring.name != old and parse(c._ring.name).daemon_pid == 1
                    # No `clean`: the trainer, last one out of the old ring, removed it.
                    wait_for(lambda: not os.path.exists(DEFAULT.path(old)), 15, f"the dead daemon's ring {old} to go")
                    second.signal(signal.SIGTERM)
                    assert second.wait() == 0, second.output()[-3000:]
            finally:
                c.close()
        assert got == reference_stream(dataset, s, 0)[0]
        assert not any(_exists(snapshot)), "the restarted daemon, last out, left the snapshot behind"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_clean_removes_the_ring_of_a_dead_pid1_daemon(synthetic_data, dealer, capsys):
    d = short_socket_dir()
    snapshot = []
    try:
        with ns_daemon(synthetic_data.coco_json, d, imgsz=IMGSZ) as daemon:
            snapshot = ask_status(d)["snapshot"]["segments"]
            ring = _raw_attach(dealer, d, 15)
            assert parse(ring).daemon_pid == 1  # PID 1 lives on the host too: its pid says nothing
            daemon.signal(signal.SIGKILL)
            daemon.wait()
        assert all(_exists([ring, *snapshot]))
        assert main(["clean", ring, *snapshot]) == 0
        out = capsys.readouterr().out
        assert f"removed {ring}" in out and not any(_exists([ring, *snapshot])), out
    finally:
        if snapshot:
            remove_snapshot(snapshot[0].rpartition("-")[0])
        shutil.rmtree(d, ignore_errors=True)


def test_ls_lists_rings_with_their_daemon_and_trainer(synthetic_data, dealer, capsys):
    s = _settings(16)
    d = short_socket_dir()
    snapshot = []
    try:
        with ns_daemon(synthetic_data.coco_json, d, imgsz=IMGSZ) as daemon:
            snapshot = ask_status(d)["snapshot"]["segments"]
            unmapped = _raw_attach(dealer, d, 17)
            with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as c:
                mapped = c._ring.name
                rows = _ls_rows(capsys)
                state = (rows[mapped]["kind"], rows[mapped]["daemon"], rows[mapped]["trainer"])
                assert state == ("ring", "alive", "attached")
                assert (rows[unmapped]["daemon"], rows[unmapped]["trainer"]) == ("alive", "none")
                assert rows[unmapped]["in_use"] is True and rows[unmapped]["daemon_pid"] == 1
                daemon.signal(signal.SIGKILL)
                daemon.wait()
                rows = _ls_rows(capsys)
                assert (rows[mapped]["daemon"], rows[mapped]["trainer"]) == ("dead", "attached")
                state = (rows[unmapped]["daemon"], rows[unmapped]["trainer"], rows[unmapped]["in_use"])
                assert state == ("dead", "none", False)
                assert main(["ls"]) == 0
                table = capsys.readouterr().out
                line = next(x for x in table.splitlines() if x.startswith(mapped))
                assert line.split()[3:5] == ["dead", "attached"], table
                assert main(["clean", mapped, unmapped]) == 0
                out = capsys.readouterr().out
                assert f"removed {unmapped}" in out and f"kept {mapped}: in use" in out, out
                assert "its daemon is gone" in out, out
            # The trainer let go (Client.close): last one out, it removed the ring.
            assert not os.path.exists(DEFAULT.path(mapped))
    finally:
        if snapshot:
            remove_snapshot(snapshot[0].rpartition("-")[0])
        shutil.rmtree(d, ignore_errors=True)


def test_a_killed_host_daemons_ring_goes_once_its_trainer_moved_to_the_successor(synthetic_data, dataset):
    s = _settings(18)
    d = short_socket_dir()
    try:
        with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, socket_dir=d) as (first, _):
            with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as c:
                it = c.epoch(0)
                got = [digest_of(next(it))]
                old = c._ring.name
                _kill_host_daemon(first)
                assert os.path.exists(DEFAULT.path(old)), "a killed daemon cannot remove its ring (the test needs it)"
                with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, socket_dir=d):
                    got += [digest_of(b) for b in it]
                    assert c.reattaches == 1 and c._ring.name != old
                    wait_for(lambda: not os.path.exists(DEFAULT.path(old)), 15, f"the killed daemon's ring {old} to go")
        assert got == reference_stream(dataset, s, 0)[0]
    finally:
        shutil.rmtree(d, ignore_errors=True)


_HELD_TRAINER = """
import sys
from pixpool.client import Client, ClientOptions
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
s = StreamSettings(seed=3, batch_size=4, augment=AugmentConfig(imgsz=int(sys.argv[2])))
with Client.connect(s, ClientOptions(socket_dir=sys.argv[1], timeout_s=60, as_torch=False)) as c:
    next(iter(c.epoch(0)))
    print(c.delivery, flush=True)
    sys.stdin.read()  # holds its ring until the test kills it
"""


def test_a_killed_trainer_in_another_pid_namespace_is_detached_by_its_ring_hold(synthetic_data):
    """A trainer in a container is PID 1 there, so the daemon cannot watch its pid; when it
    is SIGKILLed its hold on its ring goes with it, and the daemon detaches it and removes
    the ring at its next liveness tick, not after the heartbeat timeout."""
    import subprocess
    import sys
    import time

    from helpers.pidns import UNSHARE, _child_of, _env

    heartbeat_timeout_s = 120.0
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, heartbeat_timeout_s=heartbeat_timeout_s) as (
        _,
        d,
    ):
        proc = subprocess.Popen(
            [*UNSHARE, sys.executable, "-c", _HELD_TRAINER, d, str(IMGSZ)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=_env(),
        )
        try:
            assert proc.stdout.readline().strip() == DELIVERY_SHM
            (trainer,) = ask_status(d)["trainers"]
            assert trainer["pid"] == 1 and trainer["pid_watched"] is False
            ring = trainer["ring"]
            assert os.path.exists(DEFAULT.path(ring))
            killed_at = time.monotonic()
            os.kill(_child_of(proc, WAIT_S), signal.SIGKILL)  # PID 1 of the namespace: the trainer
            proc.wait(timeout=WAIT_S)
            wait_for(
                lambda: not ask_status(d)["trainers"],
                timeout_s=heartbeat_timeout_s / 4,
                what="the daemon detaching the killed trainer by its ring hold",
            )
            assert time.monotonic() - killed_at < heartbeat_timeout_s / 4
            assert not os.path.exists(DEFAULT.path(ring))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=WAIT_S)


def test_a_host_trainer_waits_for_a_starting_pid1_daemon_and_it_stops_clean(synthetic_data, dataset):
    """The starting mark is a lock the live daemon holds, never a pid: a trainer on the host
    started just after a daemon that is PID 1 of its own namespace waits for it (rather than
    failing at a socket directory with no socket yet) and reads an exact epoch; SIGTERM to
    that PID 1 stops it with status 0 and its segments go."""
    s = _settings(21)
    d = short_socket_dir()
    before = set(os.listdir("/dev/shm"))
    try:
        with ns_daemon(synthetic_data.coco_json, d, imgsz=IMGSZ, wait=False) as daemon:
            time.sleep(0.3)  # the shell's gap between `serve ... &` and the trainer's line
            with Client.connect(
                s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)
            ) as c:  # no wait_s: the mark decides
                got = [digest_of(b) for b in c.epoch(0)]
            assert ask_status(d)["daemon"]["pid"] == 1
            daemon.signal(signal.SIGTERM)
            assert daemon.wait() == 0, daemon.output()[-3000:]
        assert got == reference_stream(dataset, s, 0)[0]
        assert set(os.listdir("/dev/shm")) - before == set(), "the PID-1 daemon left segments behind"
    finally:
        shutil.rmtree(d, ignore_errors=True)
