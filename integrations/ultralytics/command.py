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
file (``failures.py``), and a refused run leaves no run folder behind.
"""

from __future__ import annotations

import argparse
import logging

from ...shared.errors import ConfigError

MODES = ("train",)


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.description = (
        "Train an Ultralytics YOLO model (detect, segment, pose or obb: the model's task) with pixpool as its training "
        "stream; arguments are Ultralytics' key=value pairs "
        "plus socket_dir=DIR and workers=N (the daemon started when none answers at socket_dir). Needs pixpool[ultralytics]."
    )
    parser.add_argument(
        "mode", choices=MODES, help="train (validation, prediction and export: Ultralytics' own `yolo` command)"
    )
    parser.add_argument(
        "pairs",
        nargs="*",
        metavar="KEY=VALUE",
        help="e.g. data=coco128.yaml model=yolo11n.yaml epochs=3 imgsz=640 batch=16 workers=4",
    )


def parse_pairs(pairs: list[str], value=lambda v: v) -> dict:
    """``["k=v", ...]`` -> ``{k: value(v)}``; ConfigError naming a pair without ``=`` or a key given twice."""
    out: dict = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise ConfigError(
                f"argument {pair!r} is not key=value (e.g. epochs=3); `pixpool yolo train` takes Ultralytics' key=value pairs",
                field=key or None,
            )
        if key in out:
            raise ConfigError(f"{key}= is given twice ({out[key]!r} and {raw!r}); give it once", field=key)
        out[key] = raw if key in ("name", "project") else value(raw)
    return out


def run(args: argparse.Namespace) -> int:
    from . import failures, require_ultralytics

    require_ultralytics("pixpool yolo train")
    failures.check_cv2()
    from ultralytics.cfg import DEFAULT_CFG_DICT, smart_value

    from .run import train

    overrides = parse_pairs(args.pairs, smart_value)
    if "model" not in overrides:
        raise ConfigError(
            "model= is missing; name an Ultralytics model, e.g. model=yolo11n.yaml (from scratch) or model=yolo11n.pt",
            field="model",
        )
    overrides.setdefault("plots", False)
    socket_dir = overrides.pop("socket_dir", None)
    _check_keys(overrides)
    try:
        metrics = train(socket_dir=None if socket_dir is None else str(socket_dir), **overrides)
    except (SyntaxError, RuntimeError, ConnectionError, FileNotFoundError) as exc:
        # The mistakes a user makes become one line naming the key or file (``failures.explain``).
        shaped = failures.explain(exc, overrides=overrides, valid_keys=DEFAULT_CFG_DICT)
        if shaped is None:
            raise
        raise shaped from None
    results = getattr(metrics, "results_dict", None) or {}
    shown = ", ".join(f"{k} {v:.4f}" for k, v in results.items() if isinstance(v, float))
    save_dir = getattr(metrics, "save_dir", None)
    print(f"pixpool yolo train: done; {shown}" + (f"; results in {save_dir}" if save_dir else ""), flush=True)
    return 0


def _check_keys(overrides: dict) -> None:
    """Ultralytics' own key check, before anything starts, without the help screen it logs
    first (its ``SyntaxError`` becomes one line: ``failures.explain``)."""
    from ultralytics.cfg import DEFAULT_CFG_DICT, check_dict_alignment
    from ultralytics.utils import LOGGER

    from . import failures

    level = LOGGER.level
    LOGGER.setLevel(logging.WARNING)
    try:
        check_dict_alignment(DEFAULT_CFG_DICT, dict(overrides))
    except SyntaxError as exc:
        raise failures.explain(exc, overrides=overrides, valid_keys=DEFAULT_CFG_DICT) from None
    finally:
        LOGGER.setLevel(level)
