"""The augmentation engine: the YOLO training route over any ``ImageSource``.

Runs in the augmentation workers (over the shared-memory snapshot), in the reference
pipeline and in the digest command. Modules: ``rng`` (where randomness comes from),
``sampler`` (epoch order, DDP shards, batches), ``mosaic``, ``canvas``, ``affine``,
``labels``, ``copy_paste``, ``hsv``, ``letterbox``, ``route`` (one sample), ``batch``
(one batch, quantised and packed).
"""

from .batch import Batch, batch_digest, max_targets, render_batch
from .route import render_sample
from .sampler import batch_samples, epoch_indices, num_batches

__all__ = ["Batch", "batch_digest", "batch_samples", "epoch_indices", "max_targets", "num_batches", "render_batch", "render_sample"]
