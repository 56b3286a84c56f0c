"""``run_daemon``: check the settings, load the dataset, prepare or re-attach its snapshot,
serve, clean up.

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

from ...shared.errors import CapacityError, ConfigError
from ...shared.stream.config import DaemonConfig, PrepareOptions

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
        datasets = _datasets(config)
        info, files = {}, {}
        options = config.prepare_options()
        for split, (dataset, lineage) in datasets.items():
            snaps[split], info[split] = _prepare(dataset, options, lineage)
            if options.memory_budget_nbytes is not None and split == "train":
                options = _budget_left(options, sum(snaps[split].nbytes.values()))  # the validation snapshot's
            files[split] = tuple(r.image_path for r in dataset.records)
        Daemon(
            snaps,
            config,
            snapshot_info=info,
            files=files,
            names=tuple(datasets["train"][0].names),
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


def _datasets(config: DaemonConfig) -> dict:
    """split -> (Dataset, lineage): the training set and, unless ``no_val``, the validation
    set (``val``, else a data.yaml's own ``val:``); their class names must agree. A split's
    lineage (``fingerprint.lineage_of``) is where its data comes from, so that a newer
    snapshot of a split supersedes only older ones of the same split."""
    from ..readers import log_missing_labels, read_dataset, yaml_has_split
    from ..snapshot.fingerprint import lineage_of

    warned: set = set()

    def read(data, images, split):
        dataset, stats = read_dataset(
            data,
            images,
            max_instances_per_image=config.max_instances_per_image,
            allow_unlabelled=config.allow_unlabelled,
            split=split,
            warn_missing_labels=False,
            task=config.task,
        )
        # One warning per set of images without labels: a data.yaml whose val: is its train:
        # folder (the demo's) reads the same images twice.
        missing = (stats.labels_missing, stats.missing_label_example)
        if missing not in warned:
            warned.add(missing)
            log_missing_labels(stats, data)
        split_data = f"{data}#{split}" if split != "train" else data
        return dataset, lineage_of(split_data, images, config.imgsz, config.dtype, config.task)

    out = {"train": read(config.data, config.images, "train")}
    if config.no_val:
        return out
    if config.val is not None:
        out["val"] = read(config.val, config.val_images, "val")
    elif str(config.data).lower().endswith((".yaml", ".yml")) and yaml_has_split(config.data, "val"):
        out["val"] = read(config.data, None, "val")
    if "val" in out and out["val"][0].names != out["train"][0].names:
        raise ConfigError(
            f"the validation set {config.val or config.data} has classes {list(out['val'][0].names)[:5]}..., the training set "
            f"{config.data} {list(out['train'][0].names)[:5]}...; they must be the same classes in the same order",
            field="val",
        )
    return out


def _budget_left(options: PrepareOptions, train_nbytes: int) -> PrepareOptions:
    """The options of the validation snapshot: the memory budget less the training snapshot."""
    budget = options.memory_budget_nbytes
    if train_nbytes >= budget:
        raise CapacityError(
            f"the training snapshot takes {train_nbytes} bytes, the whole memory budget of {budget} bytes, and leaves "
            "nothing for the validation set; raise the budget (--memory-budget) or serve no validation set (--no-val)"
        )
    return dataclasses.replace(options, memory_budget_nbytes=budget - train_nbytes)


def _prepare(dataset, options: PrepareOptions, lineage: str):
    from ..snapshot.fingerprint import content_fingerprint
    from ..snapshot.prepare import prepare_snapshot

    result = prepare_snapshot(dataset, options, lineage=lineage)
    snap = result.snapshot
    # The float32 fingerprint is the content's whatever the arena's dtype; only a uint8
    # snapshot pays a second pass (one stat per image file) to compute it.
    content = snap.fingerprint if snap.dtype == "float32" else content_fingerprint(dataset, imgsz=options.imgsz)
    log.info(
        "snapshot %s %s (%d records, %.1f s)",
        snap.name,
        "re-attached" if result.reused else "prepared",
        len(snap),
        result.seconds,
    )
    info = {
        "name": snap.name,
        "content": content,
        "reused": bool(result.reused),
        "prepare_s": round(float(result.seconds), 3),
        "segments": list(snap.segment_names),
        "dtype": snap.dtype,
        "store": snap.store,
        "image_bytes": int(result.image_bytes),
        "index_bytes": int(result.index_bytes),
        "target_bytes": int(result.target_bytes),
        "polygon_bytes": int(result.polygon_bytes),
        "keypoint_bytes": int(result.keypoint_bytes),
        "decoded_bytes": int(result.decoded_bytes),
        "classes": len(dataset.names),
    }
    return snap, info


def _raise_terminated(signum, frame):
    from ..snapshot.prepare import PreparationTerminated

    raise PreparationTerminated("SIGTERM before the daemon started serving; what it created is being removed")
