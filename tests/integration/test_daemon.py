"""The daemon end to end over a real snapshot of the synthetic dataset (imgsz 160).

Integration tests: the daemon runs in a spawned process with its spawned workers and the
real augmentation route; trainers are ``Client``s in this process (or spawned processes
where one must die). Every wait has a timeout; the helpers reap processes and unlink rings.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

from helpers.daemon import WAIT_S, ask_status, digest_of, prove, real_daemon, reference_stream, segments_of, wait_for
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings
from pixpool.shared.transport.names import user_prefix
from pixpool.shared.transport.store import DEFAULT
from pixpool.shared.wire.trainer import DELIVERY_SHM, PROTOCOL_VERSION, decode, encode

IMGSZ = 160


def settings(seed: int, batch_size: int = 5, **kw) -> StreamSettings:
    return StreamSettings(seed=seed, batch_size=batch_size, augment=AugmentConfig(imgsz=IMGSZ), **kw)


@pytest.fixture(scope="module")
def dataset(synthetic_data):
    from pixpool.server.readers import load_dataset

    return load_dataset(synthetic_data.coco_json)


@pytest.fixture(scope="module")
def daemon(synthetic_data):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=2, heartbeat_timeout_s=2.0) as (proc, d):
        yield proc, d


def test_two_trainers_at_once_each_equal_its_reference(daemon, dataset):
    _, d = daemon
    s1, s2 = settings(1), settings(2, batch_size=4, shuffle=True)
    got1, got2, samples1 = [], [], []
    with (
        Client.connect(s1, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c1,
        Client.connect(s2, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c2,
    ):
        # Interleave both streams so their jobs share the workers.
        it1, it2 = c1.epoch(0), c2.epoch(0)
        for b1, b2 in zip(it1, it2):
            got1.append(digest_of(b1)), samples1.append(b1.samples.tolist()), got2.append(digest_of(b2))
        got1 += [digest_of(b) for b in it1]
        got2 += [digest_of(b) for b in it2]
        got1_e1 = [digest_of(b) for b in c1.epoch(1)]
    ref1, ref_samples1 = reference_stream(dataset, s1, 0)
    ref2, _ = reference_stream(dataset, s2, 0)
    assert got1 == ref1 and got2 == ref2
    assert got1_e1 == reference_stream(dataset, s1, 1)[0]
    assert samples1 == ref_samples1
    flat = sorted(i for batch in samples1 for i in batch)
    assert flat == list(range(len(dataset)))  # each sample index exactly once
    assert ref1 != ref2  # different seeds, different streams


def test_workers_are_light_and_never_import_torch(daemon):
    _, d = daemon
    st = ask_status(d)
    import psutil

    for w in st["workers"]:
        maps = open(f"/proc/{w['pid']}/maps").read()
        assert "libtorch" not in maps and "/torch/" not in maps, f"worker {w['pid']} mapped torch"
        assert psutil.Process(w["pid"]).memory_info().rss < 400 * 2**20


def test_status_and_monitor_commands(daemon, capsys):
    from pixpool.cli import main

    _, d = daemon
    with Client.connect(settings(3), ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
        it = c.epoch(0)
        next(it), next(it)
        assert main(["status", "--socket-dir", d, "--json"]) == 0
        st = json.loads(capsys.readouterr().out)
        (t,) = [t for t in st["trainers"] if t["pid"] == os.getpid()]
        assert t["batches_delivered"] >= 2 and t["slots_in_use"] >= 1 and t["settings"]["seed"] == 3
        assert len(st["workers"]) == 2 and all(w["pid"] > 0 and w["state"] in ("busy", "idle") for w in st["workers"])
        assert st["snapshot"]["records"] == 24 and st["snapshot"]["name"].startswith(user_prefix() + "snap-")
        assert main(["status", "--socket-dir", d]) == 0
        table = capsys.readouterr().out
        assert "seed=3" in table and "samples done" in table
        assert main(["monitor", "--socket-dir", d, "--once"]) == 0
        out = capsys.readouterr().out
        assert "batch rings" in out and str(st["daemon"]["pid"]) in out
        # The footprint a user watches: the decoded uint8 equivalent, and this trainer by role.
        assert "decoded uint8 cache of the same images" in out
        assert "(uint8), batch rings" in out  # the snapshot's dtype: the default
        assert any(line.split()[:3] == [str(os.getpid()), "trainer", str(t["trainer_id"])] for line in out.splitlines())
        assert main(["monitor", "--socket-dir", d, "--once", "--json"]) == 0
        mem = json.loads(capsys.readouterr().out)["memory"]
        assert mem["decoded_bytes"] == st["snapshot"]["image_bytes"] and mem["dtype"] == "uint8"  # the default
        it.close()


def _doomed_trainer(socket_dir: str, conn) -> None:
    with Client.connect(settings(7), ClientOptions(socket_dir=socket_dir, timeout_s=WAIT_S)) as c:
        it = c.epoch(0)
        next(it)
        conn.send(c._ring.name)
        conn.poll(WAIT_S)  # wait to be killed


def test_killed_trainer_is_detached_and_others_continue(daemon, dataset):
    proc_d, d = daemon
    s = settings(4)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    victim = ctx.Process(target=_doomed_trainer, args=(d, child))
    victim.start()
    try:
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            it = c.epoch(0)
            got = [digest_of(next(it))]
            assert parent.poll(WAIT_S), "the victim trainer got no batch"
            ring = parent.recv()
            assert os.path.exists(DEFAULT.path(ring))
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(WAIT_S)
            got += [digest_of(b) for b in it]
            wait_for(lambda: not os.path.exists(DEFAULT.path(ring)), 15, "dead trainer's ring unlinked")
            st = ask_status(d)
            assert [t["pid"] for t in st["trainers"]] == [os.getpid()]
        assert got == reference_stream(dataset, s, 0)[0]
    finally:
        if victim.is_alive():
            victim.kill()
        victim.join(WAIT_S)


def test_silent_trainer_is_detached_after_heartbeat_timeout(daemon, dealer):
    proc_d, d = daemon
    sock = dealer(f"ipc://{d}/daemon.sock")
    # Our own (live) pid: only the missing heartbeat can get it detached.
    sock.send(
        encode(
            "attach", settings=settings(5).to_dict(), pid=os.getpid(), host=os.uname().nodename, slots=2, delivery="shm"
        )
    )
    assert sock.poll(WAIT_S * 1000)
    reply = decode(sock.recv(), reply=True)
    assert reply["op"] == "attached"
    ring = reply["ring"]
    assert os.path.exists(DEFAULT.path(ring))
    t0 = time.monotonic()
    wait_for(lambda: not os.path.exists(DEFAULT.path(ring)), 20, "silent trainer's ring unlinked")
    assert time.monotonic() - t0 >= 1.0  # not before the 2 s timeout (minus the attach time)
    sock.send(encode("heartbeat", trainer_id=reply["trainer_id"], token=reply["token"]))
    assert sock.poll(WAIT_S * 1000)
    late = decode(sock.recv(), reply=True)
    assert late["op"] == "error" and late["code"] == "unknown_trainer"
    assert all(t["trainer_id"] != reply["trainer_id"] for t in ask_status(d)["trainers"])
    assert ring not in segments_of(proc_d.pid)


def test_daemon_digests_running_and_temporary_daemon(daemon, dataset, synthetic_data):
    from pixpool.cli.digest import daemon_digests

    _, d = daemon
    s = settings(9)
    ref = reference_stream(dataset, s, 1)[0]
    assert daemon_digests(s, 1, 3, ClientOptions(socket_dir=d, timeout_s=300.0)) == ref[:3]
    # A stream that names no imgsz is rendered at the daemon's: the same bytes.
    unnamed = StreamSettings(seed=s.seed, batch_size=s.batch_size)
    assert unnamed.augment.imgsz is None and unnamed.for_imgsz(IMGSZ) == s
    assert daemon_digests(unnamed, 1, 2, ClientOptions(socket_dir=d, timeout_s=300.0)) == ref[:2]
    # A temporary daemon with one worker, started and stopped by the call.
    temporary = DaemonConfig(data=str(synthetic_data.coco_json), imgsz=IMGSZ, workers=1)
    assert daemon_digests(s, 1, None, ClientOptions(timeout_s=WAIT_S), config=temporary) == ref


def _ask(sock, frame: bytes) -> dict:
    sock.send(frame)
    assert sock.poll(WAIT_S * 1000), "no reply"
    return decode(sock.recv(), reply=True)


def test_bad_requests_get_clear_errors_and_daemon_keeps_serving(daemon, dealer):
    import msgpack

    _, d = daemon
    sock = dealer(f"ipc://{d}/daemon.sock")
    r = _ask(sock, msgpack.packb({"v": 99, "op": "status"}))
    assert r["op"] == "error" and "version 99" in r["message"] and f"version {PROTOCOL_VERSION}" in r["message"]
    r = _ask(
        sock,
        encode(
            "attach",
            settings={**settings(1).to_dict(), "batch_size": 0},
            pid=os.getpid(),
            host="x",
            slots=2,
            delivery="shm",
        ),
    )
    assert r["op"] == "error" and "batch_size" in r["message"]
    r = _ask(
        sock,
        encode(
            "attach",
            settings=StreamSettings(augment=AugmentConfig(imgsz=320)).to_dict(),
            pid=os.getpid(),
            host="x",
            slots=2,
            delivery="shm",
        ),
    )
    assert r["op"] == "error" and "imgsz 320" in r["message"] and "160" in r["message"]
    # A trainer that names no imgsz trains at the daemon's: the reply says which, the ring is sized for it.
    r = _ask(
        sock,
        encode("attach", settings=StreamSettings().to_dict(), pid=os.getpid(), host="x", slots=2, delivery="shm"),
    )
    assert (r["op"], r["imgsz"], r["layout"]["imgsz"]) == ("attached", IMGSZ, IMGSZ)
    gone = _ask(sock, encode("detach", trainer_id=r["trainer_id"], token=r["token"]))
    assert gone["op"] == "detached"
    att = _ask(
        sock, encode("attach", settings=settings(1).to_dict(), pid=os.getpid(), host="x", slots=2, delivery="shm")
    )
    assert att["op"] == "attached"
    tid, token = att["trainer_id"], att["token"]
    r = _ask(
        sock, encode("release", trainer_id=tid, token=token, slot=0, epoch=0, batch=0, generation=1)
    )  # nothing announced yet
    assert (r["op"], r["code"]) == ("error", "order") and "does not hold" in r["message"]
    r = _ask(sock, encode("release", trainer_id=tid, token=token + 1, slot=0, epoch=0, batch=0, generation=1))
    assert (r["op"], r["code"]) == ("error", "unknown_trainer")
    r = _ask(sock, encode("start", trainer_id=tid, token=token, epoch=0, batch=99))
    assert r["op"] == "error" and "99" in r["message"]
    assert _ask(sock, encode("detach", trainer_id=tid, token=token))["op"] == "detached"
    assert not os.path.exists(DEFAULT.path(att["ring"]))
    assert ask_status(d) is not None


def test_socket_dir_is_private(tmp_path):
    from pixpool.shared.errors import ConfigError
    from pixpool.shared.transport.endpoint import socket_dir

    made = socket_dir(tmp_path / "s", create=True)
    assert (made.stat().st_mode & 0o777) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(ConfigError, match="chmod 700"):
        socket_dir(open_dir, create=True)


def test_hsv_on_device_stream_as_torch(daemon, dataset):
    import torch

    from pixpool.client.hsv_torch import apply_hsv
    from pixpool.server.augment.batch import render_batch
    from pixpool.server.snapshot.reference import ReferenceSource

    _, d = daemon
    s = settings(8, hsv_on_device=True)
    ref = ReferenceSource(dataset, IMGSZ)
    with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
        it = c.epoch(0)
        for _ in range(2):
            b = next(it)
            assert isinstance(b.images, torch.Tensor) and b.images.dtype == torch.uint8
            r = render_batch(ref, s, 0, b.batch)  # no HSV on the CPU for this stream
            expected = apply_hsv(torch.from_numpy(r.images), s, 0, r.samples)
            assert torch.equal(b.images, expected)
            assert torch.equal(b.targets, torch.from_numpy(r.targets))
        it.close()


def test_new_epoch_iterator_replaces_the_old_one(daemon, dataset):
    from pixpool.shared.errors import PixpoolError

    _, d = daemon
    s = settings(10)
    with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, slots=2)) as c:
        old = c.epoch(0)
        next(old)
        new = c.epoch(1)
        got = [digest_of(next(new))]
        with pytest.raises(PixpoolError, match="replaced"):
            next(old)
        del old  # its late clean-up must not release the new iterator's slot
        got += [digest_of(b) for b in new]
    assert got == reference_stream(dataset, s, 1)[0]


def test_train_command_trains_on_the_daemons_stream(daemon, capsys, tmp_path):
    """``pixpool train``: a trainer from the command line, attached to the running daemon."""
    from pixpool.cli import main

    _, d = daemon
    argv = [
        "train",
        "--socket-dir",
        d,
        "--model",
        "tiny",
        "--imgsz",
        str(IMGSZ),
        "--batch-size",
        "4",
        "--max-steps",
        "3",
        "--seed",
        "5",
        "--project",
        str(tmp_path / "run"),
        "--json",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == 3 and report["images"] == 12 and report["device"] == "cpu"
    assert report["final_loss"] > 0 and (tmp_path / "run" / "last.pt").is_file()


def test_train_with_hsv_on_device_applies_it(daemon, monkeypatch, tmp_path):
    """The training loop's batches get HSV on the device when the workers skip it."""
    import pixpool.client.hsv_torch as hsv_torch
    from pixpool.client.train.fit import FitConfig, fit

    calls = []
    real = hsv_torch.apply_hsv
    monkeypatch.setattr(
        hsv_torch, "apply_hsv", lambda images, *a, **k: calls.append(images.shape) or real(images, *a, **k)
    )
    config = FitConfig(
        epochs=1,
        scale="tiny",
        device="cpu",
        project=str(tmp_path / "run"),
        progress=False,
        validate=False,
        max_steps=2,
        stream=StreamSettings(seed=9, batch_size=4, hsv_on_device=True, augment=AugmentConfig(imgsz=IMGSZ)),
    )
    report = fit(config, ClientOptions(socket_dir=daemon[1], timeout_s=WAIT_S))
    assert report["steps"] == 2 and len(calls) >= 2 and calls[0][0] == 4


def test_validation_stream_gets_no_device_hsv(daemon, dataset):
    import torch

    from pixpool.server.augment.batch import render_batch
    from pixpool.server.snapshot.reference import ReferenceSource

    s = StreamSettings(seed=4, batch_size=4, hsv_on_device=True, augment=AugmentConfig(imgsz=IMGSZ, train_route=False))
    with Client.connect(s, ClientOptions(socket_dir=daemon[1], timeout_s=WAIT_S)) as c:
        it = c.epoch(0)
        b = next(it)
        r = render_batch(ReferenceSource(dataset, IMGSZ), s, 0, 0)
        assert torch.equal(b.images, torch.from_numpy(r.images))  # letterboxed, unjittered, on both sides
        it.close()


def _next_ready(sock) -> dict:
    while True:
        assert sock.poll(WAIT_S * 1000), "no ready"
        msg = decode(sock.recv(), reply=True)
        if msg["op"] == "ready":
            return msg


def test_a_duplicate_release_is_refused_and_the_slot_keeps_its_batch(daemon, dealer, dataset):
    """Release batch 0, let its slot carry batch 2, release batch 0 again: refused, and
    the bytes of batch 2 stay in that slot while the stream goes on."""
    from pixpool.shared.transport.ring import Ring

    _, d = daemon
    sock = dealer(f"ipc://{d}/daemon.sock")
    s = settings(3, batch_size=4)
    att = _ask(sock, encode("attach", settings=s.to_dict(), pid=os.getpid(), host="elsewhere", slots=2, delivery="shm"))
    tid, token = att["trainer_id"], att["token"]
    # Map the ring before proving, as a trainer does: a proved trainer whose hold on its ring
    # is gone is detached at the daemon's next liveness tick.
    ring = Ring.attach(att["ring"], trainer=True)  # with the CONSUMER hold client/delivery.py takes
    assert prove(sock, att, nonce=ring.nonce()) == DELIVERY_SHM
    try:
        assert _ask(sock, encode("start", trainer_id=tid, token=token, epoch=0, batch=0))["op"] == "started"
        ready = {}
        ready[0] = _next_ready(sock)
        ready[1] = _next_ready(sock)

        def release(m):
            sock.send(
                encode(
                    "release",
                    trainer_id=tid,
                    token=token,
                    slot=m["slot"],
                    epoch=m["epoch"],
                    batch=m["batch"],
                    generation=m["generation"],
                )
            )

        release(ready[0])
        ready[2] = _next_ready(sock)
        assert ready[2]["slot"] == ready[0]["slot"]
        before = ring.images(ready[2]["slot"], ready[2]["size"]).copy()
        r = _ask(
            sock,
            encode(
                "release",
                trainer_id=tid,
                token=token,
                slot=ready[0]["slot"],
                epoch=0,
                batch=0,
                generation=ready[0]["generation"],
            ),
        )
        assert (r["op"], r["code"]) == ("error", "order") and "now holds epoch 0 batch 2" in r["message"]
        release(ready[1])
        ready[3] = _next_ready(sock)
        assert ready[3]["slot"] == ready[1]["slot"], "the refused release handed out the slot of batch 2"
        assert ring.read_header(ready[2]["slot"])[:2] == (0, 2)
        assert np.array_equal(ring.images(ready[2]["slot"], ready[2]["size"]), before)
        ref = reference_stream(dataset, s, 0)[0]
        from pixpool.shared.stream.digest import batch_digest

        for b in (2, 3):
            m = ready[b]
            assert batch_digest(ring.images(m["slot"], m["size"]), ring.targets(m["slot"], m["n_targets"])) == ref[b]
    finally:
        ring.close()
        _ask(sock, encode("detach", trainer_id=tid, token=token))
