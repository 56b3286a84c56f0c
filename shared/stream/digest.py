"""The digest of a delivered batch: equal digests mean equal bytes.

Code both sides import: the producer hashes batches it renders (``--reference`` and
``--in-process``, ``server/commands/digest.py``), a trainer-side client hashes the batches
a daemon delivers (``client/commands/digest.py``). Their one command line is
``shared/cli/digest_args.py``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..errors import ConfigError
from .config import StreamSettings
from .sampler import num_batches


def batch_digest(images: np.ndarray, targets: np.ndarray) -> str:
    """SHA-256 hex over the images' and the packed targets' shapes and bytes."""
    h = hashlib.sha256()
    for array, dtype in ((images, np.uint8), (targets, np.float32)):
        array = np.ascontiguousarray(array, dtype=dtype)
        h.update(repr(array.shape).encode())
        # As flat bytes: a memoryview cast refuses a shape with a zero in it, and a batch of
        # background images packs its targets as (0, 6).
        h.update(array.reshape(-1).view(np.uint8))
    return h.hexdigest()


def check_batches(batches: int, num_records: int, settings: StreamSettings, epoch: int) -> None:
    """ConfigError unless ``1 <= batches <=`` the number of batches of this stream's epoch."""
    total = num_batches(num_records, settings, epoch)
    if not 1 <= batches <= total:
        raise ConfigError(
            f"--batches {batches} is out of range: epoch {epoch} of this stream has {total} batches of {settings.batch_size}; use 1 to {total}"
        )
