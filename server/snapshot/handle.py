"""A prepared snapshot, attached by name: the ImageSource the augmentation workers read.

Runs in every process that reads a snapshot: the daemon, spawned augmentation workers,
``pixpool ls``. The process that prepared the snapshot holds a handle with
``owner=True`` and is the only one that calls ``unlink()``; when done, every process that
served it calls ``release()``, which passes ownership to the last user out (see there).
Every other handle attaches
read-only (``PROT_READ``), so the arrays it hands out are read-only views into the
mapping (zero-copy; writing through one raises ValueError).

A handle lives in one store (``shared.transport.store``: /dev/shm by default, or any directory
given as ``--store``) and pickles as its base name and store only; it attaches lazily, read-only, in the receiving
process on first use, so a spawned worker can be given the snapshot as an argument.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass

import numpy as np

from ...shared.errors import SnapshotError
from ...shared.stream.config import FILL_VALUE
from ...shared.stream.records import Targets
from ...shared.task import SPECS, TaskSpec, WithSpec
from ...shared.transport.holds import remove_unused
from ...shared.transport.names import SNAPSHOT_PARTS, parse, snapshot_parts
from ...shared.transport.shm import SharedSegment
from ...shared.transport.store import DEFAULT, Store
from ...shared.transport.trusted import read_prefix
from . import layout, unit

log = logging.getLogger(__name__)

PARTS = SNAPSHOT_PARTS


# What belongs to a snapshot (its removal unit) is decided by each file's owner and content,
# never by a name prefix: ``unit.py``. Re-exported here, where the rest of pixpool looks for them.
label_indexes = unit.label_indexes
unit_names = unit.unit_names


def read_header(meta_name: str, store: Store = DEFAULT) -> layout.Header:
    """Header of a ``meta`` segment read with a plain file read (no mapping); SnapshotError if unreadable."""
    try:
        data = read_prefix(meta_name, layout.HEADER_NBYTES, store=store)  # refuses a file pixpool cannot trust
    except FileNotFoundError:
        raise SnapshotError(
            f"snapshot segment {meta_name!r} not found in {store}; run `pixpool prepare` first"
        ) from None
    try:
        return layout.unpack_header(data)
    except ValueError as exc:
        raise SnapshotError(
            f"snapshot segment {meta_name!r} holds no snapshot header ({exc}); remove it with `pixpool clean`"
        ) from None


def check_header(base: str, header: layout.Header) -> None:
    """Raise SnapshotError unless the header is a complete snapshot of this layout version."""
    if header.magic != layout.MAGIC:
        raise SnapshotError(
            f"snapshot {base!r}: bad magic {header.magic!r} (expected {layout.MAGIC!r}); not a pixpool snapshot, remove it with `pixpool clean --all`"
        )
    if header.layout_version != layout.LAYOUT_VERSION:
        raise SnapshotError(
            f"snapshot {base!r} has layout version {header.layout_version}, this pixpool reads version {layout.LAYOUT_VERSION}; "
            "remove it with `pixpool clean` and prepare again"
        )
    if not header.is_complete:
        raise SnapshotError(
            f"snapshot {base!r} is incomplete (no completeness mark; its preparation by pid {header.creator_pid} "
            "is running or was killed); wait for it, or remove it with `pixpool clean`"
        )
    if header.dtype_code not in layout.DTYPE_CODES:
        raise SnapshotError(f"snapshot {base!r} has unknown dtype code {header.dtype_code}")
    if header.task_code not in layout.TASK_CODES:
        raise SnapshotError(
            f"snapshot {base!r} has unknown task code {header.task_code} (this pixpool knows "
            f"{layout.TASK_CODES}); it was prepared by a newer pixpool: remove it with `pixpool clean` and prepare again"
        )


def check_fill(meta_name: str, header: layout.Header) -> None:
    """SnapshotError unless the snapshot was centred by ``FILL_VALUE``: the route adds that fill
    back (the kernel is handed the header's value, ``fill``), and the batches' bytes are defined
    with it, so a snapshot centred by another value would serve other bytes."""
    if header.fill != FILL_VALUE:
        raise SnapshotError(
            f"snapshot segment {meta_name!r} was centred by fill {header.fill!r}, but this pixpool renders with fill "
            f"{FILL_VALUE!r}; remove it with `pixpool clean` and prepare again with this pixpool"
        )


class Snapshot(WithSpec):
    """Read access to a prepared snapshot (implements ``ImageSource``)."""

    def __init__(self, name: str, *, owner: bool = False, store: Store = DEFAULT, _lazy: bool = False):
        self.name = name
        self.store = store
        self._parts = snapshot_parts(name)
        self.owner = owner
        self._segments: dict[str, SharedSegment] | None = None
        if not _lazy:
            self._attach()

    @classmethod
    def attach(cls, name: str, *, store: Store = DEFAULT) -> "Snapshot":
        """Attach the complete snapshot with base name ``pixpool-u<uid>-snap-<fingerprint>``, read-only
        (invariant 3, ``docs/invariants.md``: nothing writes a snapshot once it is complete)."""
        return cls(name, store=store)

    # -- attaching ----------------------------------------------------------------------
    def _attach(self) -> None:
        header = read_header(self._parts["meta"], self.store)
        check_header(self.name, header)
        check_fill(self._parts["meta"], header)
        segments: dict[str, SharedSegment] = {}
        expected = {"meta": header.meta_nbytes, "img": header.image_nbytes, "tgt": header.target_nbytes}
        try:
            for part in PARTS:
                try:
                    # Owner, mode and size are checked on the opened file (shared.transport.shm).
                    segments[part] = SharedSegment.attach(
                        self._parts[part], expected_nbytes=expected[part], store=self.store
                    )
                except FileNotFoundError:
                    raise SnapshotError(
                        f"snapshot {self.name!r}: segment {self._parts[part]!r} is missing; remove the rest with `pixpool clean` and prepare again"
                    ) from None
        except BaseException:
            for seg in segments.values():
                seg.close()
            raise
        self._segments = segments
        self.header = header
        self._index = layout.index_view(segments["meta"].buf, header.records)
        self._arena = np.frombuffer(segments["img"].buf, dtype=layout.DTYPE_CODES[header.dtype_code])
        # The index's image columns as views: a mosaic reads four images per sample, and a
        # field of one row costs several times an element of a column.
        self._image_columns = (self._index["image_offset"], self._index["height"], self._index["width"])
        sections = layout.target_sections(header.instances, header.points, header.kpt_count, header.flip_count)
        self._sections = sections
        self._classes, self._boxes, self._poly_offsets, self._points = layout.target_views(
            segments["tgt"].buf, sections
        )
        self._keypoints, flip = layout.keypoint_views(segments["tgt"].buf, sections)
        for arr in (self._index, self._arena, self._classes, self._boxes, self._poly_offsets, self._points):
            arr.flags.writeable = False
        self._keypoints.flags.writeable = False
        spec = SPECS[layout.TASK_CODES[header.task_code]]  # a code the header check let through
        if spec.has_keypoints:
            flip_idx = tuple(int(v) for v in flip) if header.flip_count else None
            spec = spec.with_keypoints((header.kpt_count, header.kpt_dims), flip_idx)
        self._spec = spec

    def _ensure(self) -> None:
        if self._segments is None:
            self._attach()

    # -- pickling: name only -------------------------------------------------------------
    def __reduce__(self):
        return (_unpickle_snapshot, (self.name, self.store))

    # -- ImageSource ----------------------------------------------------------------------
    @property
    def imgsz(self) -> int:
        self._ensure()
        return self.header.imgsz

    @property
    def fill(self) -> float:
        """The value the images were centred by (the header's, equal to ``FILL_VALUE``: checked
        when attached); the route adds it back."""
        self._ensure()
        return self.header.fill

    @property
    def max_instances(self) -> int:
        self._ensure()
        return self.header.max_instances

    @property
    def fingerprint(self) -> str:
        self._ensure()
        return self.header.fingerprint

    @property
    def spec(self) -> TaskSpec:
        """The task the snapshot was prepared for, read from its header once: what its targets
        carry, and for pose the keypoint layout (``kpt_shape`` (K, D) as the dataset states it,
        the keypoints stored with 3 values each whatever D is) and the flip pairs."""
        self._ensure()
        return self._spec

    @property
    def polygon_nbytes(self) -> int:
        """Bytes of the ``tgt`` segment that hold polygons (their offsets and points)."""
        self._ensure()
        return self._sections.polygon_nbytes

    @property
    def keypoint_nbytes(self) -> int:
        """Bytes of the ``tgt`` segment that hold keypoints and flip_idx (0 unless pose)."""
        self._ensure()
        return self._sections.keypoint_nbytes

    def __len__(self) -> int:
        self._ensure()
        return self.header.records

    @property
    def index(self) -> np.ndarray:
        """The read-only structured index (``layout.INDEX_DTYPE``), one row per record."""
        self._ensure()
        return self._index

    def _check_record(self, i: int) -> None:
        n = self.header.records
        if not -n <= i < n:
            raise IndexError(f"record {i} out of range for a snapshot of {n} records")

    def _row(self, i: int):
        self._check_record(i)
        return self._index[i]

    def image(self, index: int) -> np.ndarray:
        """Read-only (h, w, 3) view of record ``index``'s BGR image: float32 centred, or
        uint8 (the pixel, centred + fill) in a ``uint8`` snapshot (``dtype``)."""
        self._ensure()
        self._check_record(index)
        offsets, heights, widths = self._image_columns
        start = int(offsets[index]) // self._arena.itemsize
        h, w = int(heights[index]), int(widths[index])
        return self._arena[start : start + h * w * 3].reshape(h, w, 3)

    def images(self, indices: list[int]) -> list[np.ndarray]:
        """``image`` of each of ``indices`` (a list of ints): a mosaic range reads four records per
        sample, and one lookup of the index columns for all of them costs less than one each."""
        self._ensure()
        if indices:
            self._check_record(min(indices))
            self._check_record(max(indices))
        rows = np.array(indices, dtype=np.int64)
        offsets, heights, widths = self._image_columns
        arena = self._arena
        starts = (offsets[rows] // arena.itemsize).tolist()
        return [
            arena[start : start + h * w * 3].reshape(h, w, 3)
            for start, h, w in zip(starts, heights[rows].tolist(), widths[rows].tolist())
        ]

    def targets(self, index: int) -> Targets:
        """Read-only views of record ``index``'s classes, boxes and polygons (normalised), and
        for the pose task its keypoints (n, K, 3)."""
        self._ensure()
        row = self._row(index)
        s, c = int(row["target_start"]), int(row["target_count"])
        off = self._poly_offsets
        polys = tuple(self._points[off[j] : off[j + 1]] for j in range(s, s + c))
        keypoints = self._keypoints[s : s + c] if self._spec.has_keypoints else None
        return Targets(self._classes[s : s + c], self._boxes[s : s + c], polys, keypoints)

    # -- bookkeeping ----------------------------------------------------------------------
    @property
    def segment_names(self) -> tuple[str, ...]:
        return tuple(self._parts[p] for p in PARTS)

    def damaged_segments(self) -> dict[str, str]:
        """segment name -> what happened to it (``SharedSegment.damage``), for each segment
        of this attached snapshot that is no longer whole in the store."""
        self._ensure()
        out = {}
        for seg in self._segments.values():
            what = seg.damage()
            if what is not None:
                out[seg.name] = what
        return out

    @property
    def nbytes(self) -> dict[str, int]:
        """part -> bytes of that segment."""
        self._ensure()
        return {p: self._segments[p].nbytes for p in PARTS}

    @property
    def dtype(self) -> str:
        """The pixel type of the image arena: ``float32`` or ``uint8``."""
        self._ensure()
        return layout.DTYPE_CODES[self.header.dtype_code].name

    @property
    def decoded_nbytes(self) -> int:
        """What the same resized images take as a decoded uint8 cache: sum of h * w * 3."""
        index = self.index
        return int((index["height"].astype("i8") * index["width"].astype("i8") * 3).sum())

    def checksum(self) -> str:
        """sha256 hex over the bytes of meta, img and tgt, in that order."""
        self._ensure()
        h = hashlib.sha256()
        for p in PARTS:
            h.update(self._segments[p].buf)
        return h.hexdigest()

    def close(self, *, let_go: bool = False) -> None:
        """Release this process's mappings (views already handed out stay valid until
        dropped, and hold the snapshot in use meanwhile unless ``let_go``: ``SharedSegment.close``)."""
        if self._segments is None:
            return
        segments, self._segments = self._segments, None
        for name in (
            "_index",
            "_image_columns",
            "_arena",
            "_classes",
            "_boxes",
            "_poly_offsets",
            "_points",
            "_keypoints",
        ):
            self.__dict__.pop(name, None)
        for seg in segments.values():
            seg.close(let_go=let_go)

    def unlink(self) -> None:
        """Remove every segment name; only the handle that created the snapshot may."""
        if not self.owner:
            raise PermissionError(
                f"snapshot {self.name!r} was attached, not prepared, by this handle; only its creator unlinks it (or `release` as its last user)"
            )
        self._unlink_parts()

    def _unlink_parts(self) -> None:
        for name in unit_names(self.name, self.store):
            try:
                os.unlink(self.store.path(name))
            except FileNotFoundError:
                pass

    def release(self, *, keep: bool = False) -> str:
        """Close this handle and, as the last user out, remove the snapshot.

        The one rule for removing a snapshot when done with it: whoever served it (the
        process that prepared it, or one that re-attached it: ownership passes to the last
        user) removes it, unless asked to ``keep`` it or it was prepared to persist
        (``pixpool prepare``, ``--keep-snapshot``: header ``persist``), and only once no
        other process maps it, in any PID namespace (``shared.transport.holds.remove_unused``: a
        write lock on every part, refused while anyone holds one). Returns "removed",
        "kept", "in use" (others map it; the last of them removes it) or "gone" (someone
        else removed it already).
        """
        persist = False
        if self._segments is not None:
            persist = bool(self.header.persist)
        else:
            try:
                persist = bool(read_header(self._parts["meta"], self.store).persist)
            except SnapshotError:
                persist = False
        if keep or persist:
            self.close()
            return "kept"
        # This process is leaving: its holds go now, even where views handed out keep a
        # mapping alive (those stay valid: an unlinked file lives on while mapped).
        self.close(let_go=True)
        outcome = remove_unused(unit_names(self.name, self.store), self.store)
        if outcome == "in use":
            log.info("snapshot %s kept: another process still maps it (the last of them removes it)", self.name)
        else:
            log.debug("snapshot %s %s", self.name, outcome)
        return outcome

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Snapshot({self.name!r}, {'attached' if self._segments else 'detached'}, owner={self.owner})"


def _unpickle_snapshot(name: str, store: Store = DEFAULT) -> Snapshot:
    return Snapshot(name, store=store, _lazy=True)


@dataclass(frozen=True)
class SnapshotInfo:
    """What ``pixpool ls`` shows of one snapshot (from the header and the segment files)."""

    name: str
    parts: dict  # part -> bytes, for the parts present (label indexes included: ``lix<8 hex>``)
    header: layout.Header | None  # None where the meta segment is missing or unreadable
    complete: bool

    @property
    def nbytes(self) -> int:
        return sum(self.parts.values())


def list_snapshots(*, uid: int | None = None, store: Store = DEFAULT) -> list[SnapshotInfo]:
    """Every snapshot (complete or not) of user ``uid`` (default: this process's) whose
    segments are in ``store`` (default /dev/shm), by base name. Files under that user's names that belong to
    someone else, or are no regular file, are left out: they are no snapshot of this user's;
    so is a file under a label index's name that is no index of that snapshot (``unit.py``)."""
    import stat

    uid = os.geteuid() if uid is None else uid
    bases: dict[str, dict[str, int]] = {}
    for seg in store.segments():
        parsed = parse(seg)
        if parsed is None or parsed.kind != "snapshot" or parsed.uid != uid:
            continue
        try:
            st = os.lstat(store.path(seg))  # never followed: a link is nobody's segment
        except FileNotFoundError:
            continue
        if st.st_uid != uid or not stat.S_ISREG(st.st_mode):
            continue
        if parsed.part not in PARTS and unit.why_not_member(seg, parsed.group, store) is not None:
            continue
        bases.setdefault(parsed.group, {})[parsed.part] = st.st_size
    infos = []
    for base, parts in sorted(bases.items()):
        header = None
        if "meta" in parts:
            try:
                header = read_header(snapshot_parts(base)["meta"], store)
            except SnapshotError:
                header = None
        complete = (
            header is not None
            and header.magic == layout.MAGIC
            and header.is_complete
            and all(p in parts for p in PARTS)
        )
        infos.append(SnapshotInfo(base, parts, header, complete))
    return infos
