"""The training step of the reference detector over static buffers: a CUDA graph on a GPU,
eager on the CPU.

Runs in the trainer process. Every tensor the step touches keeps its address and shape:
images (B, 3, S, S) uint8, targets padded to ``max_targets`` per image with a mask
(``detect.targets.pad_targets``), the learning rate and the EMA decay as device tensors the
step reads. Batches arrive through ``feeder.Feeder`` (on CUDA the copy of batch n+1
overlaps step n). So on CUDA, after a few warm-up steps on a side stream (PyTorch's
CUDA-graph rules), forward, loss, backward, optimizer and EMA are captured once and replayed; losses
add up in a device tensor that ``losses()`` reads (one host synchronisation per read, not per
step). bf16 autocast on CUDA. On the CPU the same code runs eagerly, deterministically.

Optimiser: SGD (momentum, Nesterov) or AdamW, weight decay on weights only (not on biases
and norm scales); the LR warms up linearly, then follows a cosine (or linear) decay to
``final_lr_fraction`` of itself (``lr_at``). EMA of the weights with the customary ramp
``decay * (1 - exp(-updates / tau))``.
"""

from __future__ import annotations

import copy
import logging
import math

import numpy as np
import torch

from .detect.loss import DetectionLoss
from .detect.model import Detector
from .detect.targets import pad_targets
from .feeder import Feeder

log = logging.getLogger(__name__)


def lr_at(
    step: int,
    *,
    lr: float,
    warmup_steps: int,
    total_steps: int,
    schedule: str = "cosine",
    final_lr_fraction: float = 0.01,
) -> float:
    """The learning rate of ``step`` (0-based): linear warm-up, then cosine or linear decay."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    t = min(1.0, (step - warmup_steps) / span)
    final = lr * final_lr_fraction
    if schedule == "linear":
        return lr + (final - lr) * t
    return final + (lr - final) * 0.5 * (1 + math.cos(math.pi * t))


def ema_decay_at(updates: int, *, decay: float = 0.9999, tau: float = 2000.0) -> float:
    return decay * (1 - math.exp(-updates / tau))


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            (decay if name == "weight" and p.ndim > 1 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class DetectorStep:
    """Forward + loss + backward + optimizer + EMA over static buffers (see module docstring)."""

    def __init__(
        self,
        *,
        num_classes: int,
        batch_size: int,
        imgsz: int,
        max_targets: int,
        total_steps: int,
        device: str | torch.device = "cpu",
        scale: str = "n",
        optimizer: str = "SGD",
        lr: float = 0.01,
        momentum: float = 0.937,
        weight_decay: float = 5e-4,
        warmup_steps: int = 100,
        schedule: str = "cosine",
        final_lr_fraction: float = 0.01,
        ema_decay: float = 0.9999,
        ema_tau: float = 2000.0,
        seed: int = 0,
        use_graph: bool | None = None,
        graph_warmup_steps: int = 3,
    ):
        if optimizer not in ("SGD", "AdamW"):
            raise ValueError(f"optimizer {optimizer!r}: use SGD or AdamW")
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.batch_size, self.imgsz, self.max_targets = batch_size, imgsz, max_targets
        self.schedule = dict(
            lr=lr,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            schedule=schedule,
            final_lr_fraction=final_lr_fraction,
        )
        self.ema_params = dict(decay=ema_decay, tau=ema_tau)
        torch.manual_seed(seed)
        self.model = Detector(num_classes, scale=scale).to(self.device)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        self.loss = DetectionLoss(num_classes, reg_max=self.model.reg_max, strides=self.model.strides)
        groups = _param_groups(self.model, weight_decay)
        # The LR lives in a device tensor the (captured) optimizer step reads.
        self.lr = torch.tensor(lr_at(0, **self.schedule), device=self.device) if cuda else lr_at(0, **self.schedule)
        if optimizer == "SGD":
            self.optimizer = torch.optim.SGD(groups, lr=self.lr, momentum=momentum, nesterov=True)
        else:
            self.optimizer = torch.optim.AdamW(groups, lr=self.lr, betas=(momentum, 0.999), capturable=cuda)
        self.ema_weight = torch.zeros((), device=self.device)  # 1 - decay of the coming update
        self.feeder = Feeder(batch_size=batch_size, imgsz=imgsz, max_targets=max_targets, device=self.device)
        self.static_images, self.static_targets, self.static_mask = (
            self.feeder.static[k] for k in ("images", "targets", "mask")
        )
        self.loss_sum = torch.zeros(4, device=self.device)  # total, box, cls, dfl since the last read
        self._summed = 0
        self.use_graph = cuda if use_graph is None else (use_graph and cuda)
        self.graph_warmup_steps = graph_warmup_steps
        self.graph: torch.cuda.CUDAGraph | None = None
        self.steps = 0  # optimizer steps taken (the schedule's position)

    # -- one step ---------------------------------------------------------------------------
    def _compute(self) -> None:
        x = self.static_images.float().div_(255.0)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            feats = self.model(x)
        total, parts = self.loss([f.float() for f in feats], self.static_targets, self.static_mask, self.imgsz)
        total.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)  # grads keep their addresses for the graph
        with torch.no_grad():
            w = self.ema_weight
            ema_p, model_p = list(self.ema.parameters()), list(self.model.parameters())
            torch._foreach_mul_(ema_p, 1 - w)
            torch._foreach_add_(ema_p, torch._foreach_mul(model_p, w))
            for e, m in zip(self.ema.buffers(), self.model.buffers()):
                e.copy_(m)
            self.loss_sum.add_(torch.cat((total.detach().reshape(1), parts.detach())))

    def _capture(self) -> None:
        # The warm-up steps (which allocate gradients and optimizer state before capture, as
        # PyTorch's CUDA-graph rules require) really train: keep what they change, and put it
        # back once captured (in place: the graph holds these addresses), so the first replay
        # is the run's first step and graph and eager runs stay step for step the same.
        saved = [t.detach().clone() for t in self._state_tensors()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.graph_warmup_steps):
                self._compute()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._compute()
        with torch.no_grad():
            for t, value in zip(self._state_tensors(), saved):
                t.copy_(value)
            # Optimizer state did not exist before the warm-up; zeros are what a first step
            # starts from (SGD's momentum buffer: mu * 0 + grad = grad; Adam's moments, step 0).
            for state in self.optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        value.zero_()
            self.loss_sum.zero_()
        log.info("captured the training step as a CUDA graph after %d warm-up steps", self.graph_warmup_steps)

    def _state_tensors(self) -> list[torch.Tensor]:
        return [*self.model.parameters(), *self.model.buffers(), *self.ema.parameters(), *self.ema.buffers()]

    def load(self, images, rows: np.ndarray, files=None) -> None:
        """Hand one batch to the feeder (targets padded per image); the ring slot may be
        released once this returns."""
        src = images if isinstance(images, torch.Tensor) else torch.from_numpy(np.asarray(images))
        if tuple(src.shape) != tuple(self.static_images.shape):
            raise ValueError(
                f"batch of shape {tuple(src.shape)} does not fit the step's static shape {tuple(self.static_images.shape)}"
            )
        targets, mask = pad_targets(
            np.asarray(rows, np.float32).reshape(-1, 6), self.batch_size, self.max_targets, files=files
        )
        self.feeder.put(src, targets, mask)

    def step(self, images=None, rows: np.ndarray | None = None, files=None) -> None:
        """Train on one batch (given here, or handed over before with ``load``); the loss
        adds up on the device (read it with ``losses``). On CUDA this only enqueues work."""
        if images is not None:
            self.load(images, rows, files)
        self.feeder.take()
        lr = lr_at(self.steps, **self.schedule)
        if isinstance(self.lr, torch.Tensor):
            self.lr.fill_(lr)
        else:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        self.ema_weight.fill_(1 - ema_decay_at(self.steps + 1, **self.ema_params))
        if self.use_graph:
            if self.graph is None:
                self._capture()
            self.graph.replay()
        else:
            self._compute()
        self.steps += 1
        self._summed += 1

    def losses(self) -> dict[str, float] | None:
        """Mean losses since the last call (one read from the device), or None if no step."""
        if not self._summed:
            return None
        total, box, cls, dfl = (self.loss_sum / self._summed).tolist()
        self.loss_sum.zero_()
        self._summed = 0
        return {"loss": total, "box": box, "cls": cls, "dfl": dfl}

    @property
    def unread_steps(self) -> int:
        """Steps whose losses are summed on the device but not read yet."""
        return self._summed

    @property
    def current_lr(self) -> float:
        return lr_at(max(0, self.steps - 1), **self.schedule)

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        if isinstance(self.lr, torch.Tensor):  # load_state_dict replaced the group's lr with a plain value
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr
        self.steps = int(state["steps"])
