"""The main pre-transforms' labels of a whole range of training samples at once (``pre_labels``).

Runs in the render loop (``batch.py``), between the samples' draws (``sample.draft``) and the
rest of their routes (``sample.finish``). Per sample these are a dozen numpy calls on a few
dozen rows, so the calls' overhead, not the arithmetic, is their cost; here each is one call
over every row of the range, each row tagged with its sample (its owner).

Every operation is elementwise (or a reduction within a row), in the same dtype and order as
the per-sample code, so a row's bytes do not depend on which rows are computed with it; the
tests compare both (tests/unit/test_range_labels.py).

Detect and pose ranges are done so; where a range's records carry polygons (segment, OBB) or
only some carry keypoints, ``pre_labels`` takes each sample through the per-sample code
(``sample.pre_labels``).
"""

from __future__ import annotations

import numpy as np

from ...shared.task import TaskSpec
from .affine import is_perspective
from .labels import (
    MIN_AREA_RATIO,
    Labels,
    candidates,
    clip_keypoints,
    corner_boxes,
    place_keypoints,
    transformed_keypoints,
)
from .sample import Draft, Pre
from .sample import pre_labels as sample_pre_labels

__all__ = ["pre_labels"]

_NO_POINTS = np.zeros((0, 2), np.float32)


def pre_labels(drafts: list[Draft], imgsz: int, spec: TaskSpec) -> list[Labels]:
    """Each draft's main pre-transform labels (``sample.pre_labels``), in pixels of the output."""
    pres = [d.pre for d in drafts]
    placed = [t for p in pres for t, *_ in p.placed if len(t.classes)]
    keypoints = sum(t.keypoints is not None for t in placed)
    if any(t.polygons for t in placed) or 0 < keypoints < len(placed):
        return [sample_pre_labels(p, imgsz, spec) for p in pres]
    return _gathered(pres, imgsz, keypoints=keypoints > 0)


def _gathered(pres: list[Pre], imgsz: int, *, keypoints: bool) -> list[Labels]:
    """``pre_labels`` where no record has polygons (detect, pose): the boxes (and keypoints) placed on
    their canvas (``Labels.from_placed``, ``Labels.clip``), through their sample's matrix
    (``labels.corner_boxes``, ``labels.transformed_keypoints``), clipped and filtered
    (``labels.transform_labels``), for every row of the range at once."""
    count = len(pres)
    owners: list[int] = []
    targets: list = []
    sizes: list[int] = []
    placing: list[tuple[int, int, float, float]] = []
    for s, p in enumerate(pres):
        for t, w, h, pw, ph in p.placed:
            n = len(t.classes)
            if n:  # ``Labels.concat`` drops empty parts
                owners.append(s)
                targets.append(t)
                sizes.append(n)
                placing.append((w, h, pw, ph))
    if not targets:
        return [Labels.empty() for _ in range(count)]
    owner = np.repeat(np.array(owners, np.int64), sizes)
    # ``Targets`` holds int32 (n,) classes and float32 (n, 4) boxes; the dtype casts any other
    # type as the per-sample ``np.asarray`` does
    classes = np.concatenate([t.classes for t in targets], dtype=np.int32)
    boxes = np.concatenate([t.boxes for t in targets], dtype=np.float32)
    # Each part's size and offset per row: the float32 multiply and add of ``Labels.from_targets``
    # per element, on the boxes as (x, y) pairs.
    place = np.repeat(np.array(placing, np.float32), sizes, 0)
    pairs = boxes.reshape(-1, 2, 2)
    pairs *= place[:, None, :2]
    pairs += place[:, None, 2:]
    per_sample = np.array([(p.canvas, p.scale) for p in pres], np.float64)[owner]
    canvas = per_sample[:, :1].astype(np.float32)
    # A per-row bound takes numpy's array clip, which returns +0 where the scalar clip of
    # ``Labels.clip`` keeps a -0; a whole-number offset added to a product never gives -0.
    old = np.clip(boxes, 0, canvas)
    matrices = np.array([p.matrix for p in pres], np.float64).reshape(-1, 9)[owner]
    entries = [matrices[:, k : k + 1] for k in range(9)]
    perspective = np.array([is_perspective(p.matrix) for p in pres])
    perspective = perspective[owner] if perspective.any() else None
    new = corner_boxes(old, entries, perspective)
    new = np.clip(new, 0, imgsz).astype(np.float32)
    points = None
    if keypoints:
        points = np.concatenate([t.keypoints for t in targets], dtype=np.float32)
        points = place_keypoints(points, place[:, 0:1], place[:, 1:2], place[:, 2:3], place[:, 3:4])
        points = transformed_keypoints(clip_keypoints(points, canvas, canvas), entries, perspective, imgsz)
    keep = candidates(old * per_sample[:, 1:].astype(np.float32), new, MIN_AREA_RATIO)
    classes, new, owner = classes[keep], new[keep], owner[keep]
    if points is not None:
        points = points[keep]
    bounds = np.zeros(count + 1, np.int64)
    np.cumsum(np.bincount(owner, minlength=count), out=bounds[1:])
    offsets = np.zeros(len(classes) + 1, np.int64)
    edges = bounds.tolist()
    out = [
        Labels(classes[a:b], new[a:b], _NO_POINTS, offsets[: b - a + 1], None if points is None else points[a:b])
        for a, b in zip(edges[:-1], edges[1:])
    ]
    if points is not None:
        # a sample with no instance before the filter has the labels of ``Labels.empty()``
        placed = np.bincount(owners, minlength=count)
        out = [one if n else Labels.empty() for one, n in zip(out, placed.tolist())]
    return out
