"""One YOLO label file -> the instances of one record, for the dataset's task.

Runs in whichever process reads a dataset. Pure parsing; the only file touched is the
label file itself, read one line at a time: what a file costs follows the bounds below,
never its size.

Line forms per task (its ``TaskSpec.label_line``; whitespace-separated, coordinates normalised to
the image's width/height), those of Ultralytics' label files:

- detect: ``cls cx cy w h`` (5 fields; the polygon is empty (0, 2)) or a segment line (its
  polygon kept for copy-paste); both may mix. In a data.yaml with ``kpt_shape`` (K, D), a pose
  line (5 + K * D fields) keeps its box and drops its keypoints, as Ultralytics' detect task does.
- segment: ``cls x1 y1 x2 y2 ...`` only (at least 3 points, so an odd field count >= 7); the
  box is the polygon's extents. A box line is refused: Ultralytics 8.4 refuses a segment
  dataset where a box has no polygon ("requires equal numbers of boxes and segments"), and a
  file mixing box and polygon lines is dropped by its loader as corrupt.
- obb: ``cls x1 y1 x2 y2 x3 y3 x4 y4`` (9 fields): the polygon is the 4 corners as written (not
  clipped, like keypoints below: clipping would bend the rectangle), the box their extents, clipped.
- pose: ``cls cx cy w h`` + K x (``x y`` or ``x y v``), (K, D) the data.yaml's ``kpt_shape``.
  Keypoints become (K, 3) x, y, visibility; for D = 2 visibility is 1 where x and y are both
  >= 0, else 0 (Ultralytics' ``verify_image_label``). Keypoint coordinates are kept as written
  (not clipped; the route decides what leaves the image), within the same tolerance as boxes;
  a visibility must be within 0..``MAX_VISIBILITY`` (0 absent, 1 occluded, 2 visible: a
  visibility of 1e30 would be kept as written, and 1e39 is infinite as float32).

A line that does not fit the task raises DatasetError naming the file, the line, the fields
found and expected, and what to change (``--task``, the data.yaml's ``kpt_shape``).
Blank lines are ignored; an empty or missing file is a background record. Coordinates may
stray outside [0, 1] by at most ``COORD_TOLERANCE`` (rounding in exporters) and are then
clipped (boxes, and segment/detect polygon points); further out is an error. Boxes with no width or height
after clipping are dropped and counted (with their polygon and keypoints).

Bounds, each refused by file and line as soon as it is passed (nothing after that line is read):

- ``max_instances`` (``--max-instances-per-image``): the instance after the last one allowed.
  Only kept instances count; blank lines and dropped boxes cost time, never memory.
- ``max_classes`` (``--max-classes``), where the file is read without class names (an images
  folder): a class id the names "0".."K" could not hold. With names, their count bounds the ids.
- ``MAX_LINE_CHARS`` characters and ``MAX_LINE_FIELDS`` fields in one line: both admit a polygon
  of 4M points (twice the 2M-point polygon known to work). A long line is split piece by piece
  into the same fields (``_split``), so it costs the line itself and ~20 bytes per field, never
  a Python string per field at once (~60 bytes each: 1.8 GB for a line of 64M characters).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ...shared.errors import DatasetError
from ...shared.stream.config import DEFAULT_MAX_CLASSES
from ...shared.task import DETECT, TaskSpec

#: How far outside [0, 1] a normalised coordinate may be before the line is refused.
COORD_TOLERANCE = 0.01
#: Longest label line, in characters: a polygon of 2M points takes 36M characters written as
#: Ultralytics writes coordinates (%g, "0.123457 "); this admits up to 15 characters each.
MAX_LINE_CHARS = 1 << 26
#: Most fields in one line: the class and 4M points.
MAX_LINE_FIELDS = 1 + 2 * (1 << 22)
#: Largest keypoint visibility: COCO's 2 (visible); 0 absent, 1 occluded.
MAX_VISIBILITY = 2.0
#: A line longer than this is split piece by piece (``_split``).
_PIECE_CHARS = 1 << 20
# What str.split() splits on: re's \s is str.isspace() for str patterns (its documentation).
_SPACE = re.compile(r"\s")


def _split(line: str) -> tuple[int, Iterable[str]]:
    """(field count, the fields) of ``line`` as ``line.split()`` gives them; a line over
    ``_PIECE_CHARS`` as pieces cut at whitespace, each split when its fields are needed."""
    if len(line) <= _PIECE_CHARS:
        fields = line.split()
        return len(fields), fields
    spans = []
    start = 0
    while start < len(line):
        cut = _SPACE.search(line, min(start + _PIECE_CHARS, len(line)))
        end = cut.start() if cut is not None else len(line)
        spans.append((start, end))
        start = end
    n = sum(len(line[a:b].split()) for a, b in spans)
    return n, (text for a, b in spans for text in line[a:b].split())


def _numbers(fields, n: int, where: str, lineno: int) -> np.ndarray:
    # Straight into float64: no list of float objects beside the strings.
    values = np.empty(n, dtype=np.float64)
    for i, text in enumerate(fields):
        try:
            value = float(text)
        except ValueError:
            raise DatasetError(
                f"field {i + 1} is not a number ({text!r}); lines are 'cls cx cy w h' or 'cls x1 y1 x2 y2 ...'",
                path=where,
                line=lineno,
            ) from None
        if not math.isfinite(value):
            raise DatasetError(f"field {i + 1} is not finite ({text!r})", path=where, line=lineno)
        values[i] = value
    return values


def _class_id(value: float, num_classes: int | None, max_classes: int, where: str, lineno: int) -> int:
    if value != int(value) or value < 0:
        raise DatasetError(f"class id {value:g} is not a non-negative integer", path=where, line=lineno)
    cls = int(value)
    if num_classes is not None and cls >= num_classes:
        raise DatasetError(
            f"class id {cls} out of range: the dataset names {num_classes} classes (ids 0..{num_classes - 1}); fix the label or add the class to 'names'",
            path=where,
            line=lineno,
        )
    if num_classes is None and cls >= max_classes:
        # Read without names, the dataset gets one name per id up to the largest, and every
        # attach carries them: one stray id would make that many classes.
        raise DatasetError(
            f"class id {cls} is over the limit of {max_classes} classes (ids 0..{max_classes - 1}); an images folder "
            f"read without class names gets one per id up to its largest; fix the label, serve a data.yaml with "
            f"'names', or raise --max-classes",
            path=where,
            line=lineno,
        )
    return cls


def _check_range(coords: np.ndarray, where: str, lineno: int) -> None:
    bad = (coords < -COORD_TOLERANCE) | (coords > 1.0 + COORD_TOLERANCE)
    if bad.any():
        value = float(coords[np.argmax(bad)])
        raise DatasetError(
            f"coordinate {value:g} outside [0, 1]: YOLO labels are normalised by the image's width and height",
            path=where,
            line=lineno,
        )


def _box_or_polygon(n: int, kpt_shape: tuple[int, int] | None) -> str | None:
    if n == 5 or _polygon_fields(n):
        return None
    if _pose_fields(n, kpt_shape):
        return None  # a pose line: its box is kept (module docstring)
    hint = ""
    if n > 5 and (n - 5) % 3 == 0:
        hint = f"; if it is a pose line (5 + K x 3 values, K = {(n - 5) // 3}), pass --task pose with kpt_shape in the data.yaml"
    if n > 5 and n % 2 == 0:
        return (
            f"odd number of coordinates ({n - 1}); segment lines are 'cls x1 y1 x2 y2 ...' with at least 3 points{hint}"
        )
    return f"{n} fields; detection lines have 5 ('cls cx cy w h'), segment lines an odd count >= 7 ('cls x1 y1 x2 y2 x3 y3 ...'){hint}"


def _polygon(n: int, kpt_shape: tuple[int, int] | None) -> str | None:
    if _polygon_fields(n):
        return None
    if n == 5:
        return (
            "a box line ('cls cx cy w h', 5 fields) in a segment dataset: every instance needs a polygon "
            "(Ultralytics refuses a segment dataset with boxes that have none); write the polygon "
            "'cls x1 y1 x2 y2 x3 y3 ...' or train the detect task (--task detect)"
        )
    return f"{n} fields; segment lines are 'cls x1 y1 x2 y2 x3 y3 ...': an odd count >= 7 (at least 3 points)"


def _corners(n: int, kpt_shape: tuple[int, int] | None) -> str | None:
    if n == 9:
        return None
    what = "a box line ('cls cx cy w h')" if n == 5 else "a segment line" if _polygon_fields(n) else "a line"
    return (
        f"{what} of {n} fields in an obb dataset; obb lines have 9 fields, the class and the 4 corners "
        "'cls x1 y1 x2 y2 x3 y3 x4 y4'; fix the line, or pass the task the labels are for "
        "(--task detect for boxes, --task segment for polygons)"
    )


def _box_and_keypoints(n: int, kpt_shape: tuple[int, int] | None) -> str | None:
    k, d = kpt_shape
    expected = 5 + k * d
    if n == expected:
        return None
    what = "a box line ('cls cx cy w h') without keypoints" if n == 5 else "a line"
    return (
        f"{what} of {n} fields in a pose dataset with kpt_shape [{k}, {d}]: pose lines have 5 + {k} x {d} = {expected} "
        f"fields ('cls cx cy w h' then {k} keypoints as {'x y v' if d == 3 else 'x y'}); fix the line, or the "
        "data.yaml's kpt_shape, or pass the task the labels are for (--task detect, --task segment)"
    )


def _polygon_fields(n: int) -> bool:
    """Whether ``n`` fields can be a polygon line: the class and at least 3 points."""
    return n >= 7 and n % 2 == 1


def _pose_fields(n: int, kpt_shape: tuple[int, int] | None) -> bool:
    """Whether ``n`` fields are a pose line of ``kpt_shape`` (K, D): the box and K x D values."""
    return kpt_shape is not None and n == 5 + kpt_shape[0] * kpt_shape[1]


# Why a line of n fields is not of a task's form (None when it is), by ``TaskSpec.label_line``.
_FORM_ERRORS = {
    "box or polygon": _box_or_polygon,
    "polygon": _polygon,
    "4 corners": _corners,
    "box and keypoints": _box_and_keypoints,
}


def _keypoints(values: np.ndarray, kpt_shape: tuple[int, int], where: str, lineno: int) -> np.ndarray:
    """(K, 3) x, y, visibility from the K x D values after the box (module docstring)."""
    k, d = kpt_shape
    raw = values.reshape(k, d)
    _check_range(raw[:, :2].reshape(-1), where, lineno)
    out = np.empty((k, 3), dtype=np.float64)
    out[:, :2] = raw[:, :2]
    if d == 3:
        bad = (raw[:, 2] < 0) | (raw[:, 2] > MAX_VISIBILITY)
        if bad.any():
            j = int(np.argmax(bad))
            raise DatasetError(
                f"keypoint {j} has visibility {raw[j, 2]:g}; visibility is 0 (absent), 1 (occluded) or 2 (visible)",
                path=where,
                line=lineno,
            )
        out[:, 2] = raw[:, 2]
    else:
        out[:, 2] = np.where((raw[:, 0] < 0) | (raw[:, 1] < 0), 0.0, 1.0)
    return out


def parse_label_file(
    path: Path,
    num_classes: int | None,
    *,
    task: TaskSpec = DETECT,
    kpt_shape: tuple[int, int] | None = None,
    max_instances: int | None = None,
    max_classes: int = DEFAULT_MAX_CLASSES,
) -> tuple[list[int], list[np.ndarray], list[np.ndarray], list[np.ndarray] | None, int]:
    """Parse one label file for ``task``; returns (classes, boxes xyxy, polygons (k, 2),
    keypoints (K, 3) per instance or None unless pose, dropped count).

    A missing file gives no instances. ``num_classes`` None: an images folder read without
    class names, whose ids are bounded by ``max_classes`` instead. ``kpt_shape`` (K, D) is the
    data.yaml's, needed for pose; for the other tasks it only lets a pose line keep its box
    (module docstring). ``max_instances``: refuse the file at its instance past it (None: no bound).
    """
    spec = task
    if spec.has_keypoints and kpt_shape is None:
        raise ValueError(f"parse_label_file: the {spec.name} task needs kpt_shape (K, D)")
    where = str(path)
    try:
        # Universal newlines, as Path.read_text read the whole file before; errors while
        # reading are DatasetErrors raised by _lines, so only opening fails here.
        with open(path, encoding="utf-8") as file:
            return _parse_lines(_lines(file, where), where, num_classes, spec, kpt_shape, max_instances, max_classes)
    except FileNotFoundError:
        return [], [], [], [] if spec.has_keypoints else None, 0
    except OSError as exc:
        raise DatasetError(f"cannot read the label file ({exc.strerror})", path=where) from None


def _lines(file, where: str):
    """(line number, text) of every line of ``file``, numbered as ``str.splitlines`` of the whole
    text numbers them (its breaks \\v, \\f, \\x1c, U+2028 ... included), read one physical line of
    at most ``MAX_LINE_CHARS`` at a time; DatasetError for a longer one."""
    limit = MAX_LINE_CHARS
    lineno = 0
    while True:
        try:
            chunk = file.readline(limit + 1)  # one more than allowed tells a longer line apart
        except UnicodeDecodeError:
            raise DatasetError("label file is not UTF-8 text; YOLO labels are text lines", path=where) from None
        except OSError as exc:
            raise DatasetError(f"cannot read the label file ({exc.strerror})", path=where) from None
        if not chunk:
            return
        parts = chunk.splitlines()
        if len(chunk) > limit and not chunk.endswith("\n"):
            raise DatasetError(
                f"line longer than {limit} characters (a polygon of millions of points fits in fewer); "
                "a label line is one instance: fix the file",
                path=where,
                line=lineno + len(parts),
            )
        del chunk
        parts.reverse()
        while parts:  # handed over, not kept here: the caller frees a long line once parsed
            lineno += 1
            yield lineno, parts.pop()


def _parse_lines(
    lines, where: str, num_classes: int | None, spec: TaskSpec, kpt_shape, max_instances: int | None, max_classes: int
):
    """The instances of ``lines`` ((number, text) pairs): ``parse_label_file``'s result."""
    form_error = _FORM_ERRORS[spec.label_line]
    keypoints: list[np.ndarray] | None = [] if spec.has_keypoints else None
    classes: list[int] = []
    boxes: list[np.ndarray] = []
    polygons: list[np.ndarray] = []
    dropped = 0
    for lineno, line in lines:
        n, fields = _split(line)
        if not n:
            continue
        if n > MAX_LINE_FIELDS:
            raise DatasetError(
                f"{n} fields, over the limit of {MAX_LINE_FIELDS} (a polygon of {(MAX_LINE_FIELDS - 1) // 2} points); "
                "a label line is one instance: fix the file",
                path=where,
                line=lineno,
            )
        msg = form_error(n, kpt_shape)
        if msg is not None:
            raise DatasetError(msg, path=where, line=lineno)
        values = _numbers(fields, n, where, lineno)
        del fields, line  # a long polygon's text goes before its arrays are made
        cls = _class_id(values[0], num_classes, max_classes, where, lineno)
        coords = np.asarray(values[1:], dtype=np.float64)
        kpts = None
        if spec.has_keypoints:
            kpts = _keypoints(coords[4:], kpt_shape, where, lineno)
            coords = coords[:4]
        elif n != 5 and spec.pose_lines_as_boxes and _pose_fields(n, kpt_shape):
            coords = coords[:4]  # a pose line read for boxes: its keypoints are dropped
        _check_range(coords, where, lineno)
        if len(coords) == 4:
            cx, cy, w, h = coords
            box = np.clip([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 0.0, 1.0)
            polygon = np.zeros((0, 2), dtype=np.float32)
        elif spec.rotated:
            # The corners as written: clipping one that strays by the tolerance would bend the
            # rectangle and move the angle Ultralytics measures from them (it clips none either).
            polygon = coords.reshape(4, 2)
            box = np.clip(np.concatenate([polygon.min(axis=0), polygon.max(axis=0)]), 0.0, 1.0)
        else:
            polygon = np.clip(coords.reshape(-1, 2), 0.0, 1.0)
            box = np.concatenate([polygon.min(axis=0), polygon.max(axis=0)])
        if box[2] <= box[0] or box[3] <= box[1]:
            dropped += 1
            continue
        if max_instances is not None and len(classes) >= max_instances:
            raise DatasetError(
                f"more than {max_instances} instances for one image (this line holds instance {len(classes) + 1}), "
                "over the limit per image (every batch slot is sized for the densest image); fix the labels, or "
                "raise --max-instances-per-image",
                path=where,
                line=lineno,
            )
        classes.append(cls)
        boxes.append(box.astype(np.float32))
        polygons.append(polygon.astype(np.float32))
        if keypoints is not None:
            keypoints.append(kpts.astype(np.float32))
    return classes, boxes, polygons, keypoints, dropped
