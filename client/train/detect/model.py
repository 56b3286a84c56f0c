"""A YOLOv8-style detector, written here from the published architecture.

Runs in the trainer process (training step and validation). The layout follows the YOLOv8
paper and model card: a CSP backbone of Conv-BN-SiLU blocks and C2f stages, SPPF at the
top, a PAN neck (top-down then bottom-up, C2f without shortcuts), and a decoupled
anchor-free head per level (stride 8, 16, 32): a box branch that predicts, for each of
the four sides, a distribution over ``reg_max`` bins (decoded with DFL, ``boxes.py``),
and a class branch of ``num_classes`` logits (sigmoid, no objectness).

A scale sets a depth multiplier (repeats of each C2f), a width multiplier (channels) and
a channel cap. ``"n"`` is YOLOv8n (about 3.2 M parameters at 80 classes); ``"tiny"`` keeps
the same graph at a sixteenth of the base width, small enough for CPU tests.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ....shared.errors import ConfigError

# name -> (depth multiplier, width multiplier, max channels), as in the YOLOv8 model cards.
SCALES: dict[str, tuple[float, float, int]] = {
    "tiny": (0.33, 0.0625, 1024),
    "n": (0.33, 0.25, 1024),
    "s": (0.33, 0.50, 1024),
    "m": (0.67, 0.75, 768),
}

STRIDES = (8, 16, 32)
# BatchNorm settings customary for YOLO training (slow running statistics, small eps).
_BN_EPS = 1e-3
_BN_MOMENTUM = 0.03


class Conv(nn.Module):
    """Conv2d (no bias) -> BatchNorm -> SiLU; 'same' padding for odd kernels."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=_BN_EPS, momentum=_BN_MOMENTUM)
        self.act = nn.SiLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """Two 3x3 Convs, with a residual add when asked and the channel counts allow it."""

    def __init__(self, channels: int, *, shortcut: bool):
        super().__init__()
        self.cv1 = Conv(channels, channels, 3)
        self.cv2 = Conv(channels, channels, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP stage with two convolutions: split the 1x1 output in halves, run ``n`` bottlenecks
    on the second half keeping every intermediate, concatenate all and fuse with a 1x1."""

    def __init__(self, c_in: int, c_out: int, n: int, *, shortcut: bool):
        super().__init__()
        self.hidden = c_out // 2
        self.cv1 = Conv(c_in, 2 * self.hidden, 1)
        self.cv2 = Conv((2 + n) * self.hidden, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.hidden, shortcut=shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.cv1(x).chunk(2, 1))
        for block in self.m:
            parts.append(block(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools (receptive fields 5, 9, 13)."""

    def __init__(self, c_in: int, c_out: int, *, kernel: int = 5):
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1)
        self.cv2 = Conv(hidden * 4, c_out, 1)
        self.pool = nn.MaxPool2d(kernel, stride=1, padding=kernel // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.pool(y[-1]))
        return self.cv2(torch.cat(y, 1))


class DetectHead(nn.Module):
    """Decoupled head: per level a box branch (4 * reg_max) and a class branch (num_classes)."""

    def __init__(self, num_classes: int, channels: tuple[int, ...], *, reg_max: int):
        super().__init__()
        box_hidden = max(16, channels[0] // 4, 4 * reg_max)
        cls_hidden = max(channels[0], min(num_classes, 100))
        self.box = nn.ModuleList(
            nn.Sequential(
                Conv(c, box_hidden, 3), Conv(box_hidden, box_hidden, 3), nn.Conv2d(box_hidden, 4 * reg_max, 1)
            )
            for c in channels
        )
        self.cls = nn.ModuleList(
            nn.Sequential(
                Conv(c, cls_hidden, 3), Conv(cls_hidden, cls_hidden, 3), nn.Conv2d(cls_hidden, num_classes, 1)
            )
            for c in channels
        )

    def init_biases(self, num_classes: int, strides: tuple[int, ...], *, imgsz: int = 640) -> None:
        """Box logits start flat (bias 1); class logits start at the prior of about 5 objects
        per 640 px image spread over the level's cells and the classes, so the initial BCE
        is not dominated by tens of thousands of confident negatives."""
        for box, cls, stride in zip(self.box, self.cls, strides):
            nn.init.constant_(box[-1].bias, 1.0)
            nn.init.constant_(cls[-1].bias, math.log(5 / num_classes / (imgsz / stride) ** 2))

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat((box(x), cls(x)), 1) for x, box, cls in zip(feats, self.box, self.cls)]


def _channels(base: int, width: float, max_channels: int) -> int:
    """Scaled channel count, rounded up to a multiple of 8 as in the model cards."""
    return int(math.ceil(min(base, max_channels) * width / 8) * 8)


def _depth(base: int, depth: float) -> int:
    return max(round(base * depth), 1)


class Detector(nn.Module):
    """YOLOv8-style detector. ``forward`` takes float images (B, 3, S, S) in [0, 1], S a
    multiple of 32, and returns one map per stride (8, 16, 32), each (B, 4 * reg_max +
    num_classes, S / stride, S / stride): box distribution logits first, then class logits."""

    def __init__(self, num_classes: int, *, scale: str = "n", reg_max: int = 16):
        super().__init__()
        if scale not in SCALES:
            raise ConfigError.for_field("scale", scale, f"is not a known scale; use one of {sorted(SCALES)}")
        if num_classes < 1:
            raise ConfigError.for_field(
                "num_classes", num_classes, "must be at least 1; pass the dataset's class count"
            )
        if reg_max < 2:
            raise ConfigError.for_field("reg_max", reg_max, "must be at least 2 bins per box side (16 is customary)")
        depth, width, max_channels = SCALES[scale]
        c = {base: _channels(base, width, max_channels) for base in (64, 128, 256, 512, 1024)}
        n3, n6 = _depth(3, depth), _depth(6, depth)
        self.num_classes = num_classes
        self.reg_max = reg_max
        self.strides = STRIDES
        self.scale = scale

        # Backbone: P1/2 .. P5/32; C2f stages keep their shortcuts.
        self.stem = Conv(3, c[64], 3, 2)
        self.stage2 = nn.Sequential(Conv(c[64], c[128], 3, 2), C2f(c[128], c[128], n3, shortcut=True))
        self.stage3 = nn.Sequential(Conv(c[128], c[256], 3, 2), C2f(c[256], c[256], n6, shortcut=True))
        self.stage4 = nn.Sequential(Conv(c[256], c[512], 3, 2), C2f(c[512], c[512], n6, shortcut=True))
        self.stage5 = nn.Sequential(
            Conv(c[512], c[1024], 3, 2), C2f(c[1024], c[1024], n3, shortcut=True), SPPF(c[1024], c[1024])
        )

        # PAN neck: top-down (upsample, concat with the backbone), then bottom-up.
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.top_down4 = C2f(c[1024] + c[512], c[512], n3, shortcut=False)
        self.top_down3 = C2f(c[512] + c[256], c[256], n3, shortcut=False)
        self.down3 = Conv(c[256], c[256], 3, 2)
        self.bottom_up4 = C2f(c[256] + c[512], c[512], n3, shortcut=False)
        self.down4 = Conv(c[512], c[512], 3, 2)
        self.bottom_up5 = C2f(c[512] + c[1024], c[1024], n3, shortcut=False)

        self.head = DetectHead(num_classes, (c[256], c[512], c[1024]), reg_max=reg_max)
        self.head.init_biases(num_classes, self.strides)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if x.ndim != 4 or x.shape[1] != 3 or x.shape[2] % 32 or x.shape[3] % 32:
            raise ConfigError(
                f"Detector input has shape {tuple(x.shape)}; it needs (B, 3, H, W) with H and W multiples of 32 (letterbox or resize to e.g. 640)"
            )
        p3 = self.stage3(self.stage2(self.stem(x)))
        p4 = self.stage4(p3)
        p5 = self.stage5(p4)
        t4 = self.top_down4(torch.cat((self.up(p5), p4), 1))
        n3 = self.top_down3(torch.cat((self.up(t4), p3), 1))
        n4 = self.bottom_up4(torch.cat((self.down3(n3), t4), 1))
        n5 = self.bottom_up5(torch.cat((self.down4(n4), p5), 1))
        return self.head([n3, n4, n5])
