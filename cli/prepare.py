"""``pixpool prepare DATA``: decode a dataset once into a snapshot in the store.

Runs in the user's shell process, which creates (and owns) the snapshot's segments and
leaves them in the store (``--store``, default /dev/shm) on success: the snapshot persists until ``pixpool clean``. On any
failure nothing is left behind (see ``server/snapshot/prepare.py``). The training split is
read, prepared and indexed by the daemon's own ``load_split`` (``server/snapshot/load.py``),
so a daemon started on the unchanged files re-attaches it without reading a label.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from ..shared.stream.config import DaemonConfig, PrepareOptions
from ..shared.stream.flags import add_fields, add_negative_alias, from_args, parse_bool

# Every flag is the DaemonConfig field a daemon would prepare with (``DaemonConfig.prepare_options``).
_FIELDS = ("data", "images", *(f.name for f in dataclasses.fields(PrepareOptions) if f.name != "keep_snapshot"))


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    add_fields(parser, DaemonConfig, only=_FIELDS)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--progress",
        type=parse_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="a progress bar on stderr when it is a terminal (default True)",
    )
    add_negative_alias(parser, "--progress", dest="progress")


def run(args: argparse.Namespace) -> int:
    from ..ops import accounting
    from ..server.snapshot.load import load_split, train_split
    from ..server.snapshot.prepare import PreparationTerminated
    from ..shared.transport import procmem

    # Validated before the dataset is read: a typo costs nothing. What `pixpool prepare` makes
    # stays until `pixpool clean` (keep_snapshot): that is its purpose.
    config = from_args(DaemonConfig, args)
    options = config.prepare_options(keep_snapshot=True)
    request = train_split(config)
    progress = args.progress and not args.json and sys.stderr.isatty()
    try:
        # Read in full, never on the label index alone: the report says what the reader found.
        loaded = load_split(request, options, warned=set(), use_index=False, progress=progress)
    except PreparationTerminated:
        print("pixpool prepare: terminated (SIGTERM); no snapshot was left behind", file=sys.stderr)
        return 143
    snap, result, stats = loaded.snapshot, loaded.prepared, loaded.stats
    try:
        if args.json:
            print(json.dumps({**result.as_dict(), "dataset": stats.as_dict()}))
            return 0
        state = (
            "re-attached existing"
            if result.reused
            else f"prepared in {result.seconds:.2f} s with {result.processes} process(es)"
        )
        print(f"snapshot {snap.name}: {result.records} records at imgsz {snap.imgsz}, {snap.dtype}, {state}")
        print(
            f"dataset: {stats.instances} instances, {stats.background} background images, {stats.labels_missing} without a label file"
        )
        print(accounting.format_snapshot_report(accounting.snapshot_bytes(snap), records=result.records))
        print()
        print(accounting.format_process_report(procmem.process_memory([os.getpid()], snap.store)))
        return 0
    finally:
        snap.close()
