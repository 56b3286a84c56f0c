"""One batch of a stream: render its samples, quantise, HSV, pack images and targets.

Runs in the augmentation workers (writing straight into a ring slot passed as
``images_out``), in the digest command and in the tests. Owns nothing shared: the
caller owns ``images_out``; the source is only read.

Output per batch:

- ``images``: uint8 (B, 3, S, S) RGB, C-contiguous.
- ``targets``: float32 (n, W) rows ``(batch_index, class, cx, cy, w, h)``, normalised
  by S, then the task's columns (``shared.task``, ``TaskSpec.target_width``: obb the angle in
  radians, with cx, cy, w, h those of the rotated box; pose K x (x, y normalised, visibility));
  rows in sample order, then instance order (segment: each sample's instances by mask area,
  largest first, as the mask plane numbers them).
- ``masks``: segment only, else None: with ``overlap_mask`` (B, M, M), M = S // mask_ratio,
  instance j of a sample's rows (1-based) where its mask is set (``masks.py``), uint8 unless a
  sample has more than 255 instances (then int32); without it (n, M, M) uint8, one per row.
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
from ...shared.stream.source import ImageSource
from .labels import pack
from .masks import render_masks
from .part import Part, checked_out, positions_of
from .sample import Pending, StageClock, render


@dataclass
class Batch:
    images: np.ndarray
    targets: np.ndarray
    samples: np.ndarray
    floats: list[np.ndarray] | None = None
    segments: list[np.ndarray] | None = None
    masks: np.ndarray | None = None


def max_targets(max_instances: int, settings: StreamSettings) -> int:
    """Upper bound of target rows in one batch (for sizing ring slots).

    Per sample: mosaic x4 records, copy-paste at most doubles (either mode: a partner adds at
    most its own mosaic's instances), mixup adds a partner sample (which can itself be a mosaic
    with copy-paste), cutmix adds at most one more such partner's instances.
    """
    cfg = settings.augment
    per = max(0, int(max_instances))
    if cfg.train_route:
        if cfg.mosaic > 0:
            per *= 4
        if cfg.copy_paste > 0:
            per *= 2
        one = per
        if cfg.mixup > 0:
            per *= 2
        if cfg.cutmix > 0:
            per += one
    return per * settings.batch_size


def render_batch(
    source: ImageSource,
    settings: StreamSettings,
    epoch: int,
    batch: int,
    *,
    images_out: np.ndarray | None = None,
    masks_out: np.ndarray | None = None,
    keep_float: bool = False,
    timings: dict[str, float] | None = None,
) -> Batch:
    """Render batch ``batch`` of ``epoch`` of the stream ``settings`` from ``source``: the whole
    batch as one range (``render_range``), with the float images (``keep_float``) and the
    segments.

    ``images_out``: uint8 C-contiguous (>= B, 3, S, S) to write into (e.g. a ring slot);
    ``Batch.images`` is then its first B entries; ``masks_out`` likewise for the segment mask
    planes (see ``render_range``). ``timings`` (dict) accumulates seconds per stage for the benchmark.
    """
    part = _render(
        source,
        settings,
        epoch,
        batch,
        0,
        None,
        images_out,
        masks_out,
        keep_float=keep_float,
        segments=True,
        timings=timings,
    )
    return Batch(part.images, part.targets, part.samples, part.floats, part.segments, part.masks)


def write_image(
    pending: Pending, out_chw: np.ndarray, gains: np.ndarray | None, *, timings: dict[str, float] | None = None
) -> None:
    """Render ``pending`` into ``out_chw`` (uint8 (3, S, S) C-contiguous RGB) in one kernel
    pass, with HSV when ``gains`` are given (gains of exactly 1 change nothing and skip it)."""
    clock = StageClock(timings)
    # gains of exactly 1 (hsv_* all 0): a list compare, a fraction of np.all's call cost per sample
    pending.write(out_chw, None if gains is None or gains.tolist() == [1.0, 1.0, 1.0] else tables(gains))
    clock.lap("kernel")


def _output(images_out: np.ndarray | None, count: int, imgsz: int) -> np.ndarray:
    if images_out is None:
        return np.empty((count, 3, imgsz, imgsz), dtype=np.uint8)
    return checked_out("images_out", images_out, (np.uint8,), (3, imgsz, imgsz), count, "a ring slot or np.empty")


def render_range(
    source: ImageSource,
    settings: StreamSettings,
    epoch: int,
    batch: int,
    start: int,
    stop: int,
    *,
    images_out: np.ndarray | None = None,
    masks_out: np.ndarray | None = None,
    timings: dict[str, float] | None = None,
) -> Part:
    """Sample positions ``start .. stop`` of batch ``batch`` of ``epoch``: what an
    augmentation worker renders when all workers fill one ring slot together.

    ``render_batch`` is this loop over the whole batch, so any split of a batch into
    ranges, concatenated, is byte for byte ``render_batch``'s batch
    (tests/unit/test_augment_range.py). ``images_out``: uint8 C-contiguous
    (>= stop - start, 3, S, S), e.g. those positions of a ring slot. ``masks_out``: segment
    only, uint8 or int32 C-contiguous (>= stop - start, M, M), those positions' mask planes;
    the values are written, the dtype is the container's (int32 where a sample may hold more
    than 255 instances; a uint8 plane given a sample with more is an error). Per-instance planes
    (``overlap_mask`` false) have no fixed size, so they cannot be written into ``masks_out``.
    """
    return _render(source, settings, epoch, batch, start, stop, images_out, masks_out, timings=timings)


def _render(
    source: ImageSource,
    settings: StreamSettings,
    epoch: int,
    batch: int,
    start: int,
    stop: int | None,
    images_out: np.ndarray | None,
    masks_out: np.ndarray | None = None,
    *,
    keep_float: bool = False,
    segments: bool = False,
    timings: dict[str, float] | None = None,
) -> Part:
    """The one render loop: positions ``start .. stop`` (None: to the batch's end) of the batch."""
    settings = settings.for_imgsz(source.imgsz)  # imgsz None: the source's; another value: ConfigError
    cfg = settings.augment
    if cfg.rect_stride:  # Ultralytics' rect validation batches: their own loop
        from .val_rect import render_rect_range

        return render_rect_range(
            source,
            settings,
            epoch,
            batch,
            start,
            stop,
            images_out,
            masks_out,
            keep_float=keep_float,
            segments=segments,
            timings=timings,
        )
    imgsz = cfg.imgsz
    samples = positions_of(source, settings, epoch, batch, start, stop)
    images = _output(images_out, len(samples), imgsz)
    spec = source.spec
    width = spec.target_width()
    keypoints = spec.keypoints
    side = spec.mask_side(imgsz, cfg.mask_ratio)
    planes = _masks_output(masks_out, len(samples), side, overlap=cfg.overlap_mask) if side else None
    instance_planes: list[np.ndarray] | None = [] if side and not cfg.overlap_mask else None
    apply_hsv = cfg.train_route and not settings.hsv_on_device
    counts = np.zeros(len(samples), dtype=np.int64)
    floats: list[np.ndarray] | None = [] if keep_float else None
    polygons: list[np.ndarray] | None = [] if segments else None
    rows: list[np.ndarray] = []  # each sample's packed rows, without the batch index
    for i, index in enumerate(samples.tolist()):
        pending = render(source, index, settings, epoch, timings=timings)
        if floats is not None:
            floats.append(pending.float_image())
        gains = hsv_gains(settings.seed, epoch, index, cfg.hsv_h, cfg.hsv_s, cfg.hsv_v) if apply_hsv else None
        write_image(pending, images[i], gains, timings=timings)
        labels = pending.labels
        if side:
            clock = StageClock(timings)
            if instance_planes is not None:
                per, _ = render_masks(labels, imgsz, cfg.mask_ratio, overlap=False)
                instance_planes.append(per)
            else:
                if planes is not None and masks_out is None and len(labels) > 255 and planes.dtype == np.uint8:
                    planes = planes.astype(np.int32)  # a plane of the batch's own: widen it, as Ultralytics does
                _, order = render_masks(labels, imgsz, cfg.mask_ratio, overlap=True, out=_plane(planes, i, len(labels)))
                labels = labels.select(order)
            clock.lap("masks")
        packed = pack(labels, imgsz, task=spec, keypoints=keypoints)
        rows.append(packed)
        counts[i] = len(packed)
        if polygons is not None and len(labels):
            # Views of one scaled array, as np.split gives, without its per-call overhead.
            scaled = labels.points * np.float32(1.0 / imgsz)
            bounds = labels.offsets.tolist()
            polygons.extend(scaled[a:b] for a, b in zip(bounds[:-1], bounds[1:]))
    # The batch index column and the rows written once per range, not once per sample.
    targets = np.empty((int(counts.sum()), width), dtype=np.float32)
    if len(targets):
        targets[:, 0] = np.repeat(np.arange(start, start + len(samples), dtype=np.float32), counts)
        np.concatenate(rows, out=targets[:, 1:])
    if instance_planes is not None:
        planes = np.concatenate(instance_planes) if instance_planes else np.zeros((0, side, side), np.uint8)
    return Part(images, targets, counts, samples, floats, polygons, planes)


def _plane(planes: np.ndarray, i: int, instances: int) -> np.ndarray:
    """Position ``i``'s mask plane, checked to hold ``instances`` numbers."""
    if instances > np.iinfo(planes.dtype).max:
        raise ConfigError(
            f"masks_out is {planes.dtype} and a sample has {instances} instances; "
            "give an int32 mask plane where a sample can hold more than 255 instances"
        )
    return planes[i]


def _masks_output(masks_out: np.ndarray | None, count: int, side: int, *, overlap: bool) -> np.ndarray | None:
    """The overlap planes to write: ``masks_out``'s first ``count`` (checked), or new uint8 ones."""
    if not overlap:
        if masks_out is not None:
            raise ConfigError(
                "overlap_mask=False gives one mask plane per instance, which a fixed masks_out (a ring slot) "
                "cannot hold; use overlap_mask=True (Ultralytics' default) for a served stream"
            )
        return None
    if masks_out is None:
        return np.zeros((count, side, side), np.uint8)
    return checked_out(
        "masks_out", masks_out, (np.uint8, np.int32), (side, side), count, "a ring slot's mask plane or np.zeros"
    )
