"""The YOLO layout's file rules: which files of a folder or a ``.txt`` list are images, and
which label file belongs to each image.

Runs wherever a YOLO split is read or named: the reader that turns it into records (the
daemon, ``pixpool prepare``: ``server/readers/yolo.py``) and a trainer or daemon that says
which files a split is (``served_data.py``). Both take the rules from here, so the files a
split is said to be are the files the reader reads.

The label rule works on the image path as named, never resolved: an image found as
``v2/images/train/a.jpg`` has its label at ``v2/labels/train/a.txt`` even where ``v2/images``
is a symlink to ``v1/images`` (a relabelled version that shares the pixels).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import DatasetError, MissingFileError

__all__ = [
    "IMAGE_SUFFIXES",
    "image_files_in",
    "images_from_list",
    "images_in",
    "label_dir_for",
    "label_name",
    "label_path_for",
]

#: Image suffixes the YOLO folder reader picks up (compared lower-cased).
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})


def label_dir_for(folder: str | os.PathLike, *, image: str | os.PathLike | None = None) -> Path:
    """The labels folder of the images in ``folder``: its last ``images`` component -> ``labels``.

    Raises DatasetError (naming ``image``, else ``folder``) when the path has no ``images``
    component (no sibling labels folder)."""
    parts = list(Path(folder).parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            return Path(*parts)
    raise DatasetError(
        "no 'images' folder in the path, so there is no sibling 'labels' folder; YOLO datasets keep images in .../images/... and labels in .../labels/...",
        path=str(image if image is not None else folder),
    )


def label_name(image_name: str) -> str:
    """The label file's name of an image file's name: its suffix -> ``.txt``
    (``PurePath.with_suffix``, without making a Path of every one of 100k names)."""
    return image_name[: len(image_name) - len(_suffix(image_name))] + ".txt"


def label_path_for(image_path: str | os.PathLike) -> Path:
    """The label file of an image: last ``images`` folder component -> ``labels``, suffix -> ``.txt``.

    Raises DatasetError when the path has no ``images`` component (no sibling labels folder).
    """
    image_path = Path(image_path)
    return label_dir_for(image_path.parent, image=image_path) / label_name(image_path.name)


def _suffix(name: str) -> str:
    """``PurePath(name).suffix``, without making a Path of every one of 100k names."""
    i = name.rfind(".")
    return name[i:] if 0 < i < len(name) - 1 else ""


def images_in(folder: Path, dirs: list[str] | None = None) -> list[Path]:
    """Every image file under ``folder``, as ``folder.rglob("*")`` filtered by suffix and
    ``is_file()`` finds them (symlinked folders are not entered, a folder that cannot be read
    is skipped), with one ``scandir`` per folder. Each folder looked into is appended to
    ``dirs``: its listing is part of what the dataset depends on (``Dataset.listed_dirs``)."""
    return [Path(p) for p in image_files_in(folder, dirs)]


def image_files_in(folder: str | os.PathLike, dirs: list[str] | None = None) -> list[str]:
    """``images_in`` as strings (``os.path.join(folder, name)``, the folder as given)."""
    found = []
    stack = [str(folder)]
    while stack:
        d = stack.pop()
        if dirs is not None:
            dirs.append(d)
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except PermissionError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
            except OSError:
                continue
            if _suffix(entry.name).lower() in IMAGE_SUFFIXES and _is_file(entry):
                found.append(entry.path)
    return found


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()  # follows a symlink, as Path.is_file does
    except OSError:
        return False


def images_from_list(list_path: Path) -> list[Path]:
    """The images a ``.txt`` list names, one per line, relative lines against the list's folder
    as named (not resolved); DatasetError or MissingFileError naming the list and line."""
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
