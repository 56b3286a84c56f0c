"""``FitConfig``: what a training run is, declared once; ``pixpool train``'s flags are generated from it.

Runs in the trainer process (``pixpool train``, ``fit``, the demo's trainers) and imports
neither torch nor the producer, so the CLI builds it before torch loads.

A run is its own fields (epochs, model scale, optimizer, schedule, validation) and one
``StreamSettings`` (seed, batch size, HSV placement, augmentation): those are saved in the
checkpoint and restored on resume. Fields marked ``transient`` belong to one invocation
(where the run folder is, the device, a step limit, progress output) and are neither saved
nor compared on resume. Fields marked ``run_only`` (``--val``, ``--val-batch-size``) are
saved and restored, but a resume may give them another value: they never change the model
the run trains (``run_only_settings``). Each field carries its help text, and its flag where that is not
``--field-name`` (``scale`` is ``--model``, ``validate`` is ``--val``), as the config
dataclasses in ``shared/stream/config.py`` do.

``fit`` sets four stream fields itself: ``drop_last`` (every batch fills the static step),
``start_epoch`` (the checkpoint's next epoch), ``split`` (train) and ``augment.epochs``
(= ``epochs``, so ``close_mosaic`` counts from the run's end). ``rank``/``world_size`` left
at 0/1 are taken from torch.distributed or ``RANK``/``WORLD_SIZE`` (``loader.distributed_rank``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...shared.errors import ConfigError
from ...shared.stream.config import AugmentConfig, StreamSettings, check_value, field_kind

__all__ = [
    "DETECTOR_SCALES",
    "FIT_SET_FIELDS",
    "FitConfig",
    "explicit_settings",
    "flag_of_path",
    "flat_settings",
    "from_flat",
    "run_only_settings",
]

# The reference detector's scales (``client/train/detect/model.py`` ``SCALES``, which imports torch;
# a unit test keeps the two equal).
DETECTOR_SCALES = ("n", "s", "m", "tiny")
# Stream fields ``fit`` sets itself (module docstring): never flags, never compared on resume.
FIT_SET_FIELDS = ("stream.drop_last", "stream.start_epoch", "stream.split", "stream.augment.epochs")


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class FitConfig:
    """A training run: its own settings and its stream's (module docstring)."""

    epochs: int = _opt(10, "the run's total epochs (--close-mosaic counts from its end)")
    scale: str = _opt(
        "n", "detector scale: n (YOLOv8n), s, m, or tiny (CPU tests)", flag="--model", choices=DETECTOR_SCALES
    )
    optimizer: str = _opt("SGD", "SGD (momentum, Nesterov) or AdamW", choices=("SGD", "AdamW"))
    lr: float = _opt(0.01, "initial learning rate")
    warmup_epochs: float = _opt(1.0, "linear LR warm-up, in epochs")
    schedule: str = _opt("cosine", "LR decay after the warm-up, over all --epochs", choices=("cosine", "linear"))
    # -- run-only (saved and restored on resume, but a resume may change them: they shape what
    # the run measures and how fast, never the model it trains)
    validate: bool = _opt(True, "validate each epoch on the daemon's val split", flag="--val", run_only=True)
    val_batch_size: int = _opt(16, "images per validation batch", run_only=True)
    conf_thres: float = _opt(0.001, "validation: lowest score a detection keeps before NMS")
    iou_thres: float = _opt(0.7, "validation: NMS IoU threshold")
    max_det: int = _opt(300, "validation: most detections per image")
    # -- this invocation only (transient: not saved in the checkpoint, not compared on resume)
    project: str = _opt(
        "runs/train",
        "run folder for results.jsonl, last.pt and best.pt; if it exists the run takes the next free name "
        "(runs/train2, runs/train3, ...); a resumed run writes into its checkpoint's folder",
        metavar="DIR",
        transient=True,
    )
    exist_ok: bool = _opt(
        False, "write into --project even if it exists (its results.jsonl starts afresh)", transient=True
    )
    resume: str | None = _opt(
        None,
        "continue the run of this checkpoint with every setting it saved, in its folder; a flag given that differs "
        "from the checkpoint is refused. Unchanged, the run continues exactly",
        metavar="LAST_PT",
        transient=True,
    )
    extend: bool = _opt(
        False,
        "with --resume: train on to a larger --epochs. Not an exact continuation: the LR decay is recomputed over the "
        "new total from the next step on (the LR rises back to where an --epochs run would be) and --close-mosaic "
        "counts from the new end",
        transient=True,
    )
    device: str | None = _opt(None, "torch device (default: cuda if available, else cpu)", transient=True)
    max_steps: int | None = _opt(None, "stop after this many steps", transient=True)
    threads: int | None = _opt(None, "torch CPU threads (default: torch's)", transient=True)
    follow_snapshot: bool = _opt(
        False,
        "if the daemon serves another dataset than the run's (restarted, or on resume), go on with it "
        "(default: stop with SnapshotChangedError)",
        transient=True,
    )
    record_digests: bool = _opt(
        False, "a sha256 over each epoch's batch digests in results.jsonl (a hash per batch)", transient=True
    )
    log_every: int = _opt(10, "read the loss from the device every N steps", transient=True)
    progress: bool = _opt(True, "show a progress bar", transient=True)
    stream: StreamSettings = field(default_factory=StreamSettings)

    def __post_init__(self) -> None:
        if not isinstance(self.stream, StreamSettings):
            raise ConfigError(
                f"FitConfig field 'stream' must be a StreamSettings, got {type(self.stream).__name__}", field="stream"
            )
        for f in dataclasses.fields(self):
            if f.name == "stream":
                continue
            kind, optional = field_kind(f)
            value = getattr(self, f.name)
            if optional and value is None:
                continue
            flag = flag_of_path(f.name)
            try:
                check_value(f.name, kind, value)
            except ConfigError as exc:
                raise ConfigError(f"FitConfig {exc} ({flag})", field=f.name, value=value) from None
            choices = f.metadata.get("choices")
            if choices is not None and value not in choices:
                raise _refused(f.name, value, f"is not one of {list(choices)}")
            low = _MINIMA.get(f.name)
            if low is not None and value < low:
                raise _refused(f.name, value, f"is below {low}")
        for name in ("conf_thres", "iou_thres"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise _refused(name, getattr(self, name), "is out of range; use 0 to 1")


# Lowest values of FitConfig's numbers (its types are checked by ``check_value``).
_MINIMA = {
    "epochs": 1,
    "lr": 1e-12,
    "warmup_epochs": 0.0,
    "val_batch_size": 1,
    "max_det": 1,
    "max_steps": 1,
    "threads": 1,
    "log_every": 1,
}


def _refused(name: str, value: object, problem: str) -> ConfigError:
    return ConfigError(
        f"FitConfig field {name!r} ({flag_of_path(name)}) = {value!r} {problem}", field=name, value=value
    )


# -- settings by path: "epochs", "stream.seed", "stream.augment.mosaic" --------------------
_CLASSES = ((FitConfig, ""), (StreamSettings, "stream."), (AugmentConfig, "stream.augment."))


def _walk(config: FitConfig) -> Iterator[tuple[str, dataclasses.Field, Any]]:
    objects = {FitConfig: config, StreamSettings: config.stream, AugmentConfig: config.stream.augment}
    for cls, prefix in _CLASSES:
        for f in dataclasses.fields(cls):
            if (cls, f.name) in ((FitConfig, "stream"), (StreamSettings, "augment")):
                continue
            yield prefix + f.name, f, getattr(objects[cls], f.name)


def flat_settings(config: FitConfig, *, transient: bool = False) -> dict[str, Any]:
    """path -> value of every setting of the run (and of the invocation with ``transient``),
    less the stream fields ``fit`` sets itself."""
    return {
        path: value
        for path, f, value in _walk(config)
        if path not in FIT_SET_FIELDS and (transient or not f.metadata.get("transient"))
    }


def run_only_settings() -> frozenset[str]:
    """The setting paths a resume may change (module docstring); every other saved one must match."""
    return frozenset(path for path, f, _ in _walk(FitConfig()) if f.metadata.get("run_only"))


def explicit_settings(config: FitConfig) -> set[str]:
    """The paths of the settings that differ from their defaults (what a Python caller set)."""
    default = flat_settings(FitConfig(), transient=True)
    return {path for path, value in flat_settings(config, transient=True).items() if value != default[path]}


def from_flat(values: dict[str, Any]) -> FitConfig:
    """A FitConfig from ``flat_settings``-style values (missing ones at their defaults)."""
    own = {k: v for k, v in values.items() if "." not in k}
    stream = {k[len("stream.") :]: v for k, v in values.items() if k.startswith("stream.") and k.count(".") == 1}
    aug = {k[len("stream.augment.") :]: v for k, v in values.items() if k.startswith("stream.augment.")}
    return FitConfig(**own, stream=StreamSettings.from_dict({**stream, "augment": AugmentConfig.from_dict(aug)}))


def flag_of_path(path: str) -> str:
    """The ``pixpool train`` flag of a setting path (``stream.augment.scale`` -> ``--scale``)."""
    name = path.rsplit(".", 1)[-1]
    for cls, prefix in _CLASSES:
        if path == prefix + name:
            for f in dataclasses.fields(cls):
                if f.name == name:
                    return f.metadata.get("flag") or "--" + name.replace("_", "-")
    return "--" + name.replace("_", "-")
