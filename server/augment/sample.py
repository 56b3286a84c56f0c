"""The training route for one sample, from a source's read-only views to its float image.

Runs in the augmentation workers (on the snapshot), in the reference pipeline and in the
digest command; the code cannot tell the sources apart, which is what byte parity shows.

Training (``augment=True``), every draw from the sample's generator (``pixpool.shared.rng``):

1. mosaic with probability ``mosaic`` (not in the closed epochs): the record and three
   random partners around a random centre on a 2·imgsz zero canvas; otherwise the
   record letterboxed (centred) on an imgsz zero canvas, as the customary non-mosaic
   route does, so one affine code path serves both;
2. random affine/perspective onto imgsz x imgsz, border 0; boxes from corners or polygons,
   candidate filter;
3. the fill added back (exposed padding becomes exactly the fill);
4. copy-paste (flip mode, union mask), fraction ``copy_paste`` (not in closed epochs);
5. mixup with probability ``mixup`` (not in closed epochs): a random partner through
   steps 1-4 with the same generator, ratio Beta(32, 32);
6. vertical flip (``flipud``), then horizontal flip (``fliplr``), both always drawn.

That float image is what ``render_sample`` returns; ``batch.render_batch`` quantises it
(round half to even, clip to 0..255), applies HSV and reorders to RGB CHW.

Byte-neutral shortcuts (each covered by a test): the canvas is only built where the
resample reads, with a padding fourth channel so that OpenCV's vectorised 4-channel
resample serves (``canvas.py``; the padding rides along to the 8-bit image, where the
colour conversion or the final split drops it; ``Pending.float_image`` returns B G R
only); copy-paste and flips are pure copies, so they run before
the fill is added back and the fill add is fused into quantisation (``Pending.offset``).
Only mixup, which does arithmetic, needs the fill restored first.

Validation (``augment=False``): ``letterbox.py``, no draws.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import cv2
import numpy as np

from ...shared.config import FILL_VALUE, StreamSettings
from ...shared.rng import sample_generator
from ...shared.source import ImageSource
from . import affine
from . import copy_paste as _cp
from .labels import Labels, transform_labels
from .letterbox import letterbox
from .mosaic import draw_mosaic, letterbox_tile, mosaic_tiles

MIXUP_BETA = 32.0


@dataclass
class Pending:
    """A rendered sample whose float image is ``flip(image[..., :3] + offset)``, not yet
    materialised.

    ``image`` is float32 (S, S, 3) B G R, or (S, S, 4) with a padding channel after
    B G R (the resample's 4-channel form, ``canvas.py``; ignored from then on).
    ``flip_code`` is OpenCV's (1 left-right, 0 up-down, -1 both) or None.
    """

    image: np.ndarray
    offset: float
    flip_code: int | None
    labels: Labels
    generator: np.random.Generator

    def float_image(self) -> np.ndarray:
        """The float32 (S, S, 3) BGR image before quantisation (a new array)."""
        bgr = self.image[:, :, :3]
        out = bgr + np.float32(self.offset) if self.offset else bgr.copy()  # C-contiguous either way
        return cv2.flip(out, self.flip_code) if self.flip_code is not None else out


class _Clock:
    """Accumulates seconds per stage into ``timings`` (a dict) when one is given."""

    def __init__(self, timings: dict[str, float] | None):
        self.timings = timings
        self.t = time.perf_counter() if timings is not None else 0.0

    def lap(self, stage: str) -> None:
        if self.timings is not None:
            now = time.perf_counter()
            self.timings[stage] = self.timings.get(stage, 0.0) + now - self.t
            self.t = now


def render(source: ImageSource, index: int, settings: StreamSettings, epoch: int, *, timings: dict[str, float] | None = None) -> Pending:
    """Render record ``index`` of ``epoch`` as a ``Pending`` sample."""
    cfg = settings.augment
    rng = sample_generator(settings.seed, epoch, index)
    clock = _Clock(timings)
    if not cfg.augment:
        image, labels = letterbox(source, index, cfg.imgsz)
        clock.lap("letterbox")
        return Pending(image, 0.0, None, labels, rng)
    closed = cfg.mosaic_closed(epoch)
    image, labels = _pre_transform(source, index, settings, closed, rng, clock)
    offset = FILL_VALUE
    if not closed and cfg.mixup > 0 and rng.random() < cfg.mixup:
        partner = int(rng.integers(0, len(source)))
        image2, labels2 = _pre_transform(source, partner, settings, closed, rng, clock)
        ratio = np.float32(rng.beta(MIXUP_BETA, MIXUP_BETA))
        fill = np.float32(FILL_VALUE)
        # (image + fill) * ratio + (image2 + fill) * (1 - ratio), the same float32
        # operations in the same order, in place: both are this sample's own fresh arrays.
        image += fill
        image *= ratio
        image2 += fill
        image2 *= np.float32(1.0) - ratio
        image += image2
        offset = 0.0
        labels = Labels.concat([labels, labels2])
        clock.lap("mixup")
    flip_ud = rng.random() < cfg.flipud
    flip_lr = rng.random() < cfg.fliplr
    size = cfg.imgsz
    if flip_ud:
        labels = labels.flipped(size, size, horizontal=False)
    if flip_lr:
        labels = labels.flipped(size, size, horizontal=True)
    code = -1 if flip_ud and flip_lr else 0 if flip_ud else 1 if flip_lr else None
    clock.lap("labels")
    return Pending(image, offset, code, labels, rng)


def _pre_transform(source: ImageSource, index: int, settings: StreamSettings, closed: bool, rng: np.random.Generator, clock: _Clock) -> tuple[np.ndarray, Labels]:
    """Steps 1, 2 and 4: (centred float32 S x S x 3 image, labels in pixels)."""
    cfg = settings.augment
    size = cfg.imgsz
    if not closed and cfg.mosaic > 0 and rng.random() < cfg.mosaic:
        partners, xc, yc = draw_mosaic(rng, len(source), size)
        tiles, labels = mosaic_tiles(source, [index, *partners.tolist()], size, xc, yc)
        canvas_hw = (2 * size, 2 * size)
    else:
        tiles, labels = letterbox_tile(source, index, size)
        canvas_hw = (size, size)
    matrix, scale = affine.draw_matrix(rng, cfg, canvas_hw, size)
    clock.lap("source")
    canvas = affine.build_canvas(tiles, canvas_hw, matrix, size)
    clock.lap("canvas")
    image = affine.warp(canvas, matrix, size)
    clock.lap("warp")
    labels = transform_labels(labels, matrix, size, scale, perspective=affine.is_perspective(matrix))
    clock.lap("labels")
    if not closed and cfg.copy_paste > 0:
        # A pure copy: running it on centred values gives the same bytes as after the
        # fill is restored, and lets the fill add stay fused into quantisation. In place:
        # ``image`` is this sample's own fresh resample output, read by nothing else.
        image, labels = _cp.copy_paste(image, labels, cfg.copy_paste, rng, in_place=True)
        clock.lap("copy_paste")
    return image, labels


def render_sample(source: ImageSource, index: int, settings: StreamSettings, epoch: int) -> tuple[np.ndarray, Labels, np.random.Generator]:
    """(float32 S x S x 3 BGR image before quantisation, labels in pixels, the sample's
    generator after every draw). What the parity tests compare."""
    pending = render(source, index, settings, epoch)
    return pending.float_image(), pending.labels, pending.generator
