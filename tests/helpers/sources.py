"""In-memory ImageSources for the augmentation tests (no snapshot, no files)."""

from __future__ import annotations

import math

import numpy as np

from pixpool.server.snapshot.decode import centre
from pixpool.shared.stream.records import Targets
from pixpool.shared.task import DETECT


def _polygon(x1: float, y1: float, x2: float, y2: float, k: int = 12) -> np.ndarray:
    t = np.linspace(0, 2 * math.pi, k, endpoint=False)
    cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
    return np.stack([cx + rx * np.cos(t), cy + ry * np.sin(t)], axis=1).astype(np.float32)


class ArraySource:
    """Centred read-only float32 images and targets, built from seeded noise."""

    def __init__(
        self, shapes: list[tuple[int, int]], imgsz: int, *, seed: int = 0, instances: int = 3, polygons: bool = True
    ):
        rng = np.random.default_rng(seed)
        self.imgsz = imgsz
        self.spec = DETECT
        self.uint8: list[np.ndarray] = []
        self._images: list[np.ndarray] = []
        self._targets: list[Targets] = []
        for h, w in shapes:
            u8 = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            self.uint8.append(u8)
            img = centre(u8)
            img.flags.writeable = False
            self._images.append(img)
            n = instances if h > 1 and w > 1 else 0
            xy = np.sort(rng.uniform(0, 1, (n, 2, 2)), axis=1).astype(np.float32)
            boxes = np.stack([xy[:, 0, 0], xy[:, 0, 1], xy[:, 1, 0], xy[:, 1, 1]], axis=1).astype(np.float32)
            polys = tuple(_polygon(*b) if polygons else np.zeros((0, 2), np.float32) for b in boxes)
            classes = rng.integers(0, 5, n).astype(np.int32)
            for a in (boxes, classes, *polys):
                a.flags.writeable = False
            self._targets.append(Targets(classes, boxes, polys))

    def __len__(self) -> int:
        return len(self._images)

    def image(self, index: int) -> np.ndarray:
        return self._images[index]

    def targets(self, index: int) -> Targets:
        return self._targets[index]


class Uint8Source(ArraySource):
    """Same records, but each call converts and centres from 8-bit (the baseline's way)."""

    def image(self, index: int) -> np.ndarray:
        return centre(self.uint8[index])
