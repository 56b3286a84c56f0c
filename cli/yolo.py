"""``pixpool yolo train KEY=VALUE ...``: Ultralytics' command line, with pixpool as the data stream.

The model's task picks the trainer: detect, segment (``model=yolo11n-seg.yaml``), pose or
obb, each Ultralytics' own trainer and validator (``trainer.TRAINERS``).

Runs in the user's shell process. The arguments are Ultralytics' own ``key=value`` pairs
(``data=``, ``model=``, ``epochs=``, ``imgsz=``, ``batch=``, every hyper-parameter), parsed
as Ultralytics parses them, plus two of pixpool's: ``socket_dir=DIR`` (the daemon to use;
default: the default socket directory) and ``workers=N`` (the workers of the daemon this
command starts when none answers there; Ultralytics' validation loader gets it too).
``plots`` defaults to false (Ultralytics' plots download a font). Needs the
``pixpool[ultralytics]`` extra; without it the command says so. A mistyped key, a missing
data file or a weights download that cannot happen ends in one error line naming the key or
file (``integrations/ultralytics/failures.py``), and a refused run leaves no run folder behind.
The command's work is ``integrations/ultralytics/run.py``'s ``train_command``: every import of
Ultralytics stays in the integration.

``pixpool yolo tune KEY=VALUE ...``: Ultralytics' hyper-parameter search under Ray Tune
(``use_ray=True``, the only mode here), every trial a pixpool trainer attached to one daemon
with its own augmentation settings; ``space=``, ``iterations=``, ``search_alg=`` as Ultralytics
takes them, plus ``concurrent=N`` (trials at once). Needs ``pixpool[ultralytics,tune]``; the
work is ``integrations/ultralytics/tuning.py``'s ``tune_command``.
"""

from __future__ import annotations

import argparse

MODES = ("train", "tune")


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.description = (
        "Train an Ultralytics YOLO model (detect, segment, pose or obb: the model's task) with pixpool as its training "
        "stream; arguments are Ultralytics' key=value pairs "
        "plus socket_dir=DIR and workers=N (the daemon started when none answers at socket_dir). Needs pixpool[ultralytics]. "
        "`tune` runs Ultralytics' hyper-parameter search under Ray Tune (use_ray=True, the only mode), every trial on "
        "that one daemon with its own augmentation; space=, iterations=, search_alg= as Ultralytics takes them, "
        "concurrent=N trials at once. Needs pixpool[ultralytics,tune]."
    )
    parser.add_argument(
        "mode",
        choices=MODES,
        help="train, or tune: Ultralytics' search under Ray Tune (use_ray=True), all trials on one daemon, "
        "concurrent=N trials at once (needs pixpool[tune]); validation, prediction and export: Ultralytics' own `yolo`",
    )
    parser.add_argument(
        "pairs",
        nargs="*",
        metavar="KEY=VALUE",
        help="e.g. data=coco128.yaml model=yolo11n.yaml epochs=3 imgsz=640 batch=16 workers=4",
    )


def run(args: argparse.Namespace) -> int:
    if args.mode == "tune":
        from ..integrations.ultralytics import require_ultralytics

        require_ultralytics("pixpool yolo tune")
        from ..integrations.ultralytics.tuning import tune_command

        return tune_command(args.pairs)
    from ..integrations.ultralytics.run import train_command

    return train_command(args.pairs)
