"""A small detector training step for trainers: CUDA-graph replay on a GPU, eager on the CPU.

Runs in the trainer process. It exists so the service can be exercised end to end (the
``pixpool demo`` main job, the serve benchmark) with the shape of work a YOLO trainer does:
uint8 batch in, forward, loss, backward, optimiser step and EMA update, with every tensor
the step touches kept at a fixed address so one captured graph can be replayed.

Targets arrive as a variable number of rows ``(batch_index, class, cx, cy, w, h)``; the
step needs fixed shapes, so ``dense_targets`` assigns each box to the grid cell holding its
centre (last writer wins, as in the simplest YOLO assignment) on the host, and the result
is copied into static buffers before each replay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

log = logging.getLogger(__name__)

STRIDE = 16


class TinyDetector(nn.Module):
    """Four stride-2 conv blocks and a 1x1 head: objectness, box (cx, cy, w, h), classes."""

    def __init__(self, num_classes: int, *, width: int = 16):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for i in range(4):
            out = width * (2**i)
            layers += [nn.Conv2d(channels, out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(out), nn.SiLU()]
            channels = out
        self.body = nn.Sequential(*layers)
        self.head = nn.Conv2d(channels, 5 + num_classes, 1)
        self.num_classes = num_classes

    def forward(self, images_uint8: torch.Tensor) -> torch.Tensor:
        x = images_uint8.float().div_(255.0)
        return self.head(self.body(x))


@dataclass
class DenseTargets:
    objectness: np.ndarray  # float32 (B, G, G)
    boxes: np.ndarray  # float32 (B, 4, G, G)
    classes: np.ndarray  # int64 (B, G, G); -100 where no object


def dense_targets(rows: np.ndarray, *, batch_size: int, imgsz: int) -> DenseTargets:
    """Grid targets from packed rows; ``rows`` is (n, 6) float32 with normalised boxes."""
    grid = imgsz // STRIDE
    obj = np.zeros((batch_size, grid, grid), np.float32)
    boxes = np.zeros((batch_size, 4, grid, grid), np.float32)
    classes = np.full((batch_size, grid, grid), -100, np.int64)
    if len(rows):
        b = rows[:, 0].astype(np.int64)
        gx = np.clip((rows[:, 2] * grid).astype(np.int64), 0, grid - 1)
        gy = np.clip((rows[:, 3] * grid).astype(np.int64), 0, grid - 1)
        obj[b, gy, gx] = 1.0
        classes[b, gy, gx] = rows[:, 1].astype(np.int64)
        for k in range(4):
            boxes[b, k, gy, gx] = rows[:, 2 + k]
    return DenseTargets(obj, boxes, classes)


def detection_loss(pred: torch.Tensor, obj: torch.Tensor, boxes: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """Objectness BCE over all cells, L1 on boxes and CE on classes where an object is."""
    obj_loss = F.binary_cross_entropy_with_logits(pred[:, 0], obj)
    mask = obj.unsqueeze(1)
    box_loss = (torch.sigmoid(pred[:, 1:5]) - boxes).abs().mul(mask).sum() / mask.sum().clamp(min=1.0)
    cls_loss = F.cross_entropy(pred[:, 5:], classes, ignore_index=-100, reduction="sum") / mask.sum().clamp(min=1.0)
    return obj_loss + box_loss + cls_loss


class TrainStep:
    """Forward + backward + optimiser + EMA over static buffers.

    On CUDA the whole step is captured once into a ``torch.cuda.CUDAGraph`` after a few
    warm-up iterations on a side stream (the capture rules in PyTorch's CUDA graphs notes:
    static inputs, grads allocated during capture, a capturable optimiser) and replayed;
    on the CPU it runs eagerly. Call ``step(images, rows)`` with a uint8 (B, 3, S, S)
    tensor or array and the packed target rows; it returns the loss as a float.
    """

    def __init__(self, *, num_classes: int, batch_size: int, imgsz: int, device: str | torch.device = "cpu",
                 lr: float = 1e-3, ema_decay: float = 0.999, use_graph: bool | None = None, warmup_steps: int = 3):
        if imgsz % STRIDE:
            raise ValueError(f"imgsz {imgsz} must be a multiple of {STRIDE}")
        self.device = torch.device(device)
        self.batch_size, self.imgsz = batch_size, imgsz
        self.model = TinyDetector(num_classes).to(self.device)
        self.ema = TinyDetector(num_classes).to(self.device)
        self.ema.load_state_dict(self.model.state_dict())
        self.ema.requires_grad_(False)
        cuda = self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, capturable=cuda)
        self.ema_decay = ema_decay
        grid = imgsz // STRIDE
        self.static_images = torch.zeros((batch_size, 3, imgsz, imgsz), dtype=torch.uint8, device=self.device)
        self.static_obj = torch.zeros((batch_size, grid, grid), device=self.device)
        self.static_boxes = torch.zeros((batch_size, 4, grid, grid), device=self.device)
        self.static_classes = torch.full((batch_size, grid, grid), -100, dtype=torch.long, device=self.device)
        self.use_graph = cuda if use_graph is None else (use_graph and cuda)
        self.warmup_steps = warmup_steps
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_loss: torch.Tensor | None = None
        self.steps = 0
        # Pinned host staging: the copy to the device is asynchronous and the batch slot
        # can be released as soon as the staging copy is done.
        pin = cuda
        self._stage_images = torch.empty(self.static_images.shape, dtype=torch.uint8, pin_memory=pin)

    def _eager_step(self) -> torch.Tensor:
        pred = self.model(self.static_images)
        loss = detection_loss(pred, self.static_obj, self.static_boxes, self.static_classes)
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(list(self.ema.parameters()), list(self.model.parameters()), 1.0 - self.ema_decay)
        return loss.detach()

    def _capture(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup_steps):
                self.optimizer.zero_grad(set_to_none=True)
                self._eager_step()
        torch.cuda.current_stream().wait_stream(side)
        self.optimizer.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_loss = self._eager_step()
        log.info("captured the training step as a CUDA graph after %d warm-up steps", self.warmup_steps)

    def load(self, images, rows: np.ndarray) -> None:
        """Copy one batch into the static buffers (images through pinned staging)."""
        src = images if isinstance(images, torch.Tensor) else torch.from_numpy(np.asarray(images))
        if tuple(src.shape) != tuple(self.static_images.shape):
            raise ValueError(f"batch of shape {tuple(src.shape)} does not fit the step's static shape {tuple(self.static_images.shape)}")
        dense = dense_targets(np.asarray(rows, np.float32).reshape(-1, 6), batch_size=self.batch_size, imgsz=self.imgsz)
        nb = self.device.type == "cuda"
        if src.device.type == "cpu":
            self._stage_images.copy_(src)
            src = self._stage_images
        self.static_images.copy_(src, non_blocking=nb)
        self.static_obj.copy_(torch.from_numpy(dense.objectness), non_blocking=nb)
        self.static_boxes.copy_(torch.from_numpy(dense.boxes), non_blocking=nb)
        self.static_classes.copy_(torch.from_numpy(dense.classes), non_blocking=nb)

    def step(self, images, rows: np.ndarray) -> float:
        self.load(images, rows)
        if self.use_graph:
            if self.graph is None:
                self._capture()
            self.graph.replay()
            loss = self.static_loss
        else:
            self.optimizer.zero_grad(set_to_none=True)
            loss = self._eager_step()
        self.steps += 1
        return float(loss.item())
