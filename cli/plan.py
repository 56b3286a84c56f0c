"""``pixpool plan DATA``: what serving DATA will hold, before anything is prepared.

Runs in the user's shell process. Reads the dataset as a daemon reads it (labels, the same
refusals) and the images' headers only (no image is decoded), then says what the snapshot, each
trainer's rings and the same trainers' uint8 caches (Ultralytics' ``cache=ram``) would hold, the
break-even trainer count, and whether the store has room, with the flags that make it fit where it
has not. The sizes come from the functions the daemon sizes its snapshot and rings with
(``server/snapshot/planning.py``); ``pixpool serve`` logs the same plan in one line and refuses
to start, before decoding, when its snapshots do not fit. Exit status 0 when everything fits, 1
when it does not (or on an error).
"""

from __future__ import annotations

import argparse
import json

from ..shared.stream.config import DaemonConfig
from ..shared.stream.flags import add_fields, from_args

# The DaemonConfig fields that decide what a daemon would hold (and where).
_FIELDS = (
    "data", "images", "val", "val_images", "no_val", "imgsz", "task", "dtype", "store", "processes",
    "max_instances_per_image", "allow_unlabelled", "max_classes",
)  # fmt: skip


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    add_fields(parser, DaemonConfig, only=_FIELDS)
    parser.add_argument("--trainers", type=int, default=1, metavar="N", help="trainers to plan for (default 1)")
    parser.add_argument(
        "--batch-size", type=int, default=16, metavar="N", help="each trainer's batch size (default 16)"
    )
    parser.add_argument(
        "--val-batch-size", type=int, default=16, metavar="N", help="each trainer's validation batch size (default 16)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text")


def run(args: argparse.Namespace) -> int:
    import time

    from ..server.snapshot.load import SplitClasses, read_split, splits
    from ..server.snapshot.planning import format_plan, read_header_sizes, serve_plan
    from ..shared.errors import ConfigError
    from ..shared.stream.config import StreamSettings

    config = from_args(DaemonConfig, args)
    for flag, value in (("trainers", args.trainers), ("batch_size", args.batch_size), ("val_batch_size", args.val_batch_size)):  # fmt: skip
        if value < 1:
            raise ConfigError.for_field(flag, value, "must be 1 or more")
    StreamSettings(batch_size=args.batch_size)  # its own bounds
    store = config.segment_store.checked()
    t0 = time.perf_counter()
    datasets: dict = {}
    warned: set = set()
    options = config.prepare_options()
    for split, request in splits(config).items():
        train = SplitClasses(config.data, tuple(datasets["train"].names)) if "train" in datasets else None
        datasets[split], _ = read_split(request, options, warned=warned, train=train)
    t1 = time.perf_counter()
    sizes_hw = read_header_sizes(datasets.values(), processes=config.processes)
    t2 = time.perf_counter()
    plan = serve_plan(
        datasets, sizes_hw, imgsz=config.imgsz, dtype=config.dtype, store=store, trainers=args.trainers,
        batch_size=args.batch_size, val_batch_size=args.val_batch_size,
    )  # fmt: skip
    if args.json:
        out = plan.as_dict()
        out.update(labels_s=round(t1 - t0, 3), headers_s=round(t2 - t1, 3), images=len(sizes_hw))
        print(json.dumps(out))
    else:
        print(format_plan(plan, config.data))
        print(f"  ({len(sizes_hw)} image headers read in {t2 - t1:.2f} s, the labels in {t1 - t0:.2f} s)")
    return 0 if plan.fits else 1
