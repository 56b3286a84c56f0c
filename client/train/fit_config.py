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
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...shared import schema
from ...shared.errors import ConfigError
from ...shared.schema import declare
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


def at_least(lo: float) -> schema.Field:
    """The rules of a number with a lowest value ``lo`` (and no highest)."""
    return schema.Field(lo=lo, closed=True)


def one_of(choices: tuple[str, ...]) -> dict[str, Any]:
    """``declare``'s ``rules`` for a word among ``choices``, and the choices ``--help`` shows."""
    return {"rules": schema.Field(choices=choices), "choices": choices}


@dataclass(frozen=True)
class FitConfig:
    """A training run: its own settings and its stream's (module docstring)."""

    epochs: int = declare(10, "the run's total epochs (--close-mosaic counts from its end)", at_least(1))
    scale: str = declare(
        "n", "detector scale: n (YOLOv8n), s, m, or tiny (CPU tests)", flag="--model", **one_of(DETECTOR_SCALES)
    )
    optimizer: str = declare("SGD", "SGD (momentum, Nesterov) or AdamW", **one_of(("SGD", "AdamW")))
    lr: float = declare(0.01, "initial learning rate", at_least(1e-12))
    warmup_epochs: float = declare(1.0, "linear LR warm-up, in epochs", at_least(0.0))
    schedule: str = declare("cosine", "LR decay after the warm-up, over all --epochs", **one_of(("cosine", "linear")))
    # -- run-only (saved and restored on resume, but a resume may change them: they shape what
    # the run measures and how fast, never the model it trains)
    validate: bool = declare(True, "validate each epoch on the daemon's val split", flag="--val", run_only=True)
    val_batch_size: int = declare(16, "images per validation batch", at_least(1), run_only=True)
    conf_thres: float = declare(
        0.001, "validation: lowest score a detection keeps before NMS", schema.Field(lo=0, hi=1, closed=True)
    )
    iou_thres: float = declare(0.7, "validation: NMS IoU threshold", schema.Field(lo=0, hi=1, closed=True))
    max_det: int = declare(300, "validation: most detections per image", at_least(1))
    # -- this invocation only (transient: not saved in the checkpoint, not compared on resume)
    project: str = declare(
        "runs/train",
        "run folder for results.jsonl, last.pt and best.pt; if it exists the run takes the next free name "
        "(runs/train2, runs/train3, ...); a resumed run writes into its checkpoint's folder",
        metavar="DIR",
        transient=True,
    )
    exist_ok: bool = declare(
        False, "write into --project even if it exists (its results.jsonl starts afresh)", transient=True
    )
    resume: str | None = declare(
        None,
        "continue the run of this checkpoint with every setting it saved, in its folder; a flag given that differs "
        "from the checkpoint is refused. Unchanged, the run continues exactly",
        metavar="LAST_PT",
        transient=True,
    )
    extend: bool = declare(
        False,
        "with --resume: train on to a larger --epochs. Not an exact continuation: the LR decay is recomputed over the "
        "new total from the next step on (the LR rises back to where an --epochs run would be) and --close-mosaic "
        "counts from the new end",
        transient=True,
    )
    device: str | None = declare(None, "torch device (default: cuda if available, else cpu)", transient=True)
    max_steps: int | None = declare(None, "stop after this many steps", at_least(1), transient=True)
    threads: int | None = declare(None, "torch CPU threads (default: torch's)", at_least(1), transient=True)
    follow_snapshot: bool = declare(
        False,
        "if the daemon serves another dataset than the run's (restarted, or on resume), go on with it "
        "(default: stop with SnapshotChangedError)",
        transient=True,
    )
    record_digests: bool = declare(
        False, "a sha256 over each epoch's batch digests in results.jsonl (a hash per batch)", transient=True
    )
    log_every: int = declare(10, "read the loss from the device every N steps", at_least(1), transient=True)
    progress: bool = declare(True, "show a progress bar", transient=True)
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
            try:
                check_value(f.name, kind, value)  # the kind's type, and a stream setting's bounds of its name
            except ConfigError as exc:
                raise ConfigError(f"FitConfig {exc} ({flag_of_path(f.name)})", field=f.name, value=value) from None
            broken = schema.check(value, f.metadata.get("rules", _ANY))
            if broken is not None:
                raise _refused(f.name, value, _problem(broken))


_ANY = schema.Field()


def _refused(name: str, value: object, problem: str) -> ConfigError:
    return ConfigError(
        f"FitConfig field {name!r} ({flag_of_path(name)}) = {value!r} {problem}", field=name, value=value
    )


def _problem(broken: schema.Violation) -> str:
    """What a FitConfig refusal says of a value that broke its declared ``rules``."""
    spec = broken.field
    if broken.rule == "choice":
        return f"is not one of {list(spec.choices or ())}"
    if spec.hi == math.inf:
        return f"is below {spec.lo}"
    return f"is out of range; use {spec.lo} to {spec.hi}"


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
