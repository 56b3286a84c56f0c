"""In-memory sources of the segment, pose and OBB tasks for the augmentation tests (no files).

Built on ``ArraySource``'s seeded noise images; each adds what its task carries, as the
readers give it: segment polygons (``ArraySource`` already has ellipses; here of varying
length), pose keypoints (n, K, 3) with some invisible, OBB rotated rectangles as 4 corners
with their extent as boxes.
"""

from __future__ import annotations

import math

import numpy as np

from helpers.sources import ArraySource
from pixpool.shared.stream.records import Targets
from pixpool.shared.task import WithSpec, task_spec

KPT_SHAPE = (5, 3)
FLIP_IDX = (0, 2, 1, 4, 3)  # a nose and two left/right pairs


class TaskSource(ArraySource, WithSpec):
    """``ArraySource`` with the ``spec`` of ``task`` (pose: ``KPT_SHAPE``, ``FLIP_IDX``) and the task's targets."""

    def __init__(self, task: str, shapes: list[tuple[int, int]], imgsz: int, *, seed: int = 0, instances: int = 3):
        super().__init__(shapes, imgsz, seed=seed, instances=instances, polygons=task == "segment")
        self.spec = task_spec(task, kpt_shape=KPT_SHAPE, flip_idx=FLIP_IDX) if task == "pose" else task_spec(task)
        rng = np.random.default_rng(seed + 100)
        targets = []
        for t in self._targets:
            n = len(t.classes)
            if task == "segment":
                # polygons of 3..40 vertices: ellipses of the boxes, so resampling has varied lengths
                polys = tuple(_ellipse(b, int(rng.integers(3, 41))) for b in t.boxes)
                targets.append(_frozen(Targets(t.classes, t.boxes, polys)))
            elif task == "pose":
                b = t.boxes
                xy = rng.uniform(0, 1, (n, KPT_SHAPE[0], 2)).astype(np.float32)
                xy[..., 0] = b[:, None, 0] + xy[..., 0] * (b[:, None, 2] - b[:, None, 0])
                xy[..., 1] = b[:, None, 1] + xy[..., 1] * (b[:, None, 3] - b[:, None, 1])
                vis = rng.choice(np.array([0.0, 1.0, 2.0], np.float32), (n, KPT_SHAPE[0], 1))
                kp = np.concatenate([xy, vis], axis=2).astype(np.float32)
                targets.append(_frozen(Targets(t.classes, t.boxes, tuple(_none() for _ in range(n)), kp)))
            elif task == "obb":
                corners = [_rotated(b, float(rng.uniform(-math.pi / 2, math.pi / 2))) for b in t.boxes]
                boxes = np.array(
                    [[c[:, 0].min(), c[:, 1].min(), c[:, 0].max(), c[:, 1].max()] for c in corners], np.float32
                ).reshape(-1, 4)
                targets.append(_frozen(Targets(t.classes, boxes, tuple(corners))))
            else:
                targets.append(t)
        self._targets = targets


def _none() -> np.ndarray:
    return np.zeros((0, 2), np.float32)


def _ellipse(box: np.ndarray, k: int) -> np.ndarray:
    x1, y1, x2, y2 = (float(v) for v in box)
    t = np.linspace(0, 2 * math.pi, k, endpoint=False)
    cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
    return np.stack([cx + rx * np.cos(t), cy + ry * np.sin(t)], axis=1).astype(np.float32)


def _rotated(box: np.ndarray, angle: float) -> np.ndarray:
    """The 4 corners of a rectangle of the box's size turned by ``angle`` about its centre, inside [0, 1]."""
    x1, y1, x2, y2 = (float(v) for v in box)
    cx, cy, hw, hh = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
    c, s = math.cos(angle), math.sin(angle)
    pts = [(cx + dx * c - dy * s, cy + dx * s + dy * c) for dx, dy in ((-hw, -hh), (hw, -hh), (hw, hh), (-hw, hh))]
    return np.clip(np.array(pts, np.float32), 0, 1)


def _frozen(t: Targets) -> Targets:
    """Read-only arrays, as a snapshot's views are: the route must never write them."""
    for a in (t.classes, t.boxes, *t.polygons, *(() if t.keypoints is None else (t.keypoints,))):
        a.flags.writeable = False
    return t
