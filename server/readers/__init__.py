"""Dataset readers: COCO instances json and YOLO (data.yaml or images folder) -> one Dataset.

Runs in whichever process reads a dataset (the CLI, the daemon, the reference pipeline).
Readers only read files: no shared memory, no processes, so a bad dataset is refused
before anything is allocated. Both produce ``shared.records.Record`` with normalised
float32 xyxy boxes and one (k, 2) polygon per instance, sorted by image path, so the same
images read from either format come in the same order with the same targets.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ...shared.errors import DatasetError, MissingFileError
from ...shared.records import Dataset
from ._common import ReaderStats
from .coco import read_coco
from .yolo import label_path_for, read_yolo_folder, read_yolo_yaml, yaml_has_split

__all__ = ["load_dataset", "read_dataset", "read_coco", "read_yolo_yaml", "read_yolo_folder", "label_path_for", "yaml_has_split", "ReaderStats"]

logger = logging.getLogger(__name__)


def read_dataset(data: str | os.PathLike, images: str | os.PathLike | None = None, *, split: str = "train") -> tuple[Dataset, ReaderStats]:
    """Like ``load_dataset``, also returning what the reader left out (crowd, degenerate boxes)."""
    path = Path(data)
    suffix = path.suffix.lower()
    if suffix == ".json":
        return read_coco(path, images)
    if images is not None:
        raise DatasetError("--images (images=) applies to a COCO json only; a YOLO dataset finds its images itself", path=str(path))
    if suffix in (".yaml", ".yml"):
        return read_yolo_yaml(path, split)
    if path.is_dir():
        return read_yolo_folder(path)
    if not path.exists():
        raise MissingFileError("dataset does not exist; pass a COCO json, a YOLO data.yaml or a YOLO images folder", path=str(path))
    raise DatasetError("unknown dataset kind; pass a COCO json (.json), a YOLO data.yaml (.yaml/.yml) or a YOLO images folder", path=str(path))


def load_dataset(data: str | os.PathLike, images: str | os.PathLike | None = None, *, split: str = "train") -> Dataset:
    """Read a dataset: ``data`` is a COCO json, a YOLO data.yaml (its ``split``), or a YOLO images folder.

    ``images`` is the COCO images folder (default: root/images/NAME for
    root/annotations/instances_NAME.json). Raises DatasetError (or MissingFileError)
    naming the offending file, and the line for YOLO label lines.
    """
    dataset, stats = read_dataset(data, images, split=split)
    if stats.crowd_skipped or stats.degenerate_skipped:
        logger.debug("%s: left out %d crowd annotations and %d degenerate boxes", data, stats.crowd_skipped, stats.degenerate_skipped)
    return dataset
