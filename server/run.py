"""``run_daemon``: load a dataset, prepare or re-attach its snapshot, serve, clean up.

Runs in the daemon process: ``pixpool serve`` calls it in the foreground, tests and
``daemon_digests`` use it as a spawn ``Process`` target. The snapshot is unlinked on exit
only when this call created it and ``keep_snapshot`` is false; the daemon unlinks its rings.
"""

from __future__ import annotations

import logging
import os
import signal

from ..shared.errors import ConfigError

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


def run_daemon(
    data: str | os.PathLike,
    *,
    images: str | os.PathLike | None = None,
    imgsz: int = 640,
    workers: int = 2,
    socket_dir: str | os.PathLike | None = None,
    tcp: str | None = None,
    keys_dir: str | os.PathLike | None = None,
    keep_snapshot: bool = False,
    heartbeat_timeout_s: float = 10.0,
    processes: int = 2,
    route: str | None = None,
    max_ring_nbytes: int = 2 << 30,
    max_total_ring_nbytes: int | None = None,
    job_timeout_s: float = 300.0,
) -> None:
    """Load ``data``, prepare or re-attach its snapshot, serve until stopped, clean up.

    Usable as a spawn ``Process`` target (tests) and by ``pixpool serve``.
    """
    import threading

    from .accountant import segment_users
    from .daemon import Daemon
    from .prepare import prepare_snapshot
    from .readers import load_dataset

    if imgsz < 32:
        raise ConfigError(f"--imgsz must be >= 32, got {imgsz}")
    # SIGTERM between preparation and the daemon's own handler must still unlink what this
    # call created: until serve() takes over it raises here, and the finally below runs.
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    snap, created = None, False
    try:
        dataset = load_dataset(data, images)
        result = prepare_snapshot(dataset, imgsz=imgsz, processes=processes)
        snap, created = result.snapshot, not result.reused
        info = {"name": snap.name, "reused": bool(result.reused), "prepare_s": round(float(result.seconds), 3), "segments": list(snap.segment_names),
                "image_bytes": int(result.image_bytes), "decoded_bytes": int(result.decoded_bytes)}
        log.info("snapshot %s %s (%d records, %.1f s)", snap.name, "re-attached" if result.reused else "prepared", len(snap), result.seconds)
        Daemon(snap, workers=workers, socket_dir=socket_dir, tcp=tcp, keys_dir=keys_dir, heartbeat_timeout_s=heartbeat_timeout_s, route=route, snapshot_info=info,
               max_ring_nbytes=max_ring_nbytes, max_total_ring_nbytes=max_total_ring_nbytes, job_timeout_s=job_timeout_s).serve()
    finally:
        if snap is not None:
            # Another daemon may have re-attached the snapshot this one created: leave it to
            # them (``pixpool clean`` removes it once nobody maps it).
            others = {pid for seg in snap.segment_names for pid in segment_users().get(seg, ())} - {os.getpid()}
            if created and not keep_snapshot and not others:
                snap.unlink()
                log.info("snapshot %s removed", snap.name)
            elif created and not keep_snapshot:
                log.warning("snapshot %s kept: processes %s still map it", snap.name, sorted(others))
            snap.close()
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)


def _raise_terminated(signum, frame):
    from .prepare import PreparationTerminated

    raise PreparationTerminated("SIGTERM before the daemon started serving; what it created is being removed")


