"""Polygon resampling before the route, as Ultralytics' dataset does it for segment and OBB labels.

Runs wherever a sample is rendered (workers, reference pipeline, digest), on the source's
normalised polygons as each record is read (``record.Reader.read``); the source's arrays are
only read.

Each polygon is closed (its first vertex appended), and points are placed along its outline
by linear interpolation over the vertex index: ``count`` points evenly spaced from the first
vertex to the closing one, merged with the original vertices where the closed outline has
fewer than ``count`` points (so every corner survives), or exactly ``count`` evenly spaced
points where it has more. A polygon that already has ``count`` points is kept as it is.
``count`` is per record: the task's ``TaskSpec.polygon_points``, raised to the longest
polygon's length + 1 when a polygon of the record is longer (so none is thinned out).

The positions along the outline depend only on (closed length, count), so they are computed
once per pair (a small cache) and every polygon of a record is interpolated in one gather.

A record's resampled polygons are a pure function of its polygons, so each process keeps
the most recently used records' targets (``cached_targets``, up to ``CACHE_BYTES`` per source
and task, every task, detect and pose too, these up to ``PLAIN_CACHE_BYTES``): a record used again (a mosaic partner, the next
epoch) is neither fetched nor resampled again. The cache holds read-only copies owned by this
process (classes, boxes, polygons, keypoints; the same values and dtypes as the source's), never a
view of the source's shared memory, which would keep a released snapshot mapped.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from ...shared.stream.records import Targets

MIN_VERTICES = 3  # fewer vertices count as no polygon (``labels.py``), and are not resampled
CACHE_BYTES = 64 << 20  # per source, task and process: coco128's segment polygons take ~8 MB
# Records that are not resampled (detect, pose) save only a fetch (~20 us) on a hit, and every
# worker holds its own cache: a small bound keeps a COCO-sized set's workers lean (coco128's
# detect records take ~0.2 MB) while a small set, or a mosaic's partners, still hit.
PLAIN_CACHE_BYTES = 8 << 20


@lru_cache(maxsize=4096)
def _positions(closed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(int64 segment index k, float64 fraction t) of each output point along a closed outline
    of ``closed`` vertices (first == last): the point is ``v[k] + (v[k + 1] - v[k]) * t``."""
    last = closed - 1
    if closed < count:
        even = np.linspace(0.0, last, count - closed)
        vertices = np.arange(closed, dtype=np.float64)
        # each original vertex goes before the first even position not below it
        x = np.insert(even, np.searchsorted(even, vertices), vertices)
    else:
        x = np.linspace(0.0, last, count)
    k = np.minimum(np.floor(x).astype(np.int64), last - 1)
    t = x - k
    k.flags.writeable = False
    t.flags.writeable = False
    return k, t


def record_count(polygons: tuple[np.ndarray, ...] | list[np.ndarray], points: int) -> int:
    """The resample count of one record: ``points``, or its longest polygon's length + 1 when longer."""
    longest = max((len(p) for p in polygons), default=0)
    return longest + 1 if points < longest else points


def resample_polygons(polygons: tuple[np.ndarray, ...] | list[np.ndarray], points: int) -> list[np.ndarray]:
    """The record's polygons (float32 (k, 2)) resampled for a task of ``points`` points (see the module
    docstring); polygons with fewer than 3 vertices are returned unchanged. New arrays; the inputs are read."""
    if points <= 0 or not polygons:
        return list(polygons)
    count = record_count(polygons, points)
    out = list(polygons)
    todo = [i for i, p in enumerate(polygons) if len(p) >= MIN_VERTICES and len(p) != count]
    if not todo:
        return out
    closed = [np.concatenate([polygons[i], polygons[i][:1]]).astype(np.float64) for i in todo]
    lengths = [len(c) for c in closed]
    starts = np.cumsum([0] + lengths[:-1])
    ks, ts = zip(*(_positions(m, count) for m in lengths))
    k = np.concatenate([kk + s for kk, s in zip(ks, starts)])
    t = np.concatenate(ts)[:, None]
    v = np.concatenate(closed).reshape(-1, 2)
    res = ((v[k + 1] - v[k]) * t + v[k]).astype(np.float32)
    for j, i in enumerate(todo):
        out[i] = res[j * count : (j + 1) * count]
    return out


class _Recent:
    """Targets of recently used records of one source, least recently used dropped first."""

    def __init__(self, limit: int = CACHE_BYTES) -> None:
        self.entries: OrderedDict[int, tuple[Targets, int]] = OrderedDict()
        self.nbytes = 0
        self.limit = limit

    def get(self, index: int) -> Targets | None:
        hit = self.entries.get(index)
        if hit is None:
            return None
        self.entries.move_to_end(index)
        return hit[0]

    def put(self, index: int, targets: Targets) -> None:
        size = _footprint(targets)
        if size > self.limit:
            return
        self.entries[index] = (targets, size)
        self.nbytes += size
        while self.nbytes > self.limit:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.nbytes -= dropped


def _footprint(targets: Targets) -> int:
    """Bytes a cached record holds: its arrays' data and ~100 bytes of object per array (a
    detect record's arrays are tiny, so the count, not the data, bounds the cache)."""
    arrays = [targets.classes, targets.boxes, *targets.polygons]
    if targets.keypoints is not None:
        arrays.append(targets.keypoints)
    return sum(a.nbytes for a in arrays) + _ARRAY_OVERHEAD * len(arrays)


_ARRAY_OVERHEAD = 100
_caches: weakref.WeakKeyDictionary[object, dict[int, _Recent]] = weakref.WeakKeyDictionary()


def _private(array: np.ndarray | None, dtype, shape: tuple[int, ...] | None = None) -> np.ndarray | None:
    """A read-only copy of ``array`` owned by this process (never a view of the source's shared
    memory, which a cached view would keep mapped after the snapshot is let go)."""
    if array is None:
        return None
    out = np.array(array, dtype=dtype, copy=True)
    if shape is not None:
        out = out.reshape(shape)
    out.flags.writeable = False
    return out


def resampled_targets(source, index: int, points: int) -> Targets:
    """``cached_targets`` with this process's cache of ``source`` looked up for the one call."""
    return cached_targets(source, index, points, recent_of(source, points))


def recent_of(source, points: int) -> _Recent | None:
    """This process's cache of ``source``'s targets resampled to ``points`` (None: a source that
    cannot be weakly referenced); a render loop looks it up once (``record.Reader``)."""
    try:
        per_source = _caches.setdefault(source, {})
    except TypeError:
        return None
    recent = per_source.get(points)
    if recent is None:
        recent = per_source[points] = _Recent(CACHE_BYTES if points else PLAIN_CACHE_BYTES)
    return recent


def cached_targets_of(source, indices: list[int], points: int, recent: _Recent | None) -> list[Targets]:
    """``cached_targets`` of each of ``indices``, in order (the same lookups and the same cache
    updates, one after another; a mosaic range reads four records per sample)."""
    if recent is None:
        return [cached_targets(source, i, points, None) for i in indices]
    entries = recent.entries
    out: list[Targets] = []
    for i in indices:
        hit = entries.get(i)
        if hit is None:
            out.append(cached_targets(source, i, points, recent))
        else:
            entries.move_to_end(i)
            out.append(hit[0])
    return out


def cached_targets(source, index: int, points: int, recent: _Recent | None) -> Targets:
    """``source.targets(index)`` with its polygons resampled for a task of ``points`` points (0: as
    they are), from ``recent`` (``recent_of``) when the record was used recently.

    Every route fetches a record's targets once per use (four per mosaic), and a snapshot's
    ``targets`` builds a view per polygon each time; the cache keeps the record's arrays as
    process-private read-only copies instead (the same values and dtypes), so a record used again
    costs a dictionary lookup. Without a cache (a source that cannot be weakly referenced) the
    record is read every time."""
    hit = None if recent is None else recent.get(index)
    if hit is not None:
        return hit
    targets = source.targets(index)
    if recent is None and points <= 0:
        return targets
    n = len(targets.classes)
    if len(targets.polygons) == n and points > 0:
        polys = resample_polygons(targets.polygons, points)
    elif any(len(p) for p in targets.polygons):
        polys = list(targets.polygons)
    else:
        polys = []  # no vertex anywhere: the route treats no polygons and n empty ones alike
    out = Targets(
        _private(targets.classes, np.int32, (-1,)),
        _private(targets.boxes, np.float32, (-1, 4)),
        tuple(_private(p, np.float32) for p in polys),
        _private(targets.keypoints, np.float32),
    )
    if recent is not None:
        recent.put(index, out)
    return out
