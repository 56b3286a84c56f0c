"""``pixpool synth OUT [--task detect|segment|pose|obb]``: write the embedded synthetic dataset
of a training task and print where it went.

Runs in the user's shell process; writes only under OUT.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..shared.task import TASKS


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("out", metavar="OUT", type=Path, help="folder to write the dataset into (created if needed)")
    parser.add_argument("--num-images", type=int, default=24, help="number of images (default 24)")
    parser.add_argument(
        "--seed", type=int, default=0, help="random seed; the same seed writes the same bytes (default 0)"
    )
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="detect",
        help="the set to write, in Ultralytics' label format for that task: detect (default; polygon labels, "
        "boxes are their extents), segment (denser polygons), pose (figures, 5 keypoints), obb (rotated rectangles)",
    )


def run(args: argparse.Namespace) -> int:
    from ..server.synthetic import write_synthetic
    from ..shared.errors import ConfigError

    if args.num_images < 1:
        raise ConfigError(f"--num-images must be >= 1, got {args.num_images}")
    data = write_synthetic(args.out, num_images=args.num_images, seed=args.seed, task=args.task)
    named = "" if data.spec.is_default else f" ({data.task})"
    print(f"wrote {data.num_images} images to {data.images_dir}{named}")
    if data.coco_json is not None:
        print(f"COCO json:  {data.coco_json}")
    print(f"data.yaml:  {data.data_yaml}")
    return 0
