"""Byte layout of a prepared snapshot: three segments, pure arithmetic, no I/O.

Code both sides import: the preparing process (which writes the segments) and every
process that attaches them (workers, trainers, ``pixpool ls``).

A snapshot is three POSIX shared-memory segments sharing one base name:

``meta``  a fixed 256-byte header, then the index: one ``INDEX_DTYPE`` row per record.
``img``   the image arena: every record's (h, w, 3) BGR image, back to back in record
          order with no padding, in the header's dtype: float32 centred (pixel - fill),
          4 x the bytes of the same images as uint8 (every slice starts at a multiple of
          4 bytes, which is all float32 needs); or uint8, the pixel itself (centred + fill),
          exactly the bytes of a decoded uint8 cache. Both hold the same integers: the
          prepared pixels are 8-bit (the resize runs on uint8, centring after it), so
          ``float32(u8) - fill`` is exact and equals the float32 arena's value.
``tgt``   the packed targets of all records, six sections each starting on a 64-byte
          boundary: classes int32 (n,), boxes float32 (n, 4) normalised xyxy,
          polygon offsets int64 (n + 1,) into the points, points float32 (m, 2)
          normalised, then for the pose task keypoints float32 (n, K, 3) normalised x, y,
          visibility and flip_idx int32 (K,) (both empty for the other tasks, and flip_idx
          empty for a pose set without one: header ``flip_count`` 0). Instance j's polygon is
          ``points[off[j]:off[j + 1]]``, its keypoints ``keypoints[j]``.

The task (header ``task_code``, ``TASK_CODES``), K (``kpt_count``) and the dataset's keypoint
dimension D (``kpt_dims``, 2 or 3: what its ``kpt_shape`` says; stored keypoints always have 3)
live in what was zero padding, and the two new sections follow the old ones, empty for detect:
a detect snapshot's bytes are those of the layout before tasks (task code 0 is detect), so no
byte position moved and the layout version stays. A reader that does not know a task code
refuses the snapshot.

The header's completeness mark lives in its own 4-byte word and is written last, after
every other byte of all three segments; a snapshot without it is never used.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"PIXPSNAP"
# Bump whenever any byte position or meaning below changes: it is part of the
# fingerprint, so an old snapshot is never attached by code that reads another layout.
LAYOUT_VERSION = 1
COMPLETE_MARK = 0x31504D43  # b"CMP1" little-endian; anything else means "not complete"
HEADER_NBYTES = 256
SECTION_ALIGN = 64

# Header ``dtype_code`` -> the arena's pixel type. A new code moves no byte: the layout
# version stays, and a reader that does not know a code refuses the snapshot.
DTYPE_CODES = {1: np.dtype("<f4"), 2: np.dtype("u1")}
FLOAT32_CODE = 1
UINT8_CODE = 2
CODE_OF = {"float32": FLOAT32_CODE, "uint8": UINT8_CODE}  # the names of ``config.SNAPSHOT_DTYPES``

# Header ``task_code`` -> the task (``config.TASKS``); 0 is detect, which every snapshot written
# before tasks existed reads (the field was zero padding).
TASK_CODES = {0: "detect", 1: "segment", 2: "pose", 3: "obb"}
TASK_CODE_OF = {task: code for code, task in TASK_CODES.items()}

# Field order is the byte order in the header. The mark has its own fixed offset
# (``COMPLETE_OFFSET``) so that writing it is a single aligned 4-byte store.
_HEADER_FIELDS = (
    ("magic", "8s"),
    ("layout_version", "I"),
    ("complete", "I"),
    ("records", "Q"),
    ("instances", "Q"),
    ("points", "Q"),
    ("max_instances", "Q"),
    ("imgsz", "I"),
    ("dtype_code", "I"),
    ("fill", "d"),
    ("meta_nbytes", "Q"),
    ("image_nbytes", "Q"),
    ("target_nbytes", "Q"),
    ("creator_pid", "Q"),
    ("created_unix", "d"),
    ("fingerprint", "64s"),
    # Added in what was zero padding (a snapshot written before reads 0 and ""): no byte
    # position above moved, so the layout version stays.
    ("persist", "I"),  # 1: prepared to stay (`pixpool prepare`, --keep-snapshot); only `clean` removes it
    ("lineage", "32s"),  # which dataset and settings it was prepared from (fingerprint.lineage_of)
    # Added in zero padding too, for the tasks (module docstring): 0 for a detect snapshot.
    ("task_code", "I"),  # TASK_CODES
    ("kpt_count", "I"),  # K keypoints per instance (pose), else 0
    ("kpt_dims", "I"),  # the dataset's D in kpt_shape (K, D): 2 or 3 (pose), else 0
    ("flip_count", "I"),  # K when the pose set has a flip_idx, else 0
)
_HEADER_STRUCT = struct.Struct("<" + "".join(code for _, code in _HEADER_FIELDS))
COMPLETE_OFFSET = 12  # after magic (8) and layout_version (4)
if _HEADER_STRUCT.size > HEADER_NBYTES:  # pragma: no cover - guards an edit of the fields
    raise RuntimeError("snapshot header fields exceed HEADER_NBYTES")

INDEX_DTYPE = np.dtype(
    [
        ("image_offset", "<i8"),  # byte offset of the record's image in the arena
        ("height", "<i4"),  # prepared (resized) size
        ("width", "<i4"),
        ("orig_height", "<i4"),  # decoded size, EXIF orientation applied
        ("orig_width", "<i4"),
        ("target_start", "<i8"),  # first instance in the packed targets
        ("target_count", "<i8"),
        ("point_start", "<i8"),  # first polygon point of the record's first instance
    ]
)


@dataclass(frozen=True)
class Header:
    magic: bytes
    layout_version: int
    complete: int
    records: int
    instances: int
    points: int
    max_instances: int
    imgsz: int
    dtype_code: int
    fill: float
    meta_nbytes: int
    image_nbytes: int
    target_nbytes: int
    creator_pid: int
    created_unix: float
    fingerprint: str
    persist: int = 0
    lineage: str = ""
    task_code: int = 0
    kpt_count: int = 0
    kpt_dims: int = 0
    flip_count: int = 0

    @property
    def is_complete(self) -> bool:
        return self.complete == COMPLETE_MARK

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["magic"] = self.magic.decode("ascii", "replace")
        d["complete"] = self.is_complete
        return d


def pack_header(header: Header) -> bytes:
    """The header's HEADER_NBYTES bytes (zero padded)."""
    values = []
    for name, _ in _HEADER_FIELDS:
        v = getattr(header, name)
        if name in ("fingerprint", "lineage"):
            v = v.encode("ascii")
        values.append(v)
    return _HEADER_STRUCT.pack(*values).ljust(HEADER_NBYTES, b"\0")


def unpack_header(data: bytes | memoryview) -> Header:
    """Parse a header; raises ValueError when ``data`` is too short to hold one."""
    if len(data) < _HEADER_STRUCT.size:
        raise ValueError(f"snapshot header needs {_HEADER_STRUCT.size} bytes, have {len(data)}")
    values = dict(zip((n for n, _ in _HEADER_FIELDS), _HEADER_STRUCT.unpack_from(data, 0)))
    for name in ("fingerprint", "lineage"):
        values[name] = values[name].rstrip(b"\0").decode("ascii", "replace")
    return Header(**values)


def meta_nbytes(records: int) -> int:
    return HEADER_NBYTES + records * INDEX_DTYPE.itemsize


def _align(n: int) -> int:
    return (n + SECTION_ALIGN - 1) // SECTION_ALIGN * SECTION_ALIGN


@dataclass(frozen=True)
class TargetSections:
    """Byte offsets of the six sections of the ``tgt`` segment, and its total size."""

    instances: int
    points: int
    classes_offset: int
    boxes_offset: int
    poly_offsets_offset: int
    points_offset: int
    nbytes: int
    kpt_count: int = 0
    flip_count: int = 0
    keypoints_offset: int = 0
    flip_offset: int = 0

    @property
    def polygon_nbytes(self) -> int:
        """Bytes of the polygons: their offsets and points."""
        return 8 * (self.instances + 1) + 8 * self.points

    @property
    def keypoint_nbytes(self) -> int:
        """Bytes of the keypoints (pose): (n, K, 3) float32 and flip_idx."""
        return 12 * self.instances * self.kpt_count + 4 * self.flip_count


def target_sections(instances: int, points: int, kpt_count: int = 0, flip_count: int = 0) -> TargetSections:
    """Where each section of a ``tgt`` segment of ``instances`` instances, ``points`` polygon
    points and ``kpt_count`` keypoints per instance starts (``flip_count``: K or 0)."""
    classes = 0
    boxes = _align(classes + 4 * instances)
    offsets = _align(boxes + 16 * instances)
    pts = _align(offsets + 8 * (instances + 1))
    kpts = _align(pts + 8 * points)
    flip = _align(kpts + 12 * instances * kpt_count)
    total = _align(flip + 4 * flip_count)  # equal to kpts when both are empty: a detect segment's size is unchanged
    return TargetSections(instances, points, classes, boxes, offsets, pts, total, kpt_count, flip_count, kpts, flip)


def image_nbytes(height: int, width: int, channels: int = 3, itemsize: int = 4) -> int:
    return height * width * channels * itemsize


def target_views(buf, sections: TargetSections) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(classes, boxes, poly_offsets, points) arrays over ``buf`` (writable iff buf is)."""
    s = sections
    classes = np.frombuffer(buf, dtype="<i4", count=s.instances, offset=s.classes_offset)
    boxes = np.frombuffer(buf, dtype="<f4", count=4 * s.instances, offset=s.boxes_offset).reshape(s.instances, 4)
    offsets = np.frombuffer(buf, dtype="<i8", count=s.instances + 1, offset=s.poly_offsets_offset)
    points = np.frombuffer(buf, dtype="<f4", count=2 * s.points, offset=s.points_offset).reshape(s.points, 2)
    return classes, boxes, offsets, points


def keypoint_views(buf, sections: TargetSections) -> tuple[np.ndarray, np.ndarray]:
    """(keypoints (n, K, 3) float32, flip_idx (flip_count,) int32) over ``buf`` (writable iff buf is)."""
    s = sections
    keypoints = np.frombuffer(buf, dtype="<f4", count=3 * s.instances * s.kpt_count, offset=s.keypoints_offset)
    flip = np.frombuffer(buf, dtype="<i4", count=s.flip_count, offset=s.flip_offset)
    return keypoints.reshape(s.instances, s.kpt_count, 3), flip


def index_view(buf, records: int) -> np.ndarray:
    return np.frombuffer(buf, dtype=INDEX_DTYPE, count=records, offset=HEADER_NBYTES)


def pack_targets(records, classes, boxes, offsets, points) -> None:
    """Fill the target arrays (from ``target_views``) from records' classes/boxes/polygons."""
    inst = 0
    pt = 0
    offsets[0] = 0
    for rec in records:
        n = len(rec.classes)
        if n:
            classes[inst : inst + n] = rec.classes
            boxes[inst : inst + n] = rec.boxes
        for poly in rec.polygons:
            k = len(poly)
            if k:
                points[pt : pt + k] = poly
            pt += k
            inst += 1
            offsets[inst] = pt
    if inst != len(classes) or pt != len(points):
        raise ValueError(f"packed {inst} instances / {pt} points, sections hold {len(classes)} / {len(points)}")


def pack_keypoints(records, keypoints: np.ndarray) -> None:
    """Fill the (n, K, 3) keypoints array (from ``keypoint_views``) from pose records' keypoints."""
    inst = 0
    for rec in records:
        n = len(rec.classes)
        if n:
            if rec.keypoints is None or rec.keypoints.shape[1:] != keypoints.shape[1:]:
                got = None if rec.keypoints is None else rec.keypoints.shape
                raise ValueError(f"{rec.image_path}: keypoints {got}, the snapshot holds (n, *{keypoints.shape[1:]})")
            keypoints[inst : inst + n] = rec.keypoints
        inst += n
    if inst != len(keypoints):
        raise ValueError(f"packed keypoints of {inst} instances, the section holds {len(keypoints)}")
