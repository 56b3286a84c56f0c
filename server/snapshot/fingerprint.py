"""Fingerprint of a preparation's inputs, which names its snapshot.

Runs in the preparing process, before anything is allocated. Two preparations with the
same fingerprint would write the same bytes, so the second re-attaches the first's
snapshot; any change in what the bytes depend on yields another name.

What goes in: the layout version, imgsz, fill value and dtype; every record's image path
with its size, mtime, inode and ctime (cheap: one ``stat``, no image is read), in record
order, duplicates included. Size and mtime alone miss a file rewritten in place with its
mtime set back (``touch -d``, ``cp -p``, ``rsync -t``); the ctime changes with every write
or metadata change and cannot be set from user space, and the inode changes when a file
is replaced (``mv``, most editors). What it does not catch: a file whose bytes are
changed behind the file system (a raw block device write), or a copied dataset (new
inodes and ctimes: prepared again, never served stale);
the content of every file the dataset was read from (annotation json, label files,
data.yaml); and the records' own arrays (classes, boxes, polygons), so a reader change
that alters targets also changes the name.
"""

from __future__ import annotations

import hashlib
import os

from ...shared.config import FILL_VALUE
from ...shared.errors import MissingFileError
from ...shared.names import snapshot_base, snapshot_parts
from ...shared.records import Dataset
from . import layout

NAME_HEX_DIGITS = 16


def _hash_file(h: "hashlib._Hash", path: str) -> None:
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except FileNotFoundError:
        raise MissingFileError("dataset source file disappeared while fingerprinting; re-run", path=path) from None


def fingerprint(dataset: Dataset, *, imgsz: int, fill: float = FILL_VALUE, dtype: str = "<f4") -> str:
    """sha256 hex of everything the snapshot's bytes depend on (see module docstring)."""
    h = hashlib.sha256()
    h.update(f"pixpool-snapshot layout={layout.LAYOUT_VERSION} imgsz={int(imgsz)} fill={float(fill)!r} dtype={dtype}\n".encode())
    stat_cache: dict[str, tuple[int, int, int, int]] = {}
    for rec in dataset.records:
        st = stat_cache.get(rec.image_path)
        if st is None:
            try:
                s = os.stat(rec.image_path)
            except FileNotFoundError:
                raise MissingFileError("image file does not exist; check the images folder or the annotation's file_name", path=rec.image_path) from None
            st = stat_cache[rec.image_path] = (s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns)
        h.update(("img " + "\0".join(map(str, (rec.image_path, *st))) + "\n").encode())
        h.update(rec.classes.astype("<i4", copy=False).tobytes())
        h.update(rec.boxes.astype("<f4", copy=False).tobytes())
        for poly in rec.polygons:
            h.update(len(poly).to_bytes(8, "little"))
            h.update(poly.astype("<f4", copy=False).tobytes())
    for path in sorted(dataset.source_files):
        h.update(f"src {path}\n".encode())
        _hash_file(h, path)
    return h.hexdigest()


def base_name(fp: str) -> str:
    """``pixpool-snap-<first 16 hex digits>``: the snapshot's base name."""
    return snapshot_base(fp[:NAME_HEX_DIGITS])


def segment_names(fp: str) -> dict[str, str]:
    """part -> segment name for parts meta/img/tgt."""
    return snapshot_parts(base_name(fp))
