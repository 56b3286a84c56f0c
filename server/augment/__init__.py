"""The augmentation engine: the YOLO training route over any ``ImageSource``.

Runs in the augmentation workers (over the shared-memory snapshot), in the reference
pipeline and in the digest command. Modules: ``record`` (the one reader of a source),
``mosaic`` (canvas tiles and the validation letterbox), ``affine``, ``kernel`` (the fused
pixel pass), ``labels``, ``copy_paste``, ``cutmix``, ``hsv``, ``val_rect`` (Ultralytics' rect
validation batches), ``sample`` (one sample), ``part`` (a worker's share of a batch), ``batch``
(one batch, quantised and packed). Where randomness comes from and which samples a batch
holds is the stream contract both sides share: ``pixpool.shared.stream.rng`` and
``pixpool.shared.stream.sampler``.
"""

from .batch import Batch, max_targets, render_batch, render_range
from .part import Part
from .sample import render_sample

__all__ = ["Batch", "Part", "max_targets", "render_batch", "render_range", "render_sample"]
