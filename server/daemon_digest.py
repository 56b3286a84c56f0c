"""Digests of a training stream as the daemon delivers it (for ``pixpool digest``).

Runs in the caller's process (the CLI): it attaches a ``Client`` to a running daemon, or
starts a temporary daemon in a spawned process (stopped with SIGTERM and reaped before
returning), and hashes each delivered batch with the augmentation package's
``batch_digest`` over the slot bytes exactly as a trainer receives them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time

from ..shared.config import StreamSettings
from ..shared.errors import ConfigError, DaemonStopped, DaemonTimeout


def daemon_digests(
    settings: StreamSettings,
    epoch: int,
    batches: int | None = None,
    *,
    socket_dir: str | os.PathLike | None = None,
    workers: int | None = None,
    data: str | os.PathLike | None = None,
    images: str | os.PathLike | None = None,
    timeout_s: float = 300.0,
) -> list[str]:
    """One sha256 per batch of ``epoch`` (the first ``batches`` of them, or all).

    ``workers`` None: attach to the daemon at ``socket_dir``. Otherwise start a temporary
    daemon with that many workers serving ``data`` (``images``) at the stream's imgsz.
    """
    from ..client.iterator import Client
    from .augment.batch import batch_digest

    def collect(sdir) -> list[str]:
        out = []
        with Client(settings, socket_dir=sdir, timeout_s=timeout_s, as_torch=False) as client:
            for b in client.epoch(epoch):
                out.append(batch_digest(b.images, b.targets))
                if batches is not None and len(out) >= batches:
                    break
        return out

    if workers is None:
        return collect(socket_dir)
    if data is None:
        raise ConfigError("a temporary daemon needs the dataset: pass data (and images for a COCO json)")
    from .run import run_daemon, stop_process

    sdir = tempfile.mkdtemp(prefix="pxdg-")
    proc = mp.get_context("spawn").Process(
        target=run_daemon,
        kwargs=dict(data=str(data), images=None if images is None else str(images), imgsz=settings.augment.imgsz, workers=workers, socket_dir=sdir),
    )
    proc.start()
    try:
        sock = os.path.join(sdir, "daemon.sock")
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(sock):
            if not proc.is_alive():
                raise DaemonStopped(f"the temporary daemon for {data} exited with code {proc.exitcode} before serving; run `pixpool serve {data}` to see why")
            if time.monotonic() > deadline:
                raise DaemonTimeout(f"the temporary daemon for {data} did not start within {timeout_s} s")
            proc.join(0.05)  # bounded wait for start-up, watching for an early exit
        return collect(sdir)
    finally:
        stop_process(proc)
        shutil.rmtree(sdir, ignore_errors=True)
