"""``train()``: one Ultralytics training run with pixpool as its training stream.

Runs in the trainer's process. Sets the environment the trainer (and each DDP rank
Ultralytics spawns) reads, builds Ultralytics' ``YOLO(model)`` and calls its ``train`` with
the pixpool trainer of the model's task (``trainer.TRAINERS``: detect, segment, pose, obb);
the environment is restored afterwards.
"""

from __future__ import annotations

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
    **args: Any,
):
    """Train ``model`` (an Ultralytics model yaml or checkpoint) with Ultralytics' ``args``.

    Uses the daemon at ``socket_dir`` (the default socket directory when None) if one
    answers, else starts one with ``workers`` workers for the run and stops it after.
    ``workers`` is also Ultralytics' own setting (its validation loader). The task is the
    model's (``task=`` may name it, and must then agree). Returns Ultralytics' metrics
    (``DetMetrics``, ``SegmentMetrics``, ``PoseMetrics`` or ``OBBMetrics``)."""
    require_ultralytics("pixpool yolo train")
    from ultralytics import YOLO
    from ultralytics.nn.tasks import guess_model_task

    from .trainer import SOCKET_DIR_ENV, TIMEOUT_ENV, TRAINERS, WORKERS_ENV

    model_task = guess_model_task(model)
    task = args.get("task") or model_task
    hyp.check_supported({**args, "task": task})
    if task != model_task:
        raise ConfigError(
            f"task={task} but model={model} is a {model_task} model; give a {task} model "
            f"(e.g. model=yolo11n{_SUFFIX.get(task, '')}.yaml) or leave task= out",
            field="task",
            value=task,
        )
    if workers is not None:
        args["workers"] = workers
    env = {
        SOCKET_DIR_ENV: None if socket_dir is None else str(socket_dir),
        WORKERS_ENV: None if workers is None else str(workers),
        TIMEOUT_ENV: None if timeout_s is None else str(timeout_s),
    }
    with _environment(env):
        return YOLO(model, task=task).train(trainer=TRAINERS[task], **args)
