"""The label index beside a snapshot: a restart on unchanged files reads no label; any change is caught.

Runs the daemon's own loading step (``server.daemon.run``) in this process, on a private copy
of the synthetic YOLO set and a private store folder; preparation uses one process (no
decode workers).
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from pixpool.cli.snapshots import plan_clean
from pixpool.server.daemon import run
from pixpool.server.snapshot import fs_trust, label_index
from pixpool.server.snapshot.handle import label_indexes, list_snapshots
from pixpool.server.snapshot.load import splits
from pixpool.shared.stream.config import DaemonConfig
from pixpool.shared.transport.holds import holds_of
from pixpool.shared.transport.store import Store


@pytest.fixture
def yolo_set(synthetic_copy):
    # The files must be older than the racy margin by the file system's clock, or no index is
    # written for them (label_index's racy rule): let that clock pass the margin.
    deadline = time.time_ns() + 2 * label_index.RACY_MARGIN_NS
    while time.time_ns() < deadline:
        time.sleep(0.01)
    return synthetic_copy


@pytest.fixture
def config(yolo_set, tmp_path):
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    cfg = DaemonConfig(data=str(yolo_set / "data.yaml"), imgsz=64, dtype="uint8", processes=1, no_val=True,
                       store=str(store))  # fmt: skip
    try:
        yield cfg
    finally:
        for seg in Store.of(store).segments():
            os.unlink(store / seg)


def load(config: DaemonConfig):
    """What the daemon loads for its training split: (snapshot, info, paths, names)."""
    return run._load(splits(config)["train"], config.prepare_options(), warned=set())


def no_reading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the dataset was read although the label index says nothing changed")

    monkeypatch.setattr("pixpool.server.snapshot.load.read_split", refuse)
    monkeypatch.setattr("pixpool.server.readers.yolo.parse_label_file", refuse)


def test_restart_on_unchanged_files_reads_no_label(config, monkeypatch):
    snap, info, paths, names = load(config)
    try:
        assert not info["reused"] and label_indexes(snap.name, config.segment_store)
    finally:
        snap.close()
    with monkeypatch.context() as m:
        no_reading(m)
        again, info2, paths2, names2 = load(config)
    try:
        assert again.name == snap.name and info2["reused"]
        assert info2["content"] == info["content"] and names2 == names and paths2 == paths
        assert len(paths2) == len(again) == 24 and paths2[0].endswith("synth_0000.jpg")
    finally:
        again.close()


def _changed_after_index(config) -> bool:
    """Whether a load after the first one read the dataset again (its index did not vouch)."""
    lineage = splits(config)["train"].lineage
    return label_index.find_trusted(lineage, store=config.segment_store) is None


def _indexed(config):
    snap, *_ = load(config)
    snap.close()
    lineage = splits(config)["train"].lineage
    assert label_index.find_trusted(lineage, store=config.segment_store) is not None


def test_label_rewritten_with_its_mtime_set_back_is_caught(config, yolo_set):
    _indexed(config)
    label = yolo_set / "labels" / "train" / "synth_0003.txt"
    st = os.stat(label)
    text = label.read_text()
    label.write_text(text.replace("0", "1", 1) if "0" in text else text.replace("1", "0", 1))  # same size
    os.utime(label, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(label)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert _changed_after_index(config)


def test_label_replaced_by_another_file_is_caught(config, yolo_set):
    _indexed(config)
    label = yolo_set / "labels" / "train" / "synth_0004.txt"
    copy = label.with_suffix(".new")
    shutil.copy2(label, copy)
    os.replace(copy, label)  # same bytes and mtime, another inode
    assert _changed_after_index(config)


def test_a_label_added_is_caught(config, yolo_set):
    _indexed(config)
    missing = yolo_set / "labels" / "train" / "synth_0009.txt"  # the synthetic set's background image
    assert not missing.exists()
    missing.write_text("0 0.5 0.5 0.2 0.2\n")
    assert _changed_after_index(config)


def test_a_label_removed_is_caught(config, yolo_set):
    _indexed(config)
    (yolo_set / "labels" / "train" / "synth_0002.txt").unlink()
    assert _changed_after_index(config)


def test_an_image_added_to_the_folder_is_caught(config, yolo_set):
    _indexed(config)
    images = yolo_set / "images" / "train"
    shutil.copy(images / "synth_0001.jpg", images / "synth_0100.jpg")
    assert _changed_after_index(config)


def test_a_damaged_or_foreign_index_is_ignored(config, monkeypatch, caplog):
    snap, *_ = load(config)
    snap.close()
    (name,) = label_indexes(snap.name, config.segment_store)
    path = config.segment_store.path(name)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[-5] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(label_index.IndexUnusable, match="checksum"):
        label_index.read_index(name, config.segment_store)
    assert _changed_after_index(config)
    with open(path, "wb") as f:
        f.write(b"not an index at all")
    with pytest.raises(label_index.IndexUnusable, match="magic|shorter"):
        label_index.read_index(name, config.segment_store)
    assert _changed_after_index(config)
    # A file others may write is never trusted, whatever it holds.
    again, *_ = load(config)  # a full read writes a good index over the foreign file
    again.close()
    assert not _changed_after_index(config)
    os.chmod(path, 0o666)
    assert _changed_after_index(config)


def test_an_index_written_right_after_a_change_is_not_written(config, yolo_set):
    label = yolo_set / "labels" / "train" / "synth_0005.txt"
    label.write_text(label.read_text())  # changed now: within the racy margin of the read below
    snap, *_ = load(config)
    try:
        assert label_indexes(snap.name, config.segment_store) == []
    finally:
        snap.close()


def test_ls_and_clean_take_the_index_with_its_snapshot(config):
    snap, *_ = load(config)
    (name,) = label_indexes(snap.name, config.segment_store)
    (info,) = list_snapshots(store=config.segment_store)
    assert info.complete and any(p.startswith("lix") for p in info.parts)
    segments = config.segment_store.segments()
    remove, kept = plan_clean(segments, {s: holds_of(s, config.segment_store) for s in segments})
    assert name in kept and not remove  # held with its snapshot while mapped
    snap.close()
    remove, kept = plan_clean(segments, {s: holds_of(s, config.segment_store) for s in segments})
    assert name in remove and len(remove) == 4
    # A snapshot its last user removes goes with its index.
    again, *_ = load(config)
    assert again.release() == "removed"
    assert config.segment_store.segments() == []


def _index_of(config) -> label_index.IndexedSet:
    (seg,) = [s for s in config.segment_store.segments() if "-lix" in s]
    return label_index.read_index(seg, config.segment_store)


def test_labels_indexed_while_fresh_are_checked_by_stat_once_quiet(config, yolo_set, monkeypatch, caplog):
    """A set unpacked just before its first start is indexed with its labels hashed (their stat
    cannot vouch yet); the first restart after they have been quiet for the writeback window
    rewrites the index, and later restarts open no label file at all."""
    fs = fs_trust.identify(str(yolo_set), os.stat(yolo_set).st_dev)
    if not fs_trust.times_vouch(fs, fs_trust.writeback_window_ns()):
        pytest.skip(f"the test folder's file system ({fs.type_name}) never lets a label's stat vouch for its bytes")
    snap, *_ = load(config)
    snap.close()
    modes = _index_of(config).check_modes
    labels = int((modes == label_index.RECENT).sum())
    assert labels >= 24 and not (modes == label_index.CONTENT).any()  # fresh labels (and data.yaml): RECENT

    # Within the window (the labels are seconds old): trusted by their bytes, nothing rewritten.
    with monkeypatch.context() as m:
        no_reading(m)
        again, *_ = load(config)
    again.close()
    assert int((_index_of(config).check_modes == label_index.RECENT).sum()) == labels

    # Once they are older than the window (a window of 1 ns stands for the minutes passing):
    # this restart still reads their bytes, and rewrites the index with them as STAT.
    monkeypatch.setattr(fs_trust, "writeback_window_ns", lambda vm="/proc/sys/vm": 1)
    with monkeypatch.context() as m, caplog.at_level("INFO", logger="pixpool.server.snapshot.label_index"):
        no_reading(m)
        again, *_ = load(config)
    again.close()
    assert f"{labels} labels quiet since it was written are checked by stat" in caplog.text
    refreshed = _index_of(config)
    assert not (refreshed.check_modes == label_index.RECENT).any() and len(refreshed.check_digests) == 0

    # The next restart trusts it on stat alone: no label file opened, nothing read.
    def no_open(path):
        raise AssertionError(f"{path} was opened although its stat vouches for it")

    with monkeypatch.context() as m:
        no_reading(m)
        m.setattr(fs_trust, "open_regular", no_open)
        again, *_ = load(config)
    again.close()

    # And a label rewritten with its times set back is still caught, now by its ctime.
    label = yolo_set / "labels" / "train" / "synth_0003.txt"
    st = os.stat(label)
    text = label.read_text()
    label.write_text(text.replace("0", "1", 1) if "0" in text else text.replace("1", "0", 1))
    os.utime(label, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _changed_after_index(config)
