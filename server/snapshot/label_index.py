"""The label index beside a snapshot: the stat data of every file its dataset was read from -> its fingerprint.

Runs in the process that reads a dataset and prepares or re-attaches its snapshot (the
daemon at start-up, ``pixpool prepare``). Reading a COCO-sized YOLO set means parsing 100k+
label files into records only to hash them into the fingerprint that names a snapshot
already in the store; this index lets a restart on unchanged files skip that.

What it holds (one file ``<snapshot base>-lix<8 hex of the lineage>`` in the snapshot's store,
``shared.transport.names.label_index_name``): the fingerprint, the content fingerprint, the
class names, the task, the reader's counts, every record's image path (a ``PathTable``), and
for every path the dataset depends on (``Dataset.source_files``, ``absent_files``,
``listed_dirs`` and the images) its ``(size, mtime_ns, inode, ctime_ns)``, or "absent". A
restart stats those paths again; if every one matches, the fingerprint is trusted and the
snapshot attached without a label file being opened. Any difference (a label rewritten even
with its mtime set back: the ctime changes, and cannot be set from user space; a file
replaced: the inode; a label or image added or removed: the folder's mtime and ctime; a
missing label appearing) means a full read, as before. A directory's stat stands for its
listing: POSIX updates a folder's mtime and ctime whenever an entry is created, removed or
renamed in it.

Racy entries: a file changed while (or just before) the dataset was read could carry a stat
that does not describe the bytes read. An index is written only when every recorded path
last changed (ctime) more than ``RACY_MARGIN_NS`` before the read began (the file system's
coarse clock lags by at most a tick); otherwise none is written, and the next start reads in
full and writes it then (git's "racily clean" rule).

Ownership: the file belongs to its snapshot. It is created under a temporary name and
renamed into place while the writer maps the snapshot, is removed with the snapshot's
segments as one unit (``Snapshot.release``, ``remove_superseded``, ``pixpool clean``), is
listed with it (``pixpool ls``), and is checked like a segment before it is read (owner,
mode: ``shared.transport.shm.check_trusted``), then by its magic, version, length and a
sha256 of its body; a file that fails any check is ignored (a full read follows).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
from dataclasses import dataclass

import numpy as np

from ...shared.errors import PixpoolError
from ...shared.stream.path_table import PathTable
from ...shared.transport.names import label_index_name, label_index_part, list_segments, parse, shm_path, snapshot_parts
from ...shared.transport.shm import open_trusted

log = logging.getLogger(__name__)

MAGIC = b"PIXPLIX1"
# Bump when what the index means changes. The code that reads labels is recorded as well
# (``_version``): a new release may read them differently, so its first start reads in full.
INDEX_VERSION = 1
RACY_MARGIN_NS = 100_000_000
_HEAD = struct.Struct("<8sIIQ32s")  # magic, version, reserved, body bytes, sha256 of the body
_ABSENT = (-1, -1, -1, -1)
_ALIGN = 8


def _version() -> str:
    """pixpool's version and a digest of the code that turns files into a fingerprint (the
    readers, the record form, the fingerprint): an index written by other code is not trusted,
    since that code may read the same files into other records."""
    from ...shared import __version__
    from ...shared.stream import records
    from .. import readers
    from . import fingerprint

    h = hashlib.sha256()
    folder = os.path.dirname(readers.__file__)
    sources = [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".py")]
    for path in (*sources, records.__file__, fingerprint.__file__, __file__):
        with open(path, "rb") as f:
            h.update(f.read())
    return f"{__version__} {h.hexdigest()[:16]}"


def stat_row(path: str) -> tuple[int, int, int, int]:
    """(size, mtime_ns, inode, ctime_ns) of ``path`` (a symlink followed), ``_ABSENT`` where it is gone."""
    try:
        s = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return _ABSENT
    return (s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns)


@dataclass(frozen=True)
class IndexedSet:
    """What a trusted index says about a dataset: enough to serve it without reading it."""

    name: str  # the index file's segment name
    fingerprint: str
    content: str
    lineage: str
    names: tuple[str, ...]
    task: str
    records: int
    max_instances: int
    labels_missing: int
    missing_label_example: str | None
    record_paths: PathTable
    check_paths: PathTable
    check_stats: np.ndarray  # int64 (n, 4)

    @property
    def base(self) -> str:
        return parse(self.name).group


# -- writing ------------------------------------------------------------------------------------
def dependency_paths(dataset) -> list[str]:
    """Every path the dataset's records depend on, once each, sorted."""
    paths = {*dataset.source_files, *dataset.absent_files, *dataset.listed_dirs}
    paths.update(rec.image_path for rec in dataset.records)
    return sorted(paths)


def write_index(
    snapshot,
    dataset,
    stats,
    *,
    lineage: str,
    content: str,
    read_started_ns: int,
    record_paths: PathTable | None = None,
) -> str | None:
    """Write the index of ``dataset`` (read from ``read_started_ns`` on) beside ``snapshot``,
    which this process holds attached; returns its name, or None where an entry was racy
    (module docstring). ``stats`` is the reader's ``ReaderStats``."""
    header = snapshot.header
    paths = dependency_paths(dataset)
    rows = [stat_row(p) for p in paths]
    limit = read_started_ns - RACY_MARGIN_NS
    racy = next((p for p, r in zip(paths, rows) if r != _ABSENT and r[3] >= limit), None)
    if racy is not None:
        log.info("no label index for %s: %s changed just before or while the dataset was read", snapshot.name, racy)
        return None
    meta = {
        "fingerprint": header.fingerprint,
        "content": content,
        "lineage": lineage,
        "names": list(dataset.names),
        "task": dataset.task,
        "records": len(dataset.records),
        "max_instances": int(header.max_instances),
        "labels_missing": int(stats.labels_missing),
        "missing_label_example": stats.missing_label_example,
        "pixpool": _version(),
    }
    if record_paths is None:
        record_paths = PathTable.from_paths(rec.image_path for rec in dataset.records)
    check = PathTable.from_paths(paths)
    arrays = {
        "record_paths": np.frombuffer(record_paths.data, np.uint8),
        "record_offsets": record_paths.offsets,
        "check_paths": np.frombuffer(check.data, np.uint8),
        "check_offsets": check.offsets,
        "check_stats": np.asarray(rows, dtype=np.int64).reshape(len(rows), 4),
    }
    body = _pack_body(meta, arrays)
    name = label_index_name(snapshot.name, lineage)
    _write_atomic(
        name, _HEAD.pack(MAGIC, INDEX_VERSION, 0, len(body), hashlib.sha256(body).digest()) + body, snapshot.store
    )
    return name


def _pack_body(meta: dict, arrays: dict[str, np.ndarray]) -> bytes:
    chunks, offset, sections = [], 0, {}
    for key, arr in arrays.items():
        raw = np.ascontiguousarray(arr).tobytes()
        sections[key] = [offset, len(raw), arr.dtype.str, list(arr.shape)]
        pad = (-len(raw)) % _ALIGN
        chunks.append(raw + b"\0" * pad)
        offset += len(raw) + pad
    text = json.dumps({**meta, "sections": sections}).encode()
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def _write_atomic(name: str, data: bytes, store: str) -> None:
    """Write under a temporary name, then rename over ``name``: a reader sees the old file or
    the new one, never a part. Mode 0600, like every segment."""
    final = shm_path(name, store)
    tmp = f"{final}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# -- reading ------------------------------------------------------------------------------------
class IndexUnusable(PixpoolError, ValueError):
    """An index file that is no index this pixpool wrote (damaged, foreign, of another version)."""


def read_index(name: str, store: str) -> IndexedSet:
    """The index file ``name``, checked (module docstring); IndexUnusable where it fails a check."""
    try:
        fd = open_trusted(name, store=store)  # owner and mode, as for a segment
    except PixpoolError as exc:
        raise IndexUnusable(str(exc)) from None
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0)
    finally:
        os.close(fd)
    if len(data) < _HEAD.size:
        raise IndexUnusable(f"{name}: {len(data)} bytes, shorter than its header")
    magic, version, _, body_nbytes, digest = _HEAD.unpack_from(data, 0)
    if magic != MAGIC or version != INDEX_VERSION:
        raise IndexUnusable(f"{name}: magic {magic!r} version {version}, expected {MAGIC!r} version {INDEX_VERSION}")
    body = memoryview(data)[_HEAD.size :]
    if len(body) != body_nbytes or hashlib.sha256(body).digest() != digest:
        raise IndexUnusable(f"{name}: its body does not match its length or checksum (damaged)")
    try:
        (text_nbytes,) = struct.unpack_from("<Q", body, 0)
        meta = json.loads(bytes(body[8 : 8 + text_nbytes]))
        if meta.get("pixpool") != _version():
            raise IndexUnusable(f"{name}: written by pixpool {meta.get('pixpool')!r}, this is {_version()}")
        base = 8 + text_nbytes
        arrays = {}
        for key, (offset, nbytes, dtype, shape) in meta["sections"].items():
            if not 0 <= offset <= offset + nbytes <= len(body) - base:
                raise ValueError(f"section {key} out of bounds")
            dt = np.dtype(dtype)
            arrays[key] = np.frombuffer(body, dtype=dt, count=nbytes // dt.itemsize, offset=base + offset).reshape(
                shape
            )
        return IndexedSet(
            name=name, fingerprint=str(meta["fingerprint"]), content=str(meta["content"]), lineage=str(meta["lineage"]),
            names=tuple(str(n) for n in meta["names"]), task=str(meta["task"]), records=int(meta["records"]),
            max_instances=int(meta["max_instances"]), labels_missing=int(meta["labels_missing"]),
            missing_label_example=meta["missing_label_example"],
            record_paths=PathTable(arrays["record_paths"].tobytes(), arrays["record_offsets"].copy()),
            check_paths=PathTable(arrays["check_paths"].tobytes(), arrays["check_offsets"].copy()),
            check_stats=arrays["check_stats"].reshape(-1, 4),
        )  # fmt: skip
    except IndexUnusable:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise IndexUnusable(f"{name}: unreadable ({exc})") from None


_CHUNK = 8192  # paths decoded at a time: a 100k-image set's 200k paths never exist as strings all at once


def first_change(index: IndexedSet) -> str | None:
    """The first path whose stat differs from the index's (None: all match).

    One ``stat`` per path is the whole cost (200k of them for a 100k-image YOLO set: its labels
    and images); the loop compares the fields in place rather than building a row per path."""
    paths, stats = index.check_paths, index.check_stats
    stat = os.stat
    for start in range(0, len(paths), _CHUNK):
        expected = stats[start : start + _CHUNK].tolist()
        for path, (size, mtime_ns, ino, ctime_ns) in zip(paths.tolist(start, start + _CHUNK), expected):
            try:
                s = stat(path)
            except (FileNotFoundError, NotADirectoryError):
                if size != _ABSENT[0]:
                    return path
                continue
            if s.st_ctime_ns != ctime_ns or s.st_ino != ino or s.st_mtime_ns != mtime_ns or s.st_size != size:
                return path
    return None


def find_trusted(lineage: str, *, store: str) -> IndexedSet | None:
    """A checked index of ``lineage`` whose every path still matches, beside a complete snapshot
    of the fingerprint it names; None where there is none (the caller reads in full)."""
    t0 = time.perf_counter()
    for seg in list_segments(store):
        parsed = parse(seg)
        if parsed is None or parsed.kind != "snapshot" or parsed.part != label_index_part(lineage):
            continue
        try:
            index = read_index(seg, store)
        except (IndexUnusable, OSError) as exc:
            log.warning("label index %s ignored: %s", seg, exc)
            continue
        if index.lineage != lineage or not index.fingerprint.startswith(parsed.group.rsplit("-", 1)[-1]):
            log.warning("label index %s ignored: it names another dataset or snapshot", seg)
            continue
        meta_path = shm_path(snapshot_parts(parsed.group)["meta"], store)
        if not os.path.exists(meta_path):
            continue
        changed = first_change(index)
        if changed is not None:
            log.info("label index %s: %s changed since it was written; reading the dataset", seg, changed)
            continue
        log.info("label index %s: %d paths unchanged (%.2f s)", seg, len(index.check_paths), time.perf_counter() - t0)
        return index
    return None
