"""Packed target rows -> fixed-shape padded targets with a validity mask.

Runs in the trainer process, on the host, before a batch is copied to the device. A batch
arrives with a variable number of rows ``(batch_index, class, cx, cy, w, h)`` (boxes
normalised to the image size); the training step needs the same shapes every step so it
can be captured once as a CUDA graph, so each image's boxes are written into ``max_targets``
slots and a mask says which slots hold a box. An image with more boxes than slots is an
error, not a silent truncation: the loss would quietly ignore objects.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ....shared.errors import CapacityError, ConfigError


def pad_targets(
    rows: np.ndarray, batch_size: int, max_targets: int, *, files: Sequence[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` (n, 6) -> ``targets`` (B, T, 5) float32 ``class, cx, cy, w, h`` and ``mask``
    (B, T) bool, with B = ``batch_size`` and T = ``max_targets``.

    Each image's rows keep their order and fill its first slots; empty slots are zeros.
    ``files`` (one name per image) only improves the overflow message."""
    if batch_size < 1:
        raise ConfigError.for_field("batch_size", batch_size, "must be at least 1")
    if max_targets < 1:
        raise ConfigError.for_field("max_targets", max_targets, "must be at least 1 box slot per image")
    rows = np.asarray(rows, dtype=np.float32)
    if rows.ndim != 2 or rows.shape[1] != 6:
        raise ConfigError(
            f"target rows have shape {rows.shape}; expected (n, 6) rows of batch_index, class, cx, cy, w, h"
        )
    if files is not None and len(files) != batch_size:
        raise ConfigError(
            f"{len(files)} file names given for a batch of {batch_size} images; pass one name per image or none"
        )

    targets = np.zeros((batch_size, max_targets, 5), np.float32)
    mask = np.zeros((batch_size, max_targets), bool)
    if not len(rows):
        return targets, mask
    image = rows[:, 0].astype(np.int64)
    if image.min() < 0 or image.max() >= batch_size:
        raise ConfigError(
            f"target rows name batch index {image.min()}..{image.max()} but the batch has {batch_size} images (0..{batch_size - 1}); pass the batch's own size"
        )

    counts = np.bincount(image, minlength=batch_size)
    worst = int(counts.argmax())
    if counts[worst] > max_targets:
        name = f"image {files[worst]!r} (batch index {worst})" if files is not None else f"image at batch index {worst}"
        raise CapacityError(
            f"{name} has {counts[worst]} boxes, more than max_targets={max_targets} slots; raise max_targets to at least {counts[worst]}"
        )

    order = np.argsort(image, kind="stable")
    sorted_image = image[order]
    first_of_image = np.concatenate(([0], np.cumsum(counts)[:-1]))
    slot = np.arange(len(rows)) - first_of_image[sorted_image]
    targets[sorted_image, slot] = rows[order, 1:]
    mask[sorted_image, slot] = True
    return targets, mask
