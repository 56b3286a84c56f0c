"""The main pre-transforms' labels of a whole range of training samples at once (``pre_labels``).

Runs in the render loop (``batch.py``), between the samples' draws (``sample.draft``) and the
rest of their routes (``sample.finish``). Per sample these are a dozen numpy calls on a few
dozen rows, so the calls' overhead, not the arithmetic, is their cost; here each is one call
over every row of the range, each row tagged with its sample (its owner).

Every operation is elementwise (or a reduction within a row), in the same dtype and order as
the per-sample code, so a row's bytes do not depend on which rows are computed with it; the
tests compare both (tests/unit/test_range_labels.py).

Where a range's records carry polygons or keypoints (segment, OBB, pose), ``pre_labels`` takes
each sample through the per-sample code (``sample.pre_labels``).
"""

from __future__ import annotations

import numpy as np

from ...shared.task import TaskSpec
from .affine import is_perspective
from .labels import MIN_AREA_RATIO, Labels, candidates, corner_boxes
from .sample import Draft
from .sample import pre_labels as sample_pre_labels

__all__ = ["pre_labels"]

_NO_POINTS = np.zeros((0, 2), np.float32)


def pre_labels(drafts: list[Draft], imgsz: int, spec: TaskSpec) -> list[Labels]:
    """Each draft's main pre-transform labels (``sample.pre_labels``), in pixels of the output."""
    pres = [d.pre for d in drafts]
    if any(t.polygons or t.keypoints is not None for p in pres for t, *_ in p.placed):
        return [sample_pre_labels(p, imgsz, spec) for p in pres]
    return _boxes_only(pres, imgsz)


def _boxes_only(pres: list, imgsz: int) -> list[Labels]:
    """``pre_labels`` where no record has polygons or keypoints (detect): boxes placed on their
    canvas (``Labels._from_placed_boxes``, ``Labels.clip``), through their sample's matrix
    (``labels.corner_boxes``), clipped and filtered (``labels.transform_labels``), for every row
    of the range at once."""
    parts = [(s, t, w, h, pw, ph) for s, p in enumerate(pres) for t, w, h, pw, ph in p.placed if len(t.classes)]
    count = len(pres)
    if not parts:
        return [Labels.empty() for _ in range(count)]
    sizes = [len(t.classes) for _, t, *_ in parts]
    owner = np.repeat(np.array([s for s, *_ in parts], np.int64), sizes)
    # ``Targets`` holds int32 (n,) classes and float32 (n, 4) boxes; the dtype casts any other
    # type as the per-sample ``np.asarray`` does
    classes = np.concatenate([t.classes for _, t, *_ in parts], dtype=np.int32)
    boxes = np.concatenate([t.boxes for _, t, *_ in parts], dtype=np.float32)
    # Each part's size and offset per row, the canvas side and the drawn scale per row: the
    # float32 multiply and add of ``Labels.from_targets`` per element.
    place = np.repeat(np.array([(w, h, w, h, pw, ph, pw, ph) for _, _, w, h, pw, ph in parts], np.float32), sizes, 0)
    boxes *= place[:, :4]
    boxes += place[:, 4:]
    per_sample = np.array([(p.canvas, p.scale) for p in pres], np.float64)[owner]
    # A per-row bound takes numpy's array clip, which returns +0 where the scalar clip of
    # ``Labels.clip`` keeps a -0; a whole-number offset added to a product never gives -0.
    old = np.clip(boxes, 0, per_sample[:, :1].astype(np.float32))
    matrices = np.array([p.matrix.reshape(9) for p in pres], np.float64)
    perspective = np.array([is_perspective(p.matrix) for p in pres])
    rows = matrices[owner]
    entries = [rows[:, k : k + 1] for k in range(9)]
    new = corner_boxes(old, entries, perspective[owner] if perspective.any() else None)
    new = np.clip(new, 0, imgsz).astype(np.float32)
    keep = candidates(old * per_sample[:, 1:].astype(np.float32), new, MIN_AREA_RATIO)
    classes, new, owner = classes[keep], new[keep], owner[keep]
    bounds = np.zeros(count + 1, np.int64)
    np.cumsum(np.bincount(owner, minlength=count), out=bounds[1:])
    offsets = np.zeros(len(classes) + 1, np.int64)
    edges = bounds.tolist()
    return [Labels(classes[a:b], new[a:b], _NO_POINTS, offsets[: b - a + 1]) for a, b in zip(edges[:-1], edges[1:])]
