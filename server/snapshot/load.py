"""One split of a dataset as a daemon serves it: which splits a ``DaemonConfig`` names, reading
one, and ``load_split``: its snapshot re-attached on its label index, or read, prepared (or
re-attached) and indexed.

Runs in the process that prepares a dataset's snapshot: the daemon at start-up
(``daemon/run.py``) and ``pixpool prepare`` (``commands/prepare.py``), both through
``load_split``; ``pixpool digest --reference``/``--in-process`` reads a split with
``read_split``, as the daemon would. The snapshot ``load_split`` returns is the caller's to
close or release (``Snapshot.release``); on a failure after it was attached, it is closed here.

Here, not in ``daemon/``: ``pixpool prepare`` writes the same snapshot and label index a daemon
would, without starting one, and the digest command reads as a daemon reads; all three sit on
the readers, ``prepare``, ``label_index`` and ``fingerprint`` of this package.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from ...shared.errors import CapacityError, ConfigError
from ...shared.stream.config import DaemonConfig, PrepareOptions
from ...shared.stream.path_table import PathTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedSplit:
    """A split's snapshot and what was learnt loading it.

    ``content``: the content fingerprint (``fingerprint.content_fingerprint``); ``reused``: the
    snapshot was already in the store; ``seconds``: the preparation's (or, re-attached on the
    label index, the whole load's). ``stats`` (the reader's ``ReaderStats``) and ``prepared``
    (``PrepareResult``) are None where the label index vouched for the files and none was read."""

    snapshot: Any
    names: tuple[str, ...]
    record_paths: PathTable
    content: str
    reused: bool
    seconds: float
    stats: Any = None
    prepared: Any = None


def train_split(config: DaemonConfig) -> tuple:
    """(data, images, lineage) of the training set (``splits``)."""
    return config.data, config.images, _lineage(config, config.data, config.images, "train")


def splits(config: DaemonConfig) -> dict:
    """split -> (data, images, lineage): the training set and, unless ``no_val``, the validation
    set (``val``, else a data.yaml's own ``val:``). A split's lineage (``fingerprint.lineage_of``)
    is where its data comes from, so that a newer snapshot of a split supersedes only older
    ones of the same split, and its label index is found again."""
    from ..readers import yaml_has_split

    out = {"train": train_split(config)}
    if config.no_val:
        return out
    if config.val is not None:
        out["val"] = (config.val, config.val_images, _lineage(config, config.val, config.val_images, "val"))
    elif str(config.data).lower().endswith((".yaml", ".yml")) and yaml_has_split(config.data, "val"):
        out["val"] = (config.data, None, _lineage(config, config.data, None, "val"))
    return out


def _lineage(config: DaemonConfig, data, images, split: str) -> str:
    from .fingerprint import lineage_of

    split_data = f"{data}#{split}" if split != "train" else data
    return lineage_of(split_data, images, config.imgsz, config.dtype, config.spec)


def load_split(
    config: DaemonConfig,
    options: PrepareOptions,
    data,
    images,
    split: str,
    lineage: str,
    *,
    warned: set,
    train_names=None,
    use_index: bool = True,
    progress: bool = False,
) -> LoadedSplit:
    """The snapshot of one split (module docstring): re-attached on the word of its label index
    when every file it was read from is unchanged (``use_index``; ``pixpool prepare`` reads in
    full, to report what the reader found), else read, prepared (or re-attached) with
    ``options`` (``progress``: a bar on stderr) and indexed. The records read go out of scope
    here: only their image paths are kept, in one ``PathTable``. ``train_names``: the training
    set's class names, which a validation set must have (checked before it is prepared);
    ``warned``: the sets of images without labels already warned about (a data.yaml whose val:
    is its train: folder, the demo's, reads the same images twice: one warning)."""
    opened = open_split(
        config, options, data, images, split, lineage, warned=warned, train_names=train_names, use_index=use_index
    )
    return finish_split(opened, options, lineage, progress=progress)


@dataclass
class OpenedSplit:
    """A split before anything is decoded: re-attached on its label index (``indexed``: the index
    and the snapshot, which this holds until ``finish_split`` or ``close``), or read in full
    (``dataset``, ``stats``). The daemon opens every split first, so that its check at start-up
    (``planning.py``) sees what each will take before the first is prepared."""

    split: str
    indexed: tuple | None = None
    dataset: Any = None
    stats: Any = None
    t0: float = 0.0
    started_ns: int = 0

    @property
    def names(self) -> tuple:
        """The split's class names (its label index's, or the reader's)."""
        return tuple(self.indexed[0].names if self.indexed is not None else self.dataset.names)

    def close(self) -> None:
        """Let go of a re-attached snapshot that will not be served (a failure before serving)."""
        if self.indexed is not None:
            self.indexed[1].close()
            self.indexed = None


def open_split(
    config: DaemonConfig,
    options: PrepareOptions,
    data,
    images,
    split: str,
    lineage: str,
    *,
    warned: set,
    train_names=None,
    use_index: bool = True,
) -> OpenedSplit:
    """``load_split``'s first half: the snapshot re-attached on its label index, or the split read."""
    t0 = time.perf_counter()
    indexed = _indexed(config, options, lineage) if use_index else None
    if indexed is not None:
        index, snap = indexed
        try:
            _check_names(config, index.names, train_names)
        except ConfigError:
            snap.close()
            raise
        _log_missing(index.records, index.labels_missing, index.missing_label_example, data, warned)
        return OpenedSplit(split, indexed=indexed, t0=t0)
    started_ns = time.time_ns()
    dataset, stats = read_split(config, data, images, split, warned=warned, train_names=train_names)
    return OpenedSplit(split, dataset=dataset, stats=stats, t0=t0, started_ns=started_ns)


def finish_split(
    opened: OpenedSplit,
    options: PrepareOptions,
    lineage: str,
    *,
    progress: bool = False,
    header_sizes: dict | None = None,
) -> LoadedSplit:
    """``load_split``'s second half: the split ``open_split`` opened, prepared (or re-attached) and
    indexed. ``header_sizes``: image path -> (h, w) already read (the daemon's check at start-up)."""
    from . import label_index
    from .fingerprint import content_fingerprint
    from .prepare import prepare_snapshot

    if opened.indexed is not None:
        index, snap = opened.indexed
        opened.indexed = None  # the LoadedSplit's now
        return LoadedSplit(snap, tuple(index.names), index.record_paths, index.content, reused=True,
                           seconds=time.perf_counter() - opened.t0)  # fmt: skip
    dataset, stats = opened.dataset, opened.stats
    opened.dataset = opened.stats = None  # the records go out of scope with this call (module docstring)
    result = prepare_snapshot(dataset, options, progress=progress, lineage=lineage, header_sizes=header_sizes)
    snap = result.snapshot
    # The float32 fingerprint is the content's whatever the arena's dtype; only a uint8
    # snapshot pays a second pass (one stat per image file) to compute it.
    content = snap.fingerprint if snap.dtype == "float32" else content_fingerprint(dataset, imgsz=options.imgsz)
    paths = PathTable.from_paths(rec.image_path for rec in dataset.records)
    try:
        label_index.write_index(
            snap, dataset, stats, lineage=lineage, content=content, read_started_ns=opened.started_ns,
            record_paths=paths,
        )  # fmt: skip
    except OSError as exc:  # the index only saves time: a store that cannot hold it costs a full read next time
        log.warning("no label index written beside %s: %s", snap.name, exc)
    return LoadedSplit(snap, tuple(dataset.names), paths, content, reused=bool(result.reused), seconds=result.seconds,
                       stats=stats, prepared=result)  # fmt: skip


def read_split(config: DaemonConfig, data, images, split: str, *, warned: set, train_names=None):
    """(Dataset, ReaderStats) of one split read in full, with the daemon's settings; the
    warning about images without labels once per set of them (``warned``), and a validation
    set's class names checked against ``train_names``."""
    from ..readers import read_dataset

    dataset, stats = read_dataset(
        data,
        images,
        max_instances_per_image=config.max_instances_per_image,
        allow_unlabelled=config.allow_unlabelled,
        split=split,
        warn_missing_labels=False,
        task=config.task,
        max_classes=config.max_classes,
    )
    _check_names(config, dataset.names, train_names)
    _log_missing(stats.records, stats.labels_missing, stats.missing_label_example, data, warned)
    return dataset, stats


def _indexed(config: DaemonConfig, options: PrepareOptions, lineage: str):
    """(index, snapshot) where a trusted label index (``label_index``) names a complete snapshot
    this daemon may serve as a full read would; None otherwise (read in full). What a full read
    would refuse (an image over ``max_instances_per_image``, more classes than ``max_classes``,
    a set without any label file) is read in full, so that the refusal says what it says today."""
    from ...shared.errors import UntrustedSegmentError
    from ...shared.transport.names import snapshot_parts
    from . import label_index
    from .prepare import check_budget
    from .reuse import BeingPrepared, choose_base, existing_snapshot

    store = options.segment_store
    index = label_index.find_trusted(lineage, store=store)
    if index is None or index.task != config.task:
        return None
    if index.max_instances > config.max_instances_per_image or len(index.names) > config.max_classes:
        return None
    if index.labels_missing and index.labels_missing == index.records and not config.allow_unlabelled:
        return None
    try:
        # The snapshot beside its index, under whichever name it took: the one a full read
        # would take (``reuse.choose_base``, which also reports what another user planted).
        if choose_base(index.fingerprint, store=store) != index.base:
            return None
        snap = existing_snapshot(index.base, snapshot_parts(index.base), store=store)
    except (BeingPrepared, UntrustedSegmentError):  # a full read chooses the name again
        return None
    if snap is None:
        return None
    if snap.header.fingerprint != index.fingerprint or len(snap) != index.records:
        snap.close()
        return None
    try:
        check_budget(sum(snap.nbytes.values()), options.memory_budget_nbytes, what=f"the existing snapshot {snap.name}",
                     imgsz=options.imgsz, dtype=options.dtype)  # fmt: skip
    except CapacityError:
        snap.close()
        raise
    try:
        index = label_index.refresh(index, store=store)  # while this process holds the snapshot
    except OSError as exc:
        log.warning("label index %s not refreshed (%s): the next restart hashes its labels again", index.name, exc)
    log.info("snapshot %s re-attached on its label index %s: no label file read", snap.name, index.name)
    return index, snap


def _check_names(config: DaemonConfig, names, train_names) -> None:
    if train_names is not None and tuple(names) != tuple(train_names):
        raise ConfigError(
            f"the validation set {config.val or config.data} has classes {list(names)[:5]}..., the training set "
            f"{config.data} {list(train_names)[:5]}...; they must be the same classes in the same order",
            field="val",
        )


def _log_missing(records: int, missing: int, example: str | None, data, warned: set) -> None:
    from ..readers import ReaderStats, log_missing_labels

    if (missing, example) in warned:
        return
    warned.add((missing, example))
    log_missing_labels(ReaderStats(records=records, labels_missing=missing, missing_label_example=example), data)
