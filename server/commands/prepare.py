"""``pixpool prepare DATA``: decode a dataset once into a snapshot in the store.

Runs in the user's shell process, which creates (and owns) the snapshot's segments and
leaves them in the store (``--store``, default /dev/shm) on success: the snapshot persists until ``pixpool clean``. On any
failure nothing is left behind (see ``server/snapshot/prepare.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from ...shared.cli.flags import add_fields, from_args
from ...shared.stream.config import DaemonConfig, PrepareOptions

# Every flag is the DaemonConfig field a daemon would prepare with (``DaemonConfig.prepare_options``).
_FIELDS = ("data", "images", *(f.name for f in dataclasses.fields(PrepareOptions) if f.name != "keep_snapshot"))


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    add_fields(parser, DaemonConfig, only=_FIELDS)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    from ...shared.transport import procmem
    from .. import accountant
    from ..readers import read_dataset
    from ..snapshot.fingerprint import lineage_of
    from ..snapshot.prepare import PreparationTerminated, prepare_snapshot

    # Validated before the dataset is read: a typo costs nothing. What `pixpool prepare` makes
    # stays until `pixpool clean` (keep_snapshot): that is its purpose.
    config = from_args(DaemonConfig, args)
    options = config.prepare_options(keep_snapshot=True)
    started_ns = time.time_ns()
    dataset, stats = read_dataset(
        config.data,
        config.images,
        max_instances_per_image=options.max_instances_per_image,
        allow_unlabelled=options.allow_unlabelled,
        task=options.task,
        max_classes=config.max_classes,
    )
    lineage = lineage_of(config.data, config.images, options.imgsz, options.dtype, options.task)
    try:
        result = prepare_snapshot(
            dataset, options, progress=not (args.json or args.no_progress) and sys.stderr.isatty(), lineage=lineage
        )
    except PreparationTerminated:
        print("pixpool prepare: terminated (SIGTERM); no snapshot was left behind", file=sys.stderr)
        return 143
    snap = result.snapshot
    _write_label_index(snap, dataset, stats, lineage=lineage, imgsz=options.imgsz, read_started_ns=started_ns)
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
        print(accountant.format_snapshot_report(accountant.snapshot_bytes(snap), records=result.records))
        print()
        print(accountant.format_process_report(procmem.process_memory([os.getpid()], snap.store)))
        return 0
    finally:
        snap.close()


def _write_label_index(snap, dataset, stats, *, lineage: str, imgsz: int, read_started_ns: int) -> None:
    """The label index beside the snapshot, so that a daemon started on the unchanged files
    re-attaches it without reading a label (``snapshot/label_index.py``); a store that cannot
    hold it costs that daemon a full read, nothing more."""
    import logging

    from ..snapshot import label_index
    from ..snapshot.fingerprint import content_fingerprint

    content = snap.fingerprint if snap.dtype == "float32" else content_fingerprint(dataset, imgsz=imgsz)
    try:
        label_index.write_index(snap, dataset, stats, lineage=lineage, content=content, read_started_ns=read_started_ns)
    except OSError as exc:
        logging.getLogger(__name__).warning("no label index written beside %s: %s", snap.name, exc)
