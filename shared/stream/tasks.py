"""What each training task carries beside the images, in a batch and in a ring slot.

Code both sides import: the daemon sizes ring slots with it, the workers and the reference
pipeline write target rows of this width, the trainer reads them.

A target row is ``(batch_index, class, cx, cy, w, h)`` normalised by imgsz, as for detect,
followed by the task's own columns:

- ``detect``, ``segment``: nothing more (6 columns). A segment batch also carries masks: a
  plane per image of imgsz // mask_ratio pixels a side (``mask_side``).
- ``obb``: the angle in radians (7 columns; Ultralytics' ``xywhr``).
- ``pose``: K keypoints as x, y (normalised) and visibility, flattened (6 + 3K columns).
"""

from __future__ import annotations

from .config import check_task

BASE_COLUMNS = 6


def target_width(task: str, kpt_shape: tuple[int, int] | None = None) -> int:
    """Columns of one target row for ``task`` (``kpt_shape`` (K, D) for pose)."""
    check_task(task)
    if task == "obb":
        return BASE_COLUMNS + 1
    if task == "pose":
        if kpt_shape is None:
            raise ValueError("the pose task needs kpt_shape (K, 2 or 3)")
        return BASE_COLUMNS + 3 * int(kpt_shape[0])
    return BASE_COLUMNS


def mask_side(task: str, imgsz: int, mask_ratio: int) -> int:
    """Side in pixels of a segment batch's mask plane; 0 for the tasks without masks."""
    return imgsz // mask_ratio if task == "segment" else 0
