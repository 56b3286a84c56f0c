"""``pixpool digest``: one SHA-256 per batch exactly as a trainer receives it from a daemon.

Runs in the user's shell process, as a trainer would: it attaches a ``Client`` to the
daemon at ``--socket-dir``, or, without it, starts a temporary one with ``pixpool serve``
as a child process (``--workers N``; stopped with SIGTERM, which removes its rings and the
snapshot it made, before the command returns). The digests hash the slot bytes as they
arrive. ``--reference`` and ``--in-process`` are the producer's paths
(``server/commands/digest.py``); both commands take the parser of ``shared/stream/digest.py``.
"""

from __future__ import annotations

import argparse

from ...shared.errors import ConfigError
from ...shared.stream import digest
from ...shared.stream.config import StreamSettings


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    digest.configure(parser)


def run(args: argparse.Namespace) -> int:
    settings = digest.settings_from(args)
    if args.socket_dir is None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers} must be at least 1 for a temporary daemon")
    workers = None if args.socket_dir is not None else args.workers
    digests = daemon_digests(
        settings,
        args.epoch,
        args.batches,
        socket_dir=args.socket_dir,
        workers=workers,
        data=args.data,
        images=args.images,
        processes=args.processes,
        dtype=args.dtype,
        store=args.store,
    )
    digest.report(args, "daemon", settings, digests)
    return 0


def daemon_digests(
    settings: StreamSettings,
    epoch: int,
    batches: int | None = None,
    *,
    socket_dir: str | None = None,
    workers: int | None = None,
    data: str | None = None,
    images: str | None = None,
    processes: int = 2,
    dtype: str = "float32",
    timeout_s: float = 300.0,
    store: str | None = None,
) -> list[str]:
    """One sha256 per batch of ``epoch`` (the first ``batches`` of them, or all).

    ``workers`` None: attach to the daemon at ``socket_dir``. Otherwise start a temporary
    daemon with that many workers serving ``data`` (``images``) at the stream's imgsz, from a
    snapshot of ``dtype``, its snapshot and rings in ``store`` (default /dev/shm).
    """
    if workers is None:
        return _collect(settings, epoch, batches, socket_dir, timeout_s)
    if data is None:
        raise ConfigError("a temporary daemon needs the dataset: pass data (and images for a COCO json)")
    from ..child import serve_child

    serve = [
        str(data),
        "--imgsz",
        str(settings.augment.imgsz),
        "--workers",
        str(workers),
        "--processes",
        str(processes),
        "--dtype",
        dtype,
    ]
    if images is not None:
        serve += ["--images", str(images)]
    if store is not None:
        serve += ["--store", str(store)]
    with serve_child(serve, timeout_s=timeout_s) as (_, sdir, _):
        return _collect(settings, epoch, batches, sdir, timeout_s)


def _collect(
    settings: StreamSettings, epoch: int, batches: int | None, socket_dir: str | None, timeout_s: float
) -> list[str]:
    from ..client import Client

    out = []
    with Client(settings, socket_dir=socket_dir, timeout_s=timeout_s, as_torch=False) as client:
        if batches is not None:
            digest.check_batches(batches, client.num_records, settings, epoch)
        for b in client.epoch(epoch):
            out.append(digest.batch_digest(b.images, b.targets))
            if batches is not None and len(out) >= batches:
                break
    return out
