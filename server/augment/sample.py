"""The training route for one sample, from a source's read-only views to a ``Pending`` sample.

Runs in the augmentation workers (on the snapshot), in the reference pipeline and in the
digest command; the code cannot tell the sources apart, which is what byte parity shows.

Training (``Route.TRAIN``), every draw from the sample's generator (``pixpool.shared.stream.rng``):

1. mosaic with probability ``mosaic`` (not in the closed epochs): the record and three
   random partners around a random centre on a 2·imgsz zero canvas; otherwise the
   record letterboxed (centred) on an imgsz zero canvas, as the customary non-mosaic
   route does, so one affine code path serves both;
2. random affine/perspective onto imgsz x imgsz, border 0; boxes from corners or polygons,
   candidate filter;
3. the fill added back (exposed padding becomes exactly the fill);
4. copy-paste, fraction ``copy_paste`` (not in closed epochs): flip mode (union mask of the
   mirrored instances), or mixup mode (``copy_paste.py``: with probability ``copy_paste``, a
   random partner through steps 1-2 pasted under its chosen instances' union mask);
5. mixup with probability ``mixup`` (not in closed epochs): a random partner through
   steps 1-4 with the same generator, ratio Beta(32, 32);
5b. cutmix with probability ``cutmix`` (not in closed epochs, ``cutmix.py``): a random partner
   through steps 1-4, a rectangle of it pasted over the sample (both layers under mixup);
6. vertical flip (``flipud``), then horizontal flip (``fliplr``), both always drawn; pose
   keypoints renumbered by ``flip_idx`` on either, as Ultralytics does (a pose source
   without ``flip_idx`` is never flipped).

Each draw of 4 (mixup mode), 5b is only made when its setting is non-zero, so a stream
without them draws exactly what it drew before they existed.

Here only the draws, the labels and the copy-paste mask are computed; the pixels of steps
1-6, quantisation, HSV and the RGB CHW write are one pass of the fused kernel
(``kernel.py``, which defines their arithmetic), run by ``Pending.write`` straight into
the output slot. No canvas and no intermediate image exist.

A training sample is three steps (``render``): ``draft`` makes every draw before the labels of
steps 1-2 (the mosaic decision, its partners and centre, the matrix) and places the records'
tiles (``Pre``); ``pre_labels`` makes those labels (it draws nothing); ``finish`` goes on from
step 4 on the same generator. The render loop (``batch.SquarePlacement.draw_range``) drafts a
range's samples, makes their ``pre_labels`` at once (``range_labels.py``) and finishes each: the
same draws per sample, in the same order, as ``render``. Partners (mixup, cutmix, copy-paste's
mixup mode) take the three steps in turn inside ``finish``.

Square validation (``Route.VAL``): ``mosaic.letterbox``, no draws. Rect validation renders its own
batches (``val_rect.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...shared.stream.config import StreamSettings
from ...shared.stream.rng import Draws, sample_generator
from ...shared.stream.route import Route
from ...shared.stream.source import ImageSource
from ...shared.task import TaskSpec
from . import affine, kernel
from . import copy_paste as _cp
from . import cutmix as _cutmix
from .kernel import Layer
from .labels import Labels, transform_labels
from .mosaic import Placed, Tile, letterbox, letterbox_placement, mosaic_placement, placed_labels
from .record import Reader

__all__ = ["Draft", "Pending", "Pre", "draft", "draft_range", "finish", "pre_labels", "render", "render_sample"]

MIXUP_BETA = 32.0


@dataclass
class Pending:
    """A sample whose pixels are drawn but not yet rendered: the kernel's inputs.

    ``layers``: one, or two under mixup (``ratio`` is then the float32 mixup ratio); ``fill``:
    the value the source was centred by, which the kernel adds back (``record.Reader.fill``).
    """

    imgsz: int
    layers: list[Layer]
    ratio: float | None
    flip_ud: bool
    flip_lr: bool
    labels: Labels
    generator: Draws
    fill: float

    def write(
        self, out_chw: np.ndarray | None, tables: np.ndarray | bytes | None, floats: list[np.ndarray] | None = None
    ) -> None:
        """Render into ``out_chw`` (uint8 (3, S, S) C-contiguous; None: no bytes) with the HSV
        ``tables`` (uint8 (3, 256) or its bytes) or None; with ``floats``, the float32 (S, S, 3)
        BGR image before quantisation appended to it, from the same kernel pass."""
        image = None if floats is None else np.empty((self.imgsz, self.imgsz, 3), dtype=np.float32)
        kernel.render(
            self.imgsz,
            self.layers,
            flip_ud=self.flip_ud,
            flip_lr=self.flip_lr,
            ratio=self.ratio or 0.0,
            tables=tables,
            out=out_chw,
            floats=image,
            fill=self.fill,
        )
        if image is not None:
            floats.append(image)

    def float_image(self) -> np.ndarray:
        """The float32 (S, S, 3) BGR image before quantisation (a new array)."""
        floats: list[np.ndarray] = []
        self.write(None, None, floats)
        return floats[0]


class StageClock:
    """Accumulates seconds per stage into ``timings`` (a dict) when one is given: the route's stage
    timings (``render_range(timings=)``), one clock per sample, lapped by its steps in turn."""

    def __init__(self, timings: dict[str, float] | None):
        self.timings = timings
        self.t = time.perf_counter() if timings is not None else 0.0

    def lap(self, stage: str) -> None:
        if self.timings is not None:
            now = time.perf_counter()
            self.timings[stage] = self.timings.get(stage, 0.0) + now - self.t
            self.t = now


@dataclass
class Pre:
    """A pre-transform's steps 1-2 drawn and placed, before its labels (``pre_labels``): the
    ``tiles`` and the records' targets as ``placed`` (``mosaic.Placed``) on the ``canvas``
    square, the ``matrix`` canvas -> output as its nine row-major Python floats (a 3x3 array
    given is taken as those) and its drawn ``scale``."""

    tiles: list[Tile]
    placed: list[Placed]
    canvas: int
    matrix: tuple[float, ...]
    scale: float

    def __post_init__(self) -> None:
        if not isinstance(self.matrix, tuple):
            self.matrix = tuple(np.asarray(self.matrix, dtype=np.float64).reshape(9).tolist())


@dataclass
class Draft:
    """A training sample drawn up to where its route first needs labels (``draft``): its
    generator, whether its epoch closes the mosaic, its main pre-transform (``Pre``)."""

    rng: Draws
    closed: bool
    pre: Pre


def render(
    reader: Reader, index: int, settings: StreamSettings, epoch: int, clock: StageClock, draws: Draws | None = None
) -> Pending:
    """Draw record ``index`` of ``epoch`` as a ``Pending`` sample (labels final, pixels not yet
    rendered), its stages lapped on ``clock``; ``settings`` at the source's imgsz
    (``StreamSettings.for_imgsz``). A training sample is ``draft``, ``pre_labels`` and
    ``finish`` in turn; a render loop does the middle step for a whole range at once
    (``range_labels.py``)."""
    cfg = settings.augment
    if cfg.route is not Route.TRAIN:
        rng = sample_generator(settings.seed, epoch, index) if draws is None else draws
        layer, labels = letterbox(reader.read(index), cfg.imgsz, rotated=reader.spec.rotated)
        clock.lap("letterbox")
        return Pending(cfg.imgsz, [layer], None, False, False, labels, rng, reader.fill)
    drafted = draft(reader, index, settings, epoch, clock, draws)
    labels = pre_labels(drafted.pre, cfg.imgsz, reader.spec)
    clock.lap("labels")
    return finish(reader, drafted, labels, settings, clock)


def draft(
    reader: Reader, index: int, settings: StreamSettings, epoch: int, clock: StageClock, draws: Draws | None = None
) -> Draft:
    """Training record ``index`` of ``epoch`` up to its main pre-transform's labels: every draw
    its route makes before them, its records read and placed."""
    rng = sample_generator(settings.seed, epoch, index) if draws is None else draws
    closed = settings.augment.mosaic_closed(epoch)
    return Draft(rng, closed, _draw_pre(reader, index, settings, closed, rng, clock))


def finish(
    reader: Reader,
    drafted: Draft,
    labels: Labels,
    settings: StreamSettings,
    clock: StageClock,
    *,
    flip_labels: bool = True,
) -> Pending:
    """The rest of a ``draft`` whose main pre-transform has ``labels`` (``pre_labels``): copy-paste,
    mixup, cutmix and the flips, their draws on its generator where ``draft`` stopped. Without
    ``flip_labels`` the labels are left unflipped (``Pending.flip_ud`` and ``flip_lr`` say how to
    flip them: ``range_labels.flipped`` does a range's at once)."""
    cfg = settings.augment
    imgsz = cfg.imgsz
    spec = reader.spec
    rng, closed = drafted.rng, drafted.closed
    layer, labels = _pasted(reader, settings, drafted.pre, labels, closed, rng, clock)
    layers, ratio = [layer], None
    if not closed and cfg.mixup > 0 and rng.random() < cfg.mixup:
        partner = int(rng.integers(0, reader.count))
        layer2, labels2 = _pre_transform(reader, partner, settings, closed, rng, clock)
        ratio = float(np.float32(rng.beta(MIXUP_BETA, MIXUP_BETA)))
        layers.append(layer2)
        labels = Labels.concat([labels, labels2])
        clock.lap("mixup")
    if not closed and cfg.cutmix > 0 and rng.random() < cfg.cutmix:
        partner = int(rng.integers(0, reader.count))
        layer3, labels3 = _pre_transform(reader, partner, settings, closed, rng, clock)
        labels, rect = _cutmix.cut_labels(labels, labels3, imgsz, spec, rng)
        if rect is not None:
            mask = _cutmix.rectangle_mask(imgsz, rect)
            for layer_ in layers:  # under mixup both blended layers take the partner's pixels
                layer_.pastes.append((mask, layer3))
        clock.lap("cutmix")
    flip_ud = bool(rng.random() < cfg.flipud)
    flip_lr = bool(rng.random() < cfg.fliplr)
    flip_idx = spec.flip_idx
    if spec.has_keypoints and flip_idx is None:
        # Without flip_idx a mirrored person's left and right keypoints would swap meaning:
        # no flips (Ultralytics turns fliplr and flipud off for such a dataset); still drawn,
        # so the stream's position does not depend on it.
        flip_ud = flip_lr = False
    if flip_ud and flip_labels:
        labels = labels.flipped(imgsz, imgsz, horizontal=False, flip_idx=flip_idx)
    if flip_lr and flip_labels:
        labels = labels.flipped(imgsz, imgsz, horizontal=True, flip_idx=flip_idx)
    clock.lap("labels")
    return Pending(imgsz, layers, ratio, flip_ud, flip_lr, labels, rng, reader.fill)


def draft_range(
    reader: Reader,
    records: list[int],
    settings: StreamSettings,
    epoch: int,
    clock: StageClock,
    draws: list[Draws | None],
) -> list[Draft]:
    """``draft`` of each of ``records`` (with its ``draws``, or None: its own generator), the same
    draws per sample in the same order; the records of the whole range are read together."""
    closed = settings.augment.mosaic_closed(epoch)
    rngs = [sample_generator(settings.seed, epoch, r) if d is None else d for r, d in zip(records, draws)]
    drawn = [_pre_draws(reader.count, settings, closed, r, g) for r, g in zip(records, rngs)]
    views = reader.read_many([i for d in drawn for i in d[0]])
    out: list[Draft] = []
    at = 0
    for rng, d in zip(rngs, drawn):
        k = len(d[0])
        out.append(Draft(rng, closed, _placed(d, views[at : at + k], settings.augment.imgsz)))
        at += k
    clock.lap("source")
    return out


def _draw_pre(reader: Reader, index: int, settings: StreamSettings, closed: bool, rng: Draws, clock: StageClock) -> Pre:
    """Steps 1-2 of record ``index`` up to their labels: the draws first (the mosaic's partners and
    centre, the matrix), then the records are read and their tiles placed."""
    drawn = _pre_draws(reader.count, settings, closed, index, rng)
    pre = _placed(drawn, reader.read_many(drawn[0]), settings.augment.imgsz)
    clock.lap("source")
    return pre


def _pre_draws(
    count: int, settings: StreamSettings, closed: bool, index: int, rng: Draws
) -> tuple[list[int], int, int, tuple[float, ...], float]:
    """The draws of steps 1-2 of record ``index`` (a source of ``count`` records), in the order of
    ``affine.draw_mosaic`` and ``affine.draw_matrix``: (the records to read, the record then a
    mosaic's three partners; the mosaic's centre x, y (0, 0 without); the matrix entries; the
    scale)."""
    cfg = settings.augment
    imgsz = cfg.imgsz
    if not closed and cfg.mosaic > 0 and rng.random() < cfg.mosaic:
        partners, xc, yc = affine.mosaic_entries(rng.take(5), count, imgsz)
        records, side = [index, *partners], 2 * imgsz
    else:
        records, xc, yc, side = [index], 0, 0, imgsz
    entries, scale = affine.matrix_entries(rng.take(8), cfg, (side, side), imgsz)
    return records, xc, yc, entries, scale


def _placed(drawn: tuple, views: list, imgsz: int) -> Pre:
    """The ``Pre`` of ``_pre_draws``' ``drawn`` with its records' ``views`` (``record.RecordView``)."""
    _, xc, yc, entries, scale = drawn
    if len(views) == 1:
        tiles, placed = letterbox_placement(views[0], imgsz)
        return Pre(tiles, placed, imgsz, entries, scale)
    tiles, placed = mosaic_placement(views, imgsz, xc, yc)
    return Pre(tiles, placed, 2 * imgsz, entries, scale)


def pre_labels(pre: Pre, imgsz: int, spec: TaskSpec) -> Labels:
    """One pre-transform's labels in pixels of the output: the placed records' labels on the
    canvas through the matrix, filtered (``labels.transform_labels``)."""
    return transform_labels(
        placed_labels(pre.placed, pre.canvas, rotated=spec.rotated),
        pre.matrix,
        imgsz,
        pre.scale,
        perspective=affine.is_perspective(pre.matrix),
        rotated=spec.rotated,
        visible=spec.has_masks,
    )


def _pre_transform(
    reader: Reader,
    index: int,
    settings: StreamSettings,
    closed: bool,
    rng: Draws,
    clock: StageClock,
    *,
    copy_paste: bool = True,
) -> tuple[Layer, Labels]:
    """Steps 1, 2 and (``copy_paste``) 4 of record ``index`` as a kernel layer and the labels in
    pixels, on ``rng``: a partner's (mixup, cutmix, copy-paste's mixup mode)."""
    pre = _draw_pre(reader, index, settings, closed, rng, clock)
    labels = pre_labels(pre, settings.augment.imgsz, reader.spec)
    clock.lap("labels")
    return _pasted(reader, settings, pre, labels, closed or not copy_paste, rng, clock)


def _pasted(
    reader: Reader,
    settings: StreamSettings,
    pre: Pre,
    labels: Labels,
    no_paste: bool,
    rng: Draws,
    clock: StageClock,
) -> tuple[Layer, Labels]:
    """Step 4 on a pre-transform with its ``labels`` (none when ``no_paste``): its kernel layer and
    its labels with the pasted instances appended."""
    cfg = settings.augment
    imgsz = cfg.imgsz
    layer = Layer(kernel.inverse(pre.matrix), pre.tiles, None)
    if not no_paste and cfg.copy_paste > 0:
        # Either mode chooses instances to paste (the mirrored sample's, or a partner's); both
        # append them and hand the kernel the union mask of their polygons.
        if cfg.copy_paste_mode == "mixup":
            pasted, partner = _paste_partner(reader, settings, labels, rng, clock)
        else:
            pasted, partner = _cp.flipped_pasted(labels, imgsz, cfg.copy_paste, rng), None
        if pasted is not None:
            labels = Labels.concat([labels, pasted])
            mask, _ = _cp.union_mask((imgsz, imgsz), pasted.polygons)
            if partner is None:
                layer.mask = mask  # flip mode: the kernel reads the mirrored pixel under it
            else:
                layer.pastes.append((mask, partner))
        clock.lap("copy_paste")
    return layer, labels


def _paste_partner(
    reader: Reader,
    settings: StreamSettings,
    labels: Labels,
    rng: Draws,
    clock: StageClock,
) -> tuple[Labels | None, Layer | None]:
    """Copy-paste in mixup mode (``copy_paste.py``): with probability ``copy_paste`` a random
    partner through steps 1-2; (its chosen instances, its layer), or (None, None) when nothing
    is pasted. A sample without polygons is left alone, with no draws."""
    cfg = settings.augment
    if not len(labels.points) or rng.random() >= cfg.copy_paste:
        return None, None
    partner = int(rng.integers(0, reader.count))
    layer2, labels2 = _pre_transform(reader, partner, settings, False, rng, clock, copy_paste=False)
    chosen = _cp.select_partner(labels, labels2, cfg.copy_paste)
    if len(chosen) == 0:
        return None, None
    return labels2.select(chosen), layer2


def render_sample(
    source: ImageSource, index: int, settings: StreamSettings, epoch: int
) -> tuple[np.ndarray, Labels, Draws]:
    """(float32 S x S x 3 BGR image before quantisation, labels in pixels, the sample's
    generator after every draw). What the parity tests compare."""
    pending = render(Reader.of(source), index, settings.for_imgsz(source.imgsz), epoch, StageClock(None))
    return pending.float_image(), pending.labels, pending.generator
