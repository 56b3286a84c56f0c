"""Stat is trusted only where the file system that holds the bytes moves it with content.

A dataset on each kind of mount a user serves from (tmpfs, ext4, a bind mount, an overlay over
ext4, an overlay over squashfs, squashfs, an ext4 image on a loop device) is loaded, then
swapped for a v2 with one image byte and one label byte changed at the same size and times
(``os.utime`` with ns; for a file-system image: another image swapped in underneath, so that
every size, time and inode repeats), and loaded again as a restarted daemon loads it. The
changes come one swap at a time (``STEPS``): an image, then a label, each loaded on the label
index; then another image with the index deleted, so that only the full read's fingerprint can
tell. Each load must serve the bytes of the files as they are now: every record's pixels equal
to the reference path's decode (``decode_bgr`` + ``resize_long_side``, what ``pixpool digest
--reference`` renders from) and its targets equal to a fresh read's.

Runs the daemon's own loading step (``server.daemon.run._load``) in this process on tiny BMP
sets (4 images of 40x32: a changed byte is a changed pixel), one process, a private store.
Root only (mounts, loop devices); each case skips with the reason where a tool or the kernel
lacks what it needs. Every mount and loop device is undone at the end of its test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest

from pixpool.server.daemon import run
from pixpool.server.snapshot import fs_trust, label_index
from pixpool.server.snapshot.decode import decode_bgr, resize_long_side
from pixpool.server.snapshot.load import read_split, splits
from pixpool.shared.stream.config import DaemonConfig
from pixpool.shared.stream.records import Targets
from pixpool.shared.transport.store import Store

IMGSZ = 64
_N = 4
_PIXEL_OFFSET = 100  # past a BMP's 54-byte header: a pixel's byte
_BLOCK = 4096  # ext4 images are made with this block size: a small file is one block

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the cases mount file systems and loop devices")


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


class Lab:
    """The mounts and loop devices of one test, undone in reverse order on close."""

    def __init__(self, work: Path):
        self.work = work
        self._undo: list[tuple[str, str]] = []

    def mount(self, *args: str, point: Path) -> Path:
        point.mkdir(parents=True, exist_ok=True)
        r = _sh("mount", *args, str(point), check=False)
        if r.returncode != 0:
            pytest.skip(f"cannot mount {' '.join(args)} here: {r.stderr.strip()}")
        self._undo.append(("umount", str(point)))
        return point

    def umount(self, point: Path) -> None:
        _sh("umount", str(point))
        self._undo.remove(("umount", str(point)))

    def attach(self, image: Path, *, device: str | None = None, readonly: bool = False) -> str:
        """A loop device over ``image``: ``device`` again where it is free (the same st_dev as
        before the swap), else the first free one."""
        ro = ["-r"] if readonly else []
        if device is not None and _sh("losetup", *ro, device, str(image), check=False).returncode == 0:
            dev = device
        else:
            r = _sh("losetup", "-f", "--show", *ro, str(image), check=False)
            if r.returncode != 0:
                pytest.skip(f"no loop device for a file-system image: {r.stderr.strip()}")
            dev = r.stdout.strip()
        self._undo.append(("losetup", dev))
        return dev

    def detach(self, dev: str) -> None:
        _sh("losetup", "-d", dev)
        self._undo.remove(("losetup", dev))

    def close(self) -> None:
        for kind, what in reversed(self._undo):
            if kind == "umount":
                _sh("umount", "-l", what, check=False)
            else:
                _sh("losetup", "-d", what, check=False)
        self._undo.clear()


@pytest.fixture
def lab(tmp_path):
    if not Path("/dev/loop-control").exists():
        pytest.skip("no loop devices here (/dev/loop-control)")
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "store"
    path.mkdir(mode=0o700)
    try:
        yield str(path)
    finally:
        for seg in Store.of(path).segments():
            os.unlink(path / seg)


# -- the dataset and its versions ------------------------------------------------------------------
def _write_set(root: Path) -> Path:
    rng = np.random.default_rng(0)
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    for i in range(_N):
        cv2.imwrite(str(root / "images" / "train" / f"im{i}.bmp"), rng.integers(0, 256, (32, 40, 3), dtype=np.uint8))
        (root / "labels" / "train" / f"im{i}.txt").write_text(f"{i % 2} 0.500000 0.500000 0.250000 0.250000\n")
    (root / "data.yaml").write_text("train: images/train\nnames:\n  0: a\n  1: b\n")
    # Distinct times, as a real dataset has (one time for every file would look frozen and be
    # hashed for that alone); deepest first, so that a folder's time is not moved after it is set.
    for k, p in enumerate(sorted(root.rglob("*"), key=lambda p: -len(p.parts))):
        os.utime(p, ns=((1_600_000_000 + 7 * k) * 10**9,) * 2)
    return root


def _image(root: Path, i: int) -> Path:
    return root / "images" / "train" / f"im{i}.bmp"


def _label(root: Path, i: int) -> Path:
    return root / "labels" / "train" / f"im{i}.txt"


def _flip(path: Path, offset: int, new: bytes) -> None:
    """Write ``new`` at ``offset`` in place (same inode, same size), then set the times back."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _other_pixel(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(_PIXEL_OFFSET)
        return bytes([f.read(1)[0] ^ 0x5A])


def _new_image(root: Path, i: int) -> None:
    _flip(_image(root, i), _PIXEL_OFFSET, _other_pixel(_image(root, i)))


def _new_label(root: Path, i: int) -> None:
    label = _label(root, i)
    _flip(label, 0, b"1" if label.read_bytes()[:1] == b"0" else b"0")


# v1 -> v2 is one image and one label changed, in two swaps so that each is seen on its own (a
# label read in full renames the snapshot, which would hide stale pixels); the last swap comes
# with the label index deleted: only the full read's fingerprint of the images can tell it.
STEPS = (("image", 1), ("label", 2), ("image", 3))


def _edit(root: Path, step: tuple[str, int]) -> None:
    (_new_image if step[0] == "image" else _new_label)(root, step[1])


def _stats(root: Path) -> dict:
    return {
        str(p.relative_to(root)): (s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns, s.st_dev)
        for p in sorted(root.rglob("*"))
        for s in [p.stat()]
    }


# -- loading as a restarted daemon, and the truth ----------------------------------------------------
def _config(root: Path, store: str) -> DaemonConfig:
    return DaemonConfig(data=str(root / "data.yaml"), imgsz=IMGSZ, dtype="uint8", processes=1, no_val=True,
                        store=store)  # fmt: skip


def _serves_the_files_as_they_are(config: DaemonConfig) -> None:
    """Load as the daemon does; every record's pixels and targets must be the files' as they are now."""
    request, options = splits(config)["train"], config.prepare_options()
    snap, _, paths, _ = run._load(request, options, warned=set())
    try:
        dataset, _ = read_split(request, options, warned=set())
        truth = {rec.image_path: Targets.from_record(rec) for rec in dataset.records}
        assert len(paths) == len(snap) == _N
        for i, path in enumerate(paths):
            want = resize_long_side(decode_bgr(path), IMGSZ)
            assert np.array_equal(np.asarray(snap.image(i)), want), f"{path}: served the pixels of another version"
            got, ref = snap.targets(i), truth[path]
            assert np.array_equal(got.classes, ref.classes) and np.array_equal(got.boxes, ref.boxes), (
                f"{path}: served the targets of another version"
            )
    finally:
        snap.close()


def _drop_index(store: str) -> None:
    for seg in Store.of(store).segments():
        if "-lix" in seg:
            os.unlink(os.path.join(store, seg))


def _wait_past_racy_margin() -> None:
    # An index is written only for files older than the racy margin by the file system's clock.
    import time

    deadline = time.time_ns() + 2 * label_index.RACY_MARGIN_NS
    while time.time_ns() < deadline:
        time.sleep(0.01)


def _check(config, store, root, swaps, *, same_stats: bool, hashed: bool) -> None:
    """Load v1 (its index written), then after each of ``swaps`` (one per ``STEPS``) load again,
    as a restarted daemon: on the label index, and for the last one with the index deleted.
    ``same_stats``: each swap must leave every size, time and inode equal (the case stat cannot
    see). ``hashed``: whether the index checks the images by their bytes (else by stat alone:
    where stat vouches, a restart reads no image)."""
    _wait_past_racy_margin()
    _serves_the_files_as_they_are(config)
    (index,) = [s for s in Store.of(store).segments() if "-lix" in s]
    ix = label_index.read_index(index, Store.of(store))
    modes = {m for p, m in zip(ix.check_paths.tolist(), ix.check_modes.tolist()) if p.endswith(".bmp")}
    assert modes == {label_index.CONTENT if hashed else label_index.STAT}
    for k, swap in enumerate(swaps):
        if k == len(swaps) - 1:
            _drop_index(store)
        before = _stats(root)
        swap()
        if same_stats:
            # st_dev repeats only where the swap got its device numbers back: a loop device, or an
            # anonymous device (an overlay's), that another process took meanwhile moves it.
            after = _stats(root)
            assert {p: r[:4] for p, r in after.items()} == {p: r[:4] for p, r in before.items()}, (
                "the swap left a size, time or inode changed: this case is not the one under test"
            )
            if after != before:
                print("st_dev moved with the swap (a device number was taken meanwhile): stat alone tells it apart")
        _serves_the_files_as_they_are(config)


@pytest.fixture(autouse=True)
def _quiet_labels(monkeypatch):
    # The labels count as quiet for longer than the writeback window (a window of 1 ns stands
    # for the minutes passing), as a dataset's labels are in use: a label's stat may vouch
    # where its file system lets it.
    monkeypatch.setattr(fs_trust, "writeback_window_ns", lambda vm="/proc/sys/vm": 1)


# -- the matrix ------------------------------------------------------------------------------------------
def _need(*tools: str) -> None:
    for tool in tools:
        if not shutil.which(tool):
            pytest.skip(f"needs {tool}")


def test_tmpfs(lab, tmp_path, store):
    mnt = lab.mount("-t", "tmpfs", "-o", "size=16m", "tmpfs", point=tmp_path / "mnt")
    root = _write_set(mnt / "ds")
    steps = [lambda s=s: _edit(root, s) for s in STEPS]
    _check(_config(root, store), store, root, steps, same_stats=False, hashed=False)


def _ext4_image(src: Path, image: Path) -> None:
    _need("mkfs.ext4", "debugfs")
    r = _sh("mkfs.ext4", "-q", "-F", "-b", str(_BLOCK), "-O", "^has_journal", "-E", "root_owner=0:0", "-d",
            str(src), str(image), "8M", check=False)  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"mkfs.ext4 cannot build an image from a folder here: {r.stderr.strip()}")


def _mount_ext4(lab: Lab, image: Path, point: Path, device: str | None = None) -> str:
    dev = lab.attach(image, device=device)
    lab.mount("-t", "ext4", dev, point=point)
    return dev


def test_ext4(lab, tmp_path, store):
    """ext4 as a user has it, changed through the file system (an ext4 on a loop device is the
    one this test can make; its image is never swapped here)."""
    _ext4_image(_write_set(tmp_path / "src"), tmp_path / "fs.img")
    mnt = tmp_path / "mnt"
    _mount_ext4(lab, tmp_path / "fs.img", mnt)
    steps = [lambda s=s: _edit(mnt, s) for s in STEPS]
    _check(_config(mnt, store), store, mnt, steps, same_stats=False, hashed=True)  # on a loop device


def _raw_edit(image: Path, path_in_fs: str, offset: int, new: bytes | None = None) -> None:
    """Change a byte of a file inside an unmounted ext4 image behind the file system's back (a
    pixel flipped where ``new`` is None): every inode field (size, times) stays as it was."""
    block = int(_sh("debugfs", "-R", f"bmap {path_in_fs} 0", str(image)).stdout.strip())
    with open(image, "r+b") as f:
        f.seek(block * _BLOCK + offset)
        if new is None:
            new = bytes([f.read(1)[0] ^ 0x5A])
            f.seek(block * _BLOCK + offset)
        f.write(new)


def _edit_raw(image: Path, top: str, step: tuple[str, int]) -> None:
    kind, i = step
    if kind == "image":
        _raw_edit(image, f"{top}/images/train/im{i}.bmp", _PIXEL_OFFSET)
    else:
        first = _sh("debugfs", "-R", f"cat {top}/labels/train/im{i}.txt", str(image)).stdout[:1]
        _raw_edit(image, f"{top}/labels/train/im{i}.txt", 0, b"1" if first == "0" else b"0")


class _SwappedExt4:
    """An ext4 image on a loop device at ``mnt``, swapped for a copy with bytes changed behind
    the file system (``swap``), on the same loop device where it is free again."""

    def __init__(self, lab: Lab, src: Path, work: Path, mnt: Path, *, top: str = ""):
        self.lab, self.work, self.mnt, self.top = lab, work, mnt, top
        self.image = work / "fs0.img"
        _ext4_image(src, self.image)
        self.dev = _mount_ext4(lab, self.image, mnt)

    def swap(self, step: tuple[str, int], *, before=lambda: None, after=lambda: None):
        def run():
            before()
            self.lab.umount(self.mnt)
            self.lab.detach(self.dev)
            nxt = self.work / f"fs{int(self.image.stem[2:]) + 1}.img"
            shutil.copyfile(self.image, nxt)
            _edit_raw(nxt, self.top, step)
            self.image = nxt
            self.dev = _mount_ext4(self.lab, nxt, self.mnt, device=self.dev)
            after()

        return run


def test_a_loop_mounted_ext4_image_swapped(lab, tmp_path, store):
    mnt = tmp_path / "mnt"
    fs = _SwappedExt4(lab, _write_set(tmp_path / "src"), tmp_path, mnt)
    _check(_config(mnt, store), store, mnt, [fs.swap(s) for s in STEPS], same_stats=True, hashed=True)


def test_a_bind_mount_of_a_folder_on_a_swapped_ext4_image(lab, tmp_path, store):
    """The dataset is a bind mount of a folder on an ext4 image: the bind mount's source (the
    loop device and its image) is what holds the bytes."""
    src = tmp_path / "src"
    _write_set(src / "ds")
    img_mnt, data = tmp_path / "img", tmp_path / "data"
    fs = _SwappedExt4(lab, src, tmp_path, img_mnt, top="/ds")
    lab.mount("--bind", str(img_mnt / "ds"), point=data)

    def unbind():
        lab.umount(data)

    def rebind():
        lab.mount("--bind", str(img_mnt / "ds"), point=data)

    swaps = [fs.swap(s, before=unbind, after=rebind) for s in STEPS]
    _check(_config(data, store), store, data, swaps, same_stats=True, hashed=True)


def _overlay(lab: Lab, lower: Path, tmp_path: Path, mnt: Path) -> None:
    upper, work = tmp_path / "upper", tmp_path / "work"
    upper.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    lab.mount("-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", point=mnt)


def test_an_overlay_over_ext4(lab, tmp_path, store):
    """Lower and upper layers on the test folder's own file system; the lower layer changed in
    place between two mounts of the overlay (a change under a mounted overlay is undefined)."""
    lower, mnt = _write_set(tmp_path / "lower"), tmp_path / "mnt"
    _overlay(lab, lower, tmp_path, mnt)

    def swap(step):
        def run():
            lab.umount(mnt)
            _edit(lower, step)
            _overlay(lab, lower, tmp_path, mnt)

        return run

    # Both layers on the test folder's file system: the overlay vouches exactly where that does.
    here = fs_trust.identify(str(tmp_path), os.stat(tmp_path).st_dev)
    _check(_config(mnt, store), store, mnt, [swap(s) for s in STEPS], same_stats=False,
           hashed=not fs_trust.stat_vouches(here))  # fmt: skip


def _squashfs(src: Path, image: Path) -> Path:
    _need("mksquashfs")
    # Times kept from the files (no -all-time): distinct times, so they do not look frozen.
    _sh("mksquashfs", str(src), str(image), "-noappend", "-quiet", "-no-progress", "-all-root")
    return image


def _squash_versions(tmp_path: Path) -> list[Path]:
    """v1 and the version after each of ``STEPS`` as squashfs images, each built from a copy of
    the one before with every time kept: every stat in them is v1's."""
    folders = [_write_set(tmp_path / "v0")]
    for k, step in enumerate(STEPS, 1):
        folders.append(tmp_path / f"v{k}")
        shutil.copytree(folders[-2], folders[-1], copy_function=shutil.copy2)
        _edit(folders[-1], step)
        for p in [*folders[-1].rglob("*"), folders[-1]]:  # copytree set the folders' times: make them v1's
            st = os.stat(folders[0] / p.relative_to(folders[-1]))
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    return [_squashfs(f, tmp_path / f"{f.name}.sqfs") for f in folders]


def _mount_squash(lab: Lab, image: Path, point: Path, device: str | None = None) -> str:
    dev = lab.attach(image, device=device, readonly=True)
    lab.mount("-t", "squashfs", "-o", "ro", dev, point=point)
    return dev


def test_squashfs(lab, tmp_path, store):
    images = _squash_versions(tmp_path)
    mnt = tmp_path / "mnt"
    dev = [_mount_squash(lab, images[0], mnt)]

    def swap(image):
        def run():
            lab.umount(mnt)
            lab.detach(dev[0])
            dev[0] = _mount_squash(lab, image, mnt, device=dev[0])

        return run

    _check(_config(mnt, store), store, mnt, [swap(i) for i in images[1:]], same_stats=True, hashed=True)


def test_an_overlay_over_squashfs(lab, tmp_path, store):
    """How Apptainer/Singularity images and read-only dataset images with a writable layer are
    served: the squashfs under the overlay swapped for v2, both remounted; through the overlay
    every stat field (and st_dev, f_fsid) repeats."""
    images = _squash_versions(tmp_path)
    lower, mnt = tmp_path / "lower", tmp_path / "mnt"
    dev = [_mount_squash(lab, images[0], lower)]
    _overlay(lab, lower, tmp_path, mnt)

    def swap(image):
        def run():
            lab.umount(mnt)
            lab.umount(lower)
            lab.detach(dev[0])
            dev[0] = _mount_squash(lab, image, lower, device=dev[0])
            _overlay(lab, lower, tmp_path, mnt)

        return run

    _check(_config(mnt, store), store, mnt, [swap(i) for i in images[1:]], same_stats=True, hashed=True)
