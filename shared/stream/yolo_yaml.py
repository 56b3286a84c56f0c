"""A YOLO ``data.yaml``: how it is loaded and how a split's entries resolve to paths.

Runs wherever a data.yaml is read: the reader that turns a split into records (the daemon,
``pixpool prepare``: ``server/readers/yolo.py``) and a trainer that checks which files a
daemon serves (``served_data.py``). Both resolve entries here, so the two can never disagree
on which folder a split is.

Rules, as Ultralytics applies them: relative entries resolve against ``path`` (absolute, or
relative to the yaml's folder) or else the yaml's folder; a relative entry ``../x`` that does
not exist there is also looked up as ``x`` under that root.

Bounds, checked before anything of the yaml is used or printed (a data.yaml is a few KB; the
bounds admit one that names ``MAX_CLASSES`` classes with room to spare):

- ``MAX_YAML_BYTES`` read at most, whatever the file is (a link to ``/dev/zero`` included).
- YAML aliases (``*name``, ``<<: *name``) are refused: a few hundred bytes of nested aliases
  (a "billion laughs") load as shared lists, but every walk of them (``str()``, ``repr``,
  sorting names) visits each of 10^9 strings. Ultralytics' own data.yamls use none.
- ``MAX_YAML_NODES`` scalars and collections, ``MAX_YAML_DEPTH`` levels of nesting: counted on
  libyaml's event stream before the document is built, so a refused file costs its text and
  one event at a time (a built node costs ~0.5 KB, pure-Python PyYAML ~50 us each).
- Integers past Python's 4300 digits are refused by file, not raised as a bare ValueError.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import DatasetError, MissingFileError
from ..text import shown

__all__ = [
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "load_yaml",
    "resolve_entry",
    "split_entries",
    "split_root",
]

#: Most bytes of a data.yaml read: ``MAX_CLASSES`` names of ~50 characters take ~7 MB.
MAX_YAML_BYTES = 16 << 20
#: Most scalars and collections in a data.yaml: ``MAX_CLASSES`` (131072) names with their ids, twice over.
MAX_YAML_NODES = 1 << 19
#: Deepest nesting of collections; a data.yaml is 2 or 3 levels deep.
MAX_YAML_DEPTH = 32


def load_yaml(yaml_path: Path) -> dict:
    """The yaml's mapping, within the bounds of the module docstring; MissingFileError or
    DatasetError naming the file otherwise."""
    import yaml

    where = str(yaml_path)
    try:
        with open(yaml_path, "rb") as file:
            raw = file.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise MissingFileError("data.yaml does not exist; check the path", path=where) from None
    except OSError as exc:
        raise DatasetError(f"cannot read the yaml ({exc.strerror})", path=where) from None
    if len(raw) > MAX_YAML_BYTES:
        raise DatasetError(
            f"over {MAX_YAML_BYTES} bytes; a data.yaml is a few KB (the paths of the splits, the class names, "
            "kpt_shape): is this the right file?",
            path=where,
        )
    try:
        text = raw.decode("utf-8")
        del raw
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where PyYAML was built with it
        _check_events(yaml.parse(text, Loader=loader), where)
        data = yaml.load(text, Loader=loader)
    except DatasetError:  # a bound of _check_events: a ValueError too, but said already
        raise
    except UnicodeDecodeError as exc:
        raise DatasetError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=where) from None
    except yaml.YAMLError as exc:
        raise DatasetError(f"cannot read the yaml ({shown(str(exc), 400)})", path=where) from None
    except ValueError as exc:  # an integer past sys.get_int_max_str_digits()
        raise DatasetError(f"cannot read the yaml ({shown(str(exc), 400)})", path=where) from None
    if not isinstance(data, dict):
        raise DatasetError("expected a mapping with at least 'train' and 'names'", path=where)
    return data


def _check_events(events, where: str) -> None:
    """DatasetError at the first alias, or past ``MAX_YAML_NODES`` nodes or ``MAX_YAML_DEPTH``
    levels, reading ``events`` (PyYAML's parse events) one at a time."""
    import yaml

    nodes = depth = 0
    for event in events:
        if isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1 if event.start_mark is not None else None
            raise DatasetError(
                f"YAML alias *{event.anchor[:40]} refused: a data.yaml may not repeat values by alias "
                "(nested aliases expand to billions of values); write the value out in full",
                path=where,
                line=line,
            )
        if isinstance(event, (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            nodes += 1
            if nodes > MAX_YAML_NODES:
                raise DatasetError(
                    f"more than {MAX_YAML_NODES} values (scalars, lists, mappings); a data.yaml names its splits, "
                    "kpt_shape and at most 131072 class names: is this the right file?",
                    path=where,
                )
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise DatasetError(
                    f"nested more than {MAX_YAML_DEPTH} levels deep; a data.yaml is 2 or 3 levels deep",
                    path=where,
                    line=event.start_mark.line + 1 if event.start_mark is not None else None,
                )
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def split_root(data: dict, yaml_path: Path) -> Path:
    """The folder a split's relative entries resolve against; DatasetError naming the field
    where ``path`` is not a string."""
    root = yaml_path.parent
    raw = data.get("path")
    if raw in (None, ""):
        return root
    if not isinstance(raw, str):
        raise DatasetError(
            f"'path' is {shown(raw)} ({type(raw).__name__}); it must be the dataset's root folder, a string "
            "(relative to the yaml's folder, or absolute)",
            path=str(yaml_path),
        )
    return Path(os.path.abspath(root / raw))  # an absolute 'path' replaces root


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
