"""The main pre-transforms' labels of a whole range of training samples at once (``pre_labels``).

Runs in the render loop (``batch.py``), between the samples' draws (``sample.draft``) and the
rest of their routes (``sample.finish``). Per sample these are a dozen numpy calls on a few
dozen rows, so the calls' overhead, not the arithmetic, is their cost; here each is one call
over every row (and every polygon point) of the range, each row tagged with its sample (its
owner).

Every operation is elementwise, or a reduction within a row or a polygon, in the same dtype and
order as the per-sample code, and the two steps whose result differs per sample (the area
threshold, OBB's clip) are decided per owner (``labels.transform_rows``); so a row's bytes do not
depend on which rows are computed with it. The tests compare both
(tests/unit/test_range_labels.py).

Detect, pose, segment and OBB ranges are done so; a range where only some records carry
keypoints takes each sample through the per-sample code (``sample.pre_labels``). A range with no
polygon and no keypoints (detect) takes a lighter path (``_plain``): the same operations per row,
without the polygon bookkeeping.

After the samples' pixels, ``flipped`` mirrors the range's labels as ``sample.finish`` would
each sample's (one pass over a detect range's boxes) and hands the render loop its labels joined.
"""

from __future__ import annotations

import numpy as np

from ...shared.task import TaskSpec
from .affine import is_perspective
from .labels import Labels, transform_rows
from .sample import Draft, Pre
from .sample import pre_labels as sample_pre_labels

__all__ = ["Drawn", "flipped", "pre_labels"]


# Polygon points gathered at once at most (unless one sample has more): a segment sample's
# polygons are resampled to a thousand points each, ~30k per mosaic, and the arrays of a whole range
# of them leave the cache, which costs more than the calls a range saves (measured: coco128).
POINTS_PER_GATHER = 1 << 15


def pre_labels(drafts: list[Draft], imgsz: int, spec: TaskSpec) -> list[Labels]:
    """Each draft's main pre-transform labels (``sample.pre_labels``), in pixels of the output."""
    pres = [d.pre for d in drafts]
    plain = _plain(pres, imgsz, spec)
    if plain is not None:
        return plain
    placed = [t for p in pres for t, *_ in p.placed if len(t.classes)]
    keypoints = sum(t.keypoints is not None for t in placed)
    if 0 < keypoints < len(placed):
        return [sample_pre_labels(p, imgsz, spec) for p in pres]
    out: list[Labels] = []
    for chunk in _chunks(pres):
        out.extend(_gathered(chunk, imgsz, spec))
    return out


class Drawn(list):
    """A range's labels, one ``Labels`` per sample, with ``joined`` their ``Labels.concat`` where it
    was made on the way (else None)."""

    joined: Labels | None = None


def flipped(labels: list[Labels], flips: list[tuple[bool, bool]], imgsz: int, spec: TaskSpec) -> Drawn:
    """Each sample's labels flipped as ``sample.finish`` flips them (``flips``: its (up-down,
    left-right) pair, ``Pending.flip_ud`` and ``flip_lr``; the labels of ``finish(flip_labels=False)``).

    Where no sample has polygon points or keypoints (a detect range) the flips are one pass over the
    range's boxes, the same float32 ``S - x`` per flipped coordinate (``Labels.flipped``), and the
    result holds the range's labels joined; else each sample through ``Labels.flipped``."""
    out = Drawn()
    if any(len(one.points) or one.keypoints is not None for one in labels):
        for one, (ud, lr) in zip(labels, flips):
            if ud:
                one = one.flipped(imgsz, imgsz, horizontal=False, flip_idx=spec.flip_idx)
            if lr:
                one = one.flipped(imgsz, imgsz, horizontal=True, flip_idx=spec.flip_idx)
            out.append(one)
        return out
    every = Labels.concat(labels)
    counts = [len(one) for one in labels]
    if len(every) and any(ud or lr for ud, lr in flips):
        boxes, side = every.boxes.copy(), np.float32(imgsz)
        old = every.boxes
        for flags, (lo, hi) in (([ud for ud, _ in flips], (1, 3)), ([lr for _, lr in flips], (0, 2))):
            if any(flags):
                rows = np.repeat(np.array(flags), counts)
                boxes[rows, lo] = side - old[rows, hi]
                boxes[rows, hi] = side - old[rows, lo]
        every = Labels(every.classes, boxes, every.points, every.offsets, None)
    empty = every.points
    at = 0
    for n in counts:
        out.append(Labels(every.classes[at : at + n], every.boxes[at : at + n], empty, np.zeros(n + 1, np.int64)))
        at += n
    out.joined = every
    return out


def _plain(pres: list[Pre], imgsz: int, spec: TaskSpec) -> list[Labels] | None:
    """``_gathered`` where no record has a polygon or keypoints (a detect range), else None: the
    same float32 place, clip and filter per row, each row's part geometry and sample's matrix and
    scale gathered as arrays, without the polygon bookkeeping."""
    classes: list[np.ndarray] = []
    boxes: list[np.ndarray] = []
    parts: list[int] = []  # per part, flat: w, h, padw, padh
    sizes: list[int] = []
    owners: list[int] = []
    samples: list[float] = []  # per sample, flat: the matrix's nine entries, the scale
    canvases: list[int] = []
    before: list[int] = []  # per sample: its instances before the filter
    perspective = False
    for s, p in enumerate(pres):
        m = p.matrix
        perspective = perspective or m[6] != 0 or m[7] != 0
        samples.extend(m)
        samples.append(p.scale)
        canvases.append(p.canvas)
        total = 0
        for t, w, h, pw, ph in p.placed:
            n = len(t.classes)
            if not n:  # ``Labels.concat`` drops empty parts
                continue
            if t.polygons or t.keypoints is not None:
                return None
            classes.append(t.classes)
            boxes.append(t.boxes)
            parts += (w, h, pw, ph)
            sizes.append(n)
            owners.append(s)
            total += n
        before.append(total)
    count = len(pres)
    if not sizes:
        return [Labels.empty() for _ in range(count)]
    repeats = np.array(sizes, np.int64)
    owner = np.repeat(np.array(owners, np.int64), repeats)
    # each row's part's w, h, w, h and padw, padh, padw, padh, float32 as ``Labels.from_placed``
    # takes them, as contiguous (n, 4) arrays (numpy runs a strided (n, 4) slice as n calls)
    placing = np.repeat(np.array(parts, np.float32).reshape(-1, 4), repeats, axis=0)
    try:
        placed = np.concatenate(boxes, dtype=np.float32, casting="unsafe").reshape(-1, 4)
        kinds = np.concatenate(classes, dtype=np.int32, casting="unsafe").reshape(-1)
    except ValueError:  # parts of different shapes ((n, 4) and flat): each reshaped first
        placed = np.concatenate([np.asarray(b, dtype=np.float32).reshape(-1, 4) for b in boxes])
        kinds = np.concatenate([np.asarray(c, dtype=np.int32).reshape(-1) for c in classes])
    placed *= placing.take(_SIZES, axis=1)
    placed += placing.take(_PADS, axis=1)
    # ``Labels.clip`` per row's canvas (float32); one bound when every sample has the same canvas
    if min(canvases) == max(canvases):
        placed.clip(0, np.float32(canvases[0]), out=placed)
    else:
        placed.clip(0, np.array(canvases, np.float32)[owner, None], out=placed)
    # the matrix entries, then the scale, each as an (n, 1) column of the rows' samples' values
    columns = np.array(samples, np.float64).reshape(count, 10).T.take(owner, axis=1)[:, :, None]
    empty = np.zeros((0, 2), np.float32)
    labels = Labels(kinds, placed, empty, np.zeros(len(kinds) + 1, np.int64))
    moved, keep = transform_rows(
        labels,
        list(columns[:9]),
        ((columns[6] != 0) | (columns[7] != 0)).reshape(-1) if perspective else None,
        columns[9].astype(np.float32),
        imgsz,
        owner=owner,
        rotated=spec.rotated,
        visible=spec.has_masks,
    )
    kept_classes, kept_boxes = moved.classes[keep], moved.boxes[keep]
    edges = [0, *np.cumsum(np.bincount(owner[keep], minlength=count)).tolist()]
    # a sample without an instance before the filter has the labels of ``Labels.empty()``
    return [
        Labels(kept_classes[a:b], kept_boxes[a:b], empty, np.zeros(b - a + 1, np.int64)) if n else Labels.empty()
        for a, b, n in zip(edges[:-1], edges[1:], before)
    ]


_SIZES = np.array([0, 1, 0, 1])  # w, h, w, h of a part's row
_PADS = np.array([2, 3, 2, 3])  # padw, padh, padw, padh


def _chunks(pres: list[Pre]) -> list[list[Pre]]:
    """The samples in runs of at most ``POINTS_PER_GATHER`` polygon points (a sample with more alone)."""
    chunks: list[list[Pre]] = [[]]
    total = 0
    for p in pres:
        points = sum(sum(map(len, t.polygons)) for t, *_ in p.placed)
        if chunks[-1] and total + points > POINTS_PER_GATHER:
            chunks.append([])
            total = 0
        chunks[-1].append(p)
        total += points
    return chunks if pres else []


def _gathered(pres: list[Pre], imgsz: int, spec: TaskSpec) -> list[Labels]:
    """``pre_labels`` for every row of the range at once: the records' labels placed on their
    canvases (``Labels.from_placed``) and clipped to them (``Labels.clip``, a bound per row), through
    their samples' matrices and filtered (``labels.transform_rows``), split back per sample
    (``Labels.rows``)."""
    count = len(pres)
    owners: list[int] = []
    parts: list = []
    sizes: list[int] = []
    for s, p in enumerate(pres):
        for part in p.placed:
            n = len(part[0].classes)
            if n:  # ``Labels.concat`` drops empty parts
                owners.append(s)
                parts.append(part)
                sizes.append(n)
    if not parts:
        return [Labels.empty() for _ in range(count)]
    owner = np.repeat(np.array(owners, np.int64), sizes)
    canvas = np.array([p.canvas for p in pres], np.int64)[owner]
    placed = Labels.from_placed(parts).clip(canvas, canvas, rotated=spec.rotated)
    matrices = np.array([p.matrix for p in pres], np.float64).reshape(-1, 9)[owner]
    entries = [matrices[:, k : k + 1] for k in range(9)]
    perspective = np.array([is_perspective(p.matrix) for p in pres])
    perspective = perspective[owner] if perspective.any() else None
    moved, keep = transform_rows(
        placed,
        entries,
        perspective,
        np.array([p.scale for p in pres], np.float32)[owner, None],
        imgsz,
        owner=owner,
        rotated=spec.rotated,
        visible=spec.has_masks,
    )
    kept = moved.select(keep)
    bounds = np.zeros(count + 1, np.int64)
    np.cumsum(np.bincount(owner[keep], minlength=count), out=bounds[1:])
    edges = bounds.tolist()
    rows = np.bincount(owners, sizes, minlength=count).tolist()
    # a sample without an instance before the filter has the labels of ``Labels.empty()``
    return [kept.rows(a, b) if n else Labels.empty() for a, b, n in zip(edges[:-1], edges[1:], rows)]
