"""``tune()``: Ultralytics' Ray Tune search, every trial on one pixpool daemon (``pixpool[tune]``).

Runs in two kinds of process. The *driver* (the user's process, ``pixpool yolo tune``) starts
or reuses ONE daemon for the training split, starts Ray, and calls Ultralytics' own
``model.tune(use_ray=True)`` (``ultralytics/utils/tuner.py``, ``run_ray_tune``). Each *trial*
runs in a Ray worker process: Ultralytics' trainable calls ``model.train(**config)`` on the
model it got from Ray's object store, and that model is a ``PixpoolYOLO``, whose task map
names pixpool's trainer of the task (``trainer.TRAINERS``). So every trial attaches to the
driver's daemon as one more session, with its own augmentation hyper-parameters (its own
route over the one decoded snapshot) and its own ring, and the daemon's workers serve first the
trial handed the fewest samples so far (``server/daemon/scheduler.py``).

Why not ``YOLO(...).tune(use_ray=True, trainer=PixpoolDetectionTrainer)``: ``run_ray_tune``
passes its keyword arguments through ``get_cfg``, which refuses ``trainer`` as "not a valid
YOLO argument" (Ultralytics 8.4). ``PixpoolYOLO(...).tune(use_ray=True)`` works, but only
shares when a daemon already answers at ``PIXPOOL_SOCKET_DIR`` (else each trial starts its
own); ``tune()`` starts the one daemon first.

Ownership: the driver owns the daemon it started (stopped when ``tune()`` returns, raises or is
interrupted: the trainer's own ``_daemon`` context, used here on a trainer object that never
trains) and Ray (``ray.shutdown()`` in ``finally``; Ultralytics calls it too when the search
ends). A trial refused by the daemon (``--memory-budget``, ``--max-trainers``: a
``CapacityError`` naming the numbers) errors in Ray, which runs the other trials on;
``summary_lines`` names it with that message.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ultralytics import YOLO
from ultralytics.utils import DEFAULT_CFG_DICT, NUM_THREADS

from ...shared.errors import ConfigError, MissingExtraError
from . import hyp
from .trainer import SOCKET_DIR_ENV, TRAINERS

log = logging.getLogger(__name__)

# ``run_ray_tune``'s own arguments (the rest are training arguments, Ultralytics' ``default.yaml``).
SEARCH_KEYS = ("space", "grace_period", "gpu_per_trial", "iterations", "search_alg")
# What a trial's summary line shows of its result, where present (boxes; masks of segment, keypoints of pose).
_SHOWN = ("metrics/mAP50(B)", "metrics/mAP50-95(B)", "metrics/mAP50-95(M)", "metrics/mAP50-95(P)", "fitness")


class PixpoolYOLO(YOLO):
    """Ultralytics' ``YOLO`` whose ``train()`` uses pixpool's trainer of its task when none is given.

    ``PixpoolYOLO("yolo11n.yaml").train(data=...)`` is ``YOLO(...).train(trainer=PixpoolDetectionTrainer,
    data=...)``; the point is the calls that cannot pass ``trainer=``: each Ray Tune trial's
    ``model.train(**config)`` in Ultralytics' ``run_ray_tune``."""

    @property
    def task_map(self) -> dict:
        return {
            task: {**classes, "trainer": TRAINERS[task]} if task in TRAINERS else classes
            for task, classes in super().task_map.items()
        }


def _require_ray():
    try:
        import ray
        from ray import tune as ray_tune
    except ImportError as exc:
        raise MissingExtraError(
            f"pixpool yolo tune runs its trials under Ray Tune, which is not installed here ({exc}); "
            "install the extra: pip install 'pixpool[tune]'"
        ) from None
    return ray, ray_tune


def search_space(space: Mapping[str, Any] | None, ray_tune) -> dict | None:
    """Ultralytics' search space for Ray: a ``(low, high)`` or ``(low, high, gain)`` pair (the
    form of Ultralytics' own tuner, and all a command line can write) becomes
    ``tune.uniform(low, high)``; Ray's own domains and fixed values pass as they are. A key
    pixpool refuses (``hyp.UNSUPPORTED``: ``bgr``, ...) is a ConfigError naming it, before any trial."""
    if space is None:
        return None
    if not isinstance(space, Mapping) or not space:
        raise ConfigError(
            f"space={space!r} is not a search space; give a dict of key -> (low, high), e.g. "
            "space=\"{'lr0': (1e-5, 1e-2), 'mosaic': (0.0, 1.0)}\"",
            field="space",
        )
    out = {}
    for key, value in space.items():
        if key in hyp.UNSUPPORTED:
            _, why = hyp.UNSUPPORTED[key]
            raise ConfigError(
                f"space sweeps {key}, which pixpool refuses: {why}; remove {key} from space=", field="space"
            )
        if isinstance(value, (tuple, list)):
            if len(value) not in (2, 3) or not all(isinstance(v, (int, float)) for v in value):
                raise ConfigError(
                    f"space key {key}: {value!r} is not (low, high) or (low, high, gain) of numbers", field="space"
                )
            value = ray_tune.uniform(float(value[0]), float(value[1]))
        out[key] = value
    return out


def _check_search(search_alg: Any) -> None:
    """Ultralytics' default searcher, Optuna, is a package of its own: say so before Ray starts
    (Ultralytics' own check would try to pip-install it in every run)."""
    if isinstance(search_alg, str) and search_alg.strip().lower() == "optuna":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise ConfigError(
                "search_alg=optuna (Ultralytics' default searcher) needs the optuna package, which the tune extra "
                "installs: pip install 'pixpool[tune]' (or pip install optuna), "
                "or give search_alg=random (Ray's random search, nothing more to install)",
                field="search_alg",
            ) from None


def _absolute_data(args: dict) -> None:
    """Ray runs each trial in a working directory of its own: a relative data.yaml path is made absolute here."""
    data = args.get("data")
    if isinstance(data, (str, os.PathLike)) and Path(data).exists():
        args["data"] = str(Path(data).resolve())


def tune(
    *,
    model: str,
    socket_dir: str | None = None,
    workers: int | None = None,
    concurrent: int | None = None,
    timeout_s: float | None = None,
    dtype: str | None = None,
    use_ray: bool = True,
    **args: Any,
):
    """Ultralytics' ``model.tune(use_ray=True, **args)``, every trial on one pixpool daemon.

    ``args``: Ultralytics' training arguments (``data``, ``epochs``, ``imgsz``, ``batch``, ...)
    and ``run_ray_tune``'s (``space``, ``iterations``, ``search_alg``, ``grace_period``,
    ``gpu_per_trial``). pixpool's: ``socket_dir`` (a daemon already there is used, else one is
    started for the search and stopped after), ``workers`` (that daemon's workers), ``dtype``
    (its snapshot's; None: pixpool's default, ``uint8``, a quarter of float32's bytes, the same batches),
    ``concurrent`` (trials at once: Ray is given ``concurrent`` x Ultralytics' CPUs per trial;
    default: Ray's own count of this machine's CPUs), ``timeout_s``. Without ``space``,
    Ultralytics' default space, with ``bgr`` held at 0 (pixpool's route has no channel swap).
    Returns Ray's ``ResultGrid`` (``summary_lines`` prints it)."""
    if not use_ray:
        raise ConfigError(
            "use_ray=False is Ultralytics' own sequential tuner, which trains each iteration with its own "
            "trainer and loader; pixpool tunes under Ray Tune only: leave use_ray out (or use_ray=True)",
            field="use_ray",
        )
    ray, ray_tune = _require_ray()
    from .run import _environment, trainer_env

    search = {k: args.pop(k) for k in SEARCH_KEYS if k in args}
    search.setdefault("search_alg", "optuna")  # Ultralytics' default, said here to check it
    _check_search(search["search_alg"])
    space = search_space(search.pop("space", None), ray_tune)
    if space is None:
        log.warning("pixpool: no space= given: Ultralytics' default search space, with bgr held at 0")
        args.setdefault("bgr", 0.0)  # a trial's fixed arguments override its sampled ones (run_ray_tune)
    else:
        search["space"] = space
    if concurrent is not None and (not isinstance(concurrent, int) or concurrent < 1):
        raise ConfigError(
            f"concurrent={concurrent!r}: give a whole number of trials at once, e.g. 3", field="concurrent"
        )
    _absolute_data(args)
    searched = PixpoolYOLO(model, task=args.get("task"))  # Ultralytics decides the task, as for train
    task = searched.task
    hyp.check_supported({**DEFAULT_CFG_DICT, **args, "task": task})  # refused by name before anything starts
    args.setdefault("plots", False)
    if workers is not None:
        args["workers"] = workers
    env = trainer_env(socket_dir, workers, timeout_s, dtype)
    scratch = tempfile.mkdtemp(prefix="pixpool-tune-")
    try:
        with _environment(env):
            # A trainer object that never trains: Ultralytics resolves data= and its checks run
            # (hyp) on the fixed arguments, and its _daemon() starts or finds the one daemon.
            owner = TRAINERS[task](
                overrides={**args, "model": model, "task": task, "project": scratch, "name": "driver"}
            )
            with owner._daemon():
                trial_env = {k: v for k, v in os.environ.items() if k.startswith("PIXPOOL_")}
                trial_env[SOCKET_DIR_ENV] = str(owner.pixpool_socket_dir)
                cpus = None if concurrent is None else concurrent * NUM_THREADS
                ray.init(num_cpus=cpus, include_dashboard=False, runtime_env={"env_vars": trial_env})
                try:
                    results = searched.tune(use_ray=True, **search, **args)
                finally:
                    ray.shutdown()
            # The daemon stopped with the block: its log (in the driver's scratch folder) joins the search's.
            _keep_daemon_log(owner.pixpool_daemon_log, Path(str(results.experiment_path)))
            return results
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _keep_daemon_log(log_file: Path | None, folder: Path) -> None:
    """Move the log of the daemon the search started (None: it used a running one) into ``folder``."""
    if log_file is None or not log_file.is_file() or not folder.is_dir():
        return
    target = folder / log_file.name
    shutil.move(str(log_file), str(target))
    log.info("pixpool: the daemon's log is %s", target)


def _error_line(error: BaseException) -> str:
    """The trial's own exception line out of Ray's wrapped traceback (the last line naming an error)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line.split(":", 1)[0]]
    return (named or lines or [type(error).__name__])[-1]


def outcome(result) -> str:
    """``finished`` (it reported metrics), ``failed`` (it raised) or ``stopped`` (neither: the
    search was stopped, e.g. by Ctrl-C, which Ray Tune takes as "stop the experiment")."""
    if result.error is not None:
        return "failed"
    metrics = result.metrics or {}
    return "finished" if any(isinstance(metrics.get(key), float) for key in _SHOWN) else "stopped"


def summary_lines(results) -> list[str]:
    """One line per trial of Ray's ``ResultGrid``: its metrics, the error it ended with, or that it was stopped."""
    lines = []
    for k, result in enumerate(results):
        config = result.config or {}
        trial = Path(str(result.path)).name if result.path else f"trial {k}"
        if result.error is not None:
            lines.append(f"{trial}: failed: {_error_line(result.error)}")
            continue
        metrics = result.metrics or {}
        shown = ", ".join(f"{key} {metrics[key]:.4f}" for key in _SHOWN if isinstance(metrics.get(key), float))
        swept = ", ".join(
            f"{key}={value:.4g}"
            for key, value in config.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        )
        lines.append(f"{trial}: {shown or 'stopped before its first result'}" + (f" ({swept})" if swept else ""))
    return lines


def tune_command(pairs: list[str]) -> int:
    """``pixpool yolo tune KEY=VALUE ...`` (``cli/yolo.py``): parse the pairs as Ultralytics does,
    check the training keys, run the search, print one line per trial; exit 1 unless every trial finished."""
    from .run import _check_keys, command_overrides, explained

    overrides = command_overrides(pairs)
    own = {
        k: overrides.pop(k) for k in (*SEARCH_KEYS, "use_ray", "socket_dir", "concurrent", "dtype") if k in overrides
    }
    _check_keys(overrides)
    with explained(overrides):
        results = tune(**overrides, **own)
    for line in summary_lines(results):
        print(f"pixpool yolo tune: {line}", flush=True)
    counts = Counter(outcome(result) for result in results)
    print(
        f"pixpool yolo tune: {counts['finished']} of {len(results)} trials finished"
        + "".join(f", {counts[k]} {k}" for k in ("failed", "stopped") if counts[k])
        + f"; results in {results.experiment_path}",
        flush=True,
    )
    return 0 if counts["finished"] == len(results) else 1
