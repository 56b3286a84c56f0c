"""``run_daemon``: check the settings, load the dataset, prepare or re-attach its snapshot,
serve, clean up.

Runs in the daemon process: ``pixpool serve`` calls it in the foreground, tests and
benchmarks use it as a spawn ``Process`` target (``stop_process`` stops one). Order:
``preflight`` (paths, keys, address) before the dataset is read, reading before decoding.
On exit the snapshot goes by the one rule of ``Snapshot.release``: only when this call
created it, was not asked to keep it, and no other process maps it. The daemon unlinks its
rings itself.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from ...shared.config import DaemonConfig
from ...shared.errors import ConfigError

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


def run_daemon(config: DaemonConfig) -> None:
    """Serve ``config.data`` (and its validation set) until stopped (see module docstring)."""
    from .admission import preflight
    from .service import Daemon

    if not isinstance(config, DaemonConfig):
        raise TypeError(f"run_daemon takes a DaemonConfig, got {type(config).__name__}")
    preflight(config)
    # SIGTERM between preparation and the daemon's own handler must still unlink what this
    # call created: until serve() takes over it raises here, and the finally below runs.
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    snaps: dict = {}
    try:
        datasets = _datasets(config)
        info, files = {}, {}
        budget = config.memory_budget_nbytes
        for split, dataset in datasets.items():
            snaps[split], info[split] = _prepare(dataset, config, budget)
            if budget is not None and split == "train":
                budget -= sum(snaps[split].nbytes.values())  # the validation snapshot gets what is left
            files[split] = tuple(r.image_path for r in dataset.records)
        Daemon(snaps, config, snapshot_info=info, files=files, names=tuple(datasets["train"].names)).serve()
    finally:
        # The validation handle first: where both splits are one snapshot, the training
        # handle (its creator, if any) is then the last one that maps it.
        for split in sorted(snaps, key=lambda k: k == "train"):
            snap = snaps[split]
            if snap.release(keep=config.keep_snapshot) == "removed":
                log.info("snapshot %s removed", snap.name)
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)


def _datasets(config: DaemonConfig) -> dict:
    """split -> Dataset: the training set and, unless ``no_val``, the validation set
    (``val``, else a data.yaml's own ``val:``); their class names must agree."""
    from ..readers import load_dataset, yaml_has_split

    out = {"train": load_dataset(config.data, config.images)}
    if config.no_val:
        return out
    if config.val is not None:
        out["val"] = load_dataset(config.val, config.val_images, split="val")
    elif str(config.data).lower().endswith((".yaml", ".yml")) and yaml_has_split(config.data, "val"):
        out["val"] = load_dataset(config.data, split="val")
    if "val" in out and out["val"].names != out["train"].names:
        raise ConfigError(f"the validation set {config.val or config.data} has classes {list(out['val'].names)[:5]}..., the training set "
                          f"{config.data} {list(out['train'].names)[:5]}...; they must be the same classes in the same order", field="val")
    return out


def _prepare(dataset, config: DaemonConfig, budget_nbytes: int | None):
    from ..snapshot.prepare import prepare_snapshot

    result = prepare_snapshot(dataset, imgsz=config.imgsz, processes=config.processes, budget_nbytes=budget_nbytes)
    snap = result.snapshot
    log.info("snapshot %s %s (%d records, %.1f s)", snap.name, "re-attached" if result.reused else "prepared", len(snap), result.seconds)
    info = {"name": snap.name, "reused": bool(result.reused), "prepare_s": round(float(result.seconds), 3), "segments": list(snap.segment_names),
            "dtype": snap.dtype, "image_bytes": int(result.image_bytes), "index_bytes": int(result.index_bytes),
            "target_bytes": int(result.target_bytes), "decoded_bytes": int(result.decoded_bytes), "classes": len(dataset.names)}
    return snap, info


def _raise_terminated(signum, frame):
    from ..snapshot.prepare import PreparationTerminated

    raise PreparationTerminated("SIGTERM before the daemon started serving; what it created is being removed")
