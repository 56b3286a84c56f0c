"""One batch of a stream: render its samples, quantise, HSV, pack images and targets.

Runs in the augmentation workers (writing straight into a ring slot passed as
``images_out``), in the digest command and in the tests. Owns nothing shared: the
caller owns ``images_out``; the source is only read.

Output per batch:

- ``images``: uint8 (B, 3, S, S) RGB, C-contiguous.
- ``targets``: float32 (n, 6) rows ``(batch_index, class, cx, cy, w, h)``, normalised
  by S; rows in sample order, then instance order.
- ``segments``: n float32 (k, 2) normalised polygons, one per target row ((0, 2) where
  the instance has none), for segmentation.
- ``samples``: int64 (B,) record indices; ``floats``: the float images before
  quantisation (``keep_float=True``) or None.

Per image (``write_image``): one pass of the fused kernel (``kernel.py``) from the source
tiles straight into the output planes: resample, copy-paste, mixup, fill, quantisation,
flips, HSV and the RGB CHW write, no intermediate image.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...shared.errors import ConfigError
from ...shared.stream.config import StreamSettings
from ...shared.stream.hsv_tables import tables
from ...shared.stream.rng import hsv_gains
from ...shared.stream.sampler import batch_samples
from ...shared.stream.source import ImageSource
from .labels import pack
from .sample import Pending, _Clock, render


@dataclass
class Batch:
    images: np.ndarray
    targets: np.ndarray
    samples: np.ndarray
    floats: list[np.ndarray] | None = None
    segments: list[np.ndarray] | None = None


def max_targets(max_instances: int, settings: StreamSettings) -> int:
    """Upper bound of target rows in one batch (for sizing ring slots).

    Per sample: mosaic x4 records, copy-paste at most doubles, mixup adds a partner
    sample (which can itself be a mosaic with copy-paste).
    """
    cfg = settings.augment
    per = max(0, int(max_instances))
    if cfg.augment:
        if cfg.mosaic > 0:
            per *= 4
        if cfg.copy_paste > 0:
            per *= 2
        if cfg.mixup > 0:
            per *= 2
    return per * settings.batch_size


def render_batch(
    source: ImageSource,
    settings: StreamSettings,
    epoch: int,
    batch: int,
    *,
    images_out: np.ndarray | None = None,
    keep_float: bool = False,
    timings: dict[str, float] | None = None,
) -> Batch:
    """Render batch ``batch`` of ``epoch`` of the stream ``settings`` from ``source``: the whole
    batch as one range (``render_range``), with the float images (``keep_float``) and the
    segments.

    ``images_out``: uint8 C-contiguous (>= B, 3, S, S) to write into (e.g. a ring slot);
    ``Batch.images`` is then its first B entries. ``timings`` (dict) accumulates
    seconds per stage for the benchmark.
    """
    part = _render(
        source, settings, epoch, batch, 0, None, images_out, keep_float=keep_float, segments=True, timings=timings
    )
    return Batch(part.images, part.targets, part.samples, part.floats, part.segments)


def write_image(
    pending: Pending, out_chw: np.ndarray, gains: np.ndarray | None, *, timings: dict[str, float] | None = None
) -> None:
    """Render ``pending`` into ``out_chw`` (uint8 (3, S, S) C-contiguous RGB) in one kernel
    pass, with HSV when ``gains`` are given (gains of exactly 1 change nothing and skip it)."""
    clock = _Clock(timings)
    pending.write(out_chw, None if gains is None or np.all(gains == 1.0) else tables(gains))
    clock.lap("kernel")


def _output(images_out: np.ndarray | None, count: int, size: int) -> np.ndarray:
    if images_out is None:
        return np.empty((count, 3, size, size), dtype=np.uint8)
    if (
        images_out.dtype != np.uint8
        or images_out.ndim != 4
        or images_out.shape[1:] != (3, size, size)
        or images_out.shape[0] < count
    ):
        raise ConfigError(
            f"images_out must be uint8 (>= {count}, 3, {size}, {size}), got {images_out.dtype} {images_out.shape}"
        )
    if not images_out.flags.c_contiguous:
        raise ConfigError("images_out must be C-contiguous (a ring slot or np.empty)")
    return images_out[:count]


@dataclass
class Part:
    """Sample positions ``start .. stop`` of one batch (``render_range``)."""

    images: np.ndarray  # uint8 (stop - start, 3, S, S)
    targets: np.ndarray  # float32 (n, 6), batch_index = position in the whole batch
    counts: np.ndarray  # int64 (stop - start,): target rows of each position
    samples: np.ndarray  # int64 (stop - start,): record indices
    floats: list[np.ndarray] | None = None  # with ``keep_float``: the float images before quantisation
    segments: list[np.ndarray] | None = None  # with ``segments``: one normalised polygon per target row


def render_range(
    source: ImageSource,
    settings: StreamSettings,
    epoch: int,
    batch: int,
    start: int,
    stop: int,
    *,
    images_out: np.ndarray | None = None,
    timings: dict[str, float] | None = None,
) -> Part:
    """Sample positions ``start .. stop`` of batch ``batch`` of ``epoch``: what an
    augmentation worker renders when all workers fill one ring slot together.

    ``render_batch`` is this loop over the whole batch, so any split of a batch into
    ranges, concatenated, is byte for byte ``render_batch``'s batch
    (tests/unit/test_augment_range.py). ``images_out``: uint8 C-contiguous
    (>= stop - start, 3, S, S), e.g. those positions of a ring slot.
    """
    return _render(source, settings, epoch, batch, start, stop, images_out, timings=timings)


def _render(
    source: ImageSource,
    settings: StreamSettings,
    epoch: int,
    batch: int,
    start: int,
    stop: int | None,
    images_out: np.ndarray | None,
    *,
    keep_float: bool = False,
    segments: bool = False,
    timings: dict[str, float] | None = None,
) -> Part:
    """The one render loop: positions ``start .. stop`` (None: to the batch's end) of the batch."""
    settings = settings.for_imgsz(source.imgsz)  # imgsz None: the source's; another value: ConfigError
    cfg = settings.augment
    size = cfg.imgsz
    every = batch_samples(len(source), settings, epoch, batch)
    stop = len(every) if stop is None else stop
    if not 0 <= start <= stop <= len(every):
        raise ConfigError(
            f"samples {start}..{stop} of batch {batch}, which has {len(every)}; use 0 <= start <= stop <= {len(every)}"
        )
    samples = every[start:stop]
    images = _output(images_out, len(samples), size)
    apply_hsv = cfg.augment and not settings.hsv_on_device
    counts = np.zeros(len(samples), dtype=np.int64)
    floats: list[np.ndarray] | None = [] if keep_float else None
    polygons: list[np.ndarray] | None = [] if segments else None
    rows: list[np.ndarray] = []
    for i, index in enumerate(samples.tolist()):
        pending = render(source, index, settings, epoch, timings=timings)
        if floats is not None:
            floats.append(pending.float_image())
        gains = hsv_gains(settings.seed, epoch, index, cfg.hsv_h, cfg.hsv_s, cfg.hsv_v) if apply_hsv else None
        write_image(pending, images[i], gains, timings=timings)
        packed = pack(pending.labels, size)
        row = np.empty((len(packed), 6), dtype=np.float32)
        row[:, 0] = start + i
        row[:, 1:] = packed
        rows.append(row)
        counts[i] = len(packed)
        labels = pending.labels
        if polygons is not None and len(labels):
            # Views of one scaled array, as np.split gives, without its per-call overhead.
            scaled = labels.points * np.float32(1.0 / size)
            bounds = labels.offsets.tolist()
            polygons.extend(scaled[a:b] for a, b in zip(bounds[:-1], bounds[1:]))
    targets = np.concatenate(rows) if rows else np.zeros((0, 6), np.float32)
    return Part(images, targets, counts, samples, floats, polygons)
