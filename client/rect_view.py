"""The trainer's side of rect validation batches: each batch's own (H, W), cut from its slot.

Runs in the trainer process, beside a ``Loader`` attached with ``rect_stride`` > 0 (Ultralytics'
rect validation batches, ``shared/stream/rect_plan.py``). Each ring slot holds squares of the
largest batch shape; the daemon writes a batch's images into the top-left (H, W) of them and
its mask planes into the top-left (H // mask_ratio, W // mask_ratio). This view plans the same
batches from the decoded sizes the daemon's snapshot holds (sent with the records' names:
``loader.files.sizes()``), so it needs no access to the images and cannot disagree with the
daemon; only a daemon that keeps none (a release before them) leaves it to the image files'
headers (the decoded size, EXIF orientation applied, as Ultralytics' label cache holds it).
It checks that each batch carries the records the plan puts there, and returns views of the
batch's own part. Nothing is copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from ..shared.errors import ConfigError
from ..shared.stream.rect_plan import RectPlan, rect_plan
from ..shared.stream.route import Route
from ..shared.stream.sampler import epoch_indices

__all__ = ["RectView", "decoded_shape"]

_ORIENTATION_TAG = 0x0112
_TRANSPOSED = {5, 6, 7, 8}  # EXIF orientations that swap height and width


def decoded_shape(path: str) -> tuple[int, int]:
    """(height, width) of an image as ``cv2.imread`` decodes it, from its header alone."""
    with Image.open(path) as im:
        w, h = im.size
        if im.getexif().get(_ORIENTATION_TAG, 1) in _TRANSPOSED:
            w, h = h, w
    return h, w


class RectView:
    """Rect batches of ``loader`` (a ``client.loader.Loader`` whose ``augment.rect_stride`` > 0).

    ``shape_of``: a file's decoded (height, width), read where the daemon sends no sizes; by
    default from the file's header, once."""

    def __init__(self, loader: Any, *, shape_of: Callable[[str], tuple[int, int]] = decoded_shape):
        cfg = loader.settings.augment
        if cfg.route is not Route.RECT_VAL:
            raise ConfigError.for_field("rect_stride", cfg.rect_stride, "is 0: this stream has no rect batches")
        self.loader = loader
        self.shape_of = shape_of
        self._plan: RectPlan | None = None

    @property
    def plan(self) -> RectPlan:
        if self._plan is None:
            files = self.loader.client.files
            shapes = files.sizes()
            if shapes is None:
                shapes = np.array([self.shape_of(files[i]) for i in range(len(files))], dtype=np.int64).reshape(-1, 2)
            settings = self.loader.settings
            cfg = settings.augment
            self._plan = rect_plan(shapes, settings.batch_size, cfg.imgsz, cfg.rect_stride)
        return self._plan

    def shape(self, batch: Any) -> tuple[int, int]:
        """(H, W) of ``batch`` (a ``Loader`` batch), after checking its records against the plan."""
        settings = self.loader.settings
        b, size = int(batch.batch), len(batch.indices)
        positions = epoch_indices(len(self.plan.order), settings, int(batch.epoch))[
            b * settings.batch_size : b * settings.batch_size + size
        ]
        expected = self.plan.order[positions]
        got = np.asarray(batch.indices, dtype=np.int64)
        if not np.array_equal(expected, got):
            raise ConfigError(
                f"rect batch {b} carries records {got[:4].tolist()}... where this trainer's plan has "
                f"{expected[:4].tolist()}...: the daemon's snapshot and the sizes it was planned from disagree "
                "(re-prepare the snapshot, or run the same pixpool release on both sides), or validate with rect_stride=0"
            )
        return self.plan.shape_of(positions)

    def crop(self, batch: Any) -> tuple[Any, Any, tuple[int, int]]:
        """(images (B, 3, H, W), masks (B, H // r, W // r) or None, (H, W)): views of ``batch``'s slot squares."""
        h, w = self.shape(batch)
        r = self.loader.settings.augment.mask_ratio
        masks = batch.masks
        return batch.images[:, :, :h, :w], None if masks is None else masks[:, : h // r, : w // r], (h, w)
