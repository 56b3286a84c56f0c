"""Which route a stream's samples take: training, square validation or rect validation.

Part of the stream contract both sides share. ``AugmentConfig.route`` is the one place a
stream's route is chosen; the renderers (``server/augment/batch.py``), the sampler, the ring's
slot side and the trainer side all follow it. The settings spell it with two fields, as the
command line, ``attach`` and the wire always have: ``train_route`` and ``rect_stride`` (the
model stride the rect route plans its batch shapes with).
"""

from __future__ import annotations

import enum

from ..errors import ConfigError

__all__ = ["Route"]


class Route(enum.Enum):
    # Every draw of the training route (mosaic, affine, copy-paste, mixup, cutmix, flips, HSV).
    TRAIN = "train"
    # Each record letterboxed on the imgsz square, no randomness.
    VAL = "val"
    # Ultralytics' rect validation batches: aspect-ratio order, one padded shape per batch.
    RECT_VAL = "rect_val"

    @classmethod
    def of(cls, train_route: bool, rect_stride: int) -> "Route":
        """The route ``train_route`` and ``rect_stride`` spell; a rect stride on the training
        route is a ConfigError naming ``rect_stride``."""
        if train_route:
            if rect_stride:
                raise ConfigError.for_field(
                    "rect_stride",
                    rect_stride,
                    "is for the validation route only; set train_route=False (attach(split='val') does) or rect_stride=0",
                )
            return cls.TRAIN
        return cls.RECT_VAL if rect_stride else cls.VAL
