"""Which dataset a daemon serves, said so that a trainer that names its data can compare.

Code both sides import. The daemon describes each split it serves once it has read it
(``describe``, called by ``server/daemon/run.py``) and hands the description to every
trainer of that split in its ``attached`` reply (``snapshot.served``). A trainer that names
its data (``attach(data=)``, ``pixpool train --data``, ``pixpool yolo train data=``,
``pixpool digest DATA --socket-dir``) resolves it the same way (``expect``) and refuses a
daemon that serves another (``check_served``): before this, only the class names were
compared, and a daemon serving another dataset with the same classes was trained on
without a word.

What names a split is the files its batches are read from, each resolved: for a YOLO split
every image the reader finds (``yolo_layout.images_in`` over a folder, ``images_from_list``
over a ``.txt`` list) and the label file it derives for that image from the path as found,
never as resolved (``yolo_layout.label_dir_for``), with every ``.txt`` list; for a COCO json
the json and its images folder (the reader takes each image as ``folder/file_name`` with a
relative ``file_name`` without ``..``, so the folder's real path names every image). Both
sides take the split's entries as the YOLO reader resolves them (a data.yaml's split entries
against ``path``, which resolves against the yaml's folder, and a ``../`` entry that does not
exist retried without it; an images folder; a COCO json with its images folder) and list
them with the reader's own functions, so a symlink, a relative path or another yaml naming
the same files is the same split, and two splits that differ in any file a batch is read
from never are: a ``v2/`` whose ``images`` is a symlink to ``v1/images`` but whose
``labels/`` are its own (a relabelled version that shares the pixels) is another dataset.
Both sides hash the sorted real paths into ``files_key`` (a reply stays small however many
files a split has); messages show the first few of the split's resolved entries. Beside it:
the class names where the trainer's data names them (a data.yaml's ``names``), and the task
where the trainer states one. The imgsz is compared by the daemon itself at attach
(``StreamSettings.for_imgsz``).

Not compared here: the files' content. A trainer cannot know it without reading every
label; the snapshot's content fingerprint travels beside this description, and a daemon
restarted on other content is ``SnapshotChangedError`` (``client/snapshot_check.py``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DatasetError, DatasetMismatchError, MissingFileError, PixpoolError
from .yolo_layout import image_files_in, images_from_list, label_dir_for, label_name
from .yolo_yaml import load_yaml, resolve_entry, split_entries, split_root

__all__ = [
    "ExpectedData",
    "check_served",
    "describe",
    "expect",
    "expect_entries",
    "names_split",
    "split_files",
    "split_sources",
]

_SHOWN = 3  # source paths a reply or a message shows; files_key covers every file
_YAML = (".yaml", ".yml")


def split_sources(
    data: str | os.PathLike, images: str | os.PathLike | None = None, *, split: str = "train"
) -> tuple[str, ...]:
    """The sorted real paths the ``split`` of ``data`` takes its images from (module docstring).

    A data.yaml gives its ``split`` entries; an images folder or a COCO json is the split
    itself, whatever ``split`` says (as ``pixpool serve --val DATA`` takes one). Raises
    MissingFileError or DatasetError, naming the file, where ``data`` cannot be resolved."""
    return _real(_entries(data, images, split)[0])


def split_files(
    data: str | os.PathLike, images: str | os.PathLike | None = None, *, split: str = "train"
) -> tuple[str, ...]:
    """The sorted real paths of every file the ``split`` of ``data`` is read from (module
    docstring): the split's entries themselves, and for YOLO each image with the label file
    the reader derives for it, and each ``.txt`` list. Raises as ``split_sources`` does, and
    DatasetError naming the image where the YOLO layout has no labels folder for it."""
    entries, coco = _entries(data, images, split)
    return _real(entries) if coco else _yolo_files(entries)


def _entries(data, images, split: str) -> tuple[list[Path], bool]:
    """The split's entries as the reader resolves them (absolute, symlinks kept), and whether
    ``data`` is a COCO json (its entries: the json and its images folder)."""
    path = Path(os.path.abspath(data))
    suffix = path.suffix.lower()
    if suffix in _YAML:
        return _yaml_entries(path, split), False
    if not path.exists():
        raise MissingFileError(
            "the dataset does not exist; name a COCO json, a YOLO data.yaml or an images folder", path=str(path)
        )
    if suffix == ".json":
        return [path, Path(os.path.abspath(images)) if images is not None else _default_coco_images(path)], True
    if images is not None:
        raise DatasetError(
            "images= (--images) applies to a COCO json only; a YOLO dataset finds its images itself", path=str(path)
        )
    return [path], False


def names_split(data: str | os.PathLike, split: str) -> bool:
    """Whether ``data`` names a ``split`` of its own: a data.yaml with that key (an images
    folder or a COCO json is one split, whichever a daemon serves it as)."""
    path = Path(data)
    if path.suffix.lower() not in _YAML:
        return False
    try:
        return load_yaml(path).get(split) not in (None, "", [], {})
    except PixpoolError:
        return False


def files_key(files: tuple[str, ...]) -> str:
    """sha256 hex of the sorted real paths (``split_files``): equal keys, the same files read."""
    return hashlib.sha256("\0".join(sorted(files)).encode()).hexdigest()


def describe(data: str | os.PathLike, images: str | os.PathLike | None, *, split: str, task: str) -> dict[str, Any]:
    """What a daemon serves as ``split``, as its ``attached`` reply carries it (plain msgpack
    types, bounded in size). Never raises: a daemon serves what it has read even where its
    data can no longer be resolved (moved since), and says why in ``error``; a trainer that
    names its data then refuses it (``check_served``)."""
    out: dict[str, Any] = {
        "data": os.path.abspath(data),
        "images": None if images is None else os.path.abspath(images),
        "split": split,
        "task": task,
    }
    try:
        sources = split_sources(data, images, split=split)
        files = split_files(data, images, split=split)
    except (OSError, PixpoolError) as exc:
        return {**out, "error": str(exc)[:500]}
    shown = {"sources": list(sources[:_SHOWN]), "source_count": len(sources), "file_count": len(files)}
    return {**out, "files_key": files_key(files), **shown}


@dataclass(frozen=True)
class ExpectedData:
    """The data a trainer names: its ``split``'s real ``sources`` (the resolved entries a message
    shows), ``files_key`` and ``file_count`` of every file the split is read from
    (``split_files``), its class ``names`` (None: the data does not name them) and ``task``
    (None: any). ``asked`` says, in the trainer's words, what it named (``data=B.yaml``), for
    the message that refuses another."""

    asked: str
    split: str
    sources: tuple[str, ...]
    names: tuple[str, ...] | None = None
    task: str | None = None
    files_key: str = ""
    file_count: int = 0


def expect(
    data: str | os.PathLike,
    images: str | os.PathLike | None = None,
    *,
    split: str = "train",
    task: str | None = None,
) -> ExpectedData:
    """What a trainer naming ``data`` (and ``images`` for a COCO json) expects a daemon to
    serve as ``split``: resolved as the daemon resolves what it serves (``describe``)."""
    asked = f"data={os.fspath(data)}" + ("" if images is None else f" images={os.fspath(images)}")
    names = _yaml_names(Path(data)) if Path(data).suffix.lower() in _YAML else None
    files = split_files(data, images, split=split)
    sources = split_sources(data, images, split=split)
    return ExpectedData(asked, split, sources, names, task, files_key=files_key(files), file_count=len(files))


def expect_entries(
    entries: list[str] | tuple[str, ...] | str,
    *,
    asked: str,
    split: str = "train",
    names: list[str] | tuple[str, ...] | None = None,
    task: str | None = None,
) -> ExpectedData:
    """``expect`` for a split already resolved into entries (folders, ``.txt`` lists), as
    Ultralytics resolves a data.yaml's ``train``; each entry must exist."""
    entries = [entries] if isinstance(entries, (str, os.PathLike)) else list(entries)
    paths = [Path(os.path.abspath(e)) for e in entries]
    for p in paths:
        if not p.exists():
            raise MissingFileError(f"the {split} split of {asked} names this, which does not exist", path=str(p))
    files = _yolo_files(paths)
    names = None if names is None else tuple(str(n) for n in names)
    return ExpectedData(asked, split, _real(paths), names, task, files_key=files_key(files), file_count=len(files))


def check_served(expected: ExpectedData, attached: dict, *, where: str) -> None:
    """Raise DatasetMismatchError unless the daemon's ``attached`` reply serves ``expected``
    (its split's sources, class names where the trainer's data names them, task where the
    trainer states one); ``where`` says which daemon (its socket or endpoint)."""
    snap = attached.get("snapshot")
    served = snap.get("served") if isinstance(snap, dict) else None
    daemon = _daemon_words(attached, where)
    if not isinstance(served, dict) or "files_key" not in served:
        why = served.get("error") if isinstance(served, dict) else None
        raise DatasetMismatchError(
            f"this trainer names {expected.asked}, but {daemon} does not say which files it serves "
            f"({why or 'a daemon of an earlier pixpool release'}), so it cannot be checked. Run the same pixpool "
            "release on both sides, or serve data that the daemon can resolve; to train on whatever the daemon "
            "serves, name no data",
            asked=_asked_dict(expected),
            served=dict(served or {}),
        )
    problems = _differences(expected, served, attached)
    if not problems:
        return
    raise DatasetMismatchError(
        f"this trainer names {expected.asked} ({_words(expected.split, list(expected.sources), len(expected.sources))}"
        f"{'' if expected.task is None else f', task {expected.task}'}) but {daemon} serves {served.get('data')} "
        f"({_words(served.get('split'), served.get('sources') or [], served.get('source_count', 0))}, "
        f"{attached.get('num_records')} records, task {attached.get('task')}): {'; '.join(problems)}. Training here "
        "would train on the daemon's dataset, not on the one named. Point this trainer at a daemon that serves its "
        "data (another socket directory: --socket-dir / socket_dir=, where `pixpool serve DATA` runs; "
        f"`pixpool yolo train` starts one there if none answers), or stop that daemon (Ctrl-C its `pixpool serve`, "
        f"or kill {attached.get('daemon_pid')}) and serve this data",
        asked=_asked_dict(expected),
        served=dict(served),
    )


# -- helpers --------------------------------------------------------------------------------
def _differences(expected: ExpectedData, served: dict, attached: dict) -> list[str]:
    out = []
    if served.get("split") != expected.split:
        out.append(f"it serves its {served.get('split')} split to this trainer, not {expected.split}")
    if served["files_key"] != expected.files_key:
        same_entries = served.get("sources") == list(expected.sources[:_SHOWN]) and served.get("source_count") == len(
            expected.sources
        )
        if not same_entries:
            out.append("other image sources")
        else:
            out.append(
                f"the same image folders or lists, but other files are read from them ({expected.file_count} files "
                f"named, {served.get('file_count')} served, images and label files resolved): each image's label file "
                "is found beside the image path as named, not as it resolves, so a folder whose images are a symlink "
                "to another's with a labels/ of its own is another dataset (a relabelled version)"
            )
    names = [str(n) for n in attached.get("names") or []]
    if expected.names is not None and names != list(expected.names):
        out.append(
            f"other classes ({len(names)}: {names[:5]}... against {len(expected.names)}: {list(expected.names)[:5]}...)"
        )
    if expected.task is not None and attached.get("task") != expected.task:
        out.append(f"task {expected.task} asked, task {attached.get('task')} served")
    return out


def _daemon_words(attached: dict, where: str) -> str:
    pid, host = attached.get("daemon_pid"), attached.get("host")
    return f"the pixpool daemon at {where} (pid {pid} on {host})"


def _words(split: Any, sources: list, count: int) -> str:
    shown = ", ".join(str(s) for s in sources[:_SHOWN])
    more = f" and {count - _SHOWN} more" if count > _SHOWN else ""
    return f"{split} split: {shown}{more}"


def _asked_dict(expected: ExpectedData) -> dict:
    return {"asked": expected.asked, "split": expected.split, "sources": list(expected.sources), "task": expected.task}


def _real(paths) -> tuple[str, ...]:
    return tuple(sorted({os.path.realpath(p) for p in paths}))


def _yolo_files(entries: list[Path]) -> tuple[str, ...]:
    """The sorted real paths of what the YOLO reader reads for these resolved split entries:
    each folder's images and each ``.txt`` list's (with the list), each with its label file
    as the reader derives it from the image path as found (``yolo_layout``)."""
    real = _RealPaths()
    files = set(_real(entries))
    for entry in entries:
        if entry.is_dir():
            found = image_files_in(entry)
        elif entry.suffix.lower() == ".txt":
            found = [os.fspath(p) for p in images_from_list(entry)]
        else:
            continue  # neither: the reader refuses such an entry, naming it
        labels: dict[str, str] = {}  # image folder -> its labels folder, as named
        for image in found:
            folder, name = os.path.split(image)
            label_dir = labels.get(folder)
            if label_dir is None:
                label_dir = labels[folder] = os.fspath(label_dir_for(folder, image=image))
            files.add(real(folder, name))
            files.add(real(label_dir, label_name(name)))
    return tuple(sorted(files))


class _RealPaths:
    """The real path of a file as its folder's real path and its name, each folder resolved once
    (per-file ``realpath`` took ~45 us, and ~9 s on a restart over 100k symlinked images). A
    file that is itself a symlink is named by the entry, not by its target: one real folder's
    entry is one file whatever it points to (a relative target resolves against that folder), so
    two splits that read other bytes never share a name; two folders of links to the same targets
    only count as other data, the safe side."""

    def __init__(self):
        self._folders: dict[str, str] = {}

    def __call__(self, folder: str, name: str) -> str:
        prefix = self._folders.get(folder)
        if prefix is None:
            prefix = self._folders[folder] = os.path.join(os.path.realpath(folder), "")  # with its separator
        return prefix + name


def _yaml_entries(path: Path, split: str) -> list[Path]:
    """The split's entries resolved as the reader resolves them (``yolo_yaml``)."""
    data = load_yaml(path)
    root = split_root(data, path)
    return [resolve_entry(e, root, path, split) for e in split_entries(data.get(split), path, split)]


def _yaml_names(path: Path) -> tuple[str, ...] | None:
    """A data.yaml's class names in id order; None where it names none readably (the daemon's
    reader refuses such a yaml with the reason)."""
    raw = load_yaml(Path(os.path.abspath(path))).get("names")
    if isinstance(raw, list):
        return tuple(str(n) for n in raw)
    if isinstance(raw, dict):
        try:
            return tuple(str(raw[k]) for k in sorted(raw, key=int))
        except (TypeError, ValueError):
            return None
    return None


def _default_coco_images(json_path: Path) -> Path:
    """The COCO reader's default images folder: root/annotations/instances_NAME.json ->
    root/images/NAME; elsewhere the json's own folder stands for "no folder named"."""
    stem, parent = json_path.stem, json_path.parent
    if parent.name == "annotations" and stem.startswith("instances_") and len(stem) > len("instances_"):
        return parent.parent / "images" / stem[len("instances_") :]
    return parent
