"""Which record indices a trainer's stream delivers, in which order, in which batches.

Part of the stream contract both sides share: the daemon sizes and fills batches with it,
a trainer knows from it how many batches its shard has (and anywhere a stream is replayed:
digest, tests).

Epoch order: ``arange(N)`` permuted by the epoch's shuffle generator (``rng.py``,
derived from ``(seed, epoch)`` alone) when ``settings.shuffle``, else in order.

DDP shard: like torch's ``DistributedSampler``. Without ``drop_last`` the global order is
padded to a multiple of ``world_size`` by repeating its head (so every rank has the same
number of samples); with ``drop_last`` its tail is cut to a multiple instead. Rank ``r``
takes positions ``r, r + world_size, ...``. Each position of a rank's shard is delivered
exactly once per epoch. Padding can repeat a record on another rank (and, only when
``world_size > N``, within one shard); a repeated record gets the same augmentation,
because randomness derives from the record index.

Batches: consecutive runs of ``batch_size`` shard positions; the last one is shorter,
or dropped when ``drop_last``.

Rect validation (``Route.RECT_VAL``): the shard is a contiguous run of positions of the
aspect-ratio order, whole batches per rank, as Ultralytics' ``ContiguousDistributedSampler``
(``rect_plan.py``); the route maps a position to its record.

The shard order of the last few (records, seed, epoch, shard) is kept, read-only: every
worker renders a part of every batch and asks for the batch's samples once per part,
and a permutation of a large dataset (118k COCO records) costs milliseconds each time.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import ConfigError
from .config import StreamSettings
from .rect_plan import contiguous_shard
from .rng import shuffle_generator
from .route import Route


def epoch_indices(num_records: int, settings: StreamSettings, epoch: int) -> np.ndarray:
    """int64 record indices of this rank's shard, in delivery order (read-only)."""
    if num_records <= 0:
        raise ConfigError(f"the dataset has {num_records} records; a stream needs at least one")
    if settings.augment.route is Route.RECT_VAL:
        # Rect validation: positions of the aspect-ratio order (``rect_plan``), whole batches per rank.
        return _contiguous(num_records, settings.batch_size, settings.world_size, settings.rank)
    return _shard(
        num_records, settings.seed, epoch, settings.shuffle, settings.world_size, settings.rank, settings.drop_last
    )


@functools.lru_cache(maxsize=8)
def _shard(
    num_records: int, seed: int, epoch: int, shuffle: bool, world: int, rank: int, drop_last: bool
) -> np.ndarray:
    if shuffle:
        order = shuffle_generator(seed, epoch).permutation(num_records).astype(np.int64)
    else:
        order = np.arange(num_records, dtype=np.int64)
    if drop_last:
        order = order[: (num_records // world) * world]
    else:
        total = -(-num_records // world) * world
        if total > num_records:
            order = np.resize(order, total)  # repeats the head cyclically
    shard = np.ascontiguousarray(order[rank::world])
    shard.flags.writeable = False  # cached: shared by every caller
    return shard


@functools.lru_cache(maxsize=8)
def _contiguous(num_records: int, batch_size: int, world: int, rank: int) -> np.ndarray:
    shard = contiguous_shard(num_records, batch_size, world, rank)
    shard.flags.writeable = False  # cached: shared by every caller
    return shard


def num_batches(num_records: int, settings: StreamSettings, epoch: int) -> int:
    """How many batches this rank's stream has in ``epoch``."""
    n = len(epoch_indices(num_records, settings, epoch))
    return n // settings.batch_size if settings.drop_last else -(-n // settings.batch_size)


def batch_samples(num_records: int, settings: StreamSettings, epoch: int, batch: int) -> np.ndarray:
    """int64 record indices of batch ``batch`` of ``epoch`` (this rank)."""
    total = num_batches(num_records, settings, epoch)
    if not 0 <= batch < total:
        raise ConfigError(f"batch {batch} is outside epoch {epoch}'s {total} batches; use 0 <= batch < {total}")
    indices = epoch_indices(num_records, settings, epoch)
    b = settings.batch_size
    return indices[batch * b : (batch + 1) * b].copy()
