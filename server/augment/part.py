"""One part of a batch (a worker's share of its positions), which positions it is (``Span``),
and the checks of the one render loop (``batch.py``) that every route shares.

Runs wherever a batch is rendered: the daemon's workers and the in-process reference path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...shared.errors import ConfigError
from ...shared.stream.config import StreamSettings
from ...shared.stream.sampler import batch_samples

__all__ = ["Part", "Span", "checked_out", "positions_of"]


@dataclass(frozen=True)
class Span:
    """Sample positions ``start .. stop`` (None: to the batch's end) of batch ``batch`` of ``epoch``."""

    epoch: int
    batch: int
    start: int = 0
    stop: int | None = None


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


def positions_of(records: int, settings: StreamSettings, span: Span) -> np.ndarray:
    """The stream positions of ``span`` over a source of ``records`` records, checked."""
    every = batch_samples(records, settings, span.epoch, span.batch)
    start, stop = span.start, len(every) if span.stop is None else span.stop
    if not 0 <= start <= stop <= len(every):
        raise ConfigError(
            f"samples {start}..{stop} of batch {span.batch}, which has {len(every)}; "
            f"use 0 <= start <= stop <= {len(every)}"
        )
    return every[start:stop]
