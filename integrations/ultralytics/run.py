"""``train()``: one Ultralytics training run with pixpool as its training stream.

Runs in the trainer's process. Sets the environment the trainer (and each DDP rank
Ultralytics spawns) reads, builds Ultralytics' ``YOLO(model)`` and calls its ``train`` with
the pixpool trainer of the model's task (``trainer.TRAINERS``: detect, segment, pose, obb);
the environment is restored afterwards.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...shared.errors import ConfigError
from . import hyp, require_ultralytics

# Ultralytics' model file suffix per task (yolo11n-seg.yaml), for the error that names one.
_SUFFIX = {"detect": "", "segment": "-seg", "pose": "-pose", "obb": "-obb"}


@contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is not None:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def train(
    *,
    model: str,
    socket_dir: str | None = None,
    workers: int | None = None,
    timeout_s: float | None = None,
    dtype: str | None = None,
    **args: Any,
):
    """Train ``model`` (an Ultralytics model yaml or checkpoint) with Ultralytics' ``args``.

    Uses the daemon at ``socket_dir`` (the default socket directory when None) if one
    answers, else starts one with ``workers`` workers for the run and stops it after.
    ``workers`` is also Ultralytics' own setting (its validation loader); ``dtype`` the started
    daemon's snapshot dtype (None: pixpool's default, ``uint8``; ``float32`` holds four times the
    bytes and gives the same batches). The task is the
    model's (``task=`` may name it, and must then agree). Returns Ultralytics' metrics
    (``DetMetrics``, ``SegmentMetrics``, ``PoseMetrics`` or ``OBBMetrics``)."""
    require_ultralytics("pixpool yolo train")
    from ultralytics import YOLO
    from ultralytics.utils import DEFAULT_CFG_DICT

    from .trainer import TRAINERS

    # The model's task as Ultralytics' own `yolo train` reads it: a yaml's head, a checkpoint's
    # saved args. ``guess_model_task`` on the file name instead warns "Unable to automatically
    # guess model task" for a plain name such as yolo11n.yaml.
    model_task = YOLO(model).task
    task = args.get("task") or model_task
    # Over Ultralytics' defaults, as its trainer will see them (time= beside its close_mosaic=10).
    hyp.check_supported({**DEFAULT_CFG_DICT, **args, "task": task})
    if task != model_task:
        raise ConfigError(
            f"task={task} but model={model} is a {model_task} model; give a {task} model "
            f"(e.g. model=yolo11n{_SUFFIX.get(task, '')}.yaml) or leave task= out",
            field="task",
            value=task,
        )
    if workers is not None:
        args["workers"] = workers
    with _environment(trainer_env(socket_dir, workers, timeout_s, dtype)):
        return YOLO(model, task=task).train(trainer=TRAINERS[task], **args)


def trainer_env(
    socket_dir: str | None, workers: int | None, timeout_s: float | None, dtype: str | None = None
) -> dict[str, str | None]:
    """The environment pixpool's trainers read (``trainer.py``): None leaves a variable as it is."""
    from .trainer import DTYPE_ENV, SOCKET_DIR_ENV, TIMEOUT_ENV, WORKERS_ENV

    return {
        SOCKET_DIR_ENV: None if socket_dir is None else str(socket_dir),
        WORKERS_ENV: None if workers is None else str(workers),
        TIMEOUT_ENV: None if timeout_s is None else str(timeout_s),
        DTYPE_ENV: None if dtype is None else str(dtype),
    }


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


def command_overrides(pairs: list[str]) -> dict:
    """The ``key=value`` pairs of a ``pixpool yolo`` command, parsed as Ultralytics parses them;
    ``model=`` is required (checked after the cv2 install, which every command needs)."""
    from ultralytics.cfg import smart_value

    from . import failures

    failures.check_cv2()
    overrides = parse_pairs(pairs, smart_value)
    if "model" not in overrides:
        raise ConfigError(
            "model= is missing; name an Ultralytics model, e.g. model=yolo11n.yaml (from scratch) or model=yolo11n.pt",
            field="model",
        )
    return overrides


@contextmanager
def explained(overrides: dict) -> Iterator[None]:
    """The mistakes a user makes become one line naming the key or file (``failures.explain``)."""
    from ultralytics.cfg import DEFAULT_CFG_DICT

    from . import failures

    try:
        yield
    except (SyntaxError, RuntimeError, ConnectionError, FileNotFoundError) as exc:
        shaped = failures.explain(exc, overrides=overrides, valid_keys=DEFAULT_CFG_DICT)
        if shaped is None:
            raise
        raise shaped from None


def train_command(pairs: list[str]) -> int:
    """``pixpool yolo train KEY=VALUE ...`` (``cli/yolo.py``): parse the pairs as Ultralytics does,
    check the keys, train, and print the one-line summary."""
    require_ultralytics("pixpool yolo train")
    overrides = command_overrides(pairs)
    overrides.setdefault("plots", False)
    socket_dir = overrides.pop("socket_dir", None)
    dtype = overrides.pop("dtype", None)
    _check_keys(overrides)
    with explained(overrides):
        metrics = train(
            socket_dir=None if socket_dir is None else str(socket_dir),
            dtype=None if dtype is None else str(dtype),
            **overrides,
        )
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
