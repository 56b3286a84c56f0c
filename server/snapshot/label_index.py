"""The label index beside a snapshot: what vouches for every file its dataset was read from -> its fingerprint.

Runs in the process that reads a dataset and prepares or re-attaches its snapshot (the
daemon at start-up, ``pixpool prepare``). Reading a COCO-sized YOLO set means parsing 100k+
label files into records only to hash them into the fingerprint that names a snapshot
already in the store; this index lets a restart on unchanged files skip that.

What it holds (one file ``<snapshot base>-lix<8 hex of the lineage>`` in the snapshot's store,
``shared.transport.names.label_index_name``): the fingerprint, the content fingerprint, the
class names, the task, the reader's counts, every record's image path (a ``PathTable``), and
for every path the dataset depends on (``Dataset.source_files``, ``absent_files``,
``listed_dirs`` and the images) its ``(size, mtime_ns, inode, ctime_ns, st_dev)``, or
"absent", and how a restart checks it (``STAT``, ``CONTENT``, ``LISTING``); the sha256 of every
file checked by content and of every folder's listing checked by listing; and the identity of
each file system those paths live on (``fs_trust.FileSystem``: device, type, ``f_fsid``,
read-only flag, and why what holds its bytes does not vouch: an overlay's layer, a loop device).

A restart first compares each file system's identity (a remount of another image at the same
place, a mount made read-only, another file system mounted over a folder, an overlay layer or
loop device that vouched and no longer does: a change), then
stats every path (the fast pre-filter: any difference is a change), then reads and hashes what
stat cannot vouch for. If everything matches, the fingerprint is trusted and the snapshot
attached without a label file being parsed. Any difference means a full read, as before.
What is checked how (``fs_trust`` says why):

- ``STAT`` (size, mtime, inode, ctime, device): images and folders on file systems whose stat
  tells versions apart (a label rewritten even with its mtime set back: the ctime changes, and
  cannot be set from user space; a file replaced: the inode; a label or image added or removed:
  the folder's mtime and ctime; a missing label appearing); every path recorded absent; and
  a label file (a label, the data.yaml, an image list, a COCO json) on ext4, xfs, btrfs or
  f2fs mounted read-write, whose times there are not frozen, that had been quiet for longer
  than the kernel's writeback window when the dataset was read (``fs_trust.label_vouched``:
  a write through a shared mapping moves its ctime again once its page is clean; this assumes
  the kernel writes a dirty page back within that window, 5 minutes at least).
- ``CONTENT`` (the descriptor's fstat, then the sha256 of the bytes): every other label file
  (on tmpfs a write through a mapping never moves the times; on an image file system, FUSE or
  a read-only mount no write moves them; NFS may answer a stat from its attribute cache), and
  the images the fingerprint hashed (``fingerprint.hashed_devices``: on a file system whose
  stat is not known to tell versions apart: ``fs_trust.stat_vouches`` is an allow-list, judged
  for what holds the bytes, an overlay's layers and a loop device included).
- ``LISTING`` (stat, then the sha256 of the folder's listing): folders on such file systems.
- ``RECENT``: a label checked like ``CONTENT`` only because it had changed within the
  writeback window when the dataset was read (a set just downloaded or unpacked), on a file
  system whose stat vouches for labels once they are quiet (``fs_trust.times_vouch``). The
  first restart that finds its bytes unchanged at the same stat, with that stat's ctime older
  than the window before the check began (the condition a read applies when it writes an
  index), rewrites the index with it as ``STAT`` (``refresh``): without that, every restart on
  a set indexed right after it was unpacked would hash all its labels again (1.5 s per 100k).

Racy entries: a file changed while (or just before) the dataset was read could carry a stat
that does not describe the bytes read. An index is written only when every recorded path
last changed (ctime) more than ``RACY_MARGIN_NS`` before the read began (the file system's
coarse clock lags by at most a tick); otherwise none is written, and the next start reads in
full and writes it then (git's "racily clean" rule). The content digests are taken right after
the read: a label changed without its stat moving *during* the read (through a mapping, on
tmpfs) is recorded as its later bytes, which is the one change this index cannot see.

Ownership: the file belongs to its snapshot. It is published whole while the writer maps the
snapshot (``shared.transport.publish``: anonymous until linked under its name, so a killed
writer leaves nothing), is removed with the snapshot's segments as one unit
(``Snapshot.release``, ``remove_superseded``, ``pixpool clean``), is listed with it
(``pixpool ls``), and is checked like a segment before it is read (opened non-blocking and
no-follow, then type, owner and mode on the descriptor: ``shared.transport.trusted.open_trusted``),
then by its magic, version, length and a sha256 of its body; a file that fails any check is
ignored (a full read follows). Which index files belong to a snapshot is decided by owner and
content (``snapshot/unit.py``), never by the name alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ...shared.errors import PixpoolError
from ...shared.stream.path_table import PathTable
from ...shared.transport.names import label_index_name, label_index_part, parse, snapshot_parts
from ...shared.transport.store import Store
from ...shared.transport.trusted import open_trusted
from . import fs_trust

log = logging.getLogger(__name__)

MAGIC = b"PIXPLIX1"
# Bump when what the index means changes. The code that reads labels is recorded as well
# (``_version``): a new release may read them differently, so its first start reads in full.
INDEX_VERSION = 4
RACY_MARGIN_NS = 100_000_000
_HEAD = struct.Struct("<8sIIQ32s")  # magic, version, reserved, body bytes, sha256 of the body
_ABSENT = (-1, -1, -1, -1, -1)
STAT, CONTENT, LISTING, RECENT = 0, 1, 2, 3  # how a restart checks a path (module docstring)
_DIGEST = 32
_ALIGN = 8


def _version() -> str:
    """pixpool's version and a digest of the code that turns files into a fingerprint (the
    readers, the record form, the fingerprint): an index written by other code is not trusted,
    since that code may read the same files into other records."""
    from ...shared import __version__
    from ...shared.stream import records
    from .. import readers
    from . import fingerprint, fs_trust, mounts

    h = hashlib.sha256()
    folder = os.path.dirname(readers.__file__)
    sources = [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".py")]
    for path in (*sources, records.__file__, fingerprint.__file__, fs_trust.__file__, mounts.__file__, __file__):
        with open(path, "rb") as f:
            h.update(f.read())
    return f"{__version__} {h.hexdigest()[:16]}"


def stat_row(path: str) -> tuple[int, int, int, int, int]:
    """(size, mtime_ns, inode, ctime_ns, st_dev) of ``path`` (a symlink followed), ``_ABSENT`` where it is gone."""
    try:
        s = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return _ABSENT
    return _row(s)


def _row(s: os.stat_result) -> tuple[int, int, int, int, int]:
    return (s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns, s.st_dev)


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
    check_stats: np.ndarray  # int64 (n, 5): size, mtime_ns, inode, ctime_ns, st_dev
    check_modes: np.ndarray  # uint8 (n,): STAT, CONTENT, LISTING or RECENT
    check_digests: np.ndarray  # uint8 (rows not STAT, 32): their sha256 in row order
    filesystems: tuple  # (fs_trust.FileSystem, row of a path on it) per device recorded
    meta: dict = field(default_factory=dict, compare=False)  # the file's metadata, as written (refresh)
    checked_ns: int = 0  # when the check that trusted it began (find_trusted; refresh)

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
    try:
        modes, digests, filesystems = _checks(dataset, paths, rows, read_started_ns=read_started_ns)
    except _Racy as exc:
        log.info("no label index for %s: %s changed while the index was written", snapshot.name, exc)
        return None
    finally:
        fs_trust.forget_digests()  # the fingerprint's image digests: this is their last use
    log.debug("label index for %s: %d paths checked by stat, %d by their bytes (%d of them until they are quiet), "
             "%d folders by their listing at a restart (server/snapshot/label_index.py says which and why)",
             snapshot.name, modes.count(STAT), modes.count(CONTENT) + modes.count(RECENT), modes.count(RECENT),
             modes.count(LISTING))  # fmt: skip
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
        "filesystems": [[*fs.as_row(), probe] for fs, probe in filesystems],
    }
    if record_paths is None:
        record_paths = PathTable.from_paths(rec.image_path for rec in dataset.records)
    name = label_index_name(snapshot.name, lineage)
    _publish(
        name,
        snapshot.store,
        meta,
        record_paths,
        PathTable.from_paths(paths),
        np.asarray(rows, dtype=np.int64).reshape(len(rows), 5),
        np.asarray(modes, dtype=np.uint8),
        np.frombuffer(b"".join(digests), np.uint8).reshape(len(digests), _DIGEST),
    )
    return name


def _publish(
    name: str, store: Store, meta: dict, record_paths: PathTable, check: PathTable, stats, modes, digests
) -> None:
    arrays = {
        "record_paths": np.frombuffer(record_paths.data, np.uint8),
        "record_offsets": record_paths.offsets,
        "check_paths": np.frombuffer(check.data, np.uint8),
        "check_offsets": check.offsets,
        "check_stats": stats,
        "check_modes": modes,
        "check_digests": digests,
    }
    body = _pack_body(meta, arrays)
    _write_atomic(name, _HEAD.pack(MAGIC, INDEX_VERSION, 0, len(body), hashlib.sha256(body).digest()) + body, store)


class _Racy(Exception):
    """A file changed between its stat and the read of its bytes for the index."""


def _checks(dataset, paths: list[str], rows: list, *, read_started_ns: int):
    """(mode per path, digests of the rows not STAT in order, [(FileSystem, probe row)]) for the
    ``rows`` of ``paths``; _Racy where a file hashed no longer has the stat in ``rows``."""
    from .fingerprint import hashed_devices

    filesystems: dict[int, tuple] = {}
    table = _mount_table()
    for i, (path, row) in enumerate(zip(paths, rows)):
        if row != _ABSENT and row[4] not in filesystems:
            filesystems[row[4]] = (fs_trust.identify(path, row[4], mount_table=table), i)
    images = {rec.image_path for rec in dataset.records}
    sources, dirs = set(dataset.source_files), set(dataset.listed_dirs)
    hashed_images = hashed_devices({p: r for p, r in zip(paths, rows) if p in images})  # the fingerprint's decision
    # Devices where stat cannot tell versions apart, judged by the labels' own times as well (a
    # writable ext4 image built with one fixed time and uuid: its labels' times say so).
    untrusted = hashed_images | hashed_devices(
        {p: r for p, r in zip(paths, rows) if p in sources and r != _ABSENT}, what="label files"
    )
    window_ns = fs_trust.writeback_window_ns()
    modes, digests = [], []
    for path, row in zip(paths, rows):
        mode = STAT
        if row != _ABSENT:
            fs = filesystems[row[4]][0]
            if path in images and row[4] in hashed_images:
                mode = CONTENT
                digests.append(fs_trust.image_digest(path, row))
            elif path in sources and (row[4] in untrusted or not fs_trust.label_vouched(
                fs, row[3], read_started_ns=read_started_ns, window_ns=window_ns
            )):  # fmt: skip
                mode = CONTENT if row[4] in untrusted or not fs_trust.times_vouch(fs, window_ns) else RECENT
                digest, st = fs_trust.file_digest(path)
                if _row(st) != row:  # changed since its stat a moment ago: racy (module docstring)
                    raise _Racy(path)
                digests.append(digest)
            elif path in dirs and (row[4] in untrusted or not fs_trust.stat_vouches(fs)):
                mode = LISTING
                digests.append(fs_trust.listing_digest(path))
        modes.append(mode)
    return modes, digests, list(filesystems.values())


def _mount_table():
    """/proc/self/mountinfo, read once for every file system judged; None where it cannot be read
    (``identify`` then says so for each, and nothing on it vouches)."""
    try:
        return fs_trust.mounts.read_mounts()
    except OSError:
        return None


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


def _write_atomic(name: str, data: bytes, store: Store) -> None:
    """Publish ``data`` as ``name`` at once (``shared.transport.publish``): written into an
    anonymous file, then linked or renamed into place, so a reader sees the old file or the new
    one, never a part, and a writer killed on the way leaves no file under a name anyone could
    predict or squat. Mode 0600, like every segment."""
    from ...shared.transport.publish import publish_bytes

    publish_bytes(name, data, store)


# -- reading ------------------------------------------------------------------------------------
class IndexUnusable(PixpoolError, ValueError):
    """An index file that is no index this pixpool wrote (damaged, foreign, of another version)."""


def read_index(name: str, store: Store) -> IndexedSet:
    """The index file ``name``, checked (module docstring); IndexUnusable where it fails a check."""
    try:
        fd = open_trusted(name, store=store)  # type, owner and mode on the open descriptor; never blocks (a FIFO)
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
            check_stats=arrays["check_stats"].reshape(-1, 5),
            check_modes=arrays["check_modes"].reshape(-1),
            check_digests=arrays["check_digests"].reshape(-1, _DIGEST),
            filesystems=tuple(
                (fs_trust.FileSystem(dev=int(d), type=int(t), fsid=int(f), readonly=bool(r), distrust=str(why)),
                 int(probe))
                for d, t, f, r, why, probe in meta["filesystems"]
            ),
            meta={k: v for k, v in meta.items() if k != "sections"},
        )  # fmt: skip
    except IndexUnusable:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise IndexUnusable(f"{name}: unreadable ({exc})") from None


_CHUNK = 8192  # paths decoded at a time: a 100k-image set's 200k paths never exist as strings all at once


def first_change(index: IndexedSet) -> str | None:
    """The first path found changed since the index was written (None: nothing changed): each
    file system's identity, then one ``stat`` per path (the pre-filter), then the bytes of every
    ``CONTENT`` path and the listing of every ``LISTING`` folder (module docstring).

    Where stat vouches for every path (a YOLO set on ext4 whose labels are older than the
    writeback window) the stats are the whole cost: 200k for a 100k-image set, its labels and
    images; the loop compares the fields in place rather than building a row per path."""
    return _filesystem_change(index) or _stat_change(index) or _content_change(index)


def _filesystem_change(index: IndexedSet) -> str | None:
    table = _mount_table()
    for fs, probe in index.filesystems:
        path = index.check_paths[probe]
        try:
            now = fs_trust.identify(path, os.stat(path).st_dev, mount_table=table)
        except OSError:
            return path
        if now != fs:
            log.info("label index %s: the file system of %s is not the one indexed (%s, now %s)", index.name, path,
                     fs, now)  # fmt: skip
            return path
    return None


def _stat_change(index: IndexedSet) -> str | None:
    paths, stats, modes = index.check_paths, index.check_stats, index.check_modes
    stat = os.stat
    for start in range(0, len(paths), _CHUNK):
        expected = stats[start : start + _CHUNK].tolist()
        for path, mode, (size, mtime_ns, ino, ctime_ns, dev) in zip(
            paths.tolist(start, start + _CHUNK), modes[start : start + _CHUNK].tolist(), expected
        ):
            if mode == CONTENT or mode == RECENT:
                continue  # its descriptor's fstat is compared when its bytes are read
            try:
                s = stat(path)
            except (FileNotFoundError, NotADirectoryError):
                if size != _ABSENT[0]:
                    return path
                continue
            except OSError:  # unreadable now (permissions, I/O): not what was indexed
                return path
            if (s.st_ctime_ns != ctime_ns or s.st_ino != ino or s.st_mtime_ns != mtime_ns or s.st_size != size
                    or s.st_dev != dev):  # fmt: skip
                return path
    return None


def _content_change(index: IndexedSet) -> str | None:
    paths, stats, modes = index.check_paths, index.check_stats, index.check_modes
    digests, k = index.check_digests.tobytes(), 0
    for start in range(0, len(paths), _CHUNK):
        chunk = modes[start : start + _CHUNK]
        if not chunk.any():
            continue
        expected = stats[start : start + _CHUNK].tolist()
        for path, mode, row in zip(paths.tolist(start, start + _CHUNK), chunk.tolist(), expected):
            if mode == STAT:
                continue
            want, k = digests[k * _DIGEST : (k + 1) * _DIGEST], k + 1
            try:
                if mode == LISTING:
                    digest = fs_trust.listing_digest(path)
                else:
                    fd, st = fs_trust.open_regular(path)
                    try:
                        if list(_row(st)) != row:
                            return path
                        digest = fs_trust.digest_fd(fd, st.st_size)
                    finally:
                        os.close(fd)
            except OSError:
                return path
            if digest != want:
                log.info("label index %s: %s has other bytes at the same stat", index.name, path)
                return path
    return None


def find_trusted(lineage: str, *, store: Store) -> IndexedSet | None:
    """A checked index of ``lineage`` whose every path still matches, beside a complete snapshot
    of the fingerprint it names; None where there is none (the caller reads in full)."""
    t0 = time.perf_counter()
    me = os.geteuid()
    for seg in store.segments():
        parsed = parse(seg)
        # Only this user's names: another user's index names another user's snapshot. Whose the
        # file under one of ours really is, and what it is, ``read_index`` checks on the open file.
        if parsed is None or parsed.kind != "snapshot" or parsed.uid != me or parsed.part != label_index_part(lineage):
            continue
        try:
            index = read_index(seg, store)
        except (IndexUnusable, OSError) as exc:
            log.warning("label index %s ignored: %s", seg, exc)
            continue
        if index.lineage != lineage or not index.fingerprint.startswith(parsed.group.rsplit("-", 1)[-1]):
            log.warning("label index %s ignored: it names another dataset or snapshot", seg)
            continue
        meta_path = store.path(snapshot_parts(parsed.group)["meta"])
        if not os.path.exists(meta_path):
            continue
        checked_ns = time.time_ns()  # the clock of the files' ctimes
        changed = first_change(index)
        if changed is not None:
            log.info("label index %s: %s changed since it was written; reading the dataset", seg, changed)
            continue
        log.info("label index %s: %d paths unchanged (%.2f s)", seg, len(index.check_paths), time.perf_counter() - t0)
        return replace(index, checked_ns=checked_ns)
    return None


def refresh(index: IndexedSet, *, store: Store) -> IndexedSet:
    """``index``, rewritten with its ``RECENT`` labels that are quiet now as ``STAT`` (module
    docstring); ``index`` itself where none is. Call it with the index ``find_trusted`` just
    returned (its check found every byte unchanged) while holding the snapshot it names, which
    owns the file. OSError where the file cannot be replaced (the old one then stays)."""
    recent = np.flatnonzero(index.check_modes == RECENT)
    window_ns = fs_trust.writeback_window_ns()
    if not len(recent) or not index.checked_ns or window_ns is None:
        return index
    fs_of = {fs.dev: fs for fs, _ in index.filesystems}
    stats = index.check_stats
    quiet = [
        i
        for i in recent.tolist()
        if (fs := fs_of.get(int(stats[i, 4]))) is not None
        and fs_trust.label_vouched(fs, int(stats[i, 3]), read_started_ns=index.checked_ns, window_ns=window_ns)
    ]
    if not quiet:
        return index
    hashed = index.check_modes != STAT  # the digests' rows, in row order
    modes = index.check_modes.copy()
    modes[quiet] = STAT
    digests = np.ascontiguousarray(index.check_digests[modes[hashed] != STAT])
    _publish(index.name, store, index.meta, index.record_paths, index.check_paths, stats, modes, digests)
    log.info("label index %s refreshed: %d labels quiet since it was written are checked by stat from now on, "
             "%d still by their bytes", index.name, len(quiet), int(np.count_nonzero(modes != STAT)))  # fmt: skip
    return replace(index, check_modes=modes, check_digests=digests)
