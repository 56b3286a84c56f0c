"""Box arithmetic for the detector: formats, IoU, CIoU, anchor points and DFL decoding.

Runs in the trainer process, on whatever device the tensors live on (inside the captured
training step and in validation). torchvision's box ops are not used: torchvision does
not import beside the CPU torch build the project installs. Every function is shape-
static (no data-dependent shapes, no host reads), so the loss can be captured as a graph.

Conventions: ``xyxy`` is (x1, y1, x2, y2), ``xywh`` is (cx, cy, w, h); the last dimension
holds the four numbers. Anchor points are cell centres in grid units of their level
(multiply by the level's stride for pixels).
"""

from __future__ import annotations

import math

import torch


def xywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    centre, size = boxes[..., :2], boxes[..., 2:4]
    return torch.cat((centre - size / 2, centre + size / 2), -1)


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[..., 2] - boxes[..., 0]).clamp(min=0) * (boxes[..., 3] - boxes[..., 1]).clamp(min=0)


def box_iou(a: torch.Tensor, b: torch.Tensor, *, eps: float = 1e-7) -> torch.Tensor:
    """Pairwise IoU of xyxy boxes: ``a`` (N, 4), ``b`` (M, 4) -> (N, M)."""
    top_left = torch.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(-1)
    return inter / (box_area(a)[:, None] + box_area(b)[None, :] - inter + eps)


def ciou(a: torch.Tensor, b: torch.Tensor, *, eps: float = 1e-7) -> torch.Tensor:
    """Complete IoU of xyxy boxes, elementwise over broadcast leading dimensions -> (...).

    IoU minus the squared centre distance over the squared diagonal of the enclosing box,
    minus the aspect-ratio term ``alpha * v`` (Zheng et al. 2020); ``alpha`` is a weight,
    so it is held constant for the gradient, as the paper prescribes. ``eps`` keeps
    degenerate (zero-size, e.g. padding) boxes finite, forward and backward."""
    ax1, ay1, ax2, ay2 = a.unbind(-1)
    bx1, by1, bx2, by2 = b.unbind(-1)
    aw, ah = ax2 - ax1, ay2 - ay1 + eps
    bw, bh = bx2 - bx1, by2 - by1 + eps
    inter = (torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp(min=0) * (
        torch.minimum(ay2, by2) - torch.maximum(ay1, by1)
    ).clamp(min=0)
    union = aw * ah + bw * bh - inter + eps
    iou = inter / union
    enclose_w = torch.maximum(ax2, bx2) - torch.minimum(ax1, bx1)
    enclose_h = torch.maximum(ay2, by2) - torch.minimum(ay1, by1)
    diagonal2 = enclose_w**2 + enclose_h**2 + eps
    centre2 = ((bx1 + bx2 - ax1 - ax2) ** 2 + (by1 + by2 - ay1 - ay2) ** 2) / 4
    v = (4 / math.pi**2) * (torch.atan(bw / bh) - torch.atan(aw / ah)) ** 2
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (centre2 / diagonal2 + v * alpha)


def make_anchors(
    feats: list[torch.Tensor], strides: tuple[int, ...], *, offset: float = 0.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell centres of every level, row-major, levels in order: anchor points (A, 2) as
    (x, y) in grid units of their level, and the stride of each anchor (A, 1).

    Only the maps' shapes, dtype and device are read."""
    points, stride_rows = [], []
    for feat, stride in zip(feats, strides):
        height, width = feat.shape[-2:]
        xs = torch.arange(width, device=feat.device, dtype=torch.float32) + offset
        ys = torch.arange(height, device=feat.device, dtype=torch.float32) + offset
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((grid_x, grid_y), -1).reshape(-1, 2))
        stride_rows.append(torch.full((height * width, 1), float(stride), device=feat.device))
    return torch.cat(points), torch.cat(stride_rows)


def flatten_levels(feats: list[torch.Tensor], reg_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's maps as anchor rows: box distribution logits (B, A, 4 * reg_max) and class
    logits (B, A, C), in float32 (autocast may hand bf16 maps to the loss)."""
    batch, channels = feats[0].shape[:2]
    flat = torch.cat([f.reshape(batch, channels, -1) for f in feats], 2).permute(0, 2, 1).float()
    return flat[..., : 4 * reg_max], flat[..., 4 * reg_max :]


def dfl_distances(distribution: torch.Tensor, reg_max: int) -> torch.Tensor:
    """Expected distance per side from the bin logits: (..., 4 * reg_max) -> (..., 4), in
    grid units (bins 0 .. reg_max - 1)."""
    probs = distribution.reshape(*distribution.shape[:-1], 4, reg_max).softmax(-1)
    bins = torch.arange(reg_max, device=distribution.device, dtype=probs.dtype)
    return (probs * bins).sum(-1)  # elementwise, not a matmul: autocast would run a matmul in bf16


def distances_to_boxes(anchor_points: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """(left, top, right, bottom) distances from each anchor point -> xyxy boxes."""
    return torch.cat((anchor_points - distances[..., :2], anchor_points + distances[..., 2:]), -1)


def boxes_to_distances(anchor_points: torch.Tensor, boxes: torch.Tensor, reg_max: int) -> torch.Tensor:
    """xyxy boxes -> (left, top, right, bottom) from each anchor, clamped just below the last
    bin so both DFL neighbours ``floor(d)`` and ``floor(d) + 1`` are valid bins."""
    distances = torch.cat((anchor_points - boxes[..., :2], boxes[..., 2:] - anchor_points), -1)
    return distances.clamp(0, reg_max - 1 - 0.01)


def dfl_decode(distribution: torch.Tensor, anchor_points: torch.Tensor, reg_max: int) -> torch.Tensor:
    """Box distribution logits (B, A, 4 * reg_max) -> xyxy boxes (B, A, 4) in grid units."""
    return distances_to_boxes(anchor_points, dfl_distances(distribution, reg_max))
