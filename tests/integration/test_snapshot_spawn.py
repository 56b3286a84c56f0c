"""A spawned process attaches the snapshot read-only: same bytes, no private copy, no writes."""

from __future__ import annotations

import multiprocessing
import pickle

import pytest

from helpers.snapshot import remove_snapshot
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.handle import Snapshot, list_snapshots
from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
from pixpool.shared.errors import SnapshotError
from pixpool.shared.transport.names import snapshot_base


@pytest.fixture(scope="module")
def snapshot(synthetic_data):
    # 640: the default (uint8) snapshot of the 24 images is ~20 MB, large enough that a private
    # copy in the child would stand out of its USS noise (the test asks for > 10 MiB).
    result = prepare_snapshot(load_dataset(synthetic_data.coco_json), PrepareOptions(imgsz=640, processes=1))
    try:
        yield result.snapshot
    finally:
        result.snapshot.close()
        remove_snapshot(result.snapshot.name)


def _child(snapshot: Snapshot, conn) -> None:
    """Runs in the spawned process: received by name, attaches lazily on first use."""
    import psutil

    try:
        me = psutil.Process()
        n = len(snapshot)  # attaches here (header + index only are touched)
        img = snapshot.image(n - 1)
        uss_before = me.memory_full_info().uss
        checksum = snapshot.checksum()  # reads every byte of every segment
        total = float(sum(float(snapshot.image(i).sum()) for i in range(n)))
        uss_after = me.memory_full_info().uss
        write_error = None
        try:
            img[0, 0, 0] = 1.0
        except ValueError as exc:
            write_error = str(exc)
        try:
            snapshot.targets(0).boxes[...] = 0
            target_write_error = None
        except ValueError as exc:
            target_write_error = str(exc)
        conn.send({"checksum": checksum, "uss_before": uss_before, "uss_after": uss_after, "write_error": write_error,
                   "target_write_error": target_write_error, "total": total, "owner": snapshot.owner})  # fmt: skip
        del img
        snapshot.close()
    except BaseException as exc:  # report, so the parent fails with the reason, not a timeout
        conn.send({"error": repr(exc)})
    finally:
        conn.close()


def test_spawned_reader_same_checksum_no_private_copy_read_only(snapshot):
    # The preparing process reads every page first: pages mapped by two processes are
    # shared, so the child's touching them must not show up as its unique memory (USS).
    checksum = snapshot.checksum()
    nbytes = sum(snapshot.nbytes.values())
    assert nbytes > 10 * 2**20
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(snapshot, child_conn))
    proc.start()
    try:
        child_conn.close()
        if not parent_conn.poll(120):
            raise TimeoutError("the spawned reader sent nothing within 120 s")
        got = parent_conn.recv()
        proc.join(timeout=60)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=30)
        parent_conn.close()
    assert "error" not in got, got["error"] if "error" in got else ""
    assert got["checksum"] == checksum
    assert got["owner"] is False
    assert got["total"] == float(sum(float(snapshot.image(i).sum()) for i in range(len(snapshot))))
    growth = got["uss_after"] - got["uss_before"]
    print(f"snapshot {nbytes} bytes; child USS growth {growth} bytes")
    assert growth < nbytes / 10, f"USS grew by {growth} bytes reading a {nbytes}-byte snapshot"
    assert got["write_error"] and "read-only" in got["write_error"]
    assert got["target_write_error"] and "read-only" in got["target_write_error"]


def test_pickles_as_name_only_and_views_are_read_only(snapshot):
    data = pickle.dumps(snapshot)
    assert len(data) < 200 and snapshot.name.encode() in data
    other = pickle.loads(data)
    try:
        assert other.owner is False
        assert other.checksum() == snapshot.checksum()
        view = other.image(0)
        assert not view.flags.writeable and view.base is not None  # a view, not a copy
        with pytest.raises(ValueError):
            view[...] = 0
        with pytest.raises(PermissionError):
            other.unlink()
    finally:
        other.close()
    assert any(info.name == snapshot.name and info.complete for info in list_snapshots())


def test_attach_refuses_missing_and_incomplete():
    with pytest.raises(SnapshotError, match="not found"):
        Snapshot.attach(snapshot_base("0000000000000000"))
