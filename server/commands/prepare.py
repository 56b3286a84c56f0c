"""``pixpool prepare DATA``: decode a dataset once into a shared-memory snapshot.

Runs in the user's shell process, which creates (and owns) the snapshot's segments and
leaves them in /dev/shm on success: the snapshot persists until ``pixpool clean``. On any
failure nothing is left behind (see ``server/prepare.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("data", metavar="DATA", help="a COCO instances json, a YOLO data.yaml, or a YOLO images folder")
    parser.add_argument("--images", metavar="DIR", default=None, help="COCO images folder (default: beside the json as images/NAME)")
    parser.add_argument("--imgsz", type=int, default=640, help="long side of the prepared images in pixels (default 640)")
    parser.add_argument("--processes", type=int, default=2, help="decode processes (default 2; 1 decodes in this process)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    from ...shared.errors import ConfigError
    from .. import accountant
    from ..prepare import PreparationTerminated, prepare_snapshot
    from ..readers import load_dataset

    if args.imgsz < 32:
        raise ConfigError(f"--imgsz must be >= 32, got {args.imgsz}")
    if args.processes < 1:
        raise ConfigError(f"--processes must be >= 1, got {args.processes}")
    dataset = load_dataset(args.data, args.images)
    try:
        result = prepare_snapshot(dataset, imgsz=args.imgsz, processes=args.processes, progress=not (args.json or args.no_progress) and sys.stderr.isatty())
    except PreparationTerminated:
        print("pixpool prepare: terminated (SIGTERM); no snapshot was left behind", file=sys.stderr)
        return 143
    snap = result.snapshot
    try:
        if args.json:
            print(json.dumps(result.as_dict()))
            return 0
        state = "re-attached existing" if result.reused else f"prepared in {result.seconds:.2f} s with {result.processes} process(es)"
        print(f"snapshot {snap.name}: {result.records} records at imgsz {snap.imgsz}, {state}")
        print(accountant.format_snapshot_report(accountant.snapshot_bytes(snap), records=result.records))
        print()
        print(accountant.format_process_report(accountant.process_memory([os.getpid()])))
        return 0
    finally:
        snap.close()
