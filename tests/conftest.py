"""Suite-wide guards and the fixtures every test shares.

Layout: ``unit/`` starts no process; ``integration/`` spawns daemons, workers, decoders
and CLI children; ``helpers/`` holds what several tests use. The guards: no shared-memory
segment and no child process outlives the run (segments that already existed when the run
started, a user's own prepared snapshots, are left alone and not counted). The fixtures:
``dealer`` makes ZeroMQ sockets (linger 0, closed after the test), ``shm_name`` hands out
segment names and unlinks whatever exists under them after the test.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import psutil
import pytest
import zmq

from helpers.snapshot import remove_snapshot
from pixpool.shared.transport.shm import unlink_segment
from pixpool.shared.transport.store import DEFAULT, Store

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# PIXPOOL_COCO128 names another copy (bench/coco128.py builds one from its two downloads).
COCO128 = Path(os.environ.get("PIXPOOL_COCO128") or SHARED_DATA / "coco128").absolute()

_segments_before: set[str] = set()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ultralytics: needs Ultralytics (CI runs these in its own venv: pytest -m ultralytics)"
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    _segments_before.update(DEFAULT.segments())


def _is_resource_tracker(proc: psutil.Process) -> bool:
    """multiprocessing's resource tracker lives as long as this process by design; not a leak."""
    try:
        return any("resource_tracker" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def _someone_elses(name: str, ours: set[int], users: dict[str, set[int]]) -> bool:
    """True where a process outside this run holds segment ``name`` (``shared.transport.holds``: seen
    from any PID namespace) and none of this run's processes maps it."""
    from pixpool.shared.transport.holds import holds_of
    from pixpool.shared.transport.names import parse, snapshot_parts

    parsed = parse(name)
    if parsed is not None and parsed.kind == "snapshot" and parsed.part.startswith("lix"):
        # A label index is never mapped: it belongs to whoever holds its snapshot's meta.
        name = snapshot_parts(parsed.group)["meta"]
    held = holds_of(name)
    return held is not None and held.in_use and not users.get(name, set()) & ours


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from pixpool.shared.transport.procmem import segment_users

    me = psutil.Process(os.getpid())
    children = [
        p
        for p in me.children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and not _is_resource_tracker(p)
    ]
    ours = {os.getpid()} | {p.pid for p in children}
    users = segment_users()  # which of the holders are this run's (it sees its own namespace)
    # A segment a process outside this run holds belongs to someone else (another test run
    # on the same machine, in whatever PID namespace): neither blamed on this run nor removed.
    leaked = sorted(n for n in set(DEFAULT.segments()) - _segments_before if not _someone_elses(n, ours, users))
    problems = []
    if leaked:
        problems.append(f"shared-memory segments left in /dev/shm: {leaked}")
    if children:
        problems.append("child processes still running: " + ", ".join(f"{p.pid} {p.name()}" for p in children))
        for p in children:
            p.kill()
    for name in leaked:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass
    if problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print("\nLEAK CHECK FAILED: " + "; ".join(problems))


@pytest.fixture(scope="session")
def coco128() -> Path:
    """coco128 (``PIXPOOL_COCO128``, else the shared copy beside the checkout); skips where it is
    absent (a fresh clone)."""
    if not (COCO128 / "annotations" / "instances_train2017.json").is_file():
        pytest.skip(
            f"coco128 not found at {COCO128} (PIXPOOL_COCO128, default ../shared/data/coco128 beside the "
            "checkout): bench/coco128.py builds it (docs/benchmarks.md)"
        )
    return COCO128


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory: pytest.TempPathFactory):
    """The embedded synthetic dataset (JPEG files, COCO json, YOLO labels, data.yaml), written once per run."""
    from pixpool.server.synthetic import write_synthetic

    return write_synthetic(tmp_path_factory.mktemp("synthetic"), num_images=24, seed=0)


@pytest.fixture
def synthetic_copy(synthetic_data, tmp_path) -> Path:
    """A private copy of the synthetic set, in the same layout, that a test may break."""
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(synthetic_data.images_dir, root / "images" / "train")
    shutil.copytree(synthetic_data.labels_dir, root / "labels" / "train")
    shutil.copytree(synthetic_data.coco_json.parent, root / "annotations")
    shutil.copy(synthetic_data.data_yaml, root / "data.yaml")
    return root


OTHER_USER = "pxother9"


@pytest.fixture(scope="session")
def other_user():
    """A second Unix user (``helpers.users.User``), made with ``useradd`` for this run and
    removed after it; multi-user tests skip where the run is not root."""
    import pwd
    import subprocess

    from helpers.users import User

    if os.geteuid() != 0:
        pytest.skip("needs root: the test creates a second Unix user (useradd) and acts as that user")
    try:
        pwd.getpwnam(OTHER_USER)
        made = False
    except KeyError:
        subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
            check=True,
            capture_output=True,
            timeout=60,
        )
        made = True
    entry = pwd.getpwnam(OTHER_USER)
    yield User(OTHER_USER, entry.pw_uid, entry.pw_gid)
    # Whatever that user left in /dev/shm goes with it (this run made the user).
    for name in os.listdir("/dev/shm"):
        path = os.path.join("/dev/shm", name)
        try:
            if os.lstat(path).st_uid == entry.pw_uid:
                os.unlink(path)
        except FileNotFoundError:
            pass
    if made:
        subprocess.run(["userdel", OTHER_USER], check=False, capture_output=True, timeout=60)


@pytest.fixture
def dealer():
    """``dealer(endpoint, **sockopts)``: a connected DEALER socket, linger 0, closed after the test."""
    made: list[zmq.Socket] = []

    def make(endpoint: str, **options: int) -> zmq.Socket:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        made.append(sock)
        sock.setsockopt(zmq.LINGER, 0)
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name), value)
        sock.connect(endpoint)
        return sock

    yield make
    for sock in made:
        sock.close(linger=0)


def disk_store_parent() -> str | None:
    """A folder on a disk (not a tmpfs) to make temporary stores in, or None."""
    from pixpool.shared.transport.store import is_memory

    for parent in ("/var/tmp", "/tmp"):
        if os.path.isdir(parent) and os.access(parent, os.W_OK) and not is_memory(parent):
            return parent
    return None


@pytest.fixture(params=["shm", "disk"])
def store(request):
    """The store a test runs on: /dev/shm, or a private folder (mode 0700) on a local disk,
    which must hold no pixpool file when the test ends and is then removed."""
    import shutil
    import tempfile

    if request.param == "shm":
        yield "/dev/shm"
        return
    parent = disk_store_parent()
    if parent is None:
        pytest.skip("no disk-backed folder (/var/tmp and /tmp are tmpfs here) for a disk store")
    path = os.path.realpath(tempfile.mkdtemp(prefix="pxstore-", dir=parent))
    try:
        yield path
        left = Store.of(path).segments()
        assert not left, f"segments left in the disk store {path}: {left}"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def prepared():
    """Collects PrepareResults and removes their snapshots afterwards, whatever happens."""
    results = []
    try:
        yield results
    finally:
        for r in results:
            r.snapshot.close()
            remove_snapshot(r.snapshot.name, r.snapshot.store)


@pytest.fixture
def shm_name():
    """``shm_name(tag)``: a fresh ``pixpool-test-...`` segment name; whatever the test made
    under any name it was handed is unlinked afterwards, passed or failed."""
    names: list[str] = []

    def new(tag: str = "seg") -> str:
        names.append(f"pixpool-test-{os.getpid()}-{uuid.uuid4().hex[:8]}-{tag}")
        return names[-1]

    new.own = names.append  # a name the test chose itself (a ring name, a snapshot part)
    yield new
    for name in names:
        unlink_segment(name)
