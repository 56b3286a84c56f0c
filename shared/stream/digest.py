"""The digest of a delivered batch: equal digests mean equal bytes.

Code both sides import: the producer hashes batches it renders (``--reference`` and
``--in-process``, ``server/local_stream.py``), a trainer-side client hashes the batches
a daemon delivers. Their one command line is ``cli/digest.py``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..errors import ConfigError
from .config import StreamSettings
from .sampler import num_batches


def batch_digest(images: np.ndarray, targets: np.ndarray, masks: np.ndarray | None = None) -> str:
    """SHA-256 hex over the images', the packed targets' (all their columns: a task's too) and,
    for a segment batch, the mask planes' shapes and bytes.

    The masks are hashed only when given, after the rest, so a batch without them (every task
    but segment) has the digest it always had. They are hashed as the values the planes hold,
    in int32 whatever the container's dtype (a ring's planes are int32 where a sample may have
    more than 255 instances, the route's uint8 where it has fewer): equal masks, equal digests."""
    h = hashlib.sha256()
    parts = [(images, np.uint8), (targets, np.float32)]
    if masks is not None:
        parts.append((_mask_values(masks), np.int32))
    for array, dtype in parts:
        array = np.ascontiguousarray(array, dtype=dtype)
        h.update(repr(array.shape).encode())
        # As flat bytes: a memoryview cast refuses a shape with a zero in it, and a batch of
        # background images packs its targets as (0, 6).
        h.update(array.reshape(-1).view(np.uint8))
    return h.hexdigest()


def _mask_values(masks) -> np.ndarray:
    """The mask planes as an integer numpy array (a torch tensor is brought to the host)."""
    if not isinstance(masks, np.ndarray) and hasattr(masks, "numpy"):
        masks = masks.detach().cpu().numpy()
    masks = np.asarray(masks)
    if masks.dtype.kind not in "iu":
        raise TypeError(f"mask planes must hold integers (instance numbers), got dtype {masks.dtype}")
    return masks


def check_batches(batches: int, num_records: int, settings: StreamSettings, epoch: int) -> None:
    """ConfigError unless ``1 <= batches <=`` the number of batches of this stream's epoch."""
    total = num_batches(num_records, settings, epoch)
    if not 1 <= batches <= total:
        raise ConfigError(
            f"--batches {batches} is out of range: epoch {epoch} of this stream has {total} batches of {settings.batch_size}; use 1 to {total}"
        )
