"""A source as one render loop reads it (``Reader``), and one record of it as the route's steps
take it (``RecordView``).

Runs wherever a batch is rendered. ``Reader`` is made once per range (``batch.py``) and is
the one place the route reads the source: its size, its task, the value its images are
centred by, and each record's image and targets. Mosaic, letterbox, copy-paste, mixup and
cutmix take ``RecordView`` values and labels, never the source. Only reads: the views may be
read-only shared memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ...shared.stream.config import FILL_VALUE
from ...shared.stream.records import Targets
from ...shared.stream.source import ImageSource
from ...shared.task import TaskSpec
from .resample import cached_targets, cached_targets_of, recent_of


class RecordView(NamedTuple):
    """One record: ``image`` its prepared (h, w, 3) image (a view of the source's), ``targets`` its
    normalised targets with the polygons resampled for the task (``resample.cached_targets``).
    A tuple: a mosaic reads four per sample, on the hot path."""

    image: np.ndarray
    targets: Targets


@dataclass(frozen=True)
class Reader:
    """The records of ``source`` for one render loop (``Reader.of``): ``count``, ``spec`` (the task),
    ``fill`` (the value the images are centred by, which the kernel adds back) and ``read(index)``."""

    source: ImageSource
    count: int
    spec: TaskSpec
    fill: float
    recent: object = None  # the targets' cache (``resample.recent_of``), looked up once per loop
    many: object = None  # the source's ``images(indices)`` where it has one (a snapshot's)

    @classmethod
    def of(cls, source: ImageSource) -> "Reader":
        spec = source.spec
        many = getattr(source, "images", None)
        many = many if callable(many) else None
        return cls(source, len(source), spec, fill_of(source), recent_of(source, spec.polygon_points), many)

    def read(self, index: int) -> RecordView:
        """Record ``index``: its image view and its targets, polygons resampled for the task."""
        points = self.spec.polygon_points
        return RecordView(self.source.image(index), cached_targets(self.source, index, points, self.recent))

    def read_many(self, indices: list[int]) -> list[RecordView]:
        """``read`` of each of ``indices`` (a list of ints), the images looked up together where the
        source can."""
        source = self.source
        images = self.many(indices) if self.many is not None else [source.image(i) for i in indices]
        targets = cached_targets_of(source, indices, self.spec.polygon_points, self.recent)
        return list(map(RecordView, images, targets))


def fill_of(source: ImageSource) -> float:
    """The value ``source``'s images are centred by: a prepared snapshot's header value (checked
    against ``FILL_VALUE`` when it was attached); a source without one centres by ``FILL_VALUE``
    (the reference pipeline, the tests' sources)."""
    return float(getattr(source, "fill", FILL_VALUE))
