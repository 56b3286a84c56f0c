"""``pixpool digest``: one SHA-256 per batch of a training stream, so users can check parity.

Runs in the user's shell process. Three paths, one stream:

- ``--reference``: the in-process reference pipeline (decode per sample, no snapshot);
- default: through the daemon, exactly as a trainer receives the batches: attach to the
  daemon at ``--socket-dir``, or, without it, start a temporary one with ``--workers N``
  (stopped and cleaned up before the command returns);
- ``--in-process``: render from the shared-memory snapshot in this process: it
  re-attaches an existing one for the same dataset and imgsz, or prepares one; a snapshot
  it prepared itself is unlinked at exit (also on errors and Ctrl-C) unless
  ``--keep-snapshot``.

Equal digests from the two paths, for the same flags, are the parity claim made visible.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

from ...shared.config import AugmentConfig, StreamSettings
from ...shared.errors import ConfigError
from ...shared.source import ImageSource

log = logging.getLogger(__name__)


def digest_stream(source: ImageSource, settings: StreamSettings, epoch: int, batches: int) -> list[str]:
    """SHA-256 hex of the first ``batches`` batches of ``epoch`` (images + packed targets)."""
    from ..augment import batch_digest, num_batches, render_batch

    total = num_batches(len(source), settings, epoch)
    if not 1 <= batches <= total:
        raise ConfigError(f"--batches {batches} is out of range: epoch {epoch} of this stream has {total} batches of {settings.batch_size}; use 1 to {total}")
    out = []
    for b in range(batches):
        r = render_batch(source, settings, epoch, b)
        out.append(batch_digest(r.images, r.targets))
    return out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected 0/1 or true/false, got {text!r}")


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("data", help="COCO json, YOLO data.yaml or YOLO images folder")
    parser.add_argument("--images", default=None, help="COCO images folder (default: next to the json)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--batches", type=int, default=1, help="how many batches of the epoch to digest (from the first)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--shuffle", type=_bool, default=True, help="0 keeps dataset order")
    parser.add_argument("--drop-last", type=_bool, default=False)
    parser.add_argument("--reference", action="store_true", help="decode per sample in-process, no snapshot")
    parser.add_argument("--socket-dir", default=None, help="digest the stream of the running daemon at this socket directory")
    parser.add_argument("--workers", type=int, default=2, help="workers of the temporary daemon started when no --socket-dir is given (default 2)")
    parser.add_argument("--in-process", action="store_true", help="render from the snapshot in this process, no daemon")
    parser.add_argument("--processes", type=int, default=2, help="decode processes when a snapshot must be prepared (--in-process)")
    parser.add_argument("--keep-snapshot", action="store_true", help="keep a snapshot this command prepared")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    aug = parser.add_argument_group("augmentation (AugmentConfig; defaults are YOLO's)")
    for f in dataclasses.fields(AugmentConfig):
        default = f.default
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        conv = {"bool": _bool, "int": int, "float": float}[kind]
        aug.add_argument(_flag(f.name), dest=f"aug_{f.name}", metavar=kind.upper(), type=conv, default=default, help=f"default {default}")


def run(args: argparse.Namespace) -> int:
    from ..readers import load_dataset

    augment = AugmentConfig(**{f.name: getattr(args, f"aug_{f.name}") for f in dataclasses.fields(AugmentConfig)})
    settings = StreamSettings(
        seed=args.seed,
        batch_size=args.batch_size,
        rank=args.rank,
        world_size=args.world_size,
        shuffle=args.shuffle,
        drop_last=args.drop_last,
        augment=augment,
    )
    if args.epoch < 0:
        raise ConfigError(f"--epoch {args.epoch} must be >= 0")
    dataset = load_dataset(args.data, args.images)
    if args.reference:
        from ..reference import ReferenceSource

        digests = digest_stream(ReferenceSource(dataset, augment.imgsz), settings, args.epoch, args.batches)
        path = "reference"
    elif args.in_process:
        digests = _digest_snapshot(dataset, settings, args)
        path = "snapshot"
    else:
        digests = _digest_daemon(len(dataset), settings, args)
        path = "daemon"
    if args.json:
        print(json.dumps({"path": path, "seed": args.seed, "epoch": args.epoch, "batch_size": args.batch_size, "settings": settings.to_dict(), "digests": digests}))
    else:
        for b, d in enumerate(digests):
            print(f"epoch {args.epoch} batch {b} {d}")
    return 0


def _digest_daemon(num_records: int, settings: StreamSettings, args: argparse.Namespace) -> list[str]:
    from ..augment import num_batches
    from ..daemon_digest import daemon_digests

    total = num_batches(num_records, settings, args.epoch)
    if not 1 <= args.batches <= total:
        raise ConfigError(f"--batches {args.batches} is out of range: epoch {args.epoch} of this stream has {total} batches of {settings.batch_size}; use 1 to {total}")
    if args.socket_dir is not None:
        return daemon_digests(settings, args.epoch, args.batches, socket_dir=args.socket_dir)
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers} must be at least 1 for a temporary daemon")
    return daemon_digests(settings, args.epoch, args.batches, workers=args.workers, data=args.data, images=args.images)


def _digest_snapshot(dataset, settings: StreamSettings, args: argparse.Namespace) -> list[str]:
    from ..prepare import prepare_snapshot

    result = prepare_snapshot(dataset, imgsz=settings.augment.imgsz, processes=args.processes)
    snapshot = result.snapshot
    created = not result.reused
    try:
        return digest_stream(snapshot, settings, args.epoch, args.batches)
    finally:
        snapshot.close()
        if created and not args.keep_snapshot:
            snapshot.unlink()
            log.debug("removed snapshot %s prepared for this digest", snapshot.name)
        elif created:
            log.info("kept snapshot %s (--keep-snapshot); remove it with `pixpool clean`", snapshot.name)
