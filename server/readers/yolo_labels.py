"""One YOLO label file -> the instances of one record.

Runs in whichever process reads a dataset. Pure parsing; the only file touched is the
label file itself.

Line forms (whitespace-separated, coordinates normalised to the image's width/height):

- detection: ``cls cx cy w h`` (5 fields); the polygon is empty (0, 2);
- segment: ``cls x1 y1 x2 y2 ...`` (at least 3 points, so an odd field count >= 7); the
  box is the polygon's extents.

Blank lines are ignored; an empty or missing file is a background record. Coordinates may
stray outside [0, 1] by at most ``COORD_TOLERANCE`` (rounding in exporters) and are then
clipped; further out is an error. Boxes with no width or height after clipping are
dropped and counted.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ...shared.errors import DatasetError

#: How far outside [0, 1] a normalised coordinate may be before the line is refused.
COORD_TOLERANCE = 0.01


def _numbers(fields: list[str], where: str, lineno: int) -> list[float]:
    values = []
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
        values.append(value)
    return values


def _class_id(value: float, num_classes: int | None, where: str, lineno: int) -> int:
    if value != int(value) or value < 0:
        raise DatasetError(f"class id {value:g} is not a non-negative integer", path=where, line=lineno)
    cls = int(value)
    if num_classes is not None and cls >= num_classes:
        raise DatasetError(
            f"class id {cls} out of range: the dataset names {num_classes} classes (ids 0..{num_classes - 1}); fix the label or add the class to 'names'",
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


def parse_label_file(path: Path, num_classes: int | None) -> tuple[list[int], list[np.ndarray], list[np.ndarray], int]:
    """Parse one label file; returns (classes, boxes xyxy, polygons (k, 2), dropped count).

    A missing file gives no instances. ``num_classes`` None skips the range check (an
    images folder read without class names).
    """
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], [], [], 0
    except UnicodeDecodeError:
        raise DatasetError("label file is not UTF-8 text; YOLO labels are text lines", path=where) from None
    except OSError as exc:
        raise DatasetError(f"cannot read the label file ({exc.strerror})", path=where) from None

    classes: list[int] = []
    boxes: list[np.ndarray] = []
    polygons: list[np.ndarray] = []
    dropped = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        n = len(fields)
        if n != 5 and (n < 7 or n % 2 == 0):
            if n > 5 and n % 2 == 0:
                msg = f"odd number of coordinates ({n - 1}); segment lines are 'cls x1 y1 x2 y2 ...' with at least 3 points"
            else:
                msg = f"{n} fields; detection lines have 5 ('cls cx cy w h'), segment lines an odd count >= 7 ('cls x1 y1 x2 y2 x3 y3 ...')"
            raise DatasetError(msg, path=where, line=lineno)
        values = _numbers(fields, where, lineno)
        cls = _class_id(values[0], num_classes, where, lineno)
        coords = np.asarray(values[1:], dtype=np.float64)
        _check_range(coords, where, lineno)
        if n == 5:
            cx, cy, w, h = coords
            box = np.clip([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 0.0, 1.0)
            polygon = np.zeros((0, 2), dtype=np.float32)
        else:
            polygon = np.clip(coords.reshape(-1, 2), 0.0, 1.0)
            box = np.concatenate([polygon.min(axis=0), polygon.max(axis=0)])
        if box[2] <= box[0] or box[3] <= box[1]:
            dropped += 1
            continue
        classes.append(cls)
        boxes.append(box.astype(np.float32))
        polygons.append(polygon.astype(np.float32))
    return classes, boxes, polygons, dropped
