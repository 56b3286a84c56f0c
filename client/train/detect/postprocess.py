"""Detector maps -> pixel boxes and scores -> per-image detections (torch-only NMS).

Runs in the trainer process at validation, after the forward pass; not inside the captured
step (NMS output sizes depend on the data, and it reads back to the host once per kept box).
torchvision's ``batched_nms`` is not available beside the CPU torch build, so greedy NMS
is written here.

Candidates are every (anchor, class) pair whose score exceeds ``conf_thres`` (several
labels per box, as YOLOv8 validates), at most ``max_candidates`` of them by score. The
result is greedy NMS's: walk them in score order, keep a box unless a kept box of its class
overlaps it by more than ``iou_thres``, stop after ``max_det`` kept boxes.

It is computed in blocks of ``_BLOCK`` candidates in score order, with batched IoU instead
of one box at a time (a torch step per kept box, each an IoU against every candidate, made
validation of a barely trained model, 30000 candidates an image, slower than its training
epoch). A block first drops what the boxes kept so far suppress (one (block, kept) IoU
matrix, at most ``max_det`` columns), then settles itself from its (block, block)
suppression matrix, computed at once: a walk down its rows on the host keeps a row not yet
suppressed and ORs its row into the suppressed set, a numpy step per kept box instead of a
torch IoU. Blocks end once ``max_det`` boxes are kept. IoU values are the same elementwise
``box_iou`` either way, so the kept boxes equal the one-at-a-time walk's
(``tests/unit/test_detect_postprocess.py`` keeps that walk as its reference).
"""

from __future__ import annotations

import numpy as np
import torch

from ....shared.errors import ConfigError
from .boxes import box_iou, dfl_decode, flatten_levels, make_anchors


def decode(feats: list[torch.Tensor], strides: tuple[int, ...], reg_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's maps -> xyxy boxes (B, A, 4) in pixels and class probabilities (B, A, C)."""
    distribution, logits = flatten_levels(feats, reg_max)
    anchor_points, anchor_strides = make_anchors(feats, strides)
    boxes = dfl_decode(distribution, anchor_points, reg_max) * anchor_strides
    return boxes, logits.sigmoid()


@torch.no_grad()
def nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    *,
    conf_thres: float = 0.001,
    iou_thres: float = 0.7,
    max_det: int = 300,
    max_candidates: int = 30000,
) -> list[torch.Tensor]:
    """Class-aware greedy NMS per image: ``boxes`` (B, A, 4) xyxy, ``scores`` (B, A, C) ->
    one (n, 6) tensor ``x1, y1, x2, y2, score, class`` per image, by descending score."""
    if boxes.ndim != 3 or boxes.shape[-1] != 4 or scores.ndim != 3 or scores.shape[:2] != boxes.shape[:2]:
        raise ConfigError(
            f"nms got boxes {tuple(boxes.shape)} and scores {tuple(scores.shape)}; expected (B, A, 4) and (B, A, C) from decode"
        )
    if max_det < 1:
        raise ConfigError.for_field("max_det", max_det, "must be at least 1 detection per image (300 is customary)")
    return [
        _nms_image(b, s, conf_thres=conf_thres, iou_thres=iou_thres, max_det=max_det, max_candidates=max_candidates)
        for b, s in zip(boxes, scores)
    ]


# Candidates settled per block: a (block, block) IoU matrix, 4 MiB of float32 at 1024.
_BLOCK = 1024


def _nms_image(
    boxes: torch.Tensor, scores: torch.Tensor, *, conf_thres: float, iou_thres: float, max_det: int, max_candidates: int
) -> torch.Tensor:
    anchor, label = (scores > conf_thres).nonzero(as_tuple=True)
    candidate_scores = scores[anchor, label]
    # Stable sort so equal scores keep anchor order: the result does not depend on the
    # sort algorithm, and a reference in the same order can reproduce it exactly.
    order = candidate_scores.sort(descending=True, stable=True).indices[:max_candidates]
    cand_boxes, cand_scores, cand_labels = boxes[anchor[order]], candidate_scores[order], label[order]

    kept: list[torch.Tensor] = []  # indices into the candidates, by score
    count = 0
    for start in range(0, len(order), _BLOCK):
        block = torch.arange(start, min(start + _BLOCK, len(order)), device=boxes.device)
        if kept:
            previous = torch.cat(kept)
            hit = _suppresses(cand_boxes, cand_labels, previous, block, iou_thres)
            block = block[~hit.any(0)]
        if not len(block):
            continue
        block = block[_settle(_suppresses(cand_boxes, cand_labels, block, block, iou_thres).triu_(1), max_det - count)]
        kept.append(block)
        count += len(block)
        if count >= max_det:
            break
    keep = torch.cat(kept) if kept else torch.zeros(0, dtype=torch.long, device=boxes.device)
    return torch.cat((cand_boxes[keep], cand_scores[keep, None], cand_labels[keep, None].to(boxes.dtype)), 1)


def _suppresses(
    boxes: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, iou_thres: float
) -> torch.Tensor:
    """(len(rows), len(cols)): candidate ``rows[j]``, if kept, suppresses ``cols[i]``."""
    same_class = labels[rows][:, None] == labels[cols][None, :]
    return same_class & (box_iou(boxes[rows], boxes[cols]) > iou_thres)


def _settle(suppress: torch.Tensor, limit: int) -> torch.Tensor:
    """Greedy keep indices (at most ``limit``) of one block from its strictly upper-triangular
    suppression matrix: row i, kept, suppresses the later columns it marks."""
    rows = suppress.cpu().numpy()
    suppressed = np.zeros(rows.shape[0], dtype=bool)
    kept: list[int] = []
    for i in range(rows.shape[0]):
        if suppressed[i]:
            continue
        kept.append(i)
        if len(kept) == limit:
            break
        suppressed |= rows[i]
    return torch.tensor(kept, dtype=torch.long, device=suppress.device)
