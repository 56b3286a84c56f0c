"""Fingerprint of a preparation's inputs, which names its snapshot.

Runs in the preparing process, before anything is allocated. Two preparations with the
same fingerprint would write the same bytes, so the second re-attaches the first's
snapshot; any change in what the bytes depend on yields another name.

What goes in is what the snapshot's bytes depend on, resolved, never a file's spelling:
the layout version, imgsz, fill value and the arena's dtype; the class names; and for every record,
in record order (duplicates included), its image path with the file's size, mtime, inode
and ctime (cheap: one ``stat``, no image is read), the size the annotation states, and the
record's own arrays (classes, boxes, polygons, and keypoints for pose) as the reader resolved
them; for a task other than detect also the task, and for pose ``kpt_shape`` and ``flip_idx``
(a detect dataset hashes exactly what it hashed before tasks existed, so its snapshot keeps its
name, and a daemon restarted with another ``--task`` prepares anew). So two
spellings of one dataset (a data.yaml with ``names`` as a list or as a dict, a json
reformatted) share a snapshot, and any change a reader turns into other targets gives
another name.

Size and mtime alone miss a file rewritten in place with its mtime set back (``touch
-d``, ``cp -p``, ``rsync -t``); the ctime changes with every write or metadata change and
cannot be set from user space, and the inode changes when a file is replaced (``mv``, most
editors). A copied dataset has new inodes and ctimes: it is prepared again, never served
stale.

Where stat data is not known to tell two versions of a file apart (``fs_trust.stat_vouches``
is an allow-list: ext2/3/4, xfs, btrfs, f2fs, tmpfs mounted read-write, judged for what holds
the bytes, so an overlay only where every layer is one of them and nothing on a loop device;
also times that do not move, ``fs_trust.frozen_times``), every image on that file system is
read and its sha256 goes in beside its stat (``hashed_devices``): v2 of a squashfs image with
one photo changed at the same size gets another name, seen directly or through an overlay.
Everywhere else the pixels are trusted by stat, as before, so a detect set on ext4 or tmpfs
keeps its name. What stat does not catch there: bytes changed behind the file system (a raw
write to the block device; an image file under a loop device is hashed), and an image
rewritten through a shared mapping that was already dirty (its times move only on the first
write after each writeback; ``fs_trust``); hashing every image at every start would cost a
read of the whole dataset.
"""

from __future__ import annotations

import hashlib
import logging
import os

from ...shared.errors import MissingFileError
from ...shared.stream.config import DEFAULT_SNAPSHOT_DTYPE, FILL_VALUE
from ...shared.stream.records import Dataset
from ...shared.task import DETECT, TaskSpec
from ...shared.transport.names import snapshot_base, snapshot_parts
from . import fs_trust, layout

log = logging.getLogger(__name__)

NAME_HEX_DIGITS = 16
# How many names a snapshot may take (``candidate_bases``). Anyone who can read the dataset can
# compute them and plant a file under each; a few spare names make one planted file cost the
# victim a fresh name, not its service, and past them the refusal names every planted file.
NAME_CANDIDATES = 8


def fingerprint(dataset: Dataset, *, imgsz: int, fill: float = FILL_VALUE, dtype: str = DEFAULT_SNAPSHOT_DTYPE) -> str:
    """sha256 hex of everything the snapshot's bytes depend on (see module docstring).

    ``dtype`` is the arena's pixel type by name (``config.SNAPSHOT_DTYPES``); it enters as
    numpy's type string (``<f4``, ``|u1``), so a float32 snapshot keeps the name it had
    before uint8 snapshots existed, and a uint8 one of the same data has another."""
    h = hashlib.sha256()
    code = layout.DTYPE_CODES[layout.CODE_OF[dtype]].str
    h.update(
        f"pixpool-snapshot layout={layout.LAYOUT_VERSION} imgsz={int(imgsz)} fill={float(fill)!r} dtype={code}\n".encode()
    )
    h.update(("names " + "\0".join(dataset.names) + "\n").encode())
    spec = dataset.spec
    if not spec.is_default:
        flip = None if dataset.flip_idx is None else tuple(int(v) for v in dataset.flip_idx)
        kpt = f" kpt_shape={tuple(int(v) for v in dataset.kpt_shape)!r} flip_idx={flip!r}" if spec.has_keypoints else ""
        h.update(f"task={dataset.task}{kpt}\n".encode())
    stats = image_stats(dataset)
    hashed = hashed_devices(stats)
    for rec in dataset.records:
        st = stats[rec.image_path]
        size_hw = "-" if rec.size_hw is None else f"{int(rec.size_hw[0])}x{int(rec.size_hw[1])}"
        fields = (rec.image_path, *st[:4], size_hw)
        if st[4] in hashed:  # stat cannot tell this file's versions apart: its bytes go in
            fields += ("sha256=" + fs_trust.image_digest(rec.image_path, st).hex(),)
        h.update(("img " + "\0".join(map(str, fields)) + "\n").encode())
        h.update(rec.classes.astype("<i4", copy=False).tobytes())
        h.update(rec.boxes.astype("<f4", copy=False).tobytes())
        for poly in rec.polygons:
            h.update(len(poly).to_bytes(8, "little"))
            h.update(poly.astype("<f4", copy=False).tobytes())
        if spec.has_keypoints and rec.keypoints is not None:
            h.update(rec.keypoints.astype("<f4", copy=False).tobytes())
    return h.hexdigest()


def image_stats(dataset: Dataset) -> dict[str, tuple[int, int, int, int, int]]:
    """image path -> (size, mtime_ns, inode, ctime_ns, st_dev), one ``stat`` per distinct path."""
    out: dict[str, tuple[int, int, int, int, int]] = {}
    for rec in dataset.records:
        if rec.image_path in out:
            continue
        try:
            s = os.stat(rec.image_path)
        except FileNotFoundError:
            raise MissingFileError(
                "image file does not exist; check the images folder or the annotation's file_name",
                path=rec.image_path,
            ) from None
        out[rec.image_path] = (s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns, s.st_dev)
    return out


def hashed_devices(stats: dict[str, tuple[int, int, int, int, int]], *, what: str = "images") -> frozenset[int]:
    """The devices (``st_dev``) of the files in ``stats`` (path -> ``image_stats``' rows) whose
    stat data cannot tell versions apart (``fs_trust``: a type off the allow-list, a read-only
    mount, bytes held by an overlay layer or loop device that cannot vouch, or times that do not
    move among those files). For the images it is what the fingerprint hashes; the label index
    asks it again for the images (the same answer) and for the labels.

    Each folder's files on a device are judged by one of them: one device can be seen through
    several mounts (a bind mount made read-only, an overlay whose files show the device of the
    layer below), and a device is hashed where any of them does not vouch."""
    by_dev: dict[int, dict[tuple[int, int], tuple[int, int]]] = {}
    folders: dict[tuple[int, str], str] = {}
    for path, (_, mtime_ns, ino, ctime_ns, dev) in stats.items():
        files = by_dev.setdefault(dev, {})
        files[(ino, mtime_ns)] = (mtime_ns, ctime_ns)  # distinct files: 100k symlinks to 128 images are 128
        folders.setdefault((dev, os.path.dirname(path)), path)
    try:
        table = fs_trust.mounts.read_mounts()
    except OSError:
        table = None  # identify says why, per file system
    out = set()
    for (dev, _), path in folders.items():
        if dev in out:
            continue
        try:
            fs = fs_trust.identify(path, dev, mount_table=table)
        except OSError as exc:  # what cannot be told apart by stat is hashed: the sound side
            log.warning("%s on %s are hashed: its file system is unknown (%s)", what, path, exc)
            out.add(dev)
            continue
        if not fs_trust.stat_vouches(fs):
            log.info("%s on %s (%s, device %d) are hashed: its stat data cannot tell versions apart (%s)", what,
                     path, fs.type_name, dev, fs_trust.why_not(fs))  # fmt: skip
            out.add(dev)
        elif fs_trust.frozen_times(list(by_dev[dev].values())):
            log.info("%s on %s (%s, device %d) are hashed: their times look frozen", what, path, fs.type_name, dev)
            out.add(dev)
    return frozenset(out)


def content_fingerprint(dataset: Dataset, *, imgsz: int, fill: float = FILL_VALUE) -> str:
    """What a trainer's batches depend on, as one sha256 hex: the fingerprint the float32
    snapshot of these inputs has. A uint8 snapshot of the same data is another snapshot (its
    own name) but gives the very same batches, so both have this one content fingerprint;
    the daemon hands it to each trainer at attach, and a trainer that attaches again after a
    restart compares it (``client/client.py``)."""
    return fingerprint(dataset, imgsz=imgsz, fill=fill, dtype="float32")


def lineage_of(
    data: str | os.PathLike,
    images: str | os.PathLike | None,
    imgsz: int,
    dtype: str = DEFAULT_SNAPSHOT_DTYPE,
    task: TaskSpec = DETECT,
) -> str:
    """Which dataset (its path as given to prepare or serve), imgsz, dtype and task a snapshot
    comes from: a newer snapshot of the same lineage supersedes an older one (its inputs changed).
    A uint8 and a float32 snapshot of one dataset are two lineages: preparing one never
    removes the other; so are the snapshots of one dataset for two tasks."""
    parts = [os.path.abspath(data), os.path.abspath(images) if images is not None else "", str(int(imgsz))]
    if dtype != "float32":  # float32 keeps the key it had before the dtype was a setting
        parts.append(dtype)
    if not task.is_default:  # detect keeps the key it had before tasks
        parts.append(f"task={task.name}")
    key = "\0".join(parts)
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def base_name(fp: str) -> str:
    """``pixpool-snap-<first 16 hex digits>``: the snapshot's base name."""
    return snapshot_base(fp[:NAME_HEX_DIGITS])


def candidate_bases(fp: str) -> list[str]:
    """The base names a snapshot of fingerprint ``fp`` may take, in the order they are tried:
    ``base_name(fp)``, then one more hex digit of the fingerprint each (``reuse.choose_base``
    takes the next one where another user's file sits under a name)."""
    return [
        snapshot_base(fp[: NAME_HEX_DIGITS + i]) for i in range(min(NAME_CANDIDATES, len(fp) - NAME_HEX_DIGITS + 1))
    ]


def segment_names(fp: str) -> dict[str, str]:
    """part -> segment name for parts meta/img/tgt."""
    return snapshot_parts(base_name(fp))
