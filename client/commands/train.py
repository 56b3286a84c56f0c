"""``pixpool train``: train the reference detector on a running daemon's stream.

Runs in the trainer's process. Start several beside one ``pixpool serve`` (different
``--seed``, or ``--rank/--world-size`` for a sharded job); ``pixpool monitor`` shows the
footprint meanwhile. Every augmentation setting is a flag (generated from
``AugmentConfig``); ``--epochs`` is the run's total (``close_mosaic`` counts from its end),
``--resume PROJECT/last.pt`` continues a run to it. Validation runs each epoch on the
daemon's val split when it serves one. Needs the trainer extra (torch).
"""

from __future__ import annotations

import argparse
import json

from ...shared.cli.flags import add_fields, from_args, parse_bool
from ...shared.stream.config import AugmentConfig


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--socket-dir", metavar="DIR", default=None, help="the daemon's socket directory")
    parser.add_argument("--endpoint", default=None, help="tcp://HOST:PORT of a remote daemon (needs --keys)")
    parser.add_argument("--keys", metavar="DIR", default=None, help="CURVE key directory for TCP")
    parser.add_argument("--epochs", type=int, default=10, help="the run's total epochs (default 10)")
    parser.add_argument("--batch-size", type=int, default=16, help="images per batch (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the stream and the model (default 0)")
    parser.add_argument(
        "--model", default="n", help="detector scale: n (YOLOv8n), s, m, or tiny (CPU tests) (default n)"
    )
    parser.add_argument("--optimizer", default="SGD", choices=["SGD", "AdamW"], help="default SGD")
    parser.add_argument("--lr", type=float, default=0.01, help="initial learning rate (default 0.01)")
    parser.add_argument("--warmup-epochs", type=float, default=1.0, help="linear LR warm-up (default 1)")
    parser.add_argument(
        "--project", default="runs/train", help="where results.jsonl, last.pt and best.pt go (default runs/train)"
    )
    parser.add_argument(
        "--resume", metavar="LAST_PT", default=None, help="continue the run of this checkpoint to --epochs"
    )
    parser.add_argument(
        "--val",
        type=parse_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="validate each epoch on the daemon's val split (default true)",
    )
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument(
        "--hsv-on-device",
        type=parse_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="HSV on the trainer's device instead of in the workers (default false)",
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument(
        "--follow-snapshot",
        action="store_true",
        help="if the daemon is restarted on another dataset, go on with it (default: stop with SnapshotChangedError)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=120.0, help="how long to wait for the daemon's replies (default 120)"
    )
    parser.add_argument(
        "--wait-s",
        type=float,
        default=0.0,
        help="how long to wait for a daemon that is still starting (default 0: no daemon at --socket-dir fails at once)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the final report as JSON")
    add_fields(
        parser,
        AugmentConfig,
        group="augmentation (AugmentConfig; defaults are YOLO's)",
        prefix="aug_",
        exclude=("epochs",),
    )


def run(args: argparse.Namespace) -> int:
    from ...shared.transport import endpoint as ep
    from .._torch import require_torch
    from ..daemon_socket import await_daemon

    # Before torch loads (seconds): without a daemon there is nothing to train on.
    await_daemon(args.endpoint or ep.ipc_endpoint(args.socket_dir), wait_s=args.wait_s)
    require_torch("pixpool train")
    from ..fit import FitConfig, fit

    config = FitConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=args.seed,
        scale=args.model,
        optimizer=args.optimizer,
        lr=args.lr,
        warmup_epochs=args.warmup_epochs,
        device=args.device,
        project=args.project,
        resume=args.resume,
        validate=args.val,
        max_steps=args.max_steps,
        hsv_on_device=args.hsv_on_device,
        follow_snapshot=args.follow_snapshot,
        progress=not (args.no_progress or args.json),
        augment=from_args(AugmentConfig, args, prefix="aug_"),
    )

    def show(row: dict) -> None:
        if not args.json:
            val = f", mAP50 {row['mAP50']:.3f}, mAP50-95 {row['mAP50_95']:.3f}" if "mAP50" in row else ""
            print(
                f"epoch {row['epoch'] + 1}/{args.epochs}: loss {row['loss']:.3f}{val}, {row['images_per_s']:.1f} img/s, "
                f"data wait {100 * row['data_wait_fraction']:.0f}%",
                flush=True,
            )

    report = fit(
        config,
        socket_dir=args.socket_dir,
        endpoint=args.endpoint,
        keys_dir=args.keys,
        timeout_s=args.timeout_s,
        wait_s=args.wait_s,
        on_epoch=show,
    )
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "history"}))
    else:
        print(
            f"checkpoint {report.get('checkpoint')}; metrics {report['results']} (draw them: pixpool plot {report['results']} -o results.png)"
        )
    return 0
