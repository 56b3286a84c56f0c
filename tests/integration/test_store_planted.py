"""What another user plants in a shared store must neither block, crash nor bind the victim.

Runs the daemon's own loading step (``server.daemon.run._load``, as ``pixpool serve`` does at
start), ``Snapshot.release`` and the ``ls``/``clean`` commands in this process, against a
private store: a sticky, world-writable folder in /dev/shm (as /dev/shm itself is), where a
second Unix user (``other_user``) plants things under the names the victim is about to use.
Every call that could block runs in a thread with a deadline (``_bounded``); a FIFO that
caught one is then opened for writing, so that the blocked reader returns and the test fails
rather than hangs.

The faults it reproduces: files opened before anyone looks at what they are, the snapshot's
removal unit taken by name prefix, and a killed index writer's temporary file.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import threading
import time

import pytest

from helpers.users import as_user
from pixpool.cli import main
from pixpool.server.daemon import run
from pixpool.server.daemon.sweeps import sweep_rings
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot import label_index
from pixpool.server.snapshot.handle import label_indexes
from pixpool.server.snapshot.load import splits
from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
from pixpool.shared.stream.config import DaemonConfig
from pixpool.shared.transport import holds
from pixpool.shared.transport.names import ring_segment, snapshot_parts
from pixpool.shared.transport.store import Store

DEADLINE_S = 20.0
IMGSZ = 64


def _bounded(fn, *, timeout_s: float = DEADLINE_S, fifos=()):
    """``fn()``'s result (or its exception, re-raised), failing the test where it does not
    return within ``timeout_s``; ``fifos``: FIFOs to open for writing then, so a reader
    blocked on one comes back."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread, re-raised there
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        for path in fifos:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # the blocked reader gets EOF
            except OSError:
                pass
        thread.join(timeout_s)
        pytest.fail(f"{getattr(fn, '__name__', fn)} blocked for more than {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture(scope="module")
def dataset_dir(synthetic_data):
    """A copy of the synthetic YOLO set every user may read (a victim that is not root reads it
    too), old enough by the file system's clock for a label index to be written."""
    root = tempfile.mkdtemp(prefix="pxplanted-data-", dir="/tmp")
    os.chmod(root, 0o755)
    shutil.copytree(synthetic_data.images_dir, os.path.join(root, "images", "train"))
    shutil.copytree(synthetic_data.labels_dir, os.path.join(root, "labels", "train"))
    shutil.copy(synthetic_data.data_yaml, os.path.join(root, "data.yaml"))
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            os.chmod(os.path.join(folder, d), 0o755)
        for f in files:
            os.chmod(os.path.join(folder, f), 0o644)
    deadline = time.time_ns() + 2 * label_index.RACY_MARGIN_NS
    while time.time_ns() < deadline:
        time.sleep(0.01)  # the file system's clock must pass the racy margin (label_index)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _new_store(parent: str = "/dev/shm") -> str:
    path = os.path.realpath(tempfile.mkdtemp(prefix="pxplanted-", dir=parent))
    os.chmod(path, 0o1777)  # as /dev/shm: everyone may create, nobody may remove another's file
    return path


@pytest.fixture
def shared_store():
    path = _new_store()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _config(dataset_dir: str, store: str) -> DaemonConfig:
    return DaemonConfig(data=os.path.join(dataset_dir, "data.yaml"), imgsz=IMGSZ, dtype="uint8", processes=1,
                        no_val=True, store=store)  # fmt: skip


def load(config: DaemonConfig):
    """What ``pixpool serve`` loads for its training split: (snapshot, info, paths, names)."""
    return run._load(splits(config)["train"], config.prepare_options(), warned=set())


@pytest.fixture(scope="module")
def victim_names(dataset_dir):
    """(snapshot base, label index name) the root victim's daemon uses for this data set:
    found by one load in a scratch store, removed again."""
    store = _new_store()
    try:
        snap, *_ = load(_config(dataset_dir, store))
        (index,) = label_indexes(snap.name, Store.of(store))
        assert snap.release() == "removed"
        return snap.name, index
    finally:
        shutil.rmtree(store, ignore_errors=True)


# -- planting (runs as the other user) ------------------------------------------------------------
def _plant(path: str, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path, 0o644)
    elif kind == "symlink":
        # To a FIFO beside it: whoever follows the link blocks on it.
        target = path + ".target"
        os.mkfifo(target, 0o644)
        os.symlink(target, path)
    elif kind == "directory":
        os.mkdir(path, 0o755)
    elif kind == "foreign":
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, label_index.MAGIC + b"\0" * 200)  # looks like an index at a glance
        os.close(fd)
    else:
        raise ValueError(kind)


def _fifos(store: str) -> list[str]:
    out = []
    for name in os.listdir(store):
        try:
            if stat.S_ISFIFO(os.lstat(os.path.join(store, name)).st_mode):
                out.append(os.path.join(store, name))
        except FileNotFoundError:
            pass
    return out


def _name_for(part: str, base: str, index: str) -> str:
    if part in ("meta", "img", "tgt"):
        return snapshot_parts(base)[part]
    if part == "lix":
        return index
    if part == "ring":
        return ring_segment(1, "0123456789abcdef")
    if part == "tmp":
        return f"{index}.tmp{os.getpid()}"  # the name the index writer of this process picked
    raise ValueError(part)


KINDS = ("fifo", "symlink", "directory", "foreign")
PARTS = ("meta", "img", "tgt", "lix", "ring", "tmp")


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("kind", KINDS)
def test_planted_thing_under_a_store_name_neither_blocks_nor_crashes(
    kind, part, other_user, dataset_dir, victim_names, shared_store, caplog, capsys
):
    """A FIFO, a symlink, a directory or another user's file under each name the store uses:
    serve takes the snapshot's next name (a snapshot part it cannot create) or ignores it, and
    says so; ``ls`` reports it, ``clean`` leaves it; nothing blocks, nothing crashes."""
    base, index = victim_names
    name = _name_for(part, base, index)
    path = os.path.join(shared_store, name)
    as_user(other_user, _plant, path, kind)
    config = _config(dataset_dir, shared_store)
    caplog.set_level(logging.INFO)
    fifos = _fifos(shared_store)
    if part in ("meta", "img", "tgt"):
        # A taken name costs the victim a fresh one (``reuse.choose_base``): the next name its
        # fingerprint gives; the planted thing is left alone and named with its owner.
        snap, *_ = _bounded(lambda: load(config), fifos=fifos)
        assert snap.name != base and path in caplog.text and f"uid {other_user.uid}" in caplog.text
    else:
        snap, *_ = _bounded(lambda: load(config), fifos=fifos)
        assert snap.name == base
    # Under the index's own name, the victim's new index takes the name where it may: root
    # replaces what another user put under root's name (a rename over anything but a directory).
    replaced = part == "lix" and kind != "directory"
    try:
        if part == "lix":
            assert name in caplog.text and "ignored" in caplog.text  # says what it ignored
        if part == "tmp" or replaced:
            assert label_indexes(base, Store.of(shared_store)) == [index]  # the writer was not stopped
        capsys.readouterr()
        assert _bounded(lambda: main(["ls", "--store", shared_store]), fifos=fifos) == 0
        out = capsys.readouterr()
        if not replaced:
            assert f"ignored {name}: " in out.err  # reported, by name
        assert _bounded(lambda: main(["clean", "--store", shared_store, "--keep-complete"]), fifos=fifos) == 0
        if part == "ring":
            assert _bounded(lambda: sweep_rings(Store.of(shared_store)), fifos=fifos) == []
        if not replaced:
            assert os.path.lexists(path) and os.lstat(path).st_uid == other_user.uid  # not ours to remove
    finally:
        if snap is not None:
            assert _bounded(snap.release, fifos=fifos) == "removed"
    assert os.path.lexists(path) != replaced
    assert _bounded(lambda: main(["clean", "--store", shared_store]), fifos=fifos) == 0
    assert [
        n for n in os.listdir(shared_store) if os.lstat(os.path.join(shared_store, n)).st_uid != other_user.uid
    ] == []


# -- fault 3: the removal unit ----------------------------------------------------------------------
def _squat(path: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.fchmod(fd, mode)
    os.write(fd, b"not yours")
    os.close(fd)


def test_anothers_lix_file_neither_keeps_nor_is_removed_with_the_snapshot(
    other_user, dataset_dir, victim_names, shared_store
):
    """``<base>-lix00000000`` of another user, held open with a lock as a live process would
    hold it: the victim's last-one-out release removes the snapshot all the same, and leaves
    that file alone; so do ``clean`` and a re-attach."""
    base, _ = victim_names
    squatted = os.path.join(shared_store, f"{base}-lix00000000")
    as_user(other_user, _squat, squatted, 0o644)
    fd = os.open(squatted, os.O_RDONLY)
    try:
        assert holds.hold(fd)  # the other user's process "maps" it
        config = _config(dataset_dir, shared_store)
        snap, *_ = _bounded(lambda: load(config))
        assert squatted.rsplit("/", 1)[1] not in label_indexes(base, Store.of(shared_store))
        assert _bounded(snap.release) == "removed"
        assert [
            n for n in Store.of(shared_store).segments() if os.lstat(os.path.join(shared_store, n)).st_uid == 0
        ] == []
        assert os.lstat(squatted).st_uid == other_user.uid
        # Prepared again, re-attached on its label index, released: the same.
        snap, *_ = _bounded(lambda: load(config))
        snap.close()
        snap, info, *_ = _bounded(lambda: load(config))
        assert info["reused"] and squatted.rsplit("/", 1)[1] not in info["segments"]
        assert _bounded(snap.release) == "removed"
        assert os.lstat(squatted).st_uid == other_user.uid
        # Prepared again, then cleaned: the same.
        snap, *_ = _bounded(lambda: load(config))
        snap.close()
        assert _bounded(lambda: main(["clean", "--store", shared_store])) == 0
        assert [
            n for n in Store.of(shared_store).segments() if os.lstat(os.path.join(shared_store, n)).st_uid == 0
        ] == []
        assert os.lstat(squatted).st_uid == other_user.uid
    finally:
        os.close(fd)


def _prepare_and_release(dataset_yaml_dir: str, store: str, out: str) -> None:
    """As the (non-root) victim: prepare the data set's snapshot, release it, write the outcome."""
    dataset = load_dataset(os.path.join(dataset_yaml_dir, "data.yaml"))
    result = prepare_snapshot(dataset, PrepareOptions(imgsz=IMGSZ, processes=1, store=store))
    outcome = result.snapshot.release()
    with open(out, "w") as f:
        f.write(outcome)


def test_anothers_private_lix_file_does_not_crash_a_non_root_victims_release(other_user, dataset_dir, shared_store):
    """Root plants a 0600 file under the victim's ``<base>-lix00000000``: the victim (not root)
    cannot open it, and its release must neither crash on that nor keep the snapshot."""
    from pixpool.server.snapshot.fingerprint import fingerprint
    from pixpool.shared.transport.names import snapshot_base

    dataset = load_dataset(os.path.join(dataset_dir, "data.yaml"))
    fp = fingerprint(dataset, imgsz=IMGSZ)
    base = snapshot_base(fp[:16], uid=other_user.uid)
    squatted = os.path.join(shared_store, f"{base}-lix00000000")
    _squat(squatted, 0o600)
    out = os.path.join(shared_store, "outcome")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o666)
    os.fchmod(fd, 0o666)
    os.close(fd)
    as_user(other_user, _prepare_and_release, dataset_dir, shared_store, out, timeout_s=DEADLINE_S)
    with open(out) as f:
        assert f.read() == "removed"
    assert os.lstat(squatted).st_uid == 0
    assert [n for n in Store.of(shared_store).segments() if n != os.path.basename(squatted)] == []


# -- fault 5: the index writer's temporary file ------------------------------------------------------
@pytest.mark.parametrize("parent", ["/dev/shm", "/var/tmp"])
def test_a_killed_writers_tmp_file_stops_no_successor_and_is_swept(parent, dataset_dir, victim_names, capsys):
    """A writer killed before it published its index left ``<index>.tmp<pid>``; the next writer
    with that pid (PID 1 in a container) writes its index all the same and the daemon's start
    sweeps the debris; ``ls`` shows such debris and ``clean`` removes it."""
    base, index = victim_names
    store = _new_store(parent)

    def leave_debris(name: str) -> str:
        path = os.path.join(store, name)
        with open(path, "wb") as f:
            f.write(b"half an index")
        os.chmod(path, 0o600)
        return path

    try:
        debris = leave_debris(f"{index}.tmp{os.getpid()}")
        snap, *_ = _bounded(lambda: load(_config(dataset_dir, store)))
        try:
            assert label_indexes(base, Store.of(store)) == [index]
            assert not os.path.lexists(debris)  # swept at start
        finally:
            snap.close()
        debris = leave_debris(f"{index}.tmp{os.getpid()}")
        capsys.readouterr()
        assert main(["ls", "--store", store]) == 0
        assert os.path.basename(debris) in capsys.readouterr().out
        assert main(["clean", "--store", store, "--keep-complete"]) == 0
        assert not os.path.lexists(debris)
        assert main(["clean", "--store", store]) == 0
        assert Store.of(store).segments() == []
    finally:
        shutil.rmtree(store, ignore_errors=True)


def test_an_index_writer_killed_mid_write_leaves_no_name(dataset_dir, victim_names, shared_store):
    """The temporary file is anonymous until published: a writer killed in the middle of its
    write leaves nothing in the store under any name."""
    _, index = victim_names
    before = set(os.listdir(shared_store))
    pid = os.fork()
    if pid == 0:  # the writer: dies at its first write
        try:
            os.write = lambda fd, data: os._exit(9)
            label_index._write_atomic(index, b"x" * 4096, Store.of(shared_store))
        finally:
            os._exit(1)
    deadline = time.monotonic() + DEADLINE_S
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        assert time.monotonic() < deadline, "the writer did not finish"
        time.sleep(0.01)  # polling interval of a bounded wait for the child
    assert os.waitstatus_to_exitcode(done[1]) == 9
    assert set(os.listdir(shared_store)) == before
