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

import logging
import os
import signal
import threading

from ...shared.config import DaemonConfig

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
    """Serve ``config.data`` until stopped (see module docstring)."""
    from ..readers import load_dataset
    from ..snapshot.fingerprint import lineage_of
    from ..snapshot.prepare import prepare_snapshot
    from .admission import preflight
    from .service import Daemon

    if not isinstance(config, DaemonConfig):
        raise TypeError(f"run_daemon takes a DaemonConfig, got {type(config).__name__}")
    preflight(config)
    # SIGTERM between preparation and the daemon's own handler must still unlink what this
    # call created: until serve() takes over it raises here, and the finally below runs.
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    snap = None
    try:
        dataset = load_dataset(config.data, config.images, max_instances_per_image=config.max_instances_per_image, allow_unlabelled=config.allow_unlabelled)
        result = prepare_snapshot(dataset, imgsz=config.imgsz, processes=config.processes, persist=config.keep_snapshot,
                                  lineage=lineage_of(config.data, config.images, config.imgsz), wait_s=config.prepare_wait_s)
        snap = result.snapshot
        info = {"name": snap.name, "reused": bool(result.reused), "prepare_s": round(float(result.seconds), 3), "segments": list(snap.segment_names),
                "image_bytes": int(result.image_bytes), "decoded_bytes": int(result.decoded_bytes)}
        log.info("snapshot %s %s (%d records, %.1f s)", snap.name, "re-attached" if result.reused else "prepared", len(snap), result.seconds)
        Daemon(snap, config, snapshot_info=info).serve()
    finally:
        if snap is not None and snap.release(keep=config.keep_snapshot) == "removed":
            log.info("snapshot %s removed", snap.name)
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)


def _raise_terminated(signum, frame):
    from ..snapshot.prepare import PreparationTerminated

    raise PreparationTerminated("SIGTERM before the daemon started serving; what it created is being removed")
