"""A YOLO ``data.yaml``: how it is loaded and how a split's entries resolve to paths.

Runs wherever a data.yaml is read: the reader that turns a split into records (the daemon,
``pixpool prepare``: ``server/readers/yolo.py``) and a trainer that checks which files a
daemon serves (``served_data.py``). Both resolve entries here, so the two can never disagree
on which folder a split is.

Rules, as Ultralytics applies them: relative entries resolve against ``path`` (absolute, or
relative to the yaml's folder) or else the yaml's folder; a relative entry ``../x`` that does
not exist there is also looked up as ``x`` under that root.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import DatasetError, MissingFileError

__all__ = ["load_yaml", "resolve_entry", "split_entries", "split_root"]


def load_yaml(yaml_path: Path) -> dict:
    """The yaml's mapping; MissingFileError or DatasetError naming the file otherwise."""
    import yaml

    try:
        data = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingFileError("data.yaml does not exist; check the path", path=str(yaml_path)) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DatasetError(f"cannot read the yaml ({exc})", path=str(yaml_path)) from None
    if not isinstance(data, dict):
        raise DatasetError("expected a mapping with at least 'train' and 'names'", path=str(yaml_path))
    return data


def split_root(data: dict, yaml_path: Path) -> Path:
    """The folder a split's relative entries resolve against."""
    root = yaml_path.parent
    if data.get("path"):
        root = Path(os.path.abspath(root / str(data["path"])))  # an absolute 'path' replaces root
    return root


def split_entries(raw, yaml_path: Path, split: str) -> list[str]:
    """The split's entries as a list of strings; DatasetError naming the field otherwise."""
    entries = raw if isinstance(raw, list) else [raw]
    if not entries or not all(isinstance(e, str) and e for e in entries):
        raise DatasetError(
            f"'{split}' must be a folder, a .txt image list, or a list of those (strings)", path=str(yaml_path)
        )
    return entries


def resolve_entry(
    entry: str, root: Path, yaml_path: Path, split: str = "train", absent: list[str] | None = None
) -> Path:
    """The absolute path of one entry (module docstring); ``absent`` collects the paths that,
    were they to appear, the entry would resolve to instead."""
    path = Path(entry)
    if not path.is_absolute():
        path = root / path
        if not path.exists() and entry.startswith("../"):
            if absent is not None:
                absent.append(os.path.abspath(path))
            path = root / entry[3:]
    path = Path(os.path.abspath(path))
    if not path.exists():
        raise MissingFileError(
            f"{split} entry {entry!r} -> {path} does not exist (relative entries resolve against 'path' or the yaml's folder)",
            path=str(yaml_path),
        )
    return path
