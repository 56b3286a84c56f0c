"""Task-aligned assignment of ground-truth boxes to anchors (TOOD, as used by YOLOv8).

Runs in the trainer process, on the device, inside the training step. For each ground-
truth box the alignment metric ``s**alpha * u**beta`` (``s`` the predicted score of the
box's class, ``u`` the CIoU of the predicted box with it, clamped at 0) is computed over
the anchors whose centre lies inside the box; the ``topk`` best anchors become its
candidates. An anchor claimed by several boxes keeps the one it overlaps most. Each
positive anchor's target is its box, and a class score equal to its alignment metric
rescaled so that a box's best-aligned anchor gets that box's best IoU.

Every shape is fixed by the inputs (B, A, C and the padded T): padding rows are masked
out arithmetically, one-hot encodings are scatters into zeros, and nothing reads a value
back to the host, so the step that calls this can be captured as a CUDA graph. The cost is
dense (B, T, A) intermediates: at B=16, T=100 and 8400 anchors (640 px) each is 54 MB
in float32; choose ``max_targets`` with that in mind.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ....shared.errors import ConfigError
from .boxes import ciou


class Assignment(NamedTuple):
    """Per anchor: class index (B, A) int64, xyxy box (B, A, 4) in the input's units, class
    score targets (B, A, C) (zero off the foreground), and the foreground mask (B, A) bool.
    Off the foreground, labels and boxes are those of row 0 and carry no weight."""

    labels: torch.Tensor
    boxes: torch.Tensor
    scores: torch.Tensor
    foreground: torch.Tensor


class TaskAlignedAssigner:
    """``assign(pred_scores, pred_boxes, anchor_points, gt_labels, gt_boxes, gt_mask)``.

    Inputs: predicted class probabilities (B, A, C) (after the sigmoid), predicted xyxy
    boxes (B, A, 4) and anchor points (A, 2), both in pixels; padded ground truth: labels
    (B, T) (any integer dtype), xyxy boxes (B, T, 4) in pixels and the validity mask (B, T)
    bool. Runs under ``no_grad``: the targets are constants for the loss."""

    def __init__(self, *, topk: int = 10, alpha: float = 0.5, beta: float = 6.0, eps: float = 1e-9):
        if topk < 1:
            raise ConfigError.for_field("topk", topk, "must be at least 1 (10 is customary)")
        self.topk = topk
        self.alpha = alpha
        self.beta = beta
        self.eps = eps

    @torch.no_grad()
    def __call__(
        self,
        pred_scores: torch.Tensor,
        pred_boxes: torch.Tensor,
        anchor_points: torch.Tensor,
        gt_labels: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_mask: torch.Tensor,
    ) -> Assignment:
        batch, anchors, num_classes = pred_scores.shape
        slots = gt_boxes.shape[1]
        if slots < 1:
            raise ConfigError(f"ground truth has {slots} rows per image; pad to max_targets >= 1 (pad_targets)")
        if gt_boxes.shape != (batch, slots, 4) or gt_mask.shape != (batch, slots) or gt_labels.shape != (batch, slots):
            raise ConfigError(
                f"ground truth shapes labels {tuple(gt_labels.shape)}, boxes {tuple(gt_boxes.shape)}, mask {tuple(gt_mask.shape)} "
                f"do not match (B, T) = ({batch}, {slots}); pad them with pad_targets"
            )
        labels = gt_labels.long().clamp(0, num_classes - 1)
        in_box = self._centres_inside(anchor_points, gt_boxes) & gt_mask[:, :, None]  # (B, T, A)
        valid = in_box.to(pred_scores.dtype)

        overlaps = ciou(gt_boxes[:, :, None, :], pred_boxes[:, None, :, :]).clamp(min=0) * valid
        class_scores = pred_scores.permute(0, 2, 1).gather(1, labels[:, :, None].expand(batch, slots, anchors)) * valid
        align = class_scores.pow(self.alpha) * overlaps.pow(self.beta)

        top = align.topk(min(self.topk, anchors), dim=-1).indices  # (B, T, k)
        positive = torch.zeros_like(align).scatter_(-1, top, 1.0) * valid  # (B, T, A) 0/1

        # An anchor claimed by several boxes keeps the positive box it overlaps most; the
        # -1 keeps non-positive boxes (padding included) out of the argmax.
        claimed = positive.sum(1)  # (B, A)
        best = torch.where(positive > 0, overlaps, -1.0).argmax(1)  # (B, A)
        only_best = torch.zeros_like(positive).scatter_(1, best[:, None, :], 1.0)
        positive = torch.where((claimed > 1)[:, None, :], only_best, positive)
        foreground = positive.sum(1) > 0  # (B, A)

        box_index = positive.argmax(1)  # (B, A); row 0 where no box, masked below
        target_labels = labels.gather(1, box_index)
        target_boxes = gt_boxes.gather(1, box_index[:, :, None].expand(batch, anchors, 4))
        one_hot = torch.zeros_like(pred_scores).scatter_(-1, target_labels[:, :, None], 1.0)

        # Soft targets: the metric of each positive, scaled per box so that its best anchor
        # scores the box's best IoU (TOOD's normalisation).
        align = align * positive
        best_align = align.amax(-1, keepdim=True)
        best_overlap = (overlaps * positive).amax(-1, keepdim=True)
        norm = (align * best_overlap / (best_align + self.eps)).amax(1)  # (B, A)
        target_scores = one_hot * (norm * foreground)[:, :, None]
        return Assignment(target_labels, target_boxes, target_scores, foreground)

    def _centres_inside(self, anchor_points: torch.Tensor, gt_boxes: torch.Tensor) -> torch.Tensor:
        """(B, T, A) bool: the anchor point lies strictly inside the box."""
        points = anchor_points[None, None]  # (1, 1, A, 2)
        top_left = points - gt_boxes[:, :, None, :2]
        bottom_right = gt_boxes[:, :, None, 2:] - points
        return torch.cat((top_left, bottom_right), -1).amin(-1) > self.eps
