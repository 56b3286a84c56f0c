"""Rect validation route: Ultralytics' validation batches, rendered into ring slots.

Runs where a batch of a stream on ``Route.RECT_VAL`` is rendered (the augmentation workers,
the digest command, the tests): ``batch.py``'s render loop asks ``RectPlacement`` for what this
route does differently. Owns nothing shared: it writes the caller's image slots, reads the source.

What Ultralytics 8.4's validation loader makes of each image (``YOLODataset`` with
``rect=True``: ``load_image``, ``LetterBox(scaleup=False)`` into the batch's ``rect_shape``,
``Format``), here from the prepared record, which is already ``load_image``'s resized
image (the long side at imgsz, ``cv2.INTER_LINEAR``):

- the batch's records and its shape (H, W) come from the plan (``shared/stream/rect_plan.py``):
  a stream position is a position of the aspect-ratio order, mapped here to its record;
- the record (h, w) never exceeds (H, W), so it is not resized (``scaleup=False`` keeps r = 1)
  and is placed at ``((W - w) // 2, (H - h) // 2)`` on a canvas of the fill (114), which is
  Ultralytics' ``round(d / 2 - 0.1)`` for a whole d;
- labels in pixels of that canvas, neither clipped nor filtered (Ultralytics' validation
  keeps every instance as its label file gives it); rows normalised by W and H (cx, w by W;
  cy, h by H; keypoints x by W, y by H), as ``Format(normalize=True)`` divides them;
- segment: the overlap mask plane of the canvas at (H // mask_ratio, W // mask_ratio).

A ring slot is a square of ``slot_side`` (the largest batch shape); each image of a batch
is written into the top-left (H, W) of its square, the rest of the square is the fill, and
its mask into the top-left (H // r, W // r) of its plane. The trainer cuts the (H, W) it
reads from the same plan (``crop``).
"""

from __future__ import annotations

import weakref

import numpy as np

from ...shared.errors import ConfigError
from ...shared.stream.config import StreamSettings
from ...shared.stream.rect_plan import RectPlan, rect_plan, slot_side
from ...shared.stream.source import ImageSource
from ...shared.task import TaskSpec
from .labels import Labels, pack
from .record import Reader
from .sample import StageClock

__all__ = ["RectPlacement", "crop", "original_shapes", "plan_of", "slot_side"]

_shapes: weakref.WeakKeyDictionary[object, np.ndarray] = weakref.WeakKeyDictionary()


def original_shapes(source: ImageSource) -> np.ndarray:
    """int64 (n, 2): each record's decoded (height, width), EXIF orientation applied: a
    snapshot's index (``orig_height``, ``orig_width``), or a source's ``original_shapes()``."""
    try:
        kept = _shapes.get(source)
    except TypeError:
        kept = None
    if kept is not None:
        return kept
    index = getattr(source, "index", None)
    if index is not None and "orig_height" in (index.dtype.names or ()):
        shapes = np.stack([index["orig_height"], index["orig_width"]], axis=1).astype(np.int64)
    elif hasattr(source, "original_shapes"):
        shapes = np.asarray(source.original_shapes(), dtype=np.int64).reshape(-1, 2)
    else:
        raise ConfigError(
            f"{type(source).__name__} states no decoded image sizes, which rect validation batches are planned "
            "from; serve a snapshot, or render with rect_stride=0"
        )
    try:
        _shapes[source] = shapes
    except TypeError:
        pass
    return shapes


def plan_of(source: ImageSource, settings: StreamSettings) -> RectPlan:
    """The rect plan of ``source`` for ``settings`` (batch size, imgsz, ``rect_stride``)."""
    cfg = settings.augment
    return rect_plan(original_shapes(source), settings.batch_size, cfg.imgsz, cfg.rect_stride)


def crop(images: np.ndarray, masks: np.ndarray | None, shape: tuple[int, int], mask_ratio: int):
    """(images[:, :, :H, :W], masks[:, :H // r, :W // r] or None): a batch's own part of its slot squares."""
    h, w = shape
    out = images[:, :, :h, :w]
    return out, None if masks is None else masks[:, : h // mask_ratio, : w // mask_ratio]


class RectPlacement:
    """The rect validation route's part of a span (``batch._placement``): the plan's records and
    their batch's shape (H, W); each record at the centre of an (H, W) canvas of the fill in the
    top-left of its slot square, its rows normalised by W and H."""

    ultralytics_ties = True

    def __init__(
        self,
        reader: Reader,
        settings: StreamSettings,
        positions: np.ndarray,
    ) -> None:
        cfg = settings.augment
        spec = reader.spec
        plan = plan_of(reader.source, settings)
        self.height, self.width = plan.shape_of(positions) if len(positions) else (cfg.imgsz, cfg.imgsz)
        self.side = slot_side(cfg.imgsz, cfg.rect_stride)
        self.records = plan.order[positions]
        if spec.has_masks and not cfg.overlap_mask:
            raise ConfigError.for_field(
                "overlap_mask", False, "rect validation batches carry overlap mask planes only; use overlap_mask=True"
            )
        self.reader, self.imgsz = reader, cfg.imgsz
        self.scale = np.array([self.width, self.height], np.float32)

    def draw_range(self, images: np.ndarray, floats: list[np.ndarray] | None, timings) -> list[Labels]:
        return [self.draw(r, images[i], floats, StageClock(timings)) for i, r in enumerate(self.records.tolist())]

    def draw(self, record: int, out_chw: np.ndarray, floats: list[np.ndarray] | None, clock: StageClock) -> Labels:
        view = self.reader.read(record)
        image = view.image
        h, w = image.shape[:2]
        height, width = self.height, self.width
        if h > height or w > width:
            raise ConfigError(
                f"record {record} ({h}x{w}) exceeds its rect batch shape {height}x{width}; "
                f"the snapshot's imgsz {self.reader.source.imgsz} and the stream's {self.imgsz} must agree"
            )
        top, left = (height - h) // 2, (width - w) // 2
        _write_image(out_chw, image, top, left, height, width, self.reader.fill, floats)
        labels = Labels.from_targets(view.targets, w, h, left, top)
        clock.lap("letterbox")
        return labels

    def rows(self, labels: Labels, spec: TaskSpec, keypoints: int) -> np.ndarray:
        return _normalised(pack(labels, 1, task=spec, keypoints=keypoints), spec, keypoints, self.width, self.height)

    def points(self, labels: Labels) -> np.ndarray:
        return labels.points / self.scale


def _write_image(
    out_chw: np.ndarray,
    image: np.ndarray,
    top: int,
    left: int,
    height: int,
    width: int,
    fill: float,
    floats: list[np.ndarray] | None,
) -> None:
    """The record at (top, left) of an (height, width) canvas of the fill, RGB CHW, in the
    top-left of ``out_chw``; the rest of the square the fill too. The prepared pixel minus the
    fill plus the fill is the pixel exactly (whole values in float32)."""
    out_chw[...] = np.uint8(fill)
    h, w = image.shape[:2]
    pixels = image if image.dtype == np.uint8 else image + np.float32(fill)
    out_chw[:, top : top + h, left : left + w] = pixels.transpose(2, 0, 1)[::-1]  # BGR -> RGB
    if floats is not None:
        canvas = np.full((height, width, 3), np.float32(fill), np.float32)
        canvas[top : top + h, left : left + w] = pixels
        floats.append(canvas)


def _normalised(rows: np.ndarray, spec, keypoints: int, width: int, height: int) -> np.ndarray:
    """Rows of ``pack(labels, 1)`` (pixels) divided as Ultralytics' ``Format`` divides them:
    cx and w by the width, cy and h by the height (obb: the rotated box's too), keypoints x by
    the width and y by the height."""
    w, h = np.float32(width), np.float32(height)
    rows[:, [1, 3]] /= w
    rows[:, [2, 4]] /= h
    if spec.has_keypoints and keypoints:
        rows[:, 5::3] /= w
        rows[:, 6::3] /= h
    return rows
