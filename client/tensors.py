"""What the Client yields: a ``TrainerBatch`` of numpy views, owned copies, or torch tensors.

Runs in the trainer process, in the caller's thread, once per batch. The arrays come from
the delivery reader (``delivery.py``): views of a ring slot or of received frames, valid
until the slot is released. ``to_batch`` decides what the caller gets:

- numpy views (``zero_copy``, no torch): the cheapest, valid until the next batch;
- numpy copies (``zero_copy=False``): the caller's own;
- torch tensors (``as_torch``): on the CPU a view of the slot, or the caller's own copy
  without ``zero_copy``; on another device the caller's own already (a copy from pageable
  memory has read its source when ``to`` returns, ``non_blocking`` or not); with HSV on
  the device applied there (training streams only: validation streams get no HSV).

``samples`` is always the caller's own (a copy of B integers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..shared.stream.config import StreamSettings
from ._torch import require_torch


@dataclass(frozen=True)
class TrainerBatch:
    """One delivered batch. ``images`` uint8 (B, 3, S, S) RGB (numpy, or torch when asked)."""

    images: Any
    targets: Any  # float32 (n, 6): batch_index, class, cx, cy, w, h (normalised)
    samples: np.ndarray  # int64 (B,) record indices
    epoch: int
    batch: int


@dataclass(frozen=True)
class Conversion:
    """How a Client turns slot arrays into a batch (fixed when the Client is made)."""

    as_torch: bool
    zero_copy: bool
    device: Any = None


def to_batch(
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray], ready: dict, how: Conversion, settings: StreamSettings
) -> TrainerBatch:
    images, targets, samples = arrays
    samples = samples.copy()  # B integers: never worth a view
    if how.as_torch:
        images, targets = _to_torch(images, targets, samples, ready["epoch"], how, settings)
    elif not how.zero_copy:
        images, targets = images.copy(), targets.copy()
    return TrainerBatch(images=images, targets=targets, samples=samples, epoch=ready["epoch"], batch=ready["batch"])


def _to_torch(images, targets, samples, epoch: int, how: Conversion, settings: StreamSettings):
    torch = require_torch("a Client that yields torch tensors (as_torch, device or hsv_on_device)")
    on_host = how.device is None or torch.device(how.device).type == "cpu"
    own = not how.zero_copy and on_host
    timg = torch.from_numpy(images.copy() if own or not images.flags.writeable else images)
    ttgt = torch.from_numpy(targets.copy() if own or not targets.flags.writeable else targets)
    if how.device is not None:
        timg = timg.to(how.device, non_blocking=True)
        ttgt = ttgt.to(how.device, non_blocking=True)
    if settings.hsv_on_device and settings.augment.augment:  # validation streams get no HSV
        from .hsv_torch import apply_hsv

        timg = apply_hsv(timg, settings, epoch, samples)
    return timg, ttgt
