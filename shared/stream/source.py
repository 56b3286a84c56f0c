"""What the augmentation route reads: prepared images and their targets, by record index.

Two implementations exist: the shared-memory snapshot (read-only views, zero-copy) and the
in-process reference pipeline (decodes, resizes and centres per call). The route cannot
tell them apart, which is the point: byte parity between them proves the snapshot changes
nothing.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..task import TaskSpec
from .records import Targets


class ImageSource(Protocol):
    """``imgsz``: the long side of every image. ``spec`` (``shared/task.py``): the dataset's task,
    what the targets carry beside boxes; every source states it (``DETECT`` for boxes alone). For
    pose it holds ``kpt_shape`` (K, D) as the dataset's ``kpt_shape`` states it (the targets'
    keypoints are (n, K, 3) whatever D is) and ``flip_idx``, the keypoint each one becomes under
    a left-right flip (K entries; None for a pose set that states none)."""

    imgsz: int
    spec: TaskSpec

    def __len__(self) -> int: ...

    def image(self, index: int) -> np.ndarray:
        """(h, w, 3) BGR, long side ``imgsz``, never written: float32 minus the fill value,
        or uint8 (the pixel itself; a ``uint8`` snapshot), which the route centres as it
        reads it (the kernel, ``server/augment/kernel.py``), to the same float32 values."""
        ...

    def targets(self, index: int) -> Targets:
        """Normalised targets of record ``index``; arrays never written. Polygons for every task
        (segment: the instance's outline; obb: its 4 corners; empty where an instance has none,
        always for pose), keypoints (n, K, 3) for pose only."""
        ...
