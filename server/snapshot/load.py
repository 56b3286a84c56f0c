"""The splits of a dataset as a daemon serves them: which splits a ``DaemonConfig`` names (one
``SplitRequest`` each), reading one, and ``load_split``: its snapshot re-attached on its label
index, or read, prepared (or re-attached) and indexed; ``load_splits``: every split, as a daemon
starts (all opened and checked against the store before the first is decoded).

Runs in the process that prepares a dataset's snapshot: the daemon at start-up
(``daemon/run.py``, ``load_splits``) and ``pixpool prepare`` (``cli/prepare.py``, ``load_split``);
``pixpool digest --reference``/``--in-process`` and ``pixpool plan`` read a split with
``read_split``, as the daemon would. A request goes with the ``PrepareOptions`` that say how it
is read and decoded. The snapshot ``load_split`` returns is the caller's to close or release
(``Snapshot.release``); on a failure after it was attached, it is closed here.

Here, not in ``daemon/``: ``pixpool prepare`` writes the same snapshot and label index a daemon
would, without starting one, and the digest command reads as a daemon reads; all three sit on
the readers, ``prepare``, ``label_index`` and ``fingerprint`` of this package.
"""

from __future__ import annotations

import dataclasses
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


@dataclass(frozen=True)
class SplitRequest:
    """One split a daemon serves, as ``splits`` resolves it from the settings: ``data`` and
    ``images`` (where it is read from) and its ``lineage`` (``fingerprint.lineage_of``: where its
    data comes from, so that a newer snapshot of a split supersedes only older ones of the same
    split, and its label index is found again). How it is read and decoded is the
    ``PrepareOptions`` that goes with it."""

    split: str
    data: str
    images: str | None
    lineage: str


@dataclass(frozen=True)
class SplitClasses:
    """The training set's class names, which a validation set must have, and where they were read."""

    data: str
    names: tuple[str, ...]


def train_split(config: DaemonConfig) -> SplitRequest:
    """The training set's ``SplitRequest`` (``splits``)."""
    return _request(config, "train", config.data, config.images)


def splits(config: DaemonConfig) -> dict[str, SplitRequest]:
    """split -> ``SplitRequest``: the training set and, unless ``no_val``, the validation set
    (``val``, else a data.yaml's own ``val:``)."""
    from ..readers import yaml_has_split

    out = {"train": train_split(config)}
    if config.no_val:
        return out
    if config.val is not None:
        out["val"] = _request(config, "val", config.val, config.val_images)
    elif str(config.data).lower().endswith((".yaml", ".yml")) and yaml_has_split(config.data, "val"):
        out["val"] = _request(config, "val", config.data, None)
    return out


def _request(config: DaemonConfig, split: str, data, images) -> SplitRequest:
    from .fingerprint import lineage_of

    split_data = f"{data}#{split}" if split != "train" else data
    return SplitRequest(split, data, images, lineage_of(split_data, images, config.imgsz, config.dtype, config.spec))


def load_split(
    request: SplitRequest,
    options: PrepareOptions,
    *,
    warned: set,
    train: SplitClasses | None = None,
    use_index: bool = True,
    progress: bool = False,
) -> LoadedSplit:
    """The snapshot of one split (module docstring): re-attached on the word of its label index
    when every file it was read from is unchanged (``use_index``; ``pixpool prepare`` reads in
    full, to report what the reader found), else read, prepared (or re-attached) with
    ``options`` (``progress``: a bar on stderr) and indexed. The records read go out of scope
    here: only their image paths are kept, in one ``PathTable``. ``train``: the training
    set's classes, which a validation set must have (checked before it is prepared);
    ``warned``: the sets of images without labels already warned about (a data.yaml whose val:
    is its train: folder, the demo's, reads the same images twice: one warning)."""
    opened = open_split(request, options, warned=warned, train=train, use_index=use_index)
    return finish_split(opened, options, progress=progress)


def load_splits(requests: dict[str, SplitRequest], options: PrepareOptions, *, loaded: dict) -> None:
    """Every split of ``requests`` into ``loaded`` (split -> ``LoadedSplit``), as a daemon starts:
    every split is opened first (read, or re-attached on its label index), and what they all take
    is checked against the store (``_check_room``) before the first image is decoded; the
    validation snapshot then has the memory budget the training one left. What is in ``loaded``
    is the caller's to release, also when this raises; a split opened but not loaded is closed here."""
    opened: dict[str, OpenedSplit] = {}
    warned: set = set()
    try:
        for split, request in requests.items():
            train = opened["train"].classes if "train" in opened else None
            opened[split] = open_split(request, options, warned=warned, train=train)
        header_sizes = _check_room(opened, options)
        for split in requests:
            loaded[split] = finish_split(opened.pop(split), options, header_sizes=header_sizes)
            _say_loaded(split, loaded[split], same_as_train=split != "train" and _same_snapshot(loaded))
            if options.memory_budget_nbytes is not None and split == "train":
                options = _budget_left(options, sum(loaded[split].snapshot.nbytes.values()))
    finally:
        for left in opened.values():  # opened, never loaded: a failure before every split was
            left.close()


def _same_snapshot(loaded: dict) -> bool:
    """The validation split is the training snapshot (the same images at the same size)."""
    return "train" in loaded and loaded["val"].snapshot.name == loaded["train"].snapshot.name


def _check_room(opened: dict[str, OpenedSplit], options: PrepareOptions) -> dict:
    """Log the plan (``planning.py``: the same figures as ``pixpool plan``) and refuse, with a
    CapacityError naming the store, the bytes needed and free and the flags that help, when the
    snapshots not in the store yet do not fit it: before any image is decoded and anything
    allocated. Returns the header sizes read, which the preparations then use."""
    from .planning import check_room, plan_line, read_header_sizes, serve_plan

    datasets = {split: o.dataset for split, o in opened.items() if o.dataset is not None}
    attached = {split: o.indexed[1] for split, o in opened.items() if o.indexed is not None}
    sizes_hw = read_header_sizes(datasets.values(), processes=options.processes)
    store = options.segment_store
    plan = serve_plan(datasets, sizes_hw, imgsz=options.imgsz, dtype=options.dtype, store=store, attached=attached)
    log.info("%s", plan_line(plan))
    check_room(plan)
    if not plan.fits:
        log.warning(
            "the store %s leaves a trainer's rings (%d bytes) no room in the daemon's ring budget beside the "
            "snapshots; trainers will be refused until there is more room (`pixpool plan` says what helps)",
            store,
            plan.ring_block_nbytes,
        )
    return sizes_hw


def _budget_left(options: PrepareOptions, train_nbytes: int) -> PrepareOptions:
    """The options of the validation snapshot: the memory budget less the training snapshot."""
    budget = options.memory_budget_nbytes
    if train_nbytes >= budget:
        cheaper = "use --dtype uint8 (a quarter of the bytes of float32), " if options.dtype == "float32" else ""
        raise CapacityError(
            f"the training snapshot takes {train_nbytes} bytes, the whole memory budget of {budget} bytes, and leaves "
            f"nothing for the validation set; {cheaper}raise the budget (--memory-budget) or serve no validation set (--no-val)"
        )
    return dataclasses.replace(options, memory_budget_nbytes=budget - train_nbytes)


def _say_loaded(split: str, loaded: LoadedSplit, *, same_as_train: bool) -> None:
    """One line per snapshot: which split, prepared or re-attached, and what it holds. A
    validation split of the training images is that same snapshot: said at debug, not as a
    second snapshot "re-attached" right after the first was prepared."""
    snap = loaded.snapshot
    if same_as_train:
        log.debug("validation split: the training snapshot %s (the same images)", snap.name)
        return
    log.info(
        "%s snapshot %s %s: %d records, %s at %d px, %.1f MiB in %s (%.1f s)",
        "training" if split == "train" else "validation",
        snap.name,
        "re-attached" if loaded.reused else "prepared",
        len(snap),
        snap.dtype,
        snap.imgsz,
        sum(snap.nbytes.values()) / (1 << 20),
        snap.store,
        loaded.seconds,
    )


@dataclass
class OpenedSplit:
    """A split before anything is decoded: re-attached on its label index (``indexed``: the index
    and the snapshot, which this holds until ``finish_split`` or ``close``), or read in full
    (``dataset``, ``stats``). The daemon opens every split first, so that its check at start-up
    (``planning.py``) sees what each will take before the first is prepared."""

    request: SplitRequest
    indexed: tuple | None = None
    dataset: Any = None
    stats: Any = None
    t0: float = 0.0
    started_ns: int = 0

    @property
    def classes(self) -> SplitClasses:
        """The split's class names (its label index's, or the reader's) and where it was read."""
        names = self.indexed[0].names if self.indexed is not None else self.dataset.names
        return SplitClasses(self.request.data, tuple(names))

    def close(self) -> None:
        """Let go of a re-attached snapshot that will not be served (a failure before serving)."""
        if self.indexed is not None:
            self.indexed[1].close()
            self.indexed = None


def open_split(
    request: SplitRequest,
    options: PrepareOptions,
    *,
    warned: set,
    train: SplitClasses | None = None,
    use_index: bool = True,
) -> OpenedSplit:
    """``load_split``'s first half: the snapshot re-attached on its label index, or the split read."""
    t0 = time.perf_counter()
    indexed = _indexed(options, request.lineage) if use_index else None
    if indexed is not None:
        index, snap = indexed
        try:
            _check_names(request, index.names, train)
        except ConfigError:
            snap.close()
            raise
        _log_missing(index.records, index.labels_missing, index.missing_label_example, request.data, warned)
        return OpenedSplit(request, indexed=indexed, t0=t0)
    started_ns = time.time_ns()
    dataset, stats = read_split(request, options, warned=warned, train=train)
    return OpenedSplit(request, dataset=dataset, stats=stats, t0=t0, started_ns=started_ns)


def finish_split(
    opened: OpenedSplit,
    options: PrepareOptions,
    *,
    progress: bool = False,
    header_sizes: dict | None = None,
) -> LoadedSplit:
    """``load_split``'s second half: the split ``open_split`` opened, prepared (or re-attached) and
    indexed. ``header_sizes``: image path -> (h, w) already read (the daemon's check at start-up)."""
    from . import label_index
    from .fingerprint import content_fingerprint
    from .prepare import prepare_snapshot

    lineage = opened.request.lineage
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


def read_split(request: SplitRequest, options: PrepareOptions, *, warned: set, train: SplitClasses | None = None):
    """(Dataset, ReaderStats) of one split read in full, with the daemon's settings; the
    warning about images without labels once per set of them (``warned``), and a validation
    set's class names checked against the training set's (``train``)."""
    from ..readers import read_dataset

    dataset, stats = read_dataset(
        request.data,
        request.images,
        max_instances_per_image=options.max_instances_per_image,
        allow_unlabelled=options.allow_unlabelled,
        split=request.split,
        warn_missing_labels=False,
        task=options.task,
        max_classes=options.max_classes,
    )
    _check_names(request, dataset.names, train)
    _log_missing(stats.records, stats.labels_missing, stats.missing_label_example, request.data, warned)
    return dataset, stats


def _indexed(options: PrepareOptions, lineage: str):
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
    if index is None or index.task != options.task:
        return None
    if index.max_instances > options.max_instances_per_image or len(index.names) > options.max_classes:
        return None
    if index.labels_missing and index.labels_missing == index.records and not options.allow_unlabelled:
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


def _check_names(request: SplitRequest, names, train: SplitClasses | None) -> None:
    if train is not None and tuple(names) != train.names:
        raise ConfigError(
            f"the validation set {request.data} has classes {list(names)[:5]}..., the training set "
            f"{train.data} {list(train.names)[:5]}...; they must be the same classes in the same order",
            field="val",
        )


def _log_missing(records: int, missing: int, example: str | None, data, warned: set) -> None:
    from ..readers import ReaderStats, log_missing_labels

    if (missing, example) in warned:
        return
    warned.add((missing, example))
    log_missing_labels(ReaderStats(records=records, labels_missing=missing, missing_label_example=example), data)
