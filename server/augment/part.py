"""One part of a batch (a worker's share of its positions), and the checks every renderer of
parts shares: the square route (``batch.py``) and the rect validation route (``val_rect.py``).

Runs wherever a batch is rendered: the daemon's workers and the in-process reference path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...shared.errors import ConfigError
from ...shared.stream.config import StreamSettings
from ...shared.stream.sampler import batch_samples
from ...shared.stream.source import ImageSource

__all__ = ["Part", "checked_out", "positions_of"]


@dataclass
class Part:
    """Sample positions ``start .. stop`` of one batch (``render_range``)."""

    images: np.ndarray  # uint8 (stop - start, 3, S, S)
    targets: np.ndarray  # float32 (n, W), batch_index = position in the whole batch
    counts: np.ndarray  # int64 (stop - start,): target rows of each position
    samples: np.ndarray  # int64 (stop - start,): record indices
    floats: list[np.ndarray] | None = None  # with ``keep_float``: the float images before quantisation
    segments: list[np.ndarray] | None = None  # with ``segments``: one normalised polygon per target row
    masks: np.ndarray | None = None  # segment: (stop - start, M, M) planes, or (n, M, M) without overlap_mask


def checked_out(
    name: str, out: np.ndarray, dtypes: tuple[type, ...], item_shape: tuple[int, ...], count: int, example: str
) -> np.ndarray:
    """``out``'s first ``count`` items, after checking that a caller's output array (a ring slot's
    images or mask planes) has a dtype of ``dtypes``, items of ``item_shape`` and is C-contiguous."""
    if out.dtype not in dtypes or out.shape[1:] != item_shape or out.shape[0] < count:
        kinds = " or ".join(np.dtype(d).name for d in dtypes)
        dims = ", ".join(str(d) for d in item_shape)
        raise ConfigError(f"{name} must be {kinds} (>= {count}, {dims}), got {out.dtype} {out.shape}")
    if not out.flags.c_contiguous:
        raise ConfigError(f"{name} must be C-contiguous ({example})")
    return out[:count]


def positions_of(
    source: ImageSource, settings: StreamSettings, epoch: int, batch: int, start: int, stop: int | None
) -> np.ndarray:
    """The stream positions ``start .. stop`` (None: to the end) of batch ``batch``, checked."""
    every = batch_samples(len(source), settings, epoch, batch)
    stop = len(every) if stop is None else stop
    if not 0 <= start <= stop <= len(every):
        raise ConfigError(
            f"samples {start}..{stop} of batch {batch}, which has {len(every)}; use 0 <= start <= stop <= {len(every)}"
        )
    return every[start:stop]
