"""``pixpool train``: one trainer attached to a running daemon, training the small detector.

Runs in the trainer's process. Start several of these beside one ``pixpool serve`` (with
different ``--seed``, or ``--rank/--world-size`` for a sharded job) to watch the snapshot
shared between them; ``pixpool monitor`` shows the footprint meanwhile. Every stream and
augmentation setting is a flag (generated from ``StreamSettings`` and ``AugmentConfig``);
``AugmentConfig.epochs`` is ``--start-epoch`` + ``--epochs``. Needs the trainer extra
(torch).
"""

from __future__ import annotations

import argparse
import json

from ...shared.config import AugmentConfig, StreamSettings
from ...shared.flags import add_fields, from_args


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--socket-dir", metavar="DIR", default=None, help="the daemon's socket directory")
    parser.add_argument("--endpoint", default=None, help="tcp://HOST:PORT of a remote daemon (needs --keys)")
    parser.add_argument("--keys", metavar="DIR", default=None, help="CURVE key directory for TCP")
    parser.add_argument("--num-classes", type=int, default=None, help="classes the detector predicts (default: the daemon's dataset's)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs to train (default 1)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="how long to wait for the daemon and each batch (default 120)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_fields(parser, StreamSettings, group="stream (StreamSettings)")
    add_fields(parser, AugmentConfig, group="augmentation (AugmentConfig; defaults are YOLO's)", prefix="aug_", exclude=("epochs",))


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from .._torch import require_torch

    require_torch("pixpool train")
    from ..loop import train_on_daemon

    augment = from_args(AugmentConfig, args, prefix="aug_", epochs=args.start_epoch + args.epochs)
    settings = from_args(StreamSettings, args, augment=augment)
    report = train_on_daemon(settings, epochs=args.epochs, num_classes=args.num_classes, socket_dir=args.socket_dir, endpoint=args.endpoint,
                             keys_dir=args.keys, device=args.device, max_steps=args.max_steps, timeout_s=args.timeout_s)
    if args.json:
        print(json.dumps(dataclasses.asdict(report) | {"images_per_s": report.images_per_s}))
    else:
        losses = report.losses
        print(f"{report.steps} steps on {report.device}{' (CUDA graph)' if report.graph else ''}, {report.images_per_s:.1f} img/s, "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else f"{report.steps} steps (no full batch)")
    return 0
