"""``run_daemon``: check the settings, load the dataset, prepare or re-attach its snapshot,
serve, clean up.

Each split is loaded by ``snapshot/load.py``'s ``open_split`` and ``finish_split`` (together
``load_split``), as ``pixpool prepare`` loads one; every split is opened first, and what they will
take is logged and checked against the store (``snapshot/planning.py``, the figures of ``pixpool
plan``) before any image is decoded: a restart on unchanged files re-attaches the snapshot on the word of its label index
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

from ...shared.errors import CapacityError
from ...shared.stream import served_data
from ...shared.stream.config import DaemonConfig, PrepareOptions
from ...shared.transport.starting import StartingMark
from ..snapshot.load import LoadedSplit, OpenedSplit, finish_split, open_split, splits

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


def run_daemon(config: DaemonConfig, *, renderer: str | None = None, starting: StartingMark | None = None) -> None:
    """Serve ``config.data`` (and its validation set) until stopped (see module docstring).

    ``renderer``: the module name the workers render with (``renderer.py``); None is the
    real route. Tests pass a stand-in here; nothing reads it from the environment.
    ``starting``: the socket directory's starting mark (``shared.transport.starting``), where
    the caller took it before importing this module (``pixpool serve``); taken here first
    thing otherwise, so that a trainer started beside this daemon waits for it. Held until
    the daemon exits; a daemon that never served removes it, and the directories it made."""
    if not isinstance(config, DaemonConfig):
        raise TypeError(f"run_daemon takes a DaemonConfig, got {type(config).__name__}")
    mark = starting if starting is not None else StartingMark.take(config.socket_dir)
    served: list[bool] = []
    try:
        _run(config, renderer, served)
    finally:
        mark.release(served=bool(served))


def _run(config: DaemonConfig, renderer: str | None, served: list[bool]) -> None:
    """``run_daemon``'s work; appends to ``served`` once the daemon has bound its socket."""
    from .preflight import preflight
    from .renderer import DEFAULT_RENDERER
    from .service import Daemon

    config = preflight(config)
    # SIGTERM between preparation and the daemon's own handler must still unlink what this
    # call created: until serve() takes over it raises here, and the finally below runs.
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    snaps: dict = {}
    opened: dict = {}  # split -> OpenedSplit, until its snapshot is in ``snaps``
    try:
        info, files, names = {}, {}, {}
        options = config.prepare_options()
        warned: set = set()
        named = splits(config)
        # Every split is read (or re-attached on its label index) first, and what they all take
        # is checked against the store before the first image is decoded (``_check_room``).
        for split, (data, images, lineage) in named.items():
            train_names = opened["train"].names if "train" in opened else None
            opened[split] = open_split(
                config, options, data, images, split, lineage, warned=warned, train_names=train_names
            )
        header_sizes = _check_room(config, opened)
        for split, (data, images, lineage) in named.items():
            snaps[split], info[split], files[split], names[split] = _finish(
                opened.pop(split),
                options,
                lineage,
                split,
                header_sizes=header_sizes,
                train_snapshot=snaps["train"].name if "train" in snaps else None,
            )
            # Which files this split is, resolved as it was read: a trainer that names its data compares it.
            info[split]["served"] = served_data.describe(data, images, split=split, task=config.task)
            if options.memory_budget_nbytes is not None and split == "train":
                options = _budget_left(options, sum(snaps[split].nbytes.values()))  # the validation snapshot's
        _return_freed_memory()
        daemon = Daemon(
            snaps,
            config,
            snapshot_info=info,
            files=files,
            names=tuple(names["train"]),
            renderer=renderer or DEFAULT_RENDERER,
        )
        try:
            daemon.serve()
        finally:
            if daemon.listener is not None and daemon.listener.endpoint is not None:
                served.append(True)
    finally:
        for left in opened.values():  # opened, never loaded: a failure before serving
            left.close()
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


def _load(
    config: DaemonConfig,
    options: PrepareOptions,
    data,
    images,
    split: str,
    lineage: str,
    *,
    warned: set,
    train_names,
    train_snapshot: str | None = None,
):
    """(snapshot, info, record paths, class names) of one split loaded on its own (``open_split``
    then ``_finish``), as tests load one; ``_run`` opens every split first and checks the room."""
    opened = open_split(config, options, data, images, split, lineage, warned=warned, train_names=train_names)
    return _finish(opened, options, lineage, split, header_sizes=None, train_snapshot=train_snapshot)


def _finish(
    opened: OpenedSplit,
    options: PrepareOptions,
    lineage: str,
    split: str,
    *,
    header_sizes: dict | None,
    train_snapshot: str | None = None,
):
    """(snapshot, info, record paths, class names) of one opened split: ``snapshot.load.finish_split``
    and what the daemon tells about it (``_info``)."""
    loaded = finish_split(opened, options, lineage, header_sizes=header_sizes)
    _say_loaded(split, loaded, same_as_train=loaded.snapshot.name == train_snapshot)
    return loaded.snapshot, _info(loaded), loaded.record_paths, loaded.names


def _check_room(config: DaemonConfig, opened: dict) -> dict:
    """Log the plan (``snapshot/planning.py``: the same figures as ``pixpool plan``) and refuse,
    with a CapacityError naming the store, the bytes needed and free and the flags that help,
    when the snapshots not in the store yet do not fit it: before any image is decoded and
    anything allocated. Returns the header sizes read, which the preparations then use."""
    from ..snapshot.planning import check_room, plan_line, read_header_sizes, serve_plan

    datasets = {split: o.dataset for split, o in opened.items() if o.dataset is not None}
    attached = {split: o.indexed[1] for split, o in opened.items() if o.indexed is not None}
    sizes_hw = read_header_sizes(datasets.values(), processes=config.processes)
    plan = serve_plan(
        datasets, sizes_hw, imgsz=config.imgsz, dtype=config.dtype, store=config.segment_store, attached=attached
    )
    log.info("%s", plan_line(plan))
    check_room(plan)
    if not plan.fits:
        log.warning(
            "the store %s leaves a trainer's rings (%d bytes) no room in the daemon's ring budget beside the "
            "snapshots; trainers will be refused until there is more room (`pixpool plan` says what helps)",
            config.store,
            plan.ring_block_nbytes,
        )
    return sizes_hw


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
        cheaper = "use --dtype uint8 (a quarter of the bytes of float32), " if options.dtype == "float32" else ""
        raise CapacityError(
            f"the training snapshot takes {train_nbytes} bytes, the whole memory budget of {budget} bytes, and leaves "
            f"nothing for the validation set; {cheaper}raise the budget (--memory-budget) or serve no validation set (--no-val)"
        )
    return dataclasses.replace(options, memory_budget_nbytes=budget - train_nbytes)


def _info(loaded: LoadedSplit) -> dict:
    """What the daemon tells about a split's snapshot (status, attach)."""
    from ..snapshot.handle import label_indexes

    snap = loaded.snapshot
    nbytes = snap.nbytes
    return {
        "name": snap.name,
        "content": loaded.content,
        "reused": bool(loaded.reused),
        "prepare_s": round(float(loaded.seconds), 3),
        # Its label indexes too: bytes the store retains for it (invariant 8), removed with it.
        "segments": [*snap.segment_names, *label_indexes(snap.name, snap.store)],
        "dtype": snap.dtype,
        "store": str(snap.store),
        "image_bytes": int(nbytes["img"]),
        "index_bytes": int(nbytes["meta"]),
        "target_bytes": int(nbytes["tgt"]),
        "polygon_bytes": int(snap.polygon_nbytes),
        "keypoint_bytes": int(snap.keypoint_nbytes),
        "decoded_bytes": int(snap.decoded_nbytes),
        "classes": len(loaded.names),
    }


def _raise_terminated(signum, frame):
    from ..snapshot.prepare import PreparationTerminated

    raise PreparationTerminated("SIGTERM before the daemon started serving; what it created is being removed")
