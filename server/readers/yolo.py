"""YOLO datasets -> Dataset: a ``data.yaml`` or an images folder with a sibling labels folder.

Runs in whichever process reads a dataset (the CLI, the daemon). Reads files only; it
allocates no shared memory, so every error here comes before a snapshot exists.

Layout rules (those of the Ultralytics tools):

- ``data.yaml``: ``train`` is a folder, a ``.txt`` file listing image paths, or a list of
  those; ``names`` a list, or a dict {id: name} with ids 0..N-1. Relative ``train``
  entries resolve against ``path``, which itself resolves against the yaml's folder when
  relative (Ultralytics would use its global datasets folder there; the yaml's folder keeps
  a dataset relocatable) and defaults to that folder. An entry starting with ``../`` that
  does not exist is retried without it, as Ultralytics does. Relative lines of a ``.txt``
  list resolve against the list's folder. ``val``/``test`` are not read: pixpool serves
  training data.
- Image folders are searched recursively for jpg jpeg png bmp tif tiff webp (any case).
- An image's label file replaces the last ``images`` component of its path with
  ``labels`` and its suffix with ``.txt``. Label files without an image are not read.
- An images folder read directly has no class names: names are "0".."K" up to the largest
  class id found, which must be under ``max_classes`` (``--max-classes``); a data.yaml's
  ``names`` are at most that many. A label file is refused at its instance past
  ``max_instances_per_image`` (``yolo_labels``: read line by line, nothing after it is read).

Tasks (``task``, one of ``config.TASKS``; the label line forms are in ``yolo_labels``): pose
needs the data.yaml's ``kpt_shape`` [K, D] (K >= 1, D 2 or 3), and takes its ``flip_idx`` (a
permutation of 0..K-1, the keypoint each one becomes under a left-right flip) when it has one;
without it ``Dataset.flip_idx`` is None (Ultralytics then turns its flips off, with a warning:
this reader warns too). An images folder has no data.yaml, so it cannot be read for pose. The
other tasks leave ``kpt_shape`` and ``flip_idx`` None whatever the yaml says.

Paths are made absolute without resolving symlinks (labels are found beside the path as
given). Records are sorted by image path; duplicates (an image listed twice) are kept.
``Dataset.source_files``: the yaml, every ``.txt`` list, and every label file that exists;
``Dataset.absent_files``: every label file looked for and missing (and a ``../`` entry's first
try); ``Dataset.listed_dirs``: every folder searched for images.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ...shared.errors import DatasetError, MissingFileError, PixpoolError
from ...shared.stream.config import DEFAULT_MAX_CLASSES, DEFAULT_MAX_INSTANCES
from ...shared.stream.records import Dataset, Record
from ...shared.stream.yolo_layout import IMAGE_SUFFIXES, images_from_list, images_in, label_path_for
from ...shared.stream.yolo_yaml import load_yaml, resolve_entry, split_entries, split_root
from ...shared.task import DETECT, TaskSpec
from ...shared.text import shown
from ...shared.wire.trainer import MAX_KEYPOINTS
from ._common import ReaderStats, check_class_count, check_class_names, make_record
from .yolo_labels import parse_label_file

logger = logging.getLogger(__name__)


# A class name as YAML may write it: ``person``, ``1``, ``1.5``, ``yes`` (str() as before).
_NAME_TYPES = (str, int, float, bool)


def _names(raw, yaml_path: Path, max_classes: int) -> tuple[str, ...]:
    """The data.yaml's ``names`` in id order: counted against ``max_classes`` and type-checked
    before any name is turned into text."""
    if not isinstance(raw, (list, dict)):
        raise DatasetError("'names' must be a list of class names or a {id: name} mapping", path=str(yaml_path))
    check_class_count(len(raw), max_classes=max_classes, path=str(yaml_path), what="the data.yaml's 'names'")
    if isinstance(raw, list):
        values = raw
    else:
        ids = []
        for k in raw:
            if isinstance(k, bool) or not isinstance(k, (int, str)) or (isinstance(k, str) and len(k) > 20):
                raise DatasetError(f"'names' key {shown(k, 40)} is not an integer class id", path=str(yaml_path))
            try:
                ids.append(int(k))
            except ValueError:
                raise DatasetError(
                    f"'names' key {shown(k, 40)} is not an integer class id", path=str(yaml_path)
                ) from None
        if sorted(ids) != list(range(len(ids))):
            raise DatasetError(
                f"'names' ids must be 0..{len(ids) - 1} without gaps, got {shown(sorted(ids))}", path=str(yaml_path)
            )
        by_id = dict(zip(ids, raw.values()))
        values = [by_id[i] for i in range(len(ids))]
    for i, name in enumerate(values):
        if not isinstance(name, _NAME_TYPES):
            raise DatasetError(
                f"'names' entry {i} is {shown(name, 60)} ({type(name).__name__}); a class name is a string",
                path=str(yaml_path),
            )
    return tuple(str(n) for n in values)


def _kpt_shape(raw, yaml_path: Path) -> tuple[int, int]:
    """The data.yaml's ``kpt_shape`` as (K, D), 1 <= K <= ``MAX_KEYPOINTS`` (what an ``attached``
    reply may carry); DatasetError naming the field otherwise."""
    ok = (
        isinstance(raw, (list, tuple))
        and len(raw) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in raw)
        and 1 <= raw[0] <= MAX_KEYPOINTS
        and raw[1] in (2, 3)
    )
    if not ok:
        raise DatasetError(
            f"'kpt_shape' is {shown(raw)}; the pose task needs 'kpt_shape: [K, D]' with 1 <= K <= {MAX_KEYPOINTS} "
            "keypoints and D = 2 (x y) or 3 (x y visibility), e.g. 'kpt_shape: [17, 3]'",
            path=str(yaml_path),
        )
    return int(raw[0]), int(raw[1])


def _flip_idx(raw, k: int, yaml_path: Path) -> tuple[int, ...] | None:
    """The data.yaml's ``flip_idx``: a permutation of 0..K-1; None (with a warning) when absent."""
    if raw is None:
        logger.warning(
            "%s: no 'flip_idx' for the pose task: a left-right flip cannot tell which keypoint becomes which, so "
            "Ultralytics turns fliplr and flipud off for such a dataset; add 'flip_idx' (the index each keypoint "
            "takes under a left-right flip, K = %d entries) to flip",
            yaml_path,
            k,
        )
        return None
    if not (isinstance(raw, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in raw)):
        raise DatasetError(
            f"'flip_idx' is {shown(raw)}; it must be a list of {k} keypoint indices", path=str(yaml_path)
        )
    if len(raw) != k or sorted(raw) != list(range(k)):  # k is bounded (_kpt_shape); raw by the yaml's bounds
        raise DatasetError(
            f"'flip_idx' {shown(list(raw))} is not a permutation of 0..{k - 1} (kpt_shape has K = {k} keypoints): each keypoint "
            "must appear once, as the index it takes under a left-right flip (its own index when it has no mirror)",
            path=str(yaml_path),
        )
    return tuple(int(v) for v in raw)


def _read_images(
    images: list[Path],
    names: tuple[str, ...] | None,
    source_files: list[str],
    *,
    spec: TaskSpec,
    kpt_shape: tuple[int, int] | None = None,
    max_instances: int = DEFAULT_MAX_INSTANCES,
    max_classes: int = DEFAULT_MAX_CLASSES,
) -> tuple[list[Record], int, list[Path]]:
    records = []
    dropped = 0
    missing = []
    num_classes = len(names) if names is not None else None
    kpt_count = kpt_shape[0] if spec.has_keypoints else 0
    for image in sorted(images, key=str):
        label = label_path_for(image)
        classes, boxes, polygons, keypoints, n_dropped = parse_label_file(
            label, num_classes, task=spec, kpt_shape=kpt_shape, max_instances=max_instances, max_classes=max_classes
        )
        if label.is_file():
            source_files.append(str(label))
        else:
            missing.append(label)
        dropped += n_dropped
        records.append(make_record(str(image), None, classes, boxes, polygons, keypoints, kpt_count=kpt_count))
    return records, dropped, missing


def _finish(
    records: list[Record],
    names: tuple[str, ...],
    source_files: list[str],
    dropped: int,
    missing: list[Path],
    origin: Path,
    *,
    spec: TaskSpec,
    kpt_shape: tuple[int, int] | None = None,
    flip_idx: tuple[int, ...] | None = None,
    absent: list[str] = (),
    dirs: list[str] = (),
) -> tuple[Dataset, ReaderStats]:
    stats = ReaderStats(
        records=len(records),
        instances=sum(r.num_instances for r in records),
        background=sum(1 for r in records if r.num_instances == 0),
        degenerate_skipped=dropped,
        labels_missing=len(missing),
        missing_label_example=str(missing[0]) if missing else None,
    )
    logger.debug("%s: %s", origin, stats)
    files = tuple(sorted(set(source_files)))
    dataset = Dataset(
        records=tuple(records), names=names, source_files=files, spec=spec.with_keypoints(kpt_shape, flip_idx),
        absent_files=tuple(sorted({*absent, *map(str, missing)})), listed_dirs=tuple(sorted(set(dirs))),
    )  # fmt: skip
    return dataset, stats


def yaml_has_split(yaml_path: str | os.PathLike, split: str) -> bool:
    """Whether a readable ``data.yaml`` names a ``split`` (``val``) entry."""
    try:
        data = load_yaml(Path(yaml_path))  # its bounds: a yaml that breaks one names no split
    except PixpoolError:
        return False
    return isinstance(data, dict) and data.get(split) not in (None, "", [], {})


def read_yolo_yaml(
    yaml_path: str | os.PathLike,
    split: str = "train",
    *,
    task: TaskSpec = DETECT,
    max_instances_per_image: int = DEFAULT_MAX_INSTANCES,
    max_classes: int = DEFAULT_MAX_CLASSES,
) -> tuple[Dataset, ReaderStats]:
    """Read a YOLO ``data.yaml``'s ``split`` (``train`` or ``val``) for ``task``; see the module docstring for the rules."""
    spec = task
    yaml_path = Path(os.path.abspath(yaml_path))
    data = load_yaml(yaml_path)
    for key in (split, "names"):
        if data.get(key) in (None, "", [], {}):
            raise DatasetError(
                f"missing '{key}'; a YOLO data.yaml needs '{split}' (images folder or list) and 'names' (class names)",
                path=str(yaml_path),
            )
    names = _names(data["names"], yaml_path, max_classes)
    check_class_names(names, max_classes=max_classes, path=str(yaml_path), what="the data.yaml's 'names'")
    if "nc" in data and data["nc"] != len(names):
        raise DatasetError(
            f"'nc' is {shown(data['nc'])} but 'names' lists {len(names)} classes; make them agree", path=str(yaml_path)
        )

    # kpt_shape matters for every task: a detect read of a pose set keeps the pose lines' boxes.
    kpt_shape = flip_idx = None
    if spec.has_keypoints and data.get("kpt_shape") is None:
        raise DatasetError(
            "the pose task needs 'kpt_shape: [K, D]' in the data.yaml (K keypoints per instance, D = 2 for x y or 3 "
            "for x y visibility); add it, or pass the task the labels are for (--task detect, segment, obb)",
            path=str(yaml_path),
        )
    if spec.has_keypoints:
        kpt_shape = _kpt_shape(data["kpt_shape"], yaml_path)
    elif spec.pose_lines_as_boxes and data.get("kpt_shape") is not None:
        try:
            kpt_shape = _kpt_shape(data["kpt_shape"], yaml_path)
        except DatasetError:
            kpt_shape = None  # not read for keypoints: a malformed kpt_shape only stops pose lines keeping a box
    if spec.has_keypoints:
        flip_idx = _flip_idx(data.get("flip_idx"), kpt_shape[0], yaml_path)

    root = split_root(data, yaml_path)
    source_files = [str(yaml_path)]
    images: list[Path] = []
    absent: list[str] = []
    dirs: list[str] = []
    for entry in split_entries(data[split], yaml_path, split):
        path = resolve_entry(entry, root, yaml_path, split, absent)
        if path.is_dir():
            found = images_in(path, dirs)
        elif path.suffix.lower() == ".txt":
            found = images_from_list(path)
            source_files.append(str(path))
        else:
            raise DatasetError(
                f"{split} entry {entry!r} is neither a folder nor a .txt list of image paths", path=str(yaml_path)
            )
        if not found:
            raise DatasetError(
                f"{split} entry {entry!r} ({path}) holds no images ({' '.join(sorted(IMAGE_SUFFIXES))})",
                path=str(yaml_path),
            )
        images.extend(found)
    records, dropped, missing = _read_images(
        images, names, source_files, spec=spec, kpt_shape=kpt_shape, max_instances=max_instances_per_image
    )
    return _finish(
        records,
        names,
        source_files,
        dropped,
        missing,
        yaml_path,
        spec=spec,
        kpt_shape=kpt_shape if spec.has_keypoints else None,
        flip_idx=flip_idx,
        absent=absent,
        dirs=dirs,
    )


def read_yolo_folder(
    folder: str | os.PathLike,
    *,
    task: TaskSpec = DETECT,
    max_instances_per_image: int = DEFAULT_MAX_INSTANCES,
    max_classes: int = DEFAULT_MAX_CLASSES,
) -> tuple[Dataset, ReaderStats]:
    """Read an images folder with its sibling labels folder for ``task``; class names are "0".."K",
    K the largest class id, under ``max_classes``.

    Not for pose: the keypoints' shape comes from a data.yaml's ``kpt_shape``."""
    spec = task
    folder = Path(os.path.abspath(folder))
    if spec.has_keypoints:
        raise DatasetError(
            "an images folder cannot be read for the pose task: the number of keypoints per line comes from a "
            "data.yaml's 'kpt_shape' (and the flip pairs from its 'flip_idx'); pass a data.yaml",
            path=str(folder),
        )
    if not folder.is_dir():
        raise MissingFileError("images folder does not exist", path=str(folder))
    dirs: list[str] = []
    images = images_in(folder, dirs)
    if not images:
        raise DatasetError(f"no images ({' '.join(sorted(IMAGE_SUFFIXES))}) in the folder", path=str(folder))
    label_path_for(images[0])  # fails early, naming the folder's layout problem
    source_files: list[str] = []
    records, dropped, missing = _read_images(
        images, None, source_files, spec=spec, max_instances=max_instances_per_image, max_classes=max_classes
    )
    top = max((int(r.classes.max()) for r in records if r.num_instances), default=-1)
    names = tuple(str(i) for i in range(top + 1))
    return _finish(records, names, source_files, dropped, missing, folder, spec=spec, dirs=dirs)
