"""The reference pipeline's source: decodes, resizes and centres each image on every call.

Runs in-process wherever the reference path is asked for (``pixpool digest --reference``,
the parity tests). It holds no snapshot and no cache: each ``image(i)`` calls
``decode.prepare_image``, the very functions preparation uses, so the floats it hands
to the route are the ones the snapshot stores; running the same route over both and
comparing bytes proves the snapshot changes nothing.
"""

from __future__ import annotations

import numpy as np

from ...shared.stream.records import Dataset, Targets
from ...shared.task import WithSpec
from .decode import decode_bgr, prepare_image


class ReferenceSource(WithSpec):
    """``ImageSource`` over a ``Dataset`` with no snapshot (slow by design)."""

    def __init__(self, dataset: Dataset, imgsz: int):
        self.dataset = dataset
        self.imgsz = int(imgsz)
        # What the snapshot of the same dataset says of itself (``Snapshot.spec``).
        self.spec = dataset.spec

    def __len__(self) -> int:
        return len(self.dataset.records)

    def image(self, index: int) -> np.ndarray:
        image = prepare_image(self.dataset.records[index].image_path, self.imgsz)
        image.flags.writeable = False  # same contract as the snapshot's views
        return image

    def targets(self, index: int) -> Targets:
        return Targets.from_record(self.dataset.records[index])

    def original_shapes(self) -> np.ndarray:
        """int64 (n, 2) decoded (height, width) of every record, as a snapshot's index keeps them
        (the rect validation route plans its batches from them); decodes every image."""
        return np.array([decode_bgr(r.image_path).shape[:2] for r in self.dataset.records], dtype=np.int64)
