"""The label index where stat data repeats: v2 of a dataset whose every
path has v1's size, mtime, inode and ctime is read, never re-attached on v1's index.

Runs the daemon's own loading step (``server.daemon.run._load``) in this process, on private
copies of the synthetic YOLO set and a private store folder. Two ways stat data repeats,
both real, none emulated:

- a label rewritten through a shared mapping that is already dirty: on tmpfs no time moves
  (a private folder under /dev/shm; no root needed);
- a dataset shipped as a squashfs image built with fixed times (``mksquashfs -all-time``), v1
  swapped for v2 at the same mount point (root, squashfs-tools and a loop device; skipped
  with the reason otherwise).

What a correct load gives is what a full read of the files as they are now gives: the content
fingerprint of ``read_split`` + ``content_fingerprint``, and the snapshot name of
``fingerprint``.
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from pixpool.server.daemon import run
from pixpool.server.snapshot import label_index
from pixpool.server.snapshot.fingerprint import base_name, content_fingerprint, fingerprint
from pixpool.server.snapshot.handle import label_indexes
from pixpool.server.snapshot.load import read_split, splits
from pixpool.shared.stream.config import DaemonConfig
from pixpool.shared.transport.store import Store

FIXED_TIME = 1700000000  # what -all-time and SOURCE_DATE_EPOCH builds give every file


def _copy_set(synthetic_data, root: Path) -> Path:
    shutil.copytree(synthetic_data.images_dir, root / "images" / "train")
    shutil.copytree(synthetic_data.labels_dir, root / "labels" / "train")
    shutil.copy(synthetic_data.data_yaml, root / "data.yaml")
    return root


def _a_label(root: Path) -> Path:
    return next(p for p in sorted((root / "labels" / "train").glob("*.txt")) if p.stat().st_size)


def _other_class(first: bytes) -> bytes:
    return b"1" if first == b"0" else b"0"  # the synthetic set has 8 classes: a valid line, the same size


def _wait_past_racy_margin() -> None:
    # An index is written only for files older than the racy margin by the file system's clock.
    deadline = time.time_ns() + 2 * label_index.RACY_MARGIN_NS
    while time.time_ns() < deadline:
        time.sleep(0.01)


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "store"
    path.mkdir(mode=0o700)
    try:
        yield str(path)
    finally:
        for seg in Store.of(path).segments():
            os.unlink(path / seg)


def _config(data_yaml: Path, store: str) -> DaemonConfig:
    return DaemonConfig(data=str(data_yaml), imgsz=64, dtype="uint8", processes=1, no_val=True, store=store)


def _load(config: DaemonConfig):
    """(snapshot name, content fingerprint, whether it was re-attached) of the daemon's load."""
    snap, info, _, _ = run._load(splits(config)["train"], config.prepare_options(), warned=set())
    try:
        return snap.name, info["content"], label_indexes(snap.name, config.segment_store)
    finally:
        snap.close()


def _truth(config: DaemonConfig):
    """(snapshot name, content fingerprint) a full read of the files as they are now gives."""
    dataset, _ = read_split(splits(config)["train"], config.prepare_options(), warned=set())
    name = base_name(fingerprint(dataset, imgsz=config.imgsz, dtype=config.dtype))
    return name, content_fingerprint(dataset, imgsz=config.imgsz)


def _assert_reads_the_files_as_they_are(config, caplog):
    with caplog.at_level(logging.INFO, logger="pixpool.server.daemon.run"):
        name, content, _ = _load(config)
    truth_name, truth_content = _truth(config)
    assert content == truth_content, "served the indexed version: " + "; ".join(
        r.getMessage() for r in caplog.records if "label index" in r.getMessage()
    )
    assert name.startswith(truth_name)


# -- tmpfs: a write through a mapping that is already dirty moves no time ----------------------
def test_a_label_rewritten_through_a_dirty_mapping_is_read(synthetic_data, store, caplog):
    folder = tempfile.mkdtemp(prefix="px-stat-repeats-", dir="/dev/shm")
    try:
        if _fs_type(folder) != "tmpfs":
            pytest.skip("/dev/shm is not tmpfs here")
        root = _copy_set(synthetic_data, Path(folder) / "ds")
        label = _a_label(root)
        fd = os.open(label, os.O_RDWR)
        try:
            mapped = mmap.mmap(fd, 0)
            mapped[0:1] = mapped[0:1]  # the page is now written through the mapping
            mapped.flush()
            _wait_past_racy_margin()
            config = _config(root / "data.yaml", store)
            _, v1, indexes = _load(config)
            assert indexes, "the index of v1 was written"
            before = os.stat(label)
            mapped[0:1] = _other_class(mapped[0:1])  # v2: one class id, the same size
            after = os.stat(label)
            same = (before.st_size, before.st_mtime_ns, before.st_ino, before.st_ctime_ns, before.st_dev) == (
                after.st_size, after.st_mtime_ns, after.st_ino, after.st_ctime_ns, after.st_dev)  # fmt: skip
            if not same:
                pytest.skip("this kernel moves a tmpfs file's times on every mapped write: stat tells v2 apart")
            assert _truth(config)[1] != v1
            _assert_reads_the_files_as_they_are(config, caplog)
            mapped.close()
        finally:
            os.close(fd)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _fs_type(path: str) -> str:
    """The type of the mount ``path`` lives on, from /proc/self/mounts (the longest mount point above it)."""
    best, kind = "", ""
    with open("/proc/self/mounts") as f:
        for line in f:
            point, fstype = line.split()[1:3]
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, kind = point, fstype
    return kind


# -- squashfs built with fixed times, v1 swapped for v2 at one mount point ----------------------
class _Squash:
    """Builds squashfs images of folders with every time fixed and mounts them, one at a time,
    at one mount point; unmounts on close."""

    def __init__(self, work: Path):
        if os.geteuid() != 0:
            pytest.skip("needs root: the test mounts squashfs images (mount -o loop)")
        if not shutil.which("mksquashfs"):
            pytest.skip("needs squashfs-tools (mksquashfs) to build a dataset image")
        if not Path("/dev/loop-control").exists():
            pytest.skip("no loop devices here (/dev/loop-control) to mount a file-system image")
        self.work = work
        self.mnt = work / "mnt"
        self.mnt.mkdir()
        self.mounted = False

    def image(self, folder: Path, name: str) -> Path:
        out = self.work / f"{name}.sqsh"
        subprocess.run(["mksquashfs", str(folder), str(out), "-noappend", "-quiet", "-no-progress",
                        "-all-time", str(FIXED_TIME), "-all-root"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        return out

    def mount(self, image: Path) -> Path:
        self.umount()
        r = subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro", str(image), str(self.mnt)],
                           capture_output=True, text=True)  # fmt: skip
        if r.returncode != 0:
            pytest.skip(f"cannot mount a squashfs image here: {r.stderr.strip()}")
        self.mounted = True
        return self.mnt

    def umount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.mnt)], check=True)
            self.mounted = False


@pytest.fixture
def squash(tmp_path):
    sq = _Squash(tmp_path)
    try:
        yield sq
    finally:
        sq.umount()


def _stats(root: Path) -> dict:
    return {
        str(p.relative_to(root)): (s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns, s.st_dev)
        for p in sorted(root.rglob("*"))
        for s in [p.stat()]
    }


def _v1_v2(synthetic_data, tmp_path, change) -> tuple[Path, Path]:
    v1 = _copy_set(synthetic_data, tmp_path / "v1")
    v2 = tmp_path / "v2"
    shutil.copytree(v1, v2)
    change(v2)
    return v1, v2


def _change_a_label(root: Path) -> None:
    label = _a_label(root)
    data = label.read_bytes()
    label.write_bytes(_other_class(data[:1]) + data[1:])


def _change_an_image(root: Path) -> None:
    # Bytes 14-17 of a JFIF file are its pixel density: other bytes, the same size, the same pixels.
    image = sorted((root / "images" / "train").glob("*.jpg"))[0]
    data = bytearray(image.read_bytes())
    assert data[6:10] == b"JFIF"
    data[14] ^= 0x01
    image.write_bytes(bytes(data))


def test_a_label_changed_in_a_squashfs_v2_with_every_stat_equal_is_read(
    synthetic_data, tmp_path, squash, store, caplog
):
    v1, v2 = _v1_v2(synthetic_data, tmp_path, _change_a_label)
    images = [squash.image(v1, "v1"), squash.image(v2, "v2")]
    mnt = squash.mount(images[0])
    config = _config(mnt / "data.yaml", store)
    stats_v1 = _stats(mnt)
    _, content_v1, indexes = _load(config)
    assert indexes, "the index of v1 was written"
    squash.mount(images[1])
    assert _stats(mnt) == stats_v1  # every path: size, mtime, inode, ctime and device equal
    assert _truth(config)[1] != content_v1
    _assert_reads_the_files_as_they_are(config, caplog)


def test_an_image_changed_in_a_squashfs_v2_with_every_stat_equal_gets_another_snapshot(
    synthetic_data, tmp_path, squash, store, caplog
):
    v1, v2 = _v1_v2(synthetic_data, tmp_path, _change_an_image)
    images = [squash.image(v1, "v1"), squash.image(v2, "v2")]
    mnt = squash.mount(images[0])
    config = _config(mnt / "data.yaml", store)
    stats_v1 = _stats(mnt)
    name_v1, _, _ = _load(config)
    squash.mount(images[1])
    assert _stats(mnt) == stats_v1
    truth_name, _ = _truth(config)
    assert not name_v1.startswith(truth_name), "the fingerprint of v2's images is v1's"
    _assert_reads_the_files_as_they_are(config, caplog)


def _lineage(config: DaemonConfig) -> str:
    return splits(config)["train"].lineage


def test_the_same_image_mounted_from_another_device_is_not_trusted_on_its_stat(synthetic_data, tmp_path, squash, store):
    """The file system's identity is part of the key: an index is only compared on the file
    system it was written on (another loop device here: another st_dev)."""
    v1 = _copy_set(synthetic_data, tmp_path / "v1")
    image = squash.image(v1, "v1")
    mnt = squash.mount(image)
    config = _config(mnt / "data.yaml", store)
    _load(config)
    assert label_index.find_trusted(_lineage(config), store=Store.of(store)) is not None
    squash.umount()
    busy = subprocess.run(["losetup", "-f", "--show", "-r", str(squash.image(v1, "busy"))], capture_output=True,
                          text=True)  # fmt: skip
    if busy.returncode != 0:
        pytest.skip(f"cannot hold a loop device: {busy.stderr.strip()}")
    try:
        squash.mount(image)  # the next free loop device: another st_dev for every path
        assert label_index.find_trusted(_lineage(config), store=Store.of(store)) is None
    finally:
        squash.umount()
        subprocess.run(["losetup", "-d", busy.stdout.strip()], check=True)


def test_a_read_only_mount_hashes_labels_folders_and_images(synthetic_data, tmp_path, store):
    """A read-only mount is versionless: every label and image is checked by its bytes, every
    folder by its listing, and the images' bytes are in the fingerprint."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test makes a read-only bind mount")
    src = _copy_set(synthetic_data, tmp_path / "src")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    subprocess.run(["mount", "--bind", str(src), str(mnt)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mnt)], check=True)
        _wait_past_racy_margin()
        config = _config(mnt / "data.yaml", store)
        name, _, (index_name,) = _load(config)
        index = label_index.read_index(index_name, Store.of(store))
        modes = dict(zip(index.check_paths.tolist(), index.check_modes.tolist()))
        present = dict(zip(index.check_paths.tolist(), index.check_stats[:, 0].tolist()))
        labels = [p for p in modes if p.endswith(".txt") and present[p] >= 0]  # an absent one stays absent
        images = [p for p in modes if p.endswith(".jpg")]
        assert labels and images
        assert {modes[p] for p in labels + images} == {label_index.CONTENT}
        assert modes[str(mnt / "images" / "train")] == label_index.LISTING
        assert label_index.find_trusted(_lineage(config), store=Store.of(store)) is not None
        assert name.startswith(_truth(config)[0])
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
