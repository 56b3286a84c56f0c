"""Pieces both readers share: polygon geometry, the reader statistics, record assembly, the
bound on class names.

Runs in whichever process reads a dataset (the CLI, the daemon). Pure functions over numpy
arrays; nothing here touches shared memory or the file system.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...shared.errors import DatasetError
from ...shared.stream.config import MAX_CLASSES
from ...shared.stream.records import Record
from ...shared.stream.yolo_layout import IMAGE_SUFFIXES  # noqa: F401  (the image suffixes the YOLO reader picks up)
from ...shared.wire.trainer import MAX_NAMES_BYTES, names_nbytes


@dataclass(frozen=True)
class ReaderStats:
    """What a reader left out or found, for logs and tests (never needed to train).

    - ``records``: records returned (duplicates included).
    - ``instances``: instances kept over all records.
    - ``background``: records with no instance.
    - ``crowd_skipped``: COCO ``iscrowd=1`` annotations left out (they never become boxes).
    - ``degenerate_skipped``: boxes left out because their width or height is not positive
      (after clipping to the image).
    - ``labels_missing``: YOLO images without a label file (background by the format's
      rule; all of them missing is most often a wrong layout, see ``read_dataset``).
    - ``missing_label_example``: one such label path, for the warning.
    """

    records: int = 0
    instances: int = 0
    background: int = 0
    crowd_skipped: int = 0
    degenerate_skipped: int = 0
    labels_missing: int = 0
    missing_label_example: str | None = None

    def as_dict(self) -> dict:
        return {
            "records": self.records,
            "instances": self.instances,
            "background": self.background,
            "labels_missing": self.labels_missing,
            "crowd_skipped": self.crowd_skipped,
            "degenerate_skipped": self.degenerate_skipped,
        }


def polygon_area(points: np.ndarray) -> float:
    """Absolute shoelace area of a (k, 2) polygon; 0 for fewer than 3 points."""
    if len(points) < 3:
        return 0.0
    x = points[:, 0].astype(np.float64)
    y = points[:, 1].astype(np.float64)
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def main_part(parts: list[np.ndarray]) -> np.ndarray:
    """The part a multi-part instance keeps: the one with the most points (the first of equals).

    That is the rule the YOLO segment exports of COCO follow (checked on coco128's
    ``labels-seg``: all 82 multi-part instances keep their part with the most points, 15 of
    which are not the part with the largest area). Keeping the same part here makes the
    COCO and YOLO readers give the same polygon for the same instance. Parts with fewer
    than 3 points are ignored; (0, 2) when none is left.
    """
    best = None
    for part in parts:
        if len(part) >= 3 and (best is None or len(part) > len(best)):
            best = part
    if best is None:
        return np.zeros((0, 2), dtype=np.float32)
    return best


def clip_unit(values: np.ndarray) -> np.ndarray:
    """Clip normalised coordinates into [0, 1] as float32 (a new array)."""
    return np.clip(values, 0.0, 1.0).astype(np.float32)


def make_record(
    image_path: str,
    size_hw: tuple[int, int] | None,
    classes: list[int],
    boxes: list[np.ndarray],
    polygons: list[np.ndarray],
    keypoints: list[np.ndarray] | None = None,
    *,
    kpt_count: int = 0,
) -> Record:
    """Assemble one Record with the dtypes and shapes ``shared.stream.records`` promises.

    ``keypoints`` (pose only): one (K, 3) array per instance, ``kpt_count`` K; the record's
    keypoints are then (n, K, 3), (0, K, 3) for a background image; None for the other tasks."""
    n = len(classes)
    cls = np.asarray(classes, dtype=np.int32).reshape(n)
    box = np.asarray(boxes, dtype=np.float32).reshape(n, 4) if n else np.zeros((0, 4), dtype=np.float32)
    polys = tuple(np.ascontiguousarray(p, dtype=np.float32).reshape(-1, 2) for p in polygons)
    kpts = None
    if keypoints is not None:
        kpts = np.zeros((n, kpt_count, 3), dtype=np.float32)
        if n:
            kpts[:] = np.asarray(keypoints, dtype=np.float32).reshape(n, kpt_count, 3)
    for arr in (cls, box, *polys, *(() if kpts is None else (kpts,))):
        arr.flags.writeable = False  # records are shared by reference; nobody may edit them
    return Record(image_path=image_path, size_hw=size_hw, classes=cls, boxes=box, polygons=polys, keypoints=kpts)


def check_class_names(names: tuple[str, ...], *, max_classes: int, path: str, what: str) -> None:
    """DatasetError naming ``path`` where the class ``names`` (``what``: where they come from)
    are more than ``max_classes``, or take more than ``MAX_NAMES_BYTES`` packed: every attach
    and records reply carries them whole, and a trainer refuses a reply over its frame limit."""
    check_class_count(len(names), max_classes=max_classes, path=path, what=what)
    nbytes = names_nbytes(names)
    if nbytes > MAX_NAMES_BYTES:
        raise DatasetError(
            f"the {len(names)} class names ({what}) take {nbytes} bytes packed, over the limit of {MAX_NAMES_BYTES} "
            "bytes that every reply to a trainer carrying them may hold; shorten the names",
            path=path,
        )


def check_class_count(count: int, *, max_classes: int, path: str, what: str) -> None:
    """DatasetError naming ``path`` where ``count`` classes (``what``: where they come from) are
    more than ``max_classes``: checked on the count before any name is made text."""
    if count > max_classes:
        raise DatasetError(
            f"{count} classes ({what}), over the limit of {max_classes}; check the class list, "
            f"or raise --max-classes (up to {MAX_CLASSES}) if the dataset really has that many",
            path=path,
        )
