"""Configuration, one frozen dataclass per process role, validated once where it is made.

Code both sides import.

- ``AugmentConfig``: the YOLO training route's settings.
- ``StreamSettings``: one trainer's stream (seed, batch, shard, augmentation); travels as a
  plain dict (msgpack) from trainer to daemon, where ``from_dict`` validates it again.
- ``DaemonConfig``: everything ``pixpool serve`` (or ``run_daemon``) needs.
- ``PrepareOptions``: the part of it a preparation needs (``DaemonConfig.prepare_options``).

Each field's help text and, where it differs from ``--field-name``, its flag live in the
field's metadata: the command lines are generated from the fields (``shared/stream/flags.py``),
so every setting is reachable from the CLI with its default in ``--help``. Its rules (a range,
a step, choices) are declared beside it too (``_opt(..., lo=, hi=)``, a ``shared.schema.Field``)
and checked by ``shared.schema``; a bad value raises ``ConfigError`` naming the field.

A ``DaemonConfig`` field marked ``changes_bytes`` decides what a daemon serves: the bytes of
its batches, or whether it serves a dataset at all (a bound that refuses it). ``pixpool
digest`` generates a flag for each (``changes_bytes``), so that parity can be checked on
every dataset a daemon can serve.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from .. import schema
from ..errors import ConfigError
from ..task import SPECS, TASKS, TaskSpec, task_spec
from ..transport.names import DEFAULT_STORE
from ..transport.store import Store
from .route import Route

FILL_VALUE = 114.0
# The datasets a daemon serves: its training set and, when it has one, a validation set.
SPLITS = ("train", "val")
# Instances one image may have: every ring slot is sized for the densest image.
DEFAULT_MAX_INSTANCES = 1000
# Classes a dataset may have (``--max-classes``). Every ``attached`` and ``records`` reply
# carries the class names, and an images folder read without names gets "0".."K" for its
# largest class id K, so one stray id (a pixel coordinate, a track id) made a million names.
# 20,000 admits every public detection vocabulary (LVIS 1,203; V3Det 13,204) with room.
DEFAULT_MAX_CLASSES = 20_000
# The most --max-classes may be: the names "0".."N-1" of an images folder at this N fit
# ``wire.trainer.MAX_NAMES_BYTES`` (806 KB packed; ``tests/unit/test_label_bounds.py`` checks).
MAX_CLASSES = 1 << 17
# Pixel types a snapshot's image arena may hold. float32: the pixel minus the fill, converted
# and centred once at preparation (the engineering log's snapshot). uint8: the pixel itself, a
# quarter of the bytes; the route converts each value it reads to the same float32 (pixel -
# fill is exact in float32), so the batches are byte-identical.
SNAPSHOT_DTYPES = ("float32", "uint8")
# The one default of every command and API that prepares or serves a snapshot: uint8 holds a
# quarter of float32's bytes, gives the same batches and is read faster (the route's reads are
# memory-bound). float32 stays one flag away (--dtype float32).
DEFAULT_SNAPSHOT_DTYPE = "uint8"
# Where copy-paste takes its pasted instances from: the sample's own mirror, or a random partner.
COPY_PASTE_MODES = ("flip", "mixup")


def _opt(
    default: Any,
    help: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    multiple_of: int | None = None,
    **extra: Any,
) -> Any:
    """A dataclass field with its command-line help (and flag name, positional, choices) as
    metadata, and its rules as a ``schema.Field`` under ``rules``: the closed range ``lo`` to
    ``hi``, a step (``multiple_of``) and the ``choices`` (which ``flags.py`` shows too)."""
    choices = extra.get("choices")
    bounds = {"lo": lo, "hi": hi, "multiple_of": multiple_of, "choices": None if choices is None else tuple(choices)}
    declared = {k: v for k, v in bounds.items() if v is not None}
    if declared:
        extra["rules"] = schema.Field(closed=True, **declared)
    return field(default=default, metadata={"help": help, **extra})


def changes_bytes(cls: type) -> tuple[str, ...]:
    """The fields of ``cls`` marked ``changes_bytes`` (module docstring), in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("changes_bytes"))


# The AugmentConfig defaults that are not Ultralytics' (its cfg/default.yaml): field ->
# (Ultralytics' default, why). Every other default is Ultralytics'; ``--help`` says so and
# names these (``flags.defaults_note``). A default is part of every default stream's digests,
# so these stay and are explained rather than changed.
NOT_ULTRALYTICS_DEFAULTS: dict[str, tuple[Any, str]] = {
    "imgsz": (640, "the daemon's size, so a trainer takes what is served"),
    "close_mosaic": (
        10,
        "it counts back from the run's last epoch, which a bare stream (attach(), digest) does not know, and "
        "pixpool train keeps the stream's default; give 10 for Ultralytics' closing",
    ),
    "epochs": (100, "the run's length, set by the run (pixpool train --epochs), 0 for a bare stream"),
}


@dataclass(frozen=True)
class AugmentConfig:
    """The YOLO training route's settings. The defaults are Ultralytics' but for those in
    ``NOT_ULTRALYTICS_DEFAULTS``, which says why."""

    # None: the daemon's imgsz, which it resolves at attach (``StreamSettings.for_imgsz``). A multiple
    # of 32: the detector's largest stride divides imgsz, both where a daemon prepares its snapshot
    # and where a trainer sizes its model.
    imgsz: int | None = _opt(
        None,
        "training image size in pixels (square, a multiple of 32); none: the daemon's",
        lo=32,
        hi=8192,
        multiple_of=32,
    )
    mosaic: float = _opt(1.0, "probability of a 4-image mosaic", lo=0.0, hi=1.0)
    degrees: float = _opt(0.0, "rotation range, +/- degrees", lo=0.0, hi=180.0)
    translate: float = _opt(0.1, "translation range, fraction of imgsz", lo=0.0, hi=0.9)
    scale: float = _opt(0.5, "scale range, +/- fraction", lo=0.0, hi=0.95)
    shear: float = _opt(0.0, "shear range, +/- degrees", lo=0.0, hi=90.0)
    perspective: float = _opt(0.0, "perspective range", lo=0.0, hi=0.001)
    copy_paste: float = _opt(0.0, "fraction of instances copy-pasted (mirrored)", lo=0.0, hi=1.0)
    mixup: float = _opt(0.0, "probability of mixup with a random partner", lo=0.0, hi=1.0)
    cutmix: float = _opt(0.0, "probability of cutmix: a random partner's rectangle pasted in", lo=0.0, hi=1.0)
    copy_paste_mode: str = _opt(
        "flip",
        "where copy-paste takes instances from: flip (the mirrored sample) or mixup (a random partner)",
        choices=COPY_PASTE_MODES,
    )
    fliplr: float = _opt(0.5, "probability of a left-right flip", lo=0.0, hi=1.0)
    flipud: float = _opt(0.0, "probability of an up-down flip", lo=0.0, hi=1.0)
    hsv_h: float = _opt(0.015, "hue gain range", lo=0.0, hi=0.5)
    hsv_s: float = _opt(0.7, "saturation gain range", lo=0.0, hi=1.0)
    hsv_v: float = _opt(0.4, "value gain range", lo=0.0, hi=1.0)
    # The last `close_mosaic` epochs of `epochs` run without mosaic, copy-paste and mixup.
    close_mosaic: int = _opt(
        0, "the last N epochs of --epochs run without mosaic, copy-paste and mixup", lo=0, hi=1 << 30
    )
    epochs: int = _opt(0, "epochs of the whole run (for --close-mosaic)", lo=0, hi=1 << 30)
    # Segment task only: masks are rendered at imgsz / mask_ratio, all instances of an image in
    # one plane (overlap_mask, Ultralytics' default) or one plane per instance.
    mask_ratio: int = _opt(4, "segment: masks at imgsz / mask_ratio", lo=1, hi=32)
    overlap_mask: bool = _opt(True, "segment: one mask plane per image, instances numbered 1..n by area")
    # The route (``route``) is spelt by these two: train_route False is a validation route, and
    # rect_stride > 0 makes it the rect one. Kept as two fields: the flags, attach and the wire name them.
    train_route: bool = _opt(True, "false: the validation route (letterbox only, no randomness)")
    # Validation route only: Ultralytics' rectangular validation batches (``shared/stream/rect_plan.py``)
    # for a model of this stride (Ultralytics uses max(model stride, 32)); 0: the imgsz square.
    rect_stride: int = _opt(
        0,
        "validation route only: Ultralytics' rect batches (sorted by aspect ratio, shapes padded by half "
        "this model stride); 0: every image letterboxed on the imgsz square",
        lo=0,
        hi=1024,
    )

    def __post_init__(self) -> None:
        _validate(self)
        Route.of(self.train_route, self.rect_stride)  # refuses a rect stride on the training route

    @property
    def route(self) -> Route:
        """The route this stream's samples take (``route.py``), from ``train_route`` and ``rect_stride``."""
        return Route.of(self.train_route, self.rect_stride)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AugmentConfig":
        return _from_dict(cls, data)

    def mosaic_closed(self, epoch: int) -> bool:
        """True in the last ``close_mosaic`` epochs (mosaic, copy-paste, mixup off)."""
        return self.close_mosaic > 0 and epoch >= self.epochs - self.close_mosaic


@dataclass(frozen=True)
class StreamSettings:
    """One trainer's stream: which samples, in which order, with which augmentation."""

    seed: int = _opt(0, "seed of the stream (order and augmentation)", lo=0, hi=(1 << 63) - 1)
    batch_size: int = _opt(16, "images per batch", lo=1, hi=4096)
    rank: int = _opt(0, "this trainer's shard (DDP rank)", lo=0, hi=1 << 20)
    world_size: int = _opt(1, "number of shards (DDP world size)", lo=1, hi=1 << 20)
    shuffle: bool = _opt(True, "false keeps dataset order")
    drop_last: bool = _opt(False, "drop the last, short batch (and the shard's uneven tail)")
    start_epoch: int = _opt(0, "first epoch of the stream", lo=0, hi=1 << 30)
    hsv_on_device: bool = _opt(False, "leave HSV to the trainer's device instead of the workers")
    split: str = _opt("train", "which of the daemon's datasets: train, or val (its validation split)")
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        _validate(self)
        if self.split not in SPLITS:
            raise ConfigError.for_field("split", self.split, f"is not a split; use one of {list(SPLITS)}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError.for_field(
                "rank", self.rank, f"is outside world_size {self.world_size}; use 0 <= {{rank}} < {{world_size}}"
            )
        if self.augment.route is Route.RECT_VAL and self.shuffle:
            raise ConfigError.for_field(
                "shuffle",
                self.shuffle,
                "cannot reorder rect validation batches (rect_stride): their order is by aspect ratio; use shuffle=False",
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def for_imgsz(self, imgsz: int) -> "StreamSettings":
        """These settings at the daemon's (the snapshot's) ``imgsz``: ``augment.imgsz`` None takes
        it, the same value keeps these settings (the same object), another value is a ConfigError
        naming ``imgsz`` and both values. The one place a trainer's imgsz meets the daemon's: the
        daemon at attach, the client with the ``attached`` reply, and wherever a stream is
        rendered in-process."""
        asked = self.augment.imgsz
        if asked is None:
            return dataclasses.replace(self, augment=dataclasses.replace(self.augment, imgsz=int(imgsz)))
        if asked != imgsz:
            raise ConfigError(
                f"the trainer asks for imgsz {asked} but the daemon serves imgsz {imgsz} (its snapshot is prepared "
                f"for it); leave imgsz unset to train at the daemon's, or serve the data with --imgsz {asked}",
                field="imgsz",
                value=asked,
            )
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StreamSettings":
        if not isinstance(data, dict):
            raise ConfigError(f"stream settings must be a mapping, got {type(data).__name__}")
        data = dict(data)
        aug = data.pop("augment", {})
        if isinstance(aug, dict):
            aug = AugmentConfig.from_dict(aug)
        elif not isinstance(aug, AugmentConfig):
            raise ConfigError(f"field 'augment' must be a mapping, got {type(aug).__name__}")
        return _from_dict(cls, {**data, "augment": aug})


class _StoreAndTask:
    """``segment_store`` and ``spec`` of a settings class with ``store`` and ``task`` fields."""

    store: str
    task: str

    @property
    def segment_store(self) -> Store:
        """``store`` as the ``Store`` every function that opens a segment takes."""
        return Store.of(self.store)

    @property
    def spec(self) -> TaskSpec:
        """``task`` as its ``TaskSpec`` (the name was checked when these settings were made)."""
        return SPECS[self.task]


@dataclass(frozen=True)
class DaemonConfig(_StoreAndTask):
    """What the producer daemon serves and how (``pixpool serve``, ``run_daemon``).

    Field checks run here; ``pixpool.server.preflight`` checks what needs the file
    system (socket directory, keys, address) before any image is decoded.
    """

    # changes_bytes: what is served (module docstring; every one is a `pixpool digest` flag).
    data: str = _opt(
        "", "COCO json, YOLO data.yaml, or YOLO images folder", positional=True, metavar="DATA", changes_bytes=True
    )
    images: str | None = _opt(
        None, "image folder for a COCO json (default: beside the json)", metavar="DIR", changes_bytes=True
    )
    val: str | None = _opt(
        None,
        "validation set to serve too (COCO json or YOLO images folder); a data.yaml's own val: is served without it",
        metavar="DATA",
        changes_bytes=True,
    )
    val_images: str | None = _opt(
        None, "image folder for a COCO json given as --val", metavar="DIR", changes_bytes=True
    )
    no_val: bool = _opt(False, "serve no validation set, not even a data.yaml's val:", changes_bytes=True)
    imgsz: int = _opt(
        640,
        "training image size in pixels (a multiple of 32): the snapshot is prepared for it (long side = imgsz) "
        "and a trainer that names no imgsz trains at it",
        changes_bytes=True,
        lo=32,
        hi=8192,
        multiple_of=32,
    )
    task: str = _opt(
        "detect",
        "what the snapshot holds and the stream carries beside boxes: detect, segment (polygons -> masks), "
        "pose (keypoints; the data.yaml's kpt_shape) or obb (oriented boxes)",
        choices=TASKS,
        refine=task_spec,
        changes_bytes=True,
    )
    processes: int = _opt(2, "decoder processes when preparing", lo=1, hi=256)
    dtype: str = _opt(
        DEFAULT_SNAPSHOT_DTYPE,
        "pixel type of the snapshot: uint8 (a quarter of float32's bytes, the same batches, read faster) "
        "or float32 (the pixel minus the fill, centred once at preparation: the engineering log's layout, "
        "kept to check byte parity against)",
        choices=SNAPSHOT_DTYPES,
        changes_bytes=True,  # the snapshot's bytes; the batches are the same, which digest --in-process shows
    )
    max_instances_per_image: int = _opt(
        DEFAULT_MAX_INSTANCES,
        "refuse a dataset with an image of more instances than this (ring slots are sized for the densest image)",
        lo=1,
        hi=1 << 20,
        changes_bytes=True,  # a bound: under it the dataset is refused, not served
    )
    allow_unlabelled: bool = _opt(
        False, "accept a YOLO dataset where no image has a label file (all background)", changes_bytes=True
    )
    max_classes: int = _opt(
        DEFAULT_MAX_CLASSES,
        "refuse a dataset of more classes than this: a class id >= this in an images folder (read without names), "
        "more names in a data.yaml or categories in a COCO json (every attach carries the class names)",
        lo=1,
        hi=MAX_CLASSES,
        changes_bytes=True,  # a bound: over it the dataset is refused, not served
    )
    prepare_wait_s: float = _opt(
        600.0, "wait this long for another process preparing the same snapshot, then attach it", lo=0.0, hi=1e9
    )
    workers: int = _opt(2, "augmentation worker processes", lo=1, hi=256)
    store: str = _opt(
        DEFAULT_STORE,
        "directory the snapshot and the batch rings live in, as files mapped with mmap: a tmpfs (RAM), or a folder on a "
        "local disk for a dataset larger than memory (the page cache shares one copy)",
        metavar="DIR",
    )
    socket_dir: str | None = _opt(
        None,
        "ipc socket directory, mode 0700 (default $XDG_RUNTIME_DIR/pixpool, else <tmp>/pixpool-<uid>, "
        "or ~/.pixpool/run-<host> where another user made that first)",
        metavar="DIR",
    )
    tcp: str | None = _opt(None, "also serve remote trainers over TCP (requires --keys)", metavar="HOST:PORT")
    keys_dir: str | None = _opt(None, "CURVE key directory made by `pixpool keys DIR`", flag="--keys", metavar="DIR")
    keep_snapshot: bool = _opt(False, "leave the snapshot in the store on exit")
    heartbeat_timeout_s: float = _opt(10.0, "detach a trainer silent this long", lo=1e-3, hi=1e9)
    job_timeout_s: float = _opt(
        300.0,
        "kill a worker stuck this long in one part of a batch (only that part's samples are re-run)",
        lo=1e-3,
        hi=1e9,
    )
    straggler_factor: float = _opt(
        8.0,
        "a batch part running this many times the median measured part time is also given to an idle worker (first result wins)",
        lo=1.0,
        hi=1e6,
    )
    straggler_min_s: float = _opt(
        5.0, "never re-dispatch a batch part that has run less than this many seconds", lo=1e-3, hi=1e9
    )
    max_ring_nbytes: int = _opt(2 << 30, "largest batch ring one trainer may ask for, in bytes", lo=1, hi=1 << 50)
    max_total_ring_nbytes: int | None = _opt(
        None,
        "all trainers' rings together, in bytes (default: half of the store's free space at start)",
        lo=1,
        hi=1 << 50,
    )
    max_trainers: int = _opt(64, "trainers attached at once", lo=1, hi=1 << 16)
    max_trainers_per_client: int = _opt(
        32,
        "trainers one client may have attached at once: a CURVE key over TCP, "
        "a uid over ipc (so one client cannot take every session from the others)",
        lo=1,
        hi=1 << 16,
    )
    memory_budget_nbytes: int | None = _opt(
        None,
        "most bytes the snapshot and all rings together may take in the store; a preparation or a new "
        "trainer's ring past it is refused (e.g. 8G)",
        flag="--memory-budget",
        size=True,
        metavar="SIZE",
        lo=1,
        hi=1 << 60,
    )
    store_warn_free_nbytes: int | None = _opt(
        None,
        "warn when the store has less free than this (default: a tenth of its size)",
        flag="--store-warn-free",
        size=True,
        metavar="SIZE",
        lo=0,
        hi=1 << 60,
    )
    metrics_port: int | None = _opt(
        None, "serve Prometheus metrics over HTTP on this port (off by default)", metavar="PORT", lo=1, hi=65535
    )
    metrics_host: str = _opt(
        "127.0.0.1", "address of the metrics endpoint (0.0.0.0 to let a scraper on another host in)"
    )

    def __post_init__(self) -> None:
        _validate(self)
        if not self.store:
            raise ConfigError.for_field("store", self.store, "is empty; name a directory such as /dev/shm")
        if not self.data:
            raise ConfigError.for_field(
                "data", self.data, "is empty; name a COCO json, a YOLO data.yaml or a YOLO images folder"
            )
        if self.tcp is not None and self.keys_dir is None:
            raise ConfigError.for_field(
                "tcp", self.tcp, "requires CURVE keys: make them with `pixpool keys DIR` and set {keys_dir}"
            )

    def prepare_options(self, **overrides: Any) -> "PrepareOptions":
        """The settings of this daemon's preparation (``prepare_snapshot``): the same fields,
        already validated here; ``overrides`` replace some (``keep_snapshot=True``)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(PrepareOptions)}
        return PrepareOptions(**{**values, **overrides})


def _as_in(cls: type, name: str) -> Any:
    """A field declared as ``cls``'s field ``name`` is: the same default, help and flag."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return field(default=f.default, metadata=f.metadata)


@dataclass(frozen=True)
class PrepareOptions(_StoreAndTask):
    """How a dataset is read and decoded into a snapshot (``prepare_snapshot``, ``pixpool prepare``).

    Each field is the ``DaemonConfig`` field of the same name (``DaemonConfig.prepare_options``
    makes one), declared there once. ``keep_snapshot``: the snapshot stays in the store until
    ``pixpool clean`` (no process removes it on exit); ``pixpool prepare`` sets it.
    """

    imgsz: int = _as_in(DaemonConfig, "imgsz")
    task: str = _as_in(DaemonConfig, "task")
    dtype: str = _as_in(DaemonConfig, "dtype")
    processes: int = _as_in(DaemonConfig, "processes")
    store: str = _as_in(DaemonConfig, "store")
    max_instances_per_image: int = _as_in(DaemonConfig, "max_instances_per_image")
    allow_unlabelled: bool = _as_in(DaemonConfig, "allow_unlabelled")
    max_classes: int = _as_in(DaemonConfig, "max_classes")
    memory_budget_nbytes: int | None = _as_in(DaemonConfig, "memory_budget_nbytes")
    prepare_wait_s: float = _as_in(DaemonConfig, "prepare_wait_s")
    keep_snapshot: bool = _as_in(DaemonConfig, "keep_snapshot")

    def __post_init__(self) -> None:
        _validate(self)
        if not self.store:
            raise ConfigError.for_field("store", self.store, "is empty; name a directory such as /dev/shm")


def field_kind(f: dataclasses.Field) -> tuple[str, bool]:
    """(base type name, optional) of a field: ``int | None`` -> ("int", True)."""
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    optional = text.endswith(" | None")
    return (text[: -len(" | None")] if optional else text), optional


def check_task(task: Any) -> str:
    """``task`` if it is one of ``TASKS``; otherwise ``task_spec``'s ConfigError."""
    return task_spec(task).name


def check_value(name: str, kind: str, value: Any) -> None:
    """Raise ConfigError unless ``value`` is a valid ``kind`` for setting ``name``: the rules
    declared with the setting of that name (``_opt``), or the kind's alone for another name."""
    _check(name, kind, value, _RULES.get(name))


# What a value of each annotated kind may be. An int setting takes a whole float too (640.0:
# JSON and YAML may write it so); the range of a setting declared without one is all numbers.
_KINDS = {
    "bool": schema.Field((bool,)),
    "int": schema.Field((int, float), closed=True, whole=True),
    "float": schema.Field((int, float), closed=True),
    "str": schema.Field((str,)),
}


@functools.cache
def _typed(rules: schema.Field, kind: str) -> schema.Field:
    """``rules`` (declared beside the field, without its type) for a value of ``kind``; choices
    are words, so only a ``str`` setting has them."""
    choices = rules.choices if kind == "str" else None
    return dataclasses.replace(rules, types=_KINDS[kind].types, whole=_KINDS[kind].whole, choices=choices)


def _check(name: str, kind: str, value: Any, rules: schema.Field | None, refine=None) -> None:
    if kind not in _KINDS:
        return  # a nested settings dataclass (``StreamSettings.augment``) checked itself
    broken = schema.check(value, _KINDS[kind] if rules is None else _typed(rules, kind))
    if refine is not None and isinstance(value, str):
        refine(value)  # a word with its own refusal (the task: ``task_spec``), not a choice
    if broken is not None:
        raise ConfigError.for_field(name, value, _problem(broken, kind, value))


def _problem(broken: schema.Violation, kind: str, value: Any) -> str:
    """What ``ConfigError.for_field`` says of a setting that broke a rule (ranges are closed)."""
    spec = broken.field
    if broken.rule == "type":
        return {"bool": "must be true or false", "str": "must be a string"}.get(kind, "must be a number")
    if broken.rule == "whole":
        return "must be a whole number"
    if broken.rule == "range":
        return f"is out of range; use {spec.lo} to {spec.hi}"
    if broken.rule == "multiple":
        step = spec.multiple_of
        below = max(int(value // step) * step, int(spec.lo))
        above = min(below + step, int(spec.hi))
        return f"is not a multiple of {step}; use {below} or {above}"
    return f"is not one of the choices; use one of {list(spec.choices or ())}"


def _validate(obj: Any) -> None:
    for f in dataclasses.fields(obj):
        kind, optional = field_kind(f)
        value = getattr(obj, f.name)
        if optional and value is None:
            continue
        _check(f.name, kind, value, f.metadata.get("rules"), f.metadata.get("refine"))


def _rules_by_name() -> dict[str, schema.Field]:
    """Each setting's declared rules by its name, for ``check_value`` (a reader checks its
    ``max_classes``, a ``FitConfig`` its ``epochs``, against the declarations here). A name
    declared in two classes (``imgsz``) must be declared alike."""
    rules: dict[str, schema.Field] = {}
    for cls in (AugmentConfig, StreamSettings, DaemonConfig):
        for f in dataclasses.fields(cls):
            declared = f.metadata.get("rules")
            if declared is not None and rules.setdefault(f.name, declared) != declared:
                raise TypeError(f"{cls.__name__}.{f.name} is declared with other rules than a setting of its name")
    return rules


_RULES = _rules_by_name()


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{cls.__name__} must be a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown field(s) {unknown} for {cls.__name__}; known: {sorted(known)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            value = data[f.name]
            kind, _ = field_kind(f)
            if kind == "int" and isinstance(value, float) and value.is_integer():
                value = int(value)
            if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            kwargs[f.name] = value
    return cls(**kwargs)
