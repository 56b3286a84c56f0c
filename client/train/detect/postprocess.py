"""Detector maps -> pixel boxes and scores -> per-image detections (torch-only NMS).

Runs in the trainer process at validation, after the forward pass; not inside the captured
step (NMS output sizes depend on the data, and it reads back to the host once per kept box).
torchvision's ``batched_nms`` is not available beside the CPU torch build, so greedy NMS
is written here.

Candidates are every (anchor, class) pair whose score exceeds ``conf_thres`` (several
labels per box, as YOLOv8 validates), at most ``max_candidates`` of them by score. Greedy
NMS then walks them in score order, keeping a box and suppressing every later box of the
same class whose IoU with it exceeds ``iou_thres``; it stops after ``max_det`` kept boxes,
which is the same result as suppressing all and truncating, at ``max_det`` steps of O(n)
instead of an O(n^2) IoU matrix.
"""

from __future__ import annotations

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


def _nms_image(
    boxes: torch.Tensor, scores: torch.Tensor, *, conf_thres: float, iou_thres: float, max_det: int, max_candidates: int
) -> torch.Tensor:
    anchor, label = (scores > conf_thres).nonzero(as_tuple=True)
    candidate_scores = scores[anchor, label]
    # Stable sort so equal scores keep anchor order: the result does not depend on the
    # sort algorithm, and a reference in the same order can reproduce it exactly.
    order = candidate_scores.sort(descending=True, stable=True).indices[:max_candidates]
    cand_boxes, cand_scores, cand_labels = boxes[anchor[order]], candidate_scores[order], label[order]

    alive = torch.ones(len(order), dtype=torch.bool, device=boxes.device)
    kept: list[int] = []
    while len(kept) < max_det:
        alive_index = alive.nonzero()
        if not len(alive_index):
            break
        first = int(alive_index[0, 0])
        kept.append(first)
        same_class = cand_labels == cand_labels[first]
        overlap = box_iou(cand_boxes[first : first + 1], cand_boxes)[0]
        alive &= ~(same_class & (overlap > iou_thres))
        alive[first] = False
    keep = torch.tensor(kept, dtype=torch.long, device=boxes.device)
    return torch.cat((cand_boxes[keep], cand_scores[keep, None], cand_labels[keep, None].to(boxes.dtype)), 1)
