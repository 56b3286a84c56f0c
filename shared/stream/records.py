"""The one record form both readers produce, and the target form the augmenters consume.

Runs in whichever process reads a dataset (the CLI, the daemon, the reference pipeline).

Coordinates are **normalised** to the image's width and height (x / W, y / H) as float32.
That keeps a record independent of the size the image is later resized to, and lets the
snapshot path and the reference path derive pixel coordinates with the very same
arithmetic (one multiply by the prepared width/height), which byte parity relies on.

Labels are taken to be in the frame of the decoded image *after* its EXIF orientation is
applied, which is what OpenCV's ``imread`` returns and what YOLO tools assume.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..task import DETECT, TaskSpec, WithSpec


def _empty_polygon() -> np.ndarray:
    return np.zeros((0, 2), dtype=np.float32)


@dataclass(frozen=True, eq=False)
class Record:
    """One training image and its instances.

    - ``image_path``: absolute path of the image file.
    - ``size_hw``: (height, width) the annotation file states, or ``None`` where the format
      has none (YOLO); preparation records the decoded size in the snapshot index either way.
    - ``classes``: int32 (n,), contiguous ids 0..N-1.
    - ``boxes``: float32 (n, 4), normalised x1, y1, x2, y2.
    - ``polygons``: tuple of n float32 (k, 2) arrays, normalised x, y; (0, 2) where an
      instance has no polygon. An instance with several polygon parts keeps the part with
      the most points (the first of equals): the choice the YOLO segment exports of COCO
      make, so both readers give the same records for the same images. For the obb task the
      polygon is the box's 4 corners, as the label line gives them, and ``boxes`` their extent.
    - ``keypoints``: pose task only, float32 (n, K, 3) normalised x, y and visibility (0
      absent, 1 occluded, 2 visible; a (K, 2) dataset gets 1 where x and y are >= 0, else 0,
      as Ultralytics makes it); None for the other tasks.
    """

    image_path: str
    size_hw: tuple[int, int] | None
    classes: np.ndarray
    boxes: np.ndarray
    polygons: tuple[np.ndarray, ...] = field(default=())
    keypoints: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.classes)
        if self.boxes.shape != (n, 4):
            raise ValueError(f"{self.image_path}: boxes shape {self.boxes.shape}, expected ({n}, 4)")
        if self.keypoints is not None and (self.keypoints.ndim != 3 or self.keypoints.shape[::2] != (n, 3)):
            raise ValueError(f"{self.image_path}: keypoints shape {self.keypoints.shape}, expected ({n}, K, 3)")
        if not self.polygons:
            object.__setattr__(self, "polygons", tuple(_empty_polygon() for _ in range(n)))
        elif len(self.polygons) != n:
            raise ValueError(f"{self.image_path}: {len(self.polygons)} polygons for {n} instances")

    @property
    def num_instances(self) -> int:
        return len(self.classes)


@dataclass(frozen=True)
class Dataset(WithSpec):
    """What a reader returns: the records, the class names, and the files that define it.

    ``spec``: the ``TaskSpec`` the dataset was read for, what the records carry beside boxes,
    with its keypoint layout: ``task`` its name (as the fingerprint and the label index write it),
    ``kpt_shape`` (K, 2 or 3) as the data.yaml states it and ``flip_idx`` the keypoint each one
    becomes under a left-right flip (K entries), for the pose task; None otherwise.

    ``source_files`` lists every file the dataset was read from (annotation json, label
    files, data.yaml), for the record; the snapshot fingerprint hashes the resolved
    records and names instead of these files' text (``server/snapshot/fingerprint.py``).
    ``absent_files``: files the reader looked for and did not find (a YOLO image's missing
    label file), whose appearing would change the dataset; ``listed_dirs``: every folder whose
    listing the reader took (a YOLO images folder and its subfolders), whose entries changing
    would. Together with the images these are what the label index beside a snapshot checks
    on a restart (``server/snapshot/label_index.py``).

    Checked when made (ValueError): pose has a ``kpt_shape`` (K >= 1, D 2 or
    3), every record's keypoints are (n, K, 3), and ``flip_idx``, when given, is a permutation of
    0..K-1; the other tasks have neither and their records no keypoints.
    """

    records: tuple[Record, ...]
    names: tuple[str, ...]
    source_files: tuple[str, ...]
    spec: TaskSpec = DETECT
    absent_files: tuple[str, ...] = ()
    listed_dirs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.spec.has_keypoints:
            if self.kpt_shape is not None or self.flip_idx is not None:
                raise ValueError(f"Dataset.kpt_shape and flip_idx belong to the pose task, not {self.task!r}")
            for rec in self.records:
                if rec.keypoints is not None:
                    raise ValueError(f"{rec.image_path}: keypoints in a {self.task} dataset (only pose has them)")
            return
        if (
            self.kpt_shape is None
            or len(self.kpt_shape) != 2
            or self.kpt_shape[0] < 1
            or self.kpt_shape[1] not in (2, 3)
        ):
            raise ValueError(f"Dataset.kpt_shape {self.kpt_shape!r}: the pose task needs (K >= 1, D 2 or 3)")
        k = int(self.kpt_shape[0])
        if self.flip_idx is not None and sorted(self.flip_idx) != list(range(k)):
            raise ValueError(f"Dataset.flip_idx {self.flip_idx!r} is not a permutation of 0..{k - 1}")
        for rec in self.records:
            if rec.keypoints is None or rec.keypoints.shape[1] != k:
                got = None if rec.keypoints is None else rec.keypoints.shape
                raise ValueError(
                    f"{rec.image_path}: keypoints {got}, the pose dataset's are ({rec.num_instances}, {k}, 3)"
                )

    def __len__(self) -> int:
        return len(self.records)


@dataclass(frozen=True, eq=False)
class Targets:
    """Targets of one prepared image, as the augmenters see them (normalised coordinates).

    Arrays may be read-only views into shared memory: augmenters never write them.
    """

    classes: np.ndarray  # int32 (n,)
    boxes: np.ndarray  # float32 (n, 4) normalised xyxy
    polygons: tuple[np.ndarray, ...]  # n float32 (k, 2) normalised
    keypoints: np.ndarray | None = None  # pose: float32 (n, K, 3) normalised x, y, visibility

    @classmethod
    def from_record(cls, record: Record) -> "Targets":
        return cls(record.classes, record.boxes, record.polygons, record.keypoints)
