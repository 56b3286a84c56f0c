"""The YOLOv8 detection loss: task-aligned assignment, then CIoU + BCE + DFL.

Runs in the trainer process, on the device, inside the training step (the CUDA graph on a
GPU). Given the head's maps and the padded targets (``targets.pad_targets``) it

1. decodes every anchor's box from its distance distributions (DFL, ``boxes.py``);
2. assigns ground truth to anchors with ``TaskAlignedAssigner`` on detached predictions;
3. sums the class BCE over all anchors and classes against the soft assigned scores, and
   the CIoU loss and the distribution focal loss over the foreground anchors, each weighted
   by the anchor's target score; all three are divided by the total target score (at least
   1), then scaled by their gains and the total by the batch size, as YOLOv8 does.

The published loss skips the box terms with a Python ``if`` when no anchor is foreground;
here they are computed on every anchor and weighted by the foreground mask, which gives
the same value (zero) without reading anything back to the host. Nothing else is
data-dependent either, so the call can be captured and replayed.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ....shared.errors import ConfigError
from .assign import TaskAlignedAssigner
from .boxes import boxes_to_distances, ciou, dfl_decode, flatten_levels, make_anchors, xywh_to_xyxy


def dfl_loss(distribution: torch.Tensor, distances: torch.Tensor, reg_max: int) -> torch.Tensor:
    """Distribution focal loss per anchor, mean over its four sides: (..., 4 * reg_max) logits
    and (..., 4) target distances in bins -> (...). Cross-entropy with the two bins around
    the target, weighted by how close the target is to each (Li et al., GFL, 2020)."""
    log_probs = distribution.reshape(*distribution.shape[:-1], 4, reg_max).log_softmax(-1)
    left = distances.long()
    weight_left = (left + 1).to(distances.dtype) - distances
    at_left = log_probs.gather(-1, left[..., None]).squeeze(-1)
    at_right = log_probs.gather(-1, (left + 1)[..., None]).squeeze(-1)
    return -(at_left * weight_left + at_right * (1 - weight_left)).mean(-1)


class DetectionLoss:
    """``loss(feats, targets, mask, imgsz) -> (total, parts)``.

    ``feats``: the Detector's maps, one per stride; ``targets`` (B, T, 5) ``class, cx, cy,
    w, h`` normalised to the (square) image of side ``imgsz`` pixels; ``mask`` (B, T) bool.
    ``total`` is a scalar tensor to call ``backward`` on; ``parts`` (3,) is the detached
    ``[box, cls, dfl]``, each after its gain and before the batch-size scaling."""

    def __init__(
        self,
        num_classes: int,
        *,
        reg_max: int = 16,
        strides: tuple[int, ...] = (8, 16, 32),
        box: float = 7.5,
        cls: float = 0.5,
        dfl: float = 1.5,
        topk: int = 10,
        alpha: float = 0.5,
        beta: float = 6.0,
    ):
        if num_classes < 1:
            raise ConfigError.for_field(
                "num_classes", num_classes, "must be at least 1; pass the dataset's class count"
            )
        self.num_classes = num_classes
        self.reg_max = reg_max
        self.strides = tuple(strides)
        self.gains = (box, cls, dfl)
        self.assigner = TaskAlignedAssigner(topk=topk, alpha=alpha, beta=beta)

    def __call__(
        self, feats: list[torch.Tensor], targets: torch.Tensor, mask: torch.Tensor, imgsz: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._check(feats, targets, mask)
        distribution, logits = flatten_levels(feats, self.reg_max)
        batch = logits.shape[0]
        anchor_points, anchor_strides = make_anchors(feats, self.strides)
        pred_boxes = dfl_decode(distribution, anchor_points, self.reg_max)  # grid units

        valid = mask.to(torch.float32)[:, :, None]
        gt_boxes = xywh_to_xyxy(targets[..., 1:5].float() * imgsz) * valid  # pixels; padding -> zeros
        assigned = self.assigner(
            logits.detach().sigmoid(),
            pred_boxes.detach() * anchor_strides,
            anchor_points * anchor_strides,
            targets[..., 0].long(),
            gt_boxes,
            mask,
        )
        score_sum = assigned.scores.sum().clamp(min=1.0)
        cls_loss = F.binary_cross_entropy_with_logits(logits, assigned.scores, reduction="none").sum() / score_sum

        weight = assigned.scores.sum(-1) * assigned.foreground  # (B, A); zero off the foreground
        target_boxes = assigned.boxes / anchor_strides  # grid units, like pred_boxes
        box_loss = ((1.0 - ciou(pred_boxes, target_boxes)) * weight).sum() / score_sum
        target_distances = boxes_to_distances(anchor_points, target_boxes, self.reg_max)
        distribution_loss = (dfl_loss(distribution, target_distances, self.reg_max) * weight).sum() / score_sum

        gain_box, gain_cls, gain_dfl = self.gains
        parts = torch.stack((box_loss * gain_box, cls_loss * gain_cls, distribution_loss * gain_dfl))
        return parts.sum() * batch, parts.detach()

    def _check(self, feats: list[torch.Tensor], targets: torch.Tensor, mask: torch.Tensor) -> None:
        """Shapes only (static under capture): never a tensor value."""
        channels = 4 * self.reg_max + self.num_classes
        if len(feats) != len(self.strides) or any(f.ndim != 4 or f.shape[1] != channels for f in feats):
            shapes = [tuple(f.shape) for f in feats]
            raise ConfigError(
                f"loss got maps {shapes}; expected {len(self.strides)} maps (B, {channels}, H, W) = 4 * reg_max {self.reg_max} + {self.num_classes} classes; "
                "build DetectionLoss with the Detector's num_classes and reg_max"
            )
        batch = feats[0].shape[0]
        if targets.ndim != 3 or targets.shape[0] != batch or targets.shape[2] != 5 or mask.shape != targets.shape[:2]:
            raise ConfigError(
                f"targets {tuple(targets.shape)} and mask {tuple(mask.shape)} do not fit a batch of {batch}; expected (B, T, 5) and (B, T) from pad_targets"
            )
