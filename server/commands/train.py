"""``pixpool train``: one trainer attached to a running daemon, training the small detector.

Runs in the trainer's process. Start several of these beside one ``pixpool serve`` (with
different ``--seed``, or ``--rank/--world-size`` for a sharded job) to watch the snapshot
shared between them; ``pixpool monitor`` shows the footprint meanwhile.
"""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--socket-dir", metavar="DIR", default=None, help="the daemon's socket directory")
    parser.add_argument("--endpoint", default=None, help="tcp://HOST:PORT of a remote daemon (needs --keys)")
    parser.add_argument("--keys", metavar="DIR", default=None, help="CURVE key directory for TCP")
    parser.add_argument("--num-classes", type=int, default=80, help="classes the detector predicts (default 80)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--start-epoch", type=int, default=0)
    parser.add_argument("--mosaic", type=float, default=1.0)
    parser.add_argument("--copy-paste", type=float, default=0.0)
    parser.add_argument("--mixup", type=float, default=0.0)
    parser.add_argument("--hsv-on-device", action="store_true", help="apply HSV on the trainer's device instead of in the workers")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from ...client.loop import train_on_daemon
    from ...shared.config import AugmentConfig, StreamSettings

    settings = StreamSettings(
        seed=args.seed, batch_size=args.batch_size, rank=args.rank, world_size=args.world_size, start_epoch=args.start_epoch,
        hsv_on_device=args.hsv_on_device,
        augment=AugmentConfig(imgsz=args.imgsz, mosaic=args.mosaic, copy_paste=args.copy_paste, mixup=args.mixup, epochs=args.start_epoch + args.epochs),
    )
    report = train_on_daemon(settings, epochs=args.epochs, num_classes=args.num_classes, socket_dir=args.socket_dir, endpoint=args.endpoint,
                             keys_dir=args.keys, device=args.device, max_steps=args.max_steps, timeout_s=args.timeout_s)
    if args.json:
        print(json.dumps(dataclasses.asdict(report) | {"images_per_s": report.images_per_s}))
    else:
        losses = report.losses
        print(f"{report.steps} steps on {report.device}{' (CUDA graph)' if report.graph else ''}, {report.images_per_s:.1f} img/s, "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else f"{report.steps} steps (no full batch)")
    return 0
