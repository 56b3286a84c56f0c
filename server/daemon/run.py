"""``run_daemon``: check the settings, load the dataset, prepare or re-attach its snapshot,
serve, clean up.

A restart on unchanged files re-attaches the snapshot on the word of its label index
(``snapshot/label_index.py``) without reading a label file; otherwise the dataset is read in
full, prepared (or re-attached) and indexed. Either way the daemon keeps its records' image
paths in one ``PathTable`` and no per-record object.

Runs in the daemon process: ``pixpool serve`` calls it in the foreground, tests and
benchmarks use it as a spawn ``Process`` target (``stop_process`` stops one). Order:
``preflight`` (paths, keys, address) before the dataset is read, reading before decoding.
On exit the snapshot goes by the one rule of ``Snapshot.release``: the last daemon out
removes it (whether it prepared it or re-attached it), unless asked to keep it or it was
prepared to persist, and only once no other process maps it. The daemon unlinks its
rings itself.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time

from ...shared.errors import CapacityError, ConfigError
from ...shared.stream import served_data
from ...shared.stream.config import DaemonConfig, PrepareOptions
from ...shared.stream.path_table import PathTable

log = logging.getLogger(__name__)


def stop_process(proc, *, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> None:
    """Stop a daemon started as a ``multiprocessing`` process: ``sig`` (SIGTERM: a clean
    shutdown that unlinks its rings and snapshot), then SIGKILL if it has not exited
    within ``timeout_s``; always reaps it."""
    if proc.is_alive():
        os.kill(proc.pid, sig)
        proc.join(timeout_s)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout_s)


def run_daemon(config: DaemonConfig, *, renderer: str | None = None) -> None:
    """Serve ``config.data`` (and its validation set) until stopped (see module docstring).

    ``renderer``: the module name the workers render with (``renderer.py``); None is the
    real route. Tests pass a stand-in here; nothing reads it from the environment."""
    from .preflight import preflight
    from .renderer import DEFAULT_RENDERER
    from .service import Daemon

    if not isinstance(config, DaemonConfig):
        raise TypeError(f"run_daemon takes a DaemonConfig, got {type(config).__name__}")
    config = preflight(config)
    # SIGTERM between preparation and the daemon's own handler must still unlink what this
    # call created: until serve() takes over it raises here, and the finally below runs.
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    snaps: dict = {}
    try:
        info, files, names = {}, {}, {}
        options = config.prepare_options()
        warned: set = set()
        for split, (data, images, lineage) in splits(config).items():
            snaps[split], info[split], files[split], names[split] = _load(
                config, options, data, images, split, lineage, warned=warned, train_names=names.get("train")
            )
            # Which files this split is, resolved as it was read: a trainer that names its data compares it.
            info[split]["served"] = served_data.describe(data, images, split=split, task=config.task)
            if options.memory_budget_nbytes is not None and split == "train":
                options = _budget_left(options, sum(snaps[split].nbytes.values()))  # the validation snapshot's
        _return_freed_memory()
        Daemon(
            snaps,
            config,
            snapshot_info=info,
            files=files,
            names=tuple(names["train"]),
            renderer=renderer or DEFAULT_RENDERER,
        ).serve()
    finally:
        # The validation handle first; where both splits are one snapshot it only closes,
        # and the training handle then releases the snapshot once.
        for split in sorted(snaps, key=lambda k: k == "train"):
            snap = snaps[split]
            if split != "train" and "train" in snaps and snaps["train"].name == snap.name:
                snap.close()
            elif snap.release(keep=config.keep_snapshot) == "removed":
                log.info("snapshot %s removed", snap.name)
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)


def splits(config: DaemonConfig) -> dict:
    """split -> (data, images, lineage): the training set and, unless ``no_val``, the validation
    set (``val``, else a data.yaml's own ``val:``). A split's lineage (``fingerprint.lineage_of``)
    is where its data comes from, so that a newer snapshot of a split supersedes only older
    ones of the same split, and its label index is found again."""
    from ..readers import yaml_has_split
    from ..snapshot.fingerprint import lineage_of

    def lineage(data, images, split):
        split_data = f"{data}#{split}" if split != "train" else data
        return lineage_of(split_data, images, config.imgsz, config.dtype, config.task)

    out = {"train": (config.data, config.images, lineage(config.data, config.images, "train"))}
    if config.no_val:
        return out
    if config.val is not None:
        out["val"] = (config.val, config.val_images, lineage(config.val, config.val_images, "val"))
    elif str(config.data).lower().endswith((".yaml", ".yml")) and yaml_has_split(config.data, "val"):
        out["val"] = (config.data, None, lineage(config.data, None, "val"))
    return out


def _load(
    config: DaemonConfig, options: PrepareOptions, data, images, split: str, lineage: str, *, warned: set, train_names
):
    """(snapshot, info, record paths, class names) of one split: re-attached on the word of its
    label index when every file it was read from is unchanged, else read, prepared (or
    re-attached) and indexed. The records read go out of scope here: the daemon keeps only
    the paths, in one ``PathTable``. ``train_names``: the training set's class names, which a
    validation set must have (checked before it is prepared); ``warned``: the sets of images
    without labels already warned about (a data.yaml whose val: is its train: folder, the
    demo's, reads the same images twice: one warning)."""
    from ..snapshot import label_index
    from ..snapshot.fingerprint import content_fingerprint
    from ..snapshot.prepare import prepare_snapshot

    t0 = time.perf_counter()
    indexed = _indexed(config, options, lineage)
    if indexed is not None:
        index, snap = indexed
        try:
            _check_names(config, index.names, train_names)
        except ConfigError:
            snap.close()
            raise
        _log_missing(index.records, index.labels_missing, index.missing_label_example, data, warned)
        seconds = time.perf_counter() - t0
        return snap, _info(snap, content=index.content, reused=True, seconds=seconds, classes=len(index.names)), (
            index.record_paths
        ), index.names  # fmt: skip
    started_ns = time.time_ns()
    dataset, stats = read_split(config, data, images, split, warned=warned, train_names=train_names)
    result = prepare_snapshot(dataset, options, lineage=lineage)
    snap = result.snapshot
    # The float32 fingerprint is the content's whatever the arena's dtype; only a uint8
    # snapshot pays a second pass (one stat per image file) to compute it.
    content = snap.fingerprint if snap.dtype == "float32" else content_fingerprint(dataset, imgsz=options.imgsz)
    paths = PathTable.from_paths(rec.image_path for rec in dataset.records)
    try:
        label_index.write_index(
            snap, dataset, stats, lineage=lineage, content=content, read_started_ns=started_ns, record_paths=paths
        )
    except OSError as exc:  # the index only saves time: a store that cannot hold it costs a full read next time
        log.warning("no label index written beside %s: %s", snap.name, exc)
    info = _info(snap, content=content, reused=bool(result.reused), seconds=result.seconds, classes=len(dataset.names))
    return snap, info, paths, tuple(dataset.names)


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
    """(index, snapshot) where a trusted label index (``snapshot.label_index``) names a complete
    snapshot this daemon may serve as a full read would; None otherwise (read in full). What a
    full read would refuse (an image over ``max_instances_per_image``, more classes than
    ``max_classes``, a set without any label file) is read in full, so that the refusal says
    what it says today."""
    from ..snapshot import label_index
    from ..snapshot.fingerprint import segment_names
    from ..snapshot.prepare import check_budget
    from ..snapshot.reuse import BeingPrepared, existing_snapshot

    index = label_index.find_trusted(lineage, store=options.store)
    if index is None or index.task != config.task:
        return None
    if index.max_instances > config.max_instances_per_image or len(index.names) > config.max_classes:
        return None
    if index.labels_missing and index.labels_missing == index.records and not config.allow_unlabelled:
        return None
    try:
        snap = existing_snapshot(index.base, segment_names(index.fingerprint), store=options.store)
    except BeingPrepared:
        return None
    if snap is None:
        return None
    if snap.header.fingerprint != index.fingerprint or len(snap) != index.records:
        snap.close()
        return None
    try:
        check_budget(sum(snap.nbytes.values()), options.memory_budget_nbytes, what=f"the existing snapshot {snap.name}",
                     imgsz=options.imgsz)  # fmt: skip
    except CapacityError:
        snap.close()
        raise
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


def _return_freed_memory() -> None:
    """Hand the heap that a full read freed back to the system (glibc's ``malloc_trim``): the
    parsed records of a 100k-image set are hundreds of MB of small objects, freed once the
    snapshot holds them, and glibc keeps freed heap pages mapped otherwise."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):  # not glibc (musl): nothing to hand back this way
        pass


def _budget_left(options: PrepareOptions, train_nbytes: int) -> PrepareOptions:
    """The options of the validation snapshot: the memory budget less the training snapshot."""
    budget = options.memory_budget_nbytes
    if train_nbytes >= budget:
        raise CapacityError(
            f"the training snapshot takes {train_nbytes} bytes, the whole memory budget of {budget} bytes, and leaves "
            "nothing for the validation set; raise the budget (--memory-budget) or serve no validation set (--no-val)"
        )
    return dataclasses.replace(options, memory_budget_nbytes=budget - train_nbytes)


def _info(snap, *, content: str, reused: bool, seconds: float, classes: int) -> dict:
    """What the daemon tells about a split's snapshot (status, attach)."""
    from ..snapshot.handle import label_indexes

    log.info(
        "snapshot %s %s (%d records, %.1f s)", snap.name, "re-attached" if reused else "prepared", len(snap), seconds
    )
    nbytes = snap.nbytes
    return {
        "name": snap.name,
        "content": content,
        "reused": bool(reused),
        "prepare_s": round(float(seconds), 3),
        # Its label indexes too: bytes the store retains for it (invariant 8), removed with it.
        "segments": [*snap.segment_names, *label_indexes(snap.name, snap.store)],
        "dtype": snap.dtype,
        "store": snap.store,
        "image_bytes": int(nbytes["img"]),
        "index_bytes": int(nbytes["meta"]),
        "target_bytes": int(nbytes["tgt"]),
        "polygon_bytes": int(snap.polygon_nbytes),
        "keypoint_bytes": int(snap.keypoint_nbytes),
        "decoded_bytes": int(snap.decoded_nbytes),
        "classes": classes,
    }


def _raise_terminated(signum, frame):
    from ..snapshot.prepare import PreparationTerminated

    raise PreparationTerminated("SIGTERM before the daemon started serving; what it created is being removed")
