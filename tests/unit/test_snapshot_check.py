"""``client/snapshot_check.py``: when a reattach lands on another snapshot, and what the
trainer is told. Pure functions over ``attached`` replies; no process is started."""

from __future__ import annotations

from pixpool.client import snapshot_check as sc
from pixpool.shared.errors import SnapshotChangedError, SnapshotError

NAMES = ["cat", "dog", "bird"]


def attached(fp: str = "a" * 64, records: int = 24, names=NAMES, name: str = "pixpool-u0-snap-aaaa") -> dict:
    reply = {"num_records": records, "names": list(names)}
    if fp is not None:
        reply["snapshot"] = {"fingerprint": fp, "name": name, "records": records}
    return reply


def test_the_same_content_is_the_same_snapshot_whatever_its_name():
    # A uint8 snapshot of the same data has another name but the float32 content fingerprint.
    assert not sc.changed(sc.identity(attached()), sc.identity(attached(name="pixpool-u0-snap-bbbb")))


def test_another_fingerprint_is_another_snapshot_even_with_the_same_counts():
    before, after = sc.identity(attached()), sc.identity(attached(fp="b" * 64))
    assert sc.changed(before, after)
    assert sc.differences(before, after) == ["the same record count and classes, but other image files or annotations"]


def test_without_fingerprints_records_and_class_names_are_compared():
    old = sc.identity(attached(fp=None))
    assert not sc.changed(old, sc.identity(attached(fp=None)))
    assert sc.changed(old, sc.identity(attached(fp=None, records=20)))
    assert sc.changed(old, sc.identity(attached(fp=None, names=["cat", "bird", "dog"])))


def test_the_error_names_both_snapshots_what_changed_and_the_opt_in():
    before = sc.identity(attached())
    after = sc.identity(attached(fp="c" * 64, records=20, names=["cat", "dog", "fish"]))
    err = sc.refusal(before, after, endpoint="ipc:///tmp/x/daemon.sock", position=(3, 7))
    assert isinstance(err, SnapshotChangedError) and isinstance(err, SnapshotError) and isinstance(err, RuntimeError)
    text = str(err)
    for part in (
        "a" * 16,
        "c" * 16,
        "24 records",
        "20 records",
        "4 records fewer",
        "added ['fish']",
        "removed ['bird']",
        "epoch 3 short at batch 7",
        "follow_snapshot=True",
        "--follow-snapshot",
        "ipc:///tmp/x/daemon.sock",
    ):
        assert part in text, f"{part!r} missing from: {text}"
    assert err.before is before and err.after is after


def test_reordered_classes_are_called_so():
    before, after = sc.identity(attached()), sc.identity(attached(fp="d" * 64, names=["dog", "cat", "bird"]))
    assert sc.differences(before, after) == ["the same classes in another order (class ids now mean other classes)"]
