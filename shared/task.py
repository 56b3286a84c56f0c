"""The training tasks as objects: one ``TaskSpec`` per task, asked instead of comparing names.

Code both sides import: the readers ask it what a label line holds, the route how polygons
enter and what a row carries, the daemon how big a ring slot is, the trainer and the
Ultralytics adapter what the rows and planes they receive mean. Only the name (``spec.name``),
with a pose set's ``kpt_shape`` and ``flip_idx`` as numbers, enters a fingerprint, a digest, a
snapshot's header or a wire message, so the bytes are those of before tasks were objects.

A target row is ``(batch_index, class, cx, cy, w, h)`` normalised by imgsz, as for detect,
followed by the task's own columns:

- ``detect``, ``segment``: nothing more (6 columns). A segment batch also carries masks: a
  plane per image of imgsz // mask_ratio pixels a side (``mask_side``).
- ``obb``: the angle in radians (7 columns; Ultralytics' ``xywhr``).
- ``pose``: K keypoints as x, y (normalised) and visibility, flattened (6 + 3K columns).

A dataset's spec also carries its keypoint layout (``kpt_shape`` (K, D) and ``flip_idx``, pose
only): a spec is resolved once where a task's name is first read (a reader, a snapshot's
header, an ``attached`` reply, a setting) and travels as the value from there on; a source
says its task by its ``spec``.

An unknown task is refused here and nowhere else (``task_spec``): a ConfigError (a
ValueError) naming the field ``task``, the value and the tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from .errors import ConfigError

__all__ = ["BASE_COLUMNS", "DETECT", "SPECS", "TASKS", "TaskSpec", "WithSpec", "task_spec"]

BASE_COLUMNS = 6


@dataclass(frozen=True)
class TaskSpec:
    """What one task's instances carry and how the route treats them.

    ``label_line``: what a line of a YOLO label file holds (``server/readers/yolo_labels.py``
    checks each form): "box or polygon", "polygon", "box and keypoints" or "4 corners".
    ``has_masks``: segment; polygons are masks: every instance needs one, its box after the
    affine is the extent of its visible part, and a batch carries mask planes.
    ``has_keypoints``: pose; K keypoints per instance (the dataset's ``kpt_shape``), which
    flips remap by ``flip_idx`` (without one a sample is not flipped).
    ``rotated``: obb; a box is a rotated rectangle, its 4 corners the polygon, clipped keeping
    its direction, and its row carries the angle. COCO has no field for it.
    ``polygon_points``: how many points each polygon is resampled to before the route
    (``server/augment/resample.py``; 0: none), as Ultralytics' ``YOLODataset`` does
    (``segment_resamples``: 1000, 100 for OBB).
    ``is_default``: detect, the task when none is named and the only one before tasks were a
    setting: names and keys made then left the task out, and still do (the snapshot's
    fingerprint and lineage, the synthetic set).
    ``pose_lines_as_boxes``: a pose label line (by the data.yaml's ``kpt_shape``) is read for
    its box, its keypoints dropped, as Ultralytics' detect task reads a pose set.
    ``kpt_shape``: the dataset's (K, D) for a task with keypoints, and ``flip_idx``: the keypoint
    each one becomes under a left-right flip (K entries; None when the dataset states none);
    both None for the task itself (``task_spec(name)``) and for the other tasks' datasets.
    """

    name: str
    label_line: str
    has_masks: bool = False
    has_keypoints: bool = False
    rotated: bool = False
    polygon_points: int = 0
    is_default: bool = False
    pose_lines_as_boxes: bool = False
    kpt_shape: tuple[int, int] | None = None
    flip_idx: tuple[int, ...] | None = None

    def with_keypoints(self, kpt_shape=None, flip_idx=None) -> TaskSpec:
        """This task with a dataset's keypoint layout (``kpt_shape`` (K, D), ``flip_idx``)."""
        if kpt_shape is None and flip_idx is None and self.kpt_shape is None and self.flip_idx is None:
            return self
        return replace(
            self,
            kpt_shape=None if kpt_shape is None else tuple(int(v) for v in kpt_shape),
            flip_idx=None if flip_idx is None else tuple(int(v) for v in flip_idx),
        )

    @property
    def keypoints(self) -> int:
        """K, the keypoints of an instance (the dataset's ``kpt_shape``); 0 for the tasks without."""
        return int(self.kpt_shape[0]) if self.has_keypoints and self.kpt_shape is not None else 0

    @property
    def rows_are_boxes(self) -> bool:
        """Whether a target row is the box alone (``BASE_COLUMNS``): what a detector trains on."""
        return not (self.rotated or self.has_keypoints)

    def extra_columns(self, keypoints: int = 0) -> int:
        """Columns of a target row after ``BASE_COLUMNS``; ``keypoints``: K, for a task with them."""
        return 1 if self.rotated else 3 * int(keypoints) if self.has_keypoints else 0

    def target_width(self, kpt_shape: tuple[int, int] | None = None) -> int:
        """Columns of one target row (``kpt_shape`` (K, D) for a task with keypoints: the spec's own
        unless given)."""
        kpt_shape = self.kpt_shape if kpt_shape is None else kpt_shape
        if self.has_keypoints and kpt_shape is None:
            raise ValueError(f"the {self.name} task needs kpt_shape (K, 2 or 3)")
        return BASE_COLUMNS + self.extra_columns(kpt_shape[0] if self.has_keypoints else 0)

    def mask_side(self, imgsz: int, mask_ratio: int) -> int:
        """Side in pixels of a batch's mask plane; 0 for the tasks without masks."""
        return imgsz // mask_ratio if self.has_masks else 0


_SPECS = {
    spec.name: spec
    for spec in (
        TaskSpec("detect", "box or polygon", is_default=True, pose_lines_as_boxes=True),
        TaskSpec("segment", "polygon", has_masks=True, polygon_points=1000),
        TaskSpec("pose", "box and keypoints", has_keypoints=True),
        TaskSpec("obb", "4 corners", rotated=True, polygon_points=100),
    )
}
# The Ultralytics tasks a daemon serves; a dataset is prepared for one.
TASKS = tuple(_SPECS)
# Each task's spec by its name, for a name already checked (a setting checks its own: ``task_spec``).
SPECS = MappingProxyType(_SPECS)
# The task of a source that holds boxes alone (a detect set, the benches' and tests' arrays).
DETECT = _SPECS["detect"]


def task_spec(task: Any, *, kpt_shape=None, flip_idx=None) -> TaskSpec:
    """The spec of the task named ``task`` (a ``TaskSpec`` is its own), with a dataset's keypoint
    layout where one is given; otherwise the one error an unknown task is wherever a task's name
    is read (a setting, a reader, a snapshot's header, an ``attached`` reply, a synthetic set): a
    ConfigError naming the field ``task``, the value and the tasks."""
    if isinstance(task, TaskSpec):
        spec = task
    else:
        spec = _SPECS.get(task) if isinstance(task, str) else None
        if spec is None:
            raise ConfigError.for_field("task", task, f"is not one of the tasks; use one of {list(TASKS)} (--task)")
    if kpt_shape is None and flip_idx is None:
        return spec
    return spec.with_keypoints(kpt_shape, flip_idx)


class WithSpec:
    """``task``, ``kpt_shape`` and ``flip_idx`` of whatever holds a ``spec`` (a dataset, a source,
    a client, a loader): the names older code and users read, each derived from the one value."""

    @property
    def task(self) -> str:
        return self.spec.name

    @property
    def kpt_shape(self) -> tuple[int, int] | None:
        return self.spec.kpt_shape

    @property
    def flip_idx(self) -> tuple[int, ...] | None:
        return self.spec.flip_idx
