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

Per range on the training route (``SquarePlacement.draw_range``): each sample's draws up to its
labels, the range's records read together (``sample.draft_range``), the range's main
pre-transform labels at once (``range_labels.pre_labels``), then each sample's rest
(``sample.finish``) and its image: one pass of the fused kernel (``kernel.py``, ``Pending.write``)
from the source tiles straight into the output planes (and the float image): resample,
copy-paste, mixup, fill, quantisation, flips, HSV and the RGB CHW write, no intermediate image;
then the range's labels flipped (``range_labels.flipped``). Then per sample only its mask plane
(segment); the range's target rows, batch index and segments are made once, from its labels
concatenated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...shared.errors import ConfigError
from ...shared.stream.config import StreamSettings
from ...shared.stream.hsv_tables import tables_for
from ...shared.stream.rng import range_draws
from ...shared.stream.route import Route
from ...shared.stream.source import ImageSource
from ...shared.task import TaskSpec
from . import range_labels
from .labels import Labels, pack
from .masks import render_masks
from .part import Part, Span, checked_out, positions_of
from .record import Reader
from .sample import Pending, StageClock, draft_range, finish, render
from .val_rect import RectPlacement


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
    if cfg.route is Route.TRAIN:
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
        Span(epoch, batch),
        images_out,
        masks_out,
        keep_float=keep_float,
        segments=True,
        timings=timings,
    )
    return Batch(part.images, part.targets, part.samples, part.floats, part.segments, part.masks)


def _output(images_out: np.ndarray | None, count: int, side: int) -> np.ndarray:
    if images_out is None:
        return np.empty((count, 3, side, side), dtype=np.uint8)
    return checked_out("images_out", images_out, (np.uint8,), (3, side, side), count, "a ring slot or np.empty")


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
    """Sample positions ``start .. stop`` of batch ``batch`` of ``epoch``, on the stream's route
    (``AugmentConfig.route``): what an augmentation worker renders when all workers fill one
    ring slot together.

    ``render_batch`` is this loop over the whole batch, so any split of a batch into
    ranges, concatenated, is byte for byte ``render_batch``'s batch
    (tests/unit/test_augment_range.py). ``images_out``: uint8 C-contiguous
    (>= stop - start, 3, S, S), e.g. those positions of a ring slot. ``masks_out``: segment
    only, uint8 or int32 C-contiguous (>= stop - start, M, M), those positions' mask planes;
    the values are written, the dtype is the container's (int32 where a sample may hold more
    than 255 instances; a uint8 plane given a sample with more is an error). Per-instance planes
    (``overlap_mask`` false) have no fixed size, so they cannot be written into ``masks_out``.
    """
    return _render(source, settings, Span(epoch, batch, start, stop), images_out, masks_out, timings=timings)


class SquarePlacement:
    """The training and square validation routes' part of a span (``_placement``): each record through
    ``sample.render`` (which follows the route) onto the imgsz square, HSV on the training route
    unless the trainer's device applies it."""

    ultralytics_ties = False

    def __init__(
        self,
        reader: Reader,
        settings: StreamSettings,
        epoch: int,
        positions: np.ndarray,
    ) -> None:
        cfg = settings.augment
        self.side = cfg.imgsz
        self.records = positions  # a square route's positions are record indices
        self.reader, self.settings, self.epoch = reader, settings, epoch
        train = cfg.route is Route.TRAIN
        hsv = train and not settings.hsv_on_device
        # The range's draws and HSV gains in one vectorised evaluation, its tables in another; a
        # record's are a function of (seed, epoch, record) alone, so any split of a batch draws the same.
        records = positions.tolist()
        self.draws: dict = {}
        self._tables: np.ndarray | None = None
        self._blobs: dict = {}  # record -> its HSV tables as the kernel takes them (bytes), made at once
        if not train:
            return
        draws, gains = range_draws(settings.seed, epoch, positions, (cfg.hsv_h, cfg.hsv_s, cfg.hsv_v) if hsv else None)
        self.draws = dict(zip(records, draws))
        # gains of exactly 1 (hsv_* all 0): no tables, the kernel skips HSV
        if gains is not None and (gains != 1.0).any():
            self._tables = tables_for(gains)
            blob, size = self._tables.tobytes(), 3 * 256
            self._blobs = {r: blob[i * size : (i + 1) * size] for i, r in enumerate(records)}

    @property
    def tables(self) -> dict[int, np.ndarray]:
        """record -> its uint8 (3, 256) HSV tables (none without HSV on the workers)."""
        return {} if self._tables is None else dict(zip(self.records.tolist(), self._tables))

    def draw_range(self, images: np.ndarray, floats: list[np.ndarray] | None, timings) -> list[Labels]:
        if self.settings.augment.route is not Route.TRAIN:
            return [self._draw(r, images[i], floats, StageClock(timings)) for i, r in enumerate(self.records.tolist())]
        # Each sample's draws up to its labels, the range's main pre-transform labels at once,
        # then each sample's rest (its generator's draws continue where ``draft`` stopped) and
        # its pixels.
        reader, settings, epoch, imgsz = self.reader, self.settings, self.epoch, self.side
        clock = StageClock(timings)
        records = self.records.tolist()
        drafts = draft_range(reader, records, settings, epoch, clock, [self.draws.pop(r, None) for r in records])
        pre = range_labels.pre_labels(drafts, imgsz, reader.spec)
        clock.lap("labels")
        labels: list[Labels] = []
        flips: list[tuple[bool, bool]] = []
        for i, record in enumerate(records):
            pending = finish(reader, drafts[i], pre[i], settings, clock, flip_labels=False)
            self._write(pending, record, images[i], floats)
            clock.lap("kernel")
            labels.append(pending.labels)
            flips.append((pending.flip_ud, pending.flip_lr))
        drawn = range_labels.flipped(labels, flips, imgsz, reader.spec)
        clock.lap("labels")
        return drawn

    def _draw(self, record: int, out_chw: np.ndarray, floats: list[np.ndarray] | None, clock: StageClock) -> Labels:
        pending: Pending = render(self.reader, record, self.settings, self.epoch, clock, self.draws.pop(record, None))
        self._write(pending, record, out_chw, floats)
        clock.lap("kernel")
        return pending.labels

    def _write(self, pending: Pending, record: int, out_chw: np.ndarray, floats: list[np.ndarray] | None) -> None:
        pending.write(out_chw, self._blobs.get(record), floats)

    def rows(self, labels: Labels, spec: TaskSpec, keypoints: int) -> np.ndarray:
        return pack(labels, self.side, task=spec, keypoints=keypoints)

    def points(self, labels: Labels) -> np.ndarray:
        return labels.points * np.float32(1.0 / self.side)


def _placement(reader: Reader, settings: StreamSettings, span: Span) -> SquarePlacement | RectPlacement:
    """What the stream's route (``AugmentConfig.route``) supplies to the render loop for the
    positions of ``span`` (checked); the loop does the rest alike for every route (the output
    checks, the masks, the target rows, the segments):

    - ``side``: the square each image is written into (a ring slot's image side);
    - ``records``: int64 record index at each position;
    - ``ultralytics_ties``: order equal mask areas as Ultralytics does (``masks.render_masks``);
    - ``draw_range(images, floats, timings)``: each position's image written into ``images`` (its
      float image appended to ``floats`` when given), the stages' seconds added to ``timings``;
      returns each position's labels in pixels of its image;
    - ``rows(labels, spec, keypoints)``: the labels as normalised target rows, no batch index;
    - ``points(labels)``: the polygon vertices, normalised as the rows are.
    """
    positions = positions_of(reader.count, settings, span)
    if settings.augment.route is Route.RECT_VAL:
        return RectPlacement(reader, settings, positions)
    return SquarePlacement(reader, settings, span.epoch, positions)


def _render(
    source: ImageSource,
    settings: StreamSettings,
    span: Span,
    images_out: np.ndarray | None,
    masks_out: np.ndarray | None = None,
    *,
    keep_float: bool = False,
    segments: bool = False,
    timings: dict[str, float] | None = None,
) -> Part:
    """The one render loop, for every route: the positions of ``span``."""
    settings = settings.for_imgsz(source.imgsz)  # imgsz None: the source's; another value: ConfigError
    cfg = settings.augment
    reader = Reader.of(source)  # the loop's one reader of the source: its records, task and fill
    spec = reader.spec
    place = _placement(reader, settings, span)
    samples, side, count = place.records, place.side, len(place.records)
    images = _output(images_out, count, side)
    width = spec.target_width()
    keypoints = spec.keypoints
    mask_side = spec.mask_side(side, cfg.mask_ratio)
    planes = _masks_output(masks_out, count, mask_side, overlap=cfg.overlap_mask) if mask_side else None
    instance_planes: list[np.ndarray] | None = [] if mask_side and not cfg.overlap_mask else None
    counts = np.zeros(count, dtype=np.int64)
    floats: list[np.ndarray] | None = [] if keep_float else None
    polygons: list[np.ndarray] | None = [] if segments else None
    drawn = place.draw_range(images, floats, timings)
    joined = getattr(drawn, "joined", None)  # the labels already concatenated (``range_labels.Drawn``)
    for i, labels in enumerate(drawn if mask_side else ()):
        clock = StageClock(timings)
        if instance_planes is not None:
            per, _ = render_masks(labels, side, cfg.mask_ratio, overlap=False)
            instance_planes.append(per)
        else:
            if planes is not None and masks_out is None and len(labels) > 255 and planes.dtype == np.uint8:
                planes = planes.astype(np.int32)  # a plane of the batch's own: widen it, as Ultralytics does
            out = _plane(planes, i, len(labels))
            _, order = render_masks(
                labels, side, cfg.mask_ratio, overlap=True, out=out, ultralytics_ties=place.ultralytics_ties
            )
            drawn[i] = labels.select(order)
            joined = None
        clock.lap("masks")
    counts[:] = [len(labels) for labels in drawn]
    # The range's labels as one: its rows packed, their batch index and segments, once per range.
    every = Labels.concat(drawn) if joined is None else joined
    targets = np.empty((len(every), width), dtype=np.float32)
    if len(targets):
        targets[:, 0] = np.repeat(np.arange(span.start, span.start + count, dtype=np.float32), counts)
        targets[:, 1:] = place.rows(every, spec, keypoints)
    if polygons is not None and len(every):
        # Views of one scaled array, as np.split gives, without its per-call overhead.
        scaled = place.points(every)
        bounds = every.offsets.tolist()
        polygons.extend(scaled[a:b] for a, b in zip(bounds[:-1], bounds[1:]))
    if instance_planes is not None:
        planes = np.concatenate(instance_planes) if instance_planes else np.zeros((0, mask_side, mask_side), np.uint8)
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
