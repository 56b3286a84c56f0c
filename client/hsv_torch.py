"""HSV jitter on the trainer's device, for batches streamed with ``hsv_on_device=True``.

Runs in the trainer process, on the tensor's device (CUDA or CPU); heavy imports (torch)
stay inside this module, which only the trainer imports.

Same gains as the workers' CPU version: ``rng.hsv_gains_for(seed, epoch, samples, ...)``
computes each sample's from its own HSV stream, derived from
``(seed, epoch, record index)`` alone (see ``pixpool.shared.stream.rng``). The trainer
knows all three (its settings, the epoch, ``Batch.samples``), so both sides draw the
same numbers without sending them, and the geometric stream is left untouched.

Same tables too (``pixpool.shared.stream.hsv_tables``). What differs is the colour conversion: OpenCV's 8-bit
BGR<->HSV uses fixed-point tables; here it is the same formulas in float32 with
rounding to the same integer grid (hue 0..179 in steps of 2 degrees, saturation and
value 0..255). The results agree to within a level or two on almost every pixel
(``tests/unit/test_augment_hsv.py`` bounds it); they are not byte-identical, which is why
the digest and parity tests run with HSV on the CPU.
"""

from __future__ import annotations

import numpy as np
import torch

from ..shared.stream.config import StreamSettings
from ..shared.stream.hsv_tables import tables_for
from ..shared.stream.rng import hsv_gains_for


def _tables(settings: StreamSettings, epoch: int, samples, device: torch.device) -> torch.Tensor | None:
    cfg = settings.augment
    gains = hsv_gains_for(settings.seed, epoch, np.asarray(samples), cfg.hsv_h, cfg.hsv_s, cfg.hsv_v)
    if np.all(gains == 1.0):
        return None
    tables = tables_for(gains)  # (B, 3, 256) uint8
    return torch.from_numpy(tables.astype(np.int64)).to(device)


def apply_hsv(images: torch.Tensor, settings: StreamSettings, epoch: int, samples) -> torch.Tensor:
    """uint8 (B, 3, H, W) RGB -> jittered uint8 (B, 3, H, W) RGB (a new tensor, same device)."""
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"apply_hsv needs a uint8 (B, 3, H, W) RGB tensor, got {images.dtype} {tuple(images.shape)}")
    if len(samples) != images.shape[0]:
        raise ValueError(f"{len(samples)} sample indices for a batch of {images.shape[0]} images; pass Batch.samples")
    tables = _tables(settings, epoch, samples, images.device)
    if tables is None:
        return images.clone()
    b = images.shape[0]
    h, s, v = _rgb_to_hsv(images.float())
    flat = lambda x: x.reshape(b, -1).long()  # noqa: E731
    h2 = torch.gather(tables[:, 0], 1, flat(h)).reshape(h.shape)
    s2 = torch.gather(tables[:, 1], 1, flat(s)).reshape(s.shape)
    v2 = torch.gather(tables[:, 2], 1, flat(v)).reshape(v.shape)
    return _hsv_to_rgb(h2.float(), s2.float(), v2.float())


def _rgb_to_hsv(rgb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """OpenCV's 8-bit convention: hue = round(degrees / 2) in 0..179, s and v in 0..255."""
    r, g, b = rgb[:, 0], rgb[:, 1], rgb[:, 2]
    v, _ = rgb.max(dim=1)
    vmin, _ = rgb.min(dim=1)
    diff = v - vmin
    safe_v = torch.where(v > 0, v, torch.ones_like(v))
    s = torch.round(255.0 * diff / safe_v)
    safe_d = torch.where(diff > 0, diff, torch.ones_like(diff))
    hue = torch.where(v == r, g - b, torch.where(v == g, b - r + 2.0 * diff, r - g + 4.0 * diff))
    hue = torch.round(30.0 * hue / safe_d)
    hue = torch.where(hue < 0, hue + 180.0, hue)
    hue = torch.where(hue >= 180.0, hue - 180.0, hue)
    hue = torch.where(diff > 0, hue, torch.zeros_like(hue))
    return hue, s, v


def _hsv_to_rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Inverse of ``_rgb_to_hsv`` (float HSV on the 8-bit grid) -> uint8 (B, 3, H, W) RGB.

    The branch-free form of the sector formula: channel n (5 red, 3 green, 1 blue) is
    v - v*s*clamp(min(k, 4 - k), 0, 1) with k = (n + hue/30) mod 6; three planes of
    temporaries instead of six candidates per channel.
    """
    h6 = h * (6.0 / 180.0)
    vs = v * (s / 255.0)
    planes = []
    for n in (5.0, 3.0, 1.0):
        k = torch.remainder(h6 + n, 6.0)
        planes.append(v - vs * torch.clamp(torch.minimum(k, 4.0 - k), 0.0, 1.0))
    return torch.round(torch.stack(planes, dim=1)).clamp_(0, 255).to(torch.uint8)
