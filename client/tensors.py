"""What the Client yields: a ``TrainerBatch`` of numpy views, owned copies, or torch tensors.

Runs in the trainer process, in the caller's thread, once per batch. The arrays come from
the delivery reader (``delivery.py``): views of a ring slot or of received frames, valid
until the slot is released. ``to_batch`` decides what the caller gets:

- numpy views (``zero_copy``, no torch): the cheapest, valid until the next batch;
- numpy copies (``zero_copy=False``): the caller's own;
- torch tensors (``as_torch``): on the CPU a view of the slot, or the caller's own copy
  without ``zero_copy``; on another device the caller's own already (a copy from pageable
  memory has read its source when ``to`` returns, ``non_blocking`` or not); with HSV on
  the device applied there (training streams only: validation streams get no HSV);
- lent torch images (``lend``, the Client's choice for a caller that owns its batches: see
  ``flow.py``): a tensor over the slot itself, which the Client gives back to the daemon only
  once no tensor of that storage is left. Targets and masks are copies then (small; and
  ``masks`` lives on the batch's type, which only the cyclic collector frees).

``samples`` is always the caller's own (a copy of B integers). ``masks`` (segment batches:
the mask planes, (B, M, M) uint8 or int32; None for the other tasks) go the way the images
go: a view of the slot where the images are one, else the caller's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..shared.stream.config import StreamSettings
from ..shared.stream.route import Route
from ._torch import require_torch


@dataclass(frozen=True)
class TrainerBatch:
    """One delivered batch. ``images`` uint8 (B, 3, S, S) RGB (numpy, or torch when asked)."""

    images: Any
    targets: Any  # float32 (n, W): batch_index, class, cx, cy, w, h (normalised), then the task's columns
    samples: np.ndarray  # int64 (B,) record indices
    epoch: int
    batch: int
    masks: Any = None  # segment: (B, M, M) overlap planes (instance k of an image numbered k); else None


@dataclass(frozen=True)
class Conversion:
    """How a Client turns slot arrays into a batch (fixed when the Client is made)."""

    as_torch: bool
    zero_copy: bool
    device: Any = None

    @property
    def copies_on_host(self) -> bool:
        """Whether ``to_batch`` gives the caller host copies of the slot's bytes (``zero_copy``
        off, no device): then nothing handed out views the slot, and the Client gives the slot
        back as soon as the batch is built rather than when the next one is asked for."""
        if self.zero_copy:
            return False
        if self.device is None:
            return True
        torch = require_torch("a Client with a device")
        return torch.device(self.device).type == "cpu"


def to_batch(
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None],
    ready: dict,
    how: Conversion,
    settings: StreamSettings,
    *,
    lend: bool = False,
) -> TrainerBatch:
    """The batch of slot ``arrays``; with ``lend`` (torch on the host only) the images tensor
    wraps ``arrays[0]`` itself, and the caller must keep the slot until that array is freed."""
    images, targets, samples, masks = arrays
    samples = samples.copy()  # B integers: never worth a view
    if lend:
        if not how.as_torch or not how.copies_on_host:
            raise ValueError("only torch batches of a host-copying Client are lent")
        images, targets, masks = _to_torch(
            images,
            targets.copy(),
            None if masks is None else masks.copy(),
            samples,
            ready["epoch"],
            Conversion(as_torch=True, zero_copy=True),
            settings,
        )
    elif how.as_torch:
        images, targets, masks = _to_torch(images, targets, masks, samples, ready["epoch"], how, settings)
    elif not how.zero_copy:
        images, targets = images.copy(), targets.copy()
        masks = None if masks is None else masks.copy()
    return TrainerBatch(
        images=images, targets=targets, samples=samples, epoch=ready["epoch"], batch=ready["batch"], masks=masks
    )


def _to_torch(images, targets, masks, samples, epoch: int, how: Conversion, settings: StreamSettings):
    torch = require_torch("a Client that yields torch tensors (as_torch, device or hsv_on_device)")
    on_host = how.device is None or torch.device(how.device).type == "cpu"
    own = not how.zero_copy and on_host

    def tensor(array):
        # Frames are read-only buffers, which torch cannot wrap: those are copied as well.
        return torch.from_numpy(array.copy() if own or not array.flags.writeable else array)

    out = [tensor(images), tensor(targets), None if masks is None else tensor(masks)]
    if how.device is not None:
        out = [None if t is None else t.to(how.device, non_blocking=True) for t in out]
    timg, ttgt, tmask = out
    if settings.hsv_on_device and settings.augment.route is Route.TRAIN:  # validation streams get no HSV
        from .hsv_torch import apply_hsv

        timg = apply_hsv(timg, settings, epoch, samples)
    return timg, ttgt, tmask
