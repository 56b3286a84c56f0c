"""``pixpool serve DATA``: run the producer daemon in the foreground.

Runs in the user's shell process, which becomes the daemon (systemd, a container or a
terminal manages it). Ctrl-C or SIGTERM stops it cleanly; see ``server/daemon.py``.
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("data", metavar="DATA", help="COCO json, YOLO data.yaml, or YOLO images folder")
    parser.add_argument("--images", metavar="DIR", default=None, help="image folder for a COCO json")
    parser.add_argument("--imgsz", type=int, default=640, help="long side of the prepared images (default 640)")
    parser.add_argument("--workers", type=int, default=2, help="augmentation worker processes (default 2)")
    parser.add_argument("--socket-dir", metavar="DIR", default=None, help="ipc socket directory, mode 0700 (default $XDG_RUNTIME_DIR/pixpool or <tmp>/pixpool-<uid>)")
    parser.add_argument("--tcp", metavar="HOST:PORT", default=None, help="also serve remote trainers over TCP (requires --keys)")
    parser.add_argument("--keys", metavar="DIR", default=None, help="CURVE key directory made by `pixpool keys DIR`")
    parser.add_argument("--keep-snapshot", action="store_true", help="leave the snapshot in /dev/shm on exit")
    parser.add_argument("--heartbeat-timeout-s", type=float, default=10.0, help="detach a trainer silent this long (default 10)")
    parser.add_argument("--processes", type=int, default=2, help="decoder processes when preparing (default 2)")


def run(args: argparse.Namespace) -> int:
    import sys

    from ..daemon import run_daemon
    from ..prepare import PreparationTerminated

    try:
        run_daemon(
            args.data, images=args.images, imgsz=args.imgsz, workers=args.workers, socket_dir=args.socket_dir, tcp=args.tcp,
            keys_dir=args.keys, keep_snapshot=args.keep_snapshot, heartbeat_timeout_s=args.heartbeat_timeout_s, processes=args.processes,
        )
    except PreparationTerminated:
        print("pixpool serve: terminated (SIGTERM) before serving; no segment was left behind", file=sys.stderr)
        return 143
    return 0
