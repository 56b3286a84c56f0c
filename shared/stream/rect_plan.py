"""Ultralytics' rectangular validation batches: their order, their shapes and each rank's share.

Part of the stream contract both sides share. The daemon renders a validation stream with
``AugmentConfig.rect_stride`` > 0 by this plan (``server/augment/val_rect.py``); a trainer
reads each batch's shape from the same plan to cut it out of its ring slot
(``integrations/ultralytics/val_loader.py``, ``client/train/fit.py``). Both compute it from
the records' decoded sizes (EXIF orientation applied), in record order: the daemon from its
snapshot's index, a trainer from the same sizes the daemon sends with the records' names
(from the image files' headers only where a daemon sends none).

What Ultralytics 8.4's validation dataset does (``BaseDataset.set_rectangle`` with the
validation loader's pad of 0.5, then ``ContiguousDistributedSampler`` under DDP):

- order: the records sorted by aspect ratio h / w (numpy's default ``argsort``, on the ratios
  in record order, which is Ultralytics' image order: both sort by path);
- batch ``i`` of ``batch_size`` consecutive positions in that order has the shape (H, W):
  ``[maxi, 1]`` when every ratio in it is < 1, ``[1, 1 / mini]`` when every one is > 1, else
  ``[1, 1]``, times ``imgsz / stride + pad``, rounded up, times the stride. The largest is
  ``slot_side``: a ring slot of that square holds any of them;
- DDP rank ``r`` of ``world`` takes a contiguous run of whole batches, the first
  ``num_batches % world`` ranks one more (a ``batch_size`` of the whole set or more makes
  the runs single records). Nothing is padded or repeated.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["RECT_PAD", "RectPlan", "contiguous_shard", "rect_plan", "slot_side"]

# Ultralytics' validation loader pads each batch shape by half a stride (``build_yolo_dataset``).
RECT_PAD = 0.5


@dataclass(frozen=True, eq=False)
class RectPlan:
    """``order``: int64 record index at each position; ``shapes``: int64 (positions, 2) the
    (H, W) of each position's batch; ``batch_size``: positions per batch."""

    order: np.ndarray
    shapes: np.ndarray
    batch_size: int

    def shape_of(self, positions: np.ndarray) -> tuple[int, int]:
        """The one (H, W) of ``positions`` (a rendered batch's); ConfigError if they span two."""
        shapes = np.unique(self.shapes[np.asarray(positions, dtype=np.int64)], axis=0)
        if len(shapes) != 1:
            raise ConfigError(
                f"positions {positions[:1].tolist()}..{positions[-1:].tolist()} span {len(shapes)} rectangular batch "
                "shapes; a rect stream's batches follow its plan's batches (contiguous_shard)"
            )
        return int(shapes[0, 0]), int(shapes[0, 1])


def slot_side(imgsz: int, stride: int) -> int:
    """The largest side a batch of ``rect_plan`` can have: the square a ring slot must hold."""
    return int(math.ceil(imgsz / stride + RECT_PAD)) * stride


def rect_plan(shapes_hw: np.ndarray, batch_size: int, imgsz: int, stride: int) -> RectPlan:
    """The plan of records of decoded sizes ``shapes_hw`` ((n, 2) height, width, record order)."""
    return _plan(np.asarray(shapes_hw, dtype=np.int64).tobytes(), int(batch_size), int(imgsz), int(stride))


@functools.lru_cache(maxsize=8)
def _plan(shapes: bytes, batch_size: int, imgsz: int, stride: int) -> RectPlan:
    s = np.frombuffer(shapes, dtype=np.int64).reshape(-1, 2)
    n = len(s)
    if n == 0 or stride < 1 or batch_size < 1:
        raise ConfigError(f"a rect plan needs records, a stride and a batch size; got {n}, {stride}, {batch_size}")
    if (s < 1).any():
        raise ConfigError("a record's decoded size is 0; the snapshot or the image header is damaged")
    bi = np.floor(np.arange(n) / batch_size).astype(int)  # batch of each position, as Ultralytics computes it
    nb = bi[-1] + 1
    ar = s[:, 0] / s[:, 1]
    order = ar.argsort()
    ar = ar[order]
    shapes_ = [[1, 1]] * nb
    for i in range(nb):
        ari = ar[bi == i]
        mini, maxi = ari.min(), ari.max()
        if maxi < 1:
            shapes_[i] = [maxi, 1]
        elif mini > 1:
            shapes_[i] = [1, 1 / mini]
    # The same float64 expression as Ultralytics', so the rounding is the same.
    batch_shapes = np.ceil(np.array(shapes_) * imgsz / stride + RECT_PAD).astype(int) * stride
    order = order.astype(np.int64)
    per_position = batch_shapes[bi].astype(np.int64)
    order.flags.writeable = False
    per_position.flags.writeable = False
    return RectPlan(order, per_position, batch_size)


def contiguous_shard(num_records: int, batch_size: int, world_size: int, rank: int) -> np.ndarray:
    """int64 positions of rank ``rank``'s share (Ultralytics' ``ContiguousDistributedSampler``
    over a dataset of ``batch_size``): a contiguous run of whole batches."""
    unit = 1 if batch_size >= num_records else batch_size
    batches = -(-num_records // unit)
    base, extra = divmod(batches, world_size)
    first = rank * base + min(rank, extra)
    count = base + (1 if rank < extra else 0)
    start = min(first * unit, num_records)
    stop = min((first + count) * unit, num_records)
    return np.arange(start, stop, dtype=np.int64)
