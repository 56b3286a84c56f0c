"""The store (``--store DIR``) through the daemon, and locality proved over the store.

Integration tests: a daemon in a spawned process serves from /dev/shm and from a folder on
a local disk (the ``store`` fixture); trainers are ``Client``s here or, for the PID
namespace test, a child process under ``unshare``. Root-only tests (a small tmpfs mounted
for the test, a second PID namespace) skip with the reason where they cannot run; every
mount is undone and every folder removed in ``finally``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from helpers.daemon import WAIT_S, ask_status, digest_of, prove, real_daemon, reference_stream
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
from pixpool.shared.errors import CapacityError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.names import ring_prefix
from pixpool.shared.transport.store import Store
from pixpool.shared.wire.trainer import DELIVERY_FRAMES, DELIVERY_SHM, decode, encode

IMGSZ = 96


def _settings(seed: int, batch_size: int = 6) -> StreamSettings:
    return StreamSettings(seed=seed, batch_size=batch_size, augment=AugmentConfig(imgsz=IMGSZ))


@pytest.fixture(scope="module")
def dataset(synthetic_data):
    return load_dataset(synthetic_data.coco_json)


def test_the_daemon_serves_from_the_store_byte_identical_in_place(store, synthetic_data, dataset):
    """Snapshot and rings live in the store; the trainer proves it maps its ring and reads
    the slots in place; the bytes equal the reference; the memory report measures the store."""
    from pixpool.ops.memory_report import memory_report
    from pixpool.shared.wire.status import Status

    s = _settings(3)
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, store=store) as (proc, d):
        st = ask_status(d)
        assert st["daemon"]["store"] == store and st["snapshot"]["store"] == store
        assert set(st["snapshot"]["segments"]) <= set(Store.of(store).segments())
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as client:
            assert client.delivery == DELIVERY_SHM and client._ring.store == store
            assert client._ring.name in Store.of(store).segments()
            got = [digest_of(b) for b in client.epoch(0)]
            trainer = ask_status(d)["trainers"][0]
            assert trainer["delivery"] == DELIVERY_SHM and trainer["pid_watched"] is True
            report = memory_report(Status.from_wire(ask_status(d)))
            assert report["store"]["path"] == store and report["store"]["memory"] == (store == "/dev/shm")
            # whole pages: up to one partial page per segment more than the file bytes
            assert 0 < report["snapshot_resident_bytes"] <= report["snapshot_bytes"] + 3 * os.sysconf("SC_PAGE_SIZE")
        assert got == reference_stream(dataset, s, 0)[0]
    assert not [
        n for n in Store.of(store).segments() if n.startswith(ring_prefix(proc.pid)) or n in st["snapshot"]["segments"]
    ]


def test_a_trainer_that_cannot_map_the_store_gets_frames(synthetic_data, dataset, dealer, tmp_path):
    """Locality is what the trainer proves, not where it connects from: told the wrong
    store path, or sending a wrong nonce, it gets the same bytes as frames."""
    s = _settings(4)
    elsewhere = tmp_path / "not-the-store"
    elsewhere.mkdir()
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        with Client.connect(
            s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False, store=elsewhere)
        ) as client:
            assert client.delivery == DELIVERY_FRAMES and client._ring is None
            got = [digest_of(b) for b in client.epoch(0)]
            trainer = ask_status(d)["trainers"][0]
            assert trainer["delivery"] == DELIVERY_FRAMES and trainer["pid_watched"] is False
        assert got == reference_stream(dataset, s, 0)[0]
        sock = dealer(f"ipc://{d}/daemon.sock")
        sock.send(encode("attach", settings=s.to_dict(), pid=os.getpid(), host="h", slots=2, delivery="shm"))
        assert sock.poll(WAIT_S * 1000)
        att = decode(sock.recv(), reply=True)
        assert prove(sock, att, nonce="00" * 16) == DELIVERY_FRAMES
        assert prove(sock, att) == DELIVERY_SHM  # the real nonce, read through the store
        sock.send(encode("detach", trainer_id=att["trainer_id"], token=att["token"]))


# -- root only ------------------------------------------------------------------------------
def _root_or_skip(what: str) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"needs root: {what}")


def test_a_dataset_larger_than_a_tmpfs_fails_there_cleanly_and_serves_from_disk(synthetic_data, dataset):
    """A 1 MiB tmpfs cannot hold the snapshot (1.9 MB as uint8 at 192 px): refused before anything is made, naming the
    store and both byte counts. The same dataset prepares and serves from a disk store."""
    from conftest import disk_store_parent

    _root_or_skip("the test mounts a small tmpfs (mount -t tmpfs)")
    parent = disk_store_parent()
    if parent is None:
        pytest.skip("no disk-backed folder for a disk store")
    small = tempfile.mkdtemp(prefix="pxtmpfs-")
    disk = os.path.realpath(tempfile.mkdtemp(prefix="pxdisk-", dir=parent))
    mounted = False
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", small],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted = True
        with pytest.raises(CapacityError) as info:
            prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ * 2, processes=2, store=small))
        text = str(info.value)
        assert f"the store {small} has" in text and "--store DIR" in text
        assert os.listdir(small) == [], "a refused preparation left files in the tmpfs"
        s = StreamSettings(seed=5, batch_size=6, augment=AugmentConfig(imgsz=IMGSZ * 2))
        with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ * 2, workers=1, store=disk) as (_, d):
            snap_nbytes = sum(ask_status(d)["snapshot"][k] for k in ("image_bytes", "index_bytes", "target_bytes"))
            assert snap_nbytes > 1 << 20, "the dataset must be larger than the tmpfs for this test to mean anything"
            with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S, as_torch=False)) as client:
                assert client.delivery == DELIVERY_SHM
                got = [digest_of(b) for b in client.epoch(0)]
        assert got == reference_stream(dataset, s, 0)[0]
        assert Store.of(disk).segments() == []
    finally:
        if mounted:
            subprocess.run(["umount", small], capture_output=True, timeout=30, check=False)
        if not os.path.ismount(small):
            os.rmdir(small)
        shutil.rmtree(disk, ignore_errors=True)


_TRAINER = """
import json, os, sys
from pixpool.client import Client, ClientOptions
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.digest import batch_digest
s = StreamSettings(seed=int(sys.argv[2]), batch_size=6, augment=AugmentConfig(imgsz=int(sys.argv[3])))
with Client.connect(s, ClientOptions(socket_dir=sys.argv[1], timeout_s=60, as_torch=False)) as c:
    digests = [batch_digest(b.images, b.targets) for b in c.epoch(0)]
    from pixpool.shared.transport.control import request_status
    me = [t for t in request_status("ipc://" + sys.argv[1] + "/daemon.sock", timeout_s=10)["trainers"] if t["trainer_id"] == c._ident[0]][0]
    print(json.dumps({"pid": os.getpid(), "delivery": c.delivery, "reattaches": c.reattaches, "digests": digests,
                      "seen_by_daemon": {"pid": me["pid"], "delivery": me["delivery"], "pid_watched": me["pid_watched"]}}))
"""


def test_a_trainer_in_another_pid_namespace_gets_shm_delivery(synthetic_data, dataset):
    """Daemon here, trainer under ``unshare --pid --fork --mount-proc``: its pid means
    nothing to the daemon and the daemon's pid nothing to it, yet it proves it maps its
    ring and reads the slots in place, with the reference bytes and no re-attach."""
    _root_or_skip("the trainer runs in a new PID namespace (unshare --pid)")
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"unshare --pid is not allowed here: {probe.stderr.strip()}")
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        r = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _TRAINER, d, "7", str(IMGSZ)],
            capture_output=True,
            text=True,
            timeout=WAIT_S * 2,
            env=env,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["pid"] == 1, "the trainer did not run in a PID namespace of its own"
    assert out["delivery"] == DELIVERY_SHM and out["reattaches"] == 0
    # The daemon does not watch a pid of another namespace (pid 1 there is not pid 1 here).
    assert out["seen_by_daemon"] == {"pid": 1, "delivery": DELIVERY_SHM, "pid_watched": False}
    assert out["digests"] == reference_stream(dataset, _settings(7), 0)[0]
