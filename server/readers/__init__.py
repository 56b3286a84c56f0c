"""Dataset readers: COCO instances json and YOLO (data.yaml or images folder) -> one Dataset.

Runs in whichever process reads a dataset (the CLI, the daemon, the reference pipeline).
Readers only read files: no shared memory, no processes, so a bad dataset is refused
before anything is allocated. Both produce ``shared.stream.records.Record`` with normalised
float32 xyxy boxes and one (k, 2) polygon per instance, sorted by image path, so the same
images read from either format come in the same order with the same targets.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ...shared.errors import DatasetError, MissingFileError
from ...shared.stream.config import DEFAULT_MAX_CLASSES, DEFAULT_MAX_INSTANCES, check_value
from ...shared.stream.records import Dataset
from ...shared.task import TaskSpec, task_spec
from ._common import ReaderStats
from .coco import read_coco
from .yolo import label_path_for, read_yolo_folder, read_yolo_yaml, yaml_has_split

__all__ = [
    "load_dataset",
    "read_dataset",
    "read_coco",
    "read_yolo_yaml",
    "read_yolo_folder",
    "label_path_for",
    "yaml_has_split",
    "ReaderStats",
    "log_missing_labels",
]

logger = logging.getLogger(__name__)


def read_dataset(
    data: str | os.PathLike,
    images: str | os.PathLike | None = None,
    *,
    max_instances_per_image: int = DEFAULT_MAX_INSTANCES,
    allow_unlabelled: bool = False,
    split: str = "train",
    warn_missing_labels: bool = True,
    task: str | TaskSpec = "detect",
    max_classes: int = DEFAULT_MAX_CLASSES,
) -> tuple[Dataset, ReaderStats]:
    """Like ``load_dataset``, also returning what the reader found and left out.

    ``warn_missing_labels=False`` leaves the warning about images without a label file to
    the caller (``log_missing_labels``), which reads several splits that may be one folder."""
    check_value("max_instances_per_image", "int", max_instances_per_image)
    check_value("max_classes", "int", max_classes)
    check_value("allow_unlabelled", "bool", allow_unlabelled)
    spec = task_spec(task)  # an unknown task is refused before any file is looked at
    path = Path(data)
    suffix = path.suffix.lower()
    if suffix == ".json":
        return _capped(
            read_coco(path, images, task=spec, max_classes=max_classes),
            max_instances_per_image,
            lambda rec: f"{path} (image {rec.image_path})",
        )
    if images is not None:
        raise DatasetError(
            "--images (images=) applies to a COCO json only; a YOLO dataset finds its images itself", path=str(path)
        )
    # A YOLO label file is refused at its instance past the bound, while it is read.
    bounds = {"max_instances_per_image": max_instances_per_image, "max_classes": max_classes}
    if suffix in (".yaml", ".yml"):
        result = read_yolo_yaml(path, split, task=spec, **bounds)
    elif path.is_dir():
        result = read_yolo_folder(path, task=spec, **bounds)
    else:
        result = None
    if result is not None:
        _check_labels(result[1], path, allow_unlabelled)
        if warn_missing_labels:
            log_missing_labels(result[1], path)
        return _capped(result, max_instances_per_image, lambda rec: str(label_path_for(rec.image_path)))
    if not path.exists():
        raise MissingFileError(
            "dataset does not exist; pass a COCO json, a YOLO data.yaml or a YOLO images folder", path=str(path)
        )
    raise DatasetError(
        "unknown dataset kind; pass a COCO json (.json), a YOLO data.yaml (.yaml/.yml) or a YOLO images folder",
        path=str(path),
    )


def _check_labels(stats: ReaderStats, origin: Path, allow_unlabelled: bool) -> None:
    """A YOLO image without a label file is background, by the format's rule
    (``log_missing_labels`` says so). None of them with a label is most often a wrong layout
    (no ``labels/`` beside ``images/``): refused unless ``allow_unlabelled``."""
    if stats.labels_missing and stats.labels_missing == stats.records and not allow_unlabelled:
        raise DatasetError(
            f"none of the {stats.records} images has a label file (looked for e.g. {stats.missing_label_example}): every image "
            "would be background. Put the labels in a labels/ folder beside images/, or pass --allow-unlabelled if they really have none",
            path=str(origin),
        )


# A data.yaml key (pixpool's own; Ultralytics ignores it) saying how many of the set's images
# have no label file on purpose: background images. ``pixpool synth`` writes it.
DECLARED_BACKGROUND_KEY = "background_without_labels"


def log_missing_labels(stats: ReaderStats, origin: str | os.PathLike) -> None:
    """Warn that ``stats.labels_missing`` images of the dataset read from ``origin`` have no
    label file and are prepared as background (nothing when every image has one). Where the
    data.yaml declares exactly that many (``DECLARED_BACKGROUND_KEY``), they are backgrounds by
    design and this is said at info level: the synthetic set's first command warns of nothing."""
    if not stats.labels_missing:
        return
    declared = _declared_backgrounds(origin)
    if declared == stats.labels_missing:
        logger.info(
            "%s: %d of %d images have no label file (e.g. %s), by design (%s: %d in the data.yaml): prepared as background",
            origin,
            stats.labels_missing,
            stats.records,
            stats.missing_label_example,
            DECLARED_BACKGROUND_KEY,
            declared,
        )
        return
    logger.warning(
        "%s: %d of %d images have no label file (e.g. %s) and are prepared as background%s",
        origin,
        stats.labels_missing,
        stats.records,
        stats.missing_label_example,
        "" if declared is None else f" (the data.yaml declares {declared} as {DECLARED_BACKGROUND_KEY})",
    )


def _declared_backgrounds(origin: str | os.PathLike) -> int | None:
    """The data.yaml's ``DECLARED_BACKGROUND_KEY`` (None where ``origin`` is no data.yaml, or
    it does not say); read again here, a file of a few lines, only when labels are missing."""
    if not str(origin).endswith((".yaml", ".yml")):
        return None
    import yaml

    try:
        spec = yaml.safe_load(Path(origin).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # the reader has already read it; a warning without this is still right
    value = spec.get(DECLARED_BACKGROUND_KEY) if isinstance(spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _capped(result: tuple[Dataset, ReaderStats], cap: int, source_of) -> tuple[Dataset, ReaderStats]:
    """DatasetError naming the file of the first image with more than ``cap`` instances:
    every ring slot is sized for the densest image, so one runaway label file (a million
    lines) would make every trainer's ring huge. (A YOLO reader refuses such a file by line
    while reading it; this is the check for a COCO json, and for YOLO a second look.)"""
    dataset, _ = result
    for rec in dataset.records:
        if rec.num_instances > cap:
            raise DatasetError(
                f"{rec.num_instances} instances for one image, over the limit of {cap} per image "
                "(every batch slot is sized for the densest image); fix the labels, or raise --max-instances-per-image",
                path=source_of(rec),
            )
    return result


def load_dataset(
    data: str | os.PathLike,
    images: str | os.PathLike | None = None,
    *,
    max_instances_per_image: int = DEFAULT_MAX_INSTANCES,
    allow_unlabelled: bool = False,
    split: str = "train",
    task: str | TaskSpec = "detect",
    max_classes: int = DEFAULT_MAX_CLASSES,
) -> Dataset:
    """Read a dataset: ``data`` is a COCO json, a YOLO data.yaml (its ``split``), or a YOLO images folder.

    ``task`` (``config.TASKS``) is what the records carry beside boxes and which label lines fit:
    ``readers.yolo_labels`` for YOLO, ``readers.coco`` for COCO json (which has no obb).

    ``images`` is the COCO images folder (default: root/images/NAME for
    root/annotations/instances_NAME.json). Raises DatasetError (or MissingFileError)
    naming the offending file, and the line for YOLO label lines, also for an image with
    more than ``max_instances_per_image`` instances, and for a YOLO dataset where no image
    has a label file unless ``allow_unlabelled`` (some missing: a warning), and for more than
    ``max_classes`` classes (in an images folder: a class id >= it, by file and line).
    """
    dataset, stats = read_dataset(
        data,
        images,
        max_instances_per_image=max_instances_per_image,
        allow_unlabelled=allow_unlabelled,
        split=split,
        task=task,
        max_classes=max_classes,
    )
    if stats.crowd_skipped or stats.degenerate_skipped:
        logger.debug(
            "%s: left out %d crowd annotations and %d degenerate boxes",
            data,
            stats.crowd_skipped,
            stats.degenerate_skipped,
        )
    return dataset
