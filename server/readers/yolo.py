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
  class id found.

Paths are made absolute without resolving symlinks (labels are found beside the path as
given). Records are sorted by image path; duplicates (an image listed twice) are kept.
``Dataset.source_files``: the yaml, every ``.txt`` list, and every label file that exists.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import yaml

from ...shared.errors import DatasetError, MissingFileError
from ...shared.stream.records import Dataset, Record
from ._common import IMAGE_SUFFIXES, ReaderStats, make_record
from .yolo_labels import parse_label_file

logger = logging.getLogger(__name__)


def label_path_for(image_path: str | os.PathLike) -> Path:
    """The label file of an image: last ``images`` component -> ``labels``, suffix -> ``.txt``.

    Raises DatasetError when the path has no ``images`` component (no sibling labels folder).
    """
    parts = list(Path(image_path).parts)
    for i in range(len(parts) - 2, -1, -1):  # a folder component, never the file name
        if parts[i] == "images":
            parts[i] = "labels"
            return Path(*parts).with_suffix(".txt")
    raise DatasetError(
        "no 'images' folder in the path, so there is no sibling 'labels' folder; YOLO datasets keep images in .../images/... and labels in .../labels/...",
        path=str(image_path),
    )


def _images_in(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()]


def _images_from_list(list_path: Path) -> list[Path]:
    try:
        text = list_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read the image list ({exc})", path=str(list_path)) from None
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        entry = line.strip()
        if not entry:
            continue
        path = Path(os.path.abspath(list_path.parent / entry))
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            raise DatasetError(
                f"{entry!r} is not an image file (suffixes: {' '.join(sorted(IMAGE_SUFFIXES))})",
                path=str(list_path),
                line=lineno,
            )
        if not path.is_file():
            raise MissingFileError(
                f"image file does not exist (listed in {list_path} line {lineno}); add the file or remove the line",
                path=str(path),
            )
        out.append(path)
    return out


def _names(raw, yaml_path: Path) -> tuple[str, ...]:
    if isinstance(raw, list):
        return tuple(str(n) for n in raw)
    if isinstance(raw, dict):
        try:
            ids = sorted(int(k) for k in raw)
        except (TypeError, ValueError):
            raise DatasetError("'names' keys must be integer class ids", path=str(yaml_path)) from None
        if ids != list(range(len(ids))):
            raise DatasetError(f"'names' ids must be 0..{len(ids) - 1} without gaps, got {ids}", path=str(yaml_path))
        by_id = {int(k): str(v) for k, v in raw.items()}
        return tuple(by_id[i] for i in ids)
    raise DatasetError("'names' must be a list of class names or a {id: name} mapping", path=str(yaml_path))


def _split_entries(raw, yaml_path: Path, split: str) -> list[str]:
    entries = raw if isinstance(raw, list) else [raw]
    if not entries or not all(isinstance(e, str) and e for e in entries):
        raise DatasetError(
            f"'{split}' must be a folder, a .txt image list, or a list of those (strings)", path=str(yaml_path)
        )
    return entries


def _resolve_entry(entry: str, root: Path, yaml_path: Path, split: str = "train") -> Path:
    path = Path(entry)
    if not path.is_absolute():
        path = root / path
        if not path.exists() and entry.startswith("../"):
            path = root / entry[3:]
    path = Path(os.path.abspath(path))
    if not path.exists():
        raise MissingFileError(
            f"{split} entry {entry!r} -> {path} does not exist (relative entries resolve against 'path' or the yaml's folder)",
            path=str(yaml_path),
        )
    return path


def _read_images(
    images: list[Path], names: tuple[str, ...] | None, source_files: list[str]
) -> tuple[list[Record], int, list[Path]]:
    records = []
    dropped = 0
    missing = []
    num_classes = len(names) if names is not None else None
    for image in sorted(images, key=str):
        label = label_path_for(image)
        classes, boxes, polygons, n_dropped = parse_label_file(label, num_classes)
        if label.is_file():
            source_files.append(str(label))
        else:
            missing.append(label)
        dropped += n_dropped
        records.append(make_record(str(image), None, classes, boxes, polygons))
    return records, dropped, missing


def _finish(
    records: list[Record],
    names: tuple[str, ...],
    source_files: list[str],
    dropped: int,
    missing: list[Path],
    origin: Path,
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
    return Dataset(records=tuple(records), names=names, source_files=files), stats


def yaml_has_split(yaml_path: str | os.PathLike, split: str) -> bool:
    """Whether a readable ``data.yaml`` names a ``split`` (``val``) entry."""
    try:
        data = yaml.safe_load(Path(yaml_path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and data.get(split) not in (None, "", [], {})


def read_yolo_yaml(yaml_path: str | os.PathLike, split: str = "train") -> tuple[Dataset, ReaderStats]:
    """Read a YOLO ``data.yaml``'s ``split`` (``train`` or ``val``); see the module docstring for the rules."""
    yaml_path = Path(os.path.abspath(yaml_path))
    try:
        data = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingFileError("data.yaml does not exist; check the path", path=str(yaml_path)) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DatasetError(f"cannot read the yaml ({exc})", path=str(yaml_path)) from None
    if not isinstance(data, dict):
        raise DatasetError("expected a mapping with at least 'train' and 'names'", path=str(yaml_path))
    for key in (split, "names"):
        if data.get(key) in (None, "", [], {}):
            raise DatasetError(
                f"missing '{key}'; a YOLO data.yaml needs '{split}' (images folder or list) and 'names' (class names)",
                path=str(yaml_path),
            )
    names = _names(data["names"], yaml_path)
    if "nc" in data and data["nc"] != len(names):
        raise DatasetError(
            f"'nc' is {data['nc']} but 'names' lists {len(names)} classes; make them agree", path=str(yaml_path)
        )

    root = yaml_path.parent
    if data.get("path"):
        root = Path(os.path.abspath(root / str(data["path"])))  # an absolute 'path' replaces root
    source_files = [str(yaml_path)]
    images: list[Path] = []
    for entry in _split_entries(data[split], yaml_path, split):
        path = _resolve_entry(entry, root, yaml_path, split)
        if path.is_dir():
            found = _images_in(path)
        elif path.suffix.lower() == ".txt":
            found = _images_from_list(path)
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
    records, dropped, missing = _read_images(images, names, source_files)
    return _finish(records, names, source_files, dropped, missing, yaml_path)


def read_yolo_folder(folder: str | os.PathLike) -> tuple[Dataset, ReaderStats]:
    """Read an images folder with its sibling labels folder; class names are "0".."K"."""
    folder = Path(os.path.abspath(folder))
    if not folder.is_dir():
        raise MissingFileError("images folder does not exist", path=str(folder))
    images = _images_in(folder)
    if not images:
        raise DatasetError(f"no images ({' '.join(sorted(IMAGE_SUFFIXES))}) in the folder", path=str(folder))
    label_path_for(images[0])  # fails early, naming the folder's layout problem
    source_files: list[str] = []
    records, dropped, missing = _read_images(images, None, source_files)
    top = max((int(r.classes.max()) for r in records if r.num_instances), default=-1)
    names = tuple(str(i) for i in range(top + 1))
    return _finish(records, names, source_files, dropped, missing, folder)
