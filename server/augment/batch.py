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

Quantisation is one OpenCV pass per image (fill add in float32, round half to even,
saturate to 0..255: ``cv2.add(image, fill_array, dtype=CV_8U)``, equal to
``clip(rint(image + fill), 0, 255)``), then the flip as an 8-bit copy, then HSV (lookup tables) whose colour conversion also yields RGB,
then one split straight into the three output planes.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import cv2
import numpy as np

from ...shared.config import FILL_VALUE, StreamSettings
from ...shared.errors import ConfigError
from ...shared.source import ImageSource
from . import hsv
from .labels import pack
from .route import Pending, _Clock, render
from .rng import hsv_gains
from .sampler import batch_samples


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


def batch_digest(images: np.ndarray, targets: np.ndarray) -> str:
    """SHA-256 hex over the images' and the packed targets' shapes and bytes."""
    h = hashlib.sha256()
    for array, dtype in ((images, np.uint8), (targets, np.float32)):
        array = np.ascontiguousarray(array, dtype=dtype)
        h.update(repr(array.shape).encode())
        h.update(memoryview(array).cast("B"))
    return h.hexdigest()


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
    """Render batch ``batch`` of ``epoch`` of the stream ``settings`` from ``source``.

    ``images_out``: uint8 C-contiguous (>= B, 3, S, S) to write into (e.g. a ring slot);
    ``Batch.images`` is then its first B entries. ``timings`` (dict) accumulates
    seconds per stage for the benchmark.
    """
    cfg = settings.augment
    size = cfg.imgsz
    if source.imgsz != size:
        raise ConfigError(f"the source is prepared at imgsz {source.imgsz} but the stream asks for imgsz {size}; prepare at {size} or set imgsz={source.imgsz}")
    samples = batch_samples(len(source), settings, epoch, batch)
    count = len(samples)
    images = _output(images_out, count, size)
    apply_hsv = cfg.augment and not settings.hsv_on_device
    floats: list[np.ndarray] | None = [] if keep_float else None
    rows: list[np.ndarray] = []
    segments: list[np.ndarray] = []
    for b, index in enumerate(samples.tolist()):
        pending = render(source, index, settings, epoch, timings=timings)
        if floats is not None:
            floats.append(pending.float_image())
        gains = hsv_gains(settings.seed, epoch, index, cfg.hsv_h, cfg.hsv_s, cfg.hsv_v) if apply_hsv else None
        write_image(pending, images[b], gains, timings=timings)
        packed = pack(pending.labels, size)
        row = np.empty((len(packed), 6), dtype=np.float32)
        row[:, 0] = b
        row[:, 1:] = packed
        rows.append(row)
        labels = pending.labels
        if len(labels):
            segments.extend(np.split(labels.points * np.float32(1.0 / size), labels.offsets[1:-1]))
    targets = np.concatenate(rows) if rows else np.zeros((0, 6), np.float32)
    return Batch(images, targets, samples, floats, segments)


def write_image(pending: Pending, out_chw: np.ndarray, gains: np.ndarray | None, *, timings: dict[str, float] | None = None) -> None:
    """Quantise ``pending``'s float image, flip, HSV, and write it as RGB planes into ``out_chw``."""
    clock = _Clock(timings)
    if pending.offset:
        # Array + array: OpenCV adds in float32, exactly the float image's own sum, then
        # rounds half to even. (With a scalar it adds in float64 instead, which rounds
        # differently where the float32 sum lands on .5 but the exact one lies just below;
        # tests/test_augment_straightforward.py caught it.)
        u8 = cv2.add(pending.image, _fill_like(pending.image), dtype=cv2.CV_8U)
    else:
        u8 = cv2.add(pending.image, (0.0, 0.0, 0.0, 0.0), dtype=cv2.CV_8U)  # x + 0.0 is exact in any precision
    if pending.flip_code is not None:
        u8 = cv2.flip(u8, pending.flip_code)
    clock.lap("quantise")
    if gains is not None:
        rgb = hsv.apply_hsv_bgr(u8, gains, to_rgb=True)
        clock.lap("hsv")
        cv2.split(rgb, [out_chw[0], out_chw[1], out_chw[2]])
    else:
        cv2.split(u8, [out_chw[2], out_chw[1], out_chw[0]])
    clock.lap("pack")


_fills = threading.local()


def _fill_like(image: np.ndarray) -> np.ndarray:
    """A read-only float32 array of the fill value shaped like ``image`` (cached per thread)."""
    cache = getattr(_fills, "by_shape", None)
    if cache is None:
        cache = _fills.by_shape = {}
    fill = cache.get(image.shape)
    if fill is None:
        if len(cache) > 4:
            cache.clear()
        fill = cache[image.shape] = np.full(image.shape, FILL_VALUE, dtype=np.float32)
        fill.flags.writeable = False
    return fill


def _output(images_out: np.ndarray | None, count: int, size: int) -> np.ndarray:
    if images_out is None:
        return np.empty((count, 3, size, size), dtype=np.uint8)
    if images_out.dtype != np.uint8 or images_out.ndim != 4 or images_out.shape[1:] != (3, size, size) or images_out.shape[0] < count:
        raise ConfigError(f"images_out must be uint8 (>= {count}, 3, {size}, {size}), got {images_out.dtype} {images_out.shape}")
    if not images_out.flags.c_contiguous:
        raise ConfigError("images_out must be C-contiguous (a ring slot or np.empty)")
    return images_out[:count]
