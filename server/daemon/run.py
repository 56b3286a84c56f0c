"""``run_daemon``: check the settings, load the dataset, prepare or re-attach its snapshot,
serve, clean up.

The settings name the splits (``snapshot/load.py``'s ``splits``: one ``SplitRequest`` each), and
``load_splits`` loads them with the settings' ``PrepareOptions``: every split is opened first,
and what they will take is logged and checked against the store (``snapshot/planning.py``, the
figures of ``pixpool plan``) before any image is decoded: a restart on unchanged files
re-attaches the snapshot on the word of its label index (``snapshot/label_index.py``) without
reading a label file; otherwise the dataset is read in full, prepared (or re-attached) and
indexed. Either way the daemon keeps its records' image
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

import logging
import os
import signal
import threading

from ...shared.stream import served_data
from ...shared.stream.config import DaemonConfig, PrepareOptions
from ...shared.transport.starting import StartingMark
from ..snapshot.load import LoadedSplit, SplitRequest, load_split, load_splits, splits

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
    loaded: dict[str, LoadedSplit] = {}
    try:
        requests = splits(config)
        load_splits(requests, config.prepare_options(), loaded=loaded)
        _return_freed_memory()
        daemon = Daemon(
            {split: one.snapshot for split, one in loaded.items()},
            config,
            snapshot_info={split: _info(loaded[split], requests[split], config.task) for split in loaded},
            files={split: one.record_paths for split, one in loaded.items()},
            names=loaded["train"].names,
            renderer=renderer or DEFAULT_RENDERER,
        )
        try:
            daemon.serve()
        finally:
            if daemon.listener is not None and daemon.listener.endpoint is not None:
                served.append(True)
    finally:
        _release(loaded, keep=config.keep_snapshot)
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)


def _release(loaded: dict[str, LoadedSplit], *, keep: bool) -> None:
    """Let go of the snapshots: the validation handle first; where both splits are one snapshot
    it only closes, and the training handle then releases the snapshot once."""
    for split in sorted(loaded, key=lambda k: k == "train"):
        snap = loaded[split].snapshot
        if split != "train" and "train" in loaded and loaded["train"].snapshot.name == snap.name:
            snap.close()
        elif snap.release(keep=keep) == "removed":
            log.info("snapshot %s removed", snap.name)


def _load(request: SplitRequest, options: PrepareOptions, *, warned: set, train=None):
    """(snapshot, info, record paths, class names) of one split loaded on its own
    (``load_split``), as tests load one; ``_run`` loads every split with ``load_splits``."""
    loaded = load_split(request, options, warned=warned, train=train)
    return loaded.snapshot, _info(loaded, request, options.task), loaded.record_paths, loaded.names


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


def _info(loaded: LoadedSplit, request: SplitRequest, task: str) -> dict:
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
        # Which files this split is, resolved as it was read: a trainer that names its data compares it.
        "served": served_data.describe(request.data, request.images, split=request.split, task=task),
    }


def _raise_terminated(signum, frame):
    from ..snapshot.prepare import PreparationTerminated

    raise PreparationTerminated("SIGTERM before the daemon started serving; what it created is being removed")
