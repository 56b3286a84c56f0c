"""Ultralytics' training arguments -> pixpool's stream settings, and what pixpool refuses.

Pure functions over a plain mapping (Ultralytics' ``trainer.args`` as a dict, or the
``key=value`` pairs of the command line merged over its defaults): nothing here imports
Ultralytics, so the mapping is tested field by field where it is not installed.

Ultralytics' training route and pixpool's route take the same settings under the same names
(``mosaic``, ``degrees``, ``translate``, ``scale``, ``shear``, ``perspective``, ``flipud``,
``fliplr``, ``hsv_h``, ``hsv_s``, ``hsv_v``, ``mixup``, ``cutmix``, ``copy_paste``,
``copy_paste_mode``, ``close_mosaic``, ``imgsz``; for segment also ``mask_ratio`` and
``overlap_mask``); ``batch`` becomes ``batch_size``, ``epochs`` the run length that
``close_mosaic`` counts back from, and ``seed`` the stream's seed. The tasks served are
detect, segment, pose and obb (``SERVED_TASKS``). A setting pixpool's route does not have is
refused by name when it is set away from the value that makes it a no-op (``UNSUPPORTED``),
and so are ``time`` beside ``close_mosaic`` and ``classes`` for segment or beside
``copy_paste`` (``_check_combinations``). Settings that only act in Ultralytics' own code
(the optimiser, the loss, validation, ``multi_scale`` in ``preprocess_batch``, ``time`` in
its epoch loop, AutoBatch before it builds the loader) pass through untouched; ``classes``
drops the other classes' rows from each batch (``loader.py``), and an ``imgsz`` pair trains
at its larger side (``train_imgsz``), both as Ultralytics' own trainer does. The table of
every data argument is in docs/ultralytics.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ...shared.errors import ConfigError
from ...shared.stream.config import AugmentConfig, StreamSettings
from ...shared.task import TASKS, TaskSpec, task_spec

log = logging.getLogger(__name__)

# Ultralytics key -> AugmentConfig field (same meaning, same units).
AUGMENT_KEYS: dict[str, str] = {
    "imgsz": "imgsz",
    "mosaic": "mosaic",
    "degrees": "degrees",
    "translate": "translate",
    "scale": "scale",
    "shear": "shear",
    "perspective": "perspective",
    "flipud": "flipud",
    "fliplr": "fliplr",
    "hsv_h": "hsv_h",
    "hsv_s": "hsv_s",
    "hsv_v": "hsv_v",
    "mixup": "mixup",
    "cutmix": "cutmix",
    "copy_paste": "copy_paste",
    "copy_paste_mode": "copy_paste_mode",
    "close_mosaic": "close_mosaic",
    "epochs": "epochs",
}
# Segment task only (Ultralytics' Format reads them only when it renders masks): Ultralytics
# key -> AugmentConfig field. Other tasks keep pixpool's defaults, whatever args say.
SEGMENT_KEYS: dict[str, str] = {"mask_ratio": "mask_ratio", "overlap_mask": "overlap_mask"}
# Ultralytics key -> StreamSettings field.
STREAM_KEYS: dict[str, str] = {"batch": "batch_size", "seed": "seed"}
# The Ultralytics tasks whose training batches pixpool's ring carries (``shared/task.py``).
SERVED_TASKS = TASKS


def spec_of(args: Mapping[str, Any]) -> TaskSpec:
    """The task of Ultralytics' ``args`` (its own default, detect, where none is named): where a
    trainer's task is first read."""
    return task_spec(args.get("task") or "detect")


def _off(value: Any) -> bool:
    return value in (None, False, 0, 0.0, "", [], ())


# key -> (is the value one pixpool serves?, why not and what to do). Checked in this order.
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "task": (
        lambda v: v is None or v in SERVED_TASKS,
        (
            "pixpool serves the detect, segment, pose and obb tasks (its ring carries boxes, masks, keypoints and "
            "angles); train other tasks, such as classify, on Ultralytics' own loader"
        ),
    ),
    "bgr": (
        _off,
        "pixpool's route has no RGB/BGR channel swap (its batches are RGB, as Ultralytics' with bgr=0); set bgr=0",
    ),
    "augmentations": (_off, "custom Albumentations transforms do not run in pixpool's workers; remove augmentations"),
    "rect": (
        _off,
        "rect=True trains on unshuffled aspect-ratio batches without mosaic, and pixpool streams shuffled square imgsz "
        "batches; set rect=False (validation is rectangular either way)",
    ),
    "fraction": (
        lambda v: train_fraction(v) == 1.0,
        "pixpool serves the whole training split; set fraction=1 (a per-split list [1.0, val, test] keeps the "
        "validation fraction, which Ultralytics' own loader applies), or serve a data.yaml whose train: lists the "
        "images to train on",
    ),
    "cache": (
        lambda v: v in (None, False, "ram", True),
        "pixpool is the training cache; cache=disk writes .npy files pixpool never reads (cache=ram/False only affect Ultralytics' own validation loader)",
    ),
    "quantize": (
        lambda v: v in (None, 16, 32, "fp16", "fp32"),
        "quantisation-aware training calibrates on a second training loader; train without quantize=8 on pixpool",
    ),
}


def train_fraction(value: Any) -> float | int:
    """The training split's share of Ultralytics' ``fraction`` (a ratio, an image count, or a
    per-split list ``[train, val, test]``), normalised as its ``get_split_fraction`` does:
    a list gives its first entry (1.0 when empty), and 0 or 1 become floats."""
    if value is None:
        return 1.0
    if isinstance(value, (list, tuple)):
        value = value[0] if value else 1.0
    return float(value) if value in (0, 1) else value


def classes_of(value: Any) -> tuple[int, ...] | None:
    """Ultralytics' ``classes`` (one class id or a list of them) as a tuple, None when unset."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return None
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) or not float(v).is_integer() for v in values):
        raise ConfigError(
            f"Ultralytics setting classes={value!r}: give class ids, e.g. classes=0 or classes=[0,2]",
            field="classes",
            value=value,
        )
    return tuple(int(v) for v in values)


def _check_combinations(args: Mapping[str, Any]) -> None:
    """The settings pixpool honours only beside others (``time``, ``classes``)."""
    # time= re-plans epochs after each epoch (Ultralytics' trainer); the stream learns the
    # epoch its mosaic closes on when it attaches, so time= is exact only without close_mosaic.
    if not _off(args.get("time")) and not _off(args.get("close_mosaic")):
        raise ConfigError(
            f"Ultralytics setting time={args['time']!r} with close_mosaic={args['close_mosaic']!r} is not "
            "supported with pixpool as the data stream: time= re-plans the number of epochs after each one, but the "
            "stream fixes the epoch it closes mosaic on when the trainer attaches; set close_mosaic=0 with time=, or "
            "give epochs= instead of time=",
            field="time",
            value=args["time"],
        )
    if classes_of(args.get("classes")) is None:
        return
    # The rows of other classes are dropped from each batch (loader.py). That is Ultralytics'
    # filter exactly where each row is transformed on its own; copy-paste pastes instances
    # (and occludes others) by the rows of every class, and a segment batch's mask planes
    # number every instance.
    if spec_of(args).has_masks:
        raise ConfigError(
            f"Ultralytics setting classes={args['classes']!r} is not supported for segment with pixpool as the data "
            "stream: each mask plane numbers every instance of the image, filtered or not; serve labels of the "
            "wanted classes only, or remove classes=",
            field="classes",
            value=args["classes"],
        )
    if not _off(args.get("copy_paste")):
        raise ConfigError(
            f"Ultralytics setting classes={args['classes']!r} with copy_paste={args['copy_paste']!r} is not supported "
            "with pixpool as the data stream: the workers paste instances of every class before the trainer drops "
            "the others; set copy_paste=0, or remove classes=",
            field="classes",
            value=args["classes"],
        )


def check_supported(args: Mapping[str, Any]) -> None:
    """Raise ConfigError naming the first Ultralytics setting pixpool's stream cannot honour."""
    for key, (accepted, why) in UNSUPPORTED.items():
        if key in args and not accepted(args[key]):
            raise ConfigError(
                f"Ultralytics setting {key}={args[key]!r} is not supported with pixpool as the data stream: {why}",
                field=key,
                value=args[key],
            )
    if spec_of(args).has_masks and args.get("overlap_mask") is False:
        raise ConfigError(
            "Ultralytics setting overlap_mask=False is not supported with pixpool as the data stream: a ring slot holds "
            "one mask plane per image (instances numbered 1..n, Ultralytics' default overlap_mask=True), not one plane "
            "per instance; set overlap_mask=True",
            field="overlap_mask",
            value=False,
        )
    _check_combinations(args)
    batch = args.get("batch")
    # batch=-1 or a memory fraction in (0, 1): AutoBatch, which Ultralytics' trainer resolves to
    # a whole size before it builds the training loader (the stream attaches with that size).
    if batch is not None and (isinstance(batch, bool) or not (batch == -1 or 0 < batch < 1 or _whole(batch))):
        raise ConfigError(
            f"Ultralytics setting batch={batch!r} is not a batch size: give a whole size (batch=16), batch=-1 "
            "(AutoBatch) or a fraction of GPU memory in (0, 1)",
            field="batch",
            value=batch,
        )
    scale = args.get("scale")
    if isinstance(scale, (list, tuple)):
        raise ConfigError(
            f"Ultralytics setting scale={scale!r}: pixpool's route takes scale as one number s (gain 1-s to 1+s), not a (min, max) pair",
            field="scale",
            value=scale,
        )


def _whole(value: Any) -> bool:
    return float(value).is_integer() and value >= 1


def train_imgsz(imgsz: Any) -> Any:
    """The training size of Ultralytics' ``imgsz``: a [h, w] pair trains square at its larger
    side, as its trainer's ``check_imgsz(..., max_dim=1)`` makes it (with a warning there)."""
    if isinstance(imgsz, (list, tuple)):
        return max(int(v) for v in imgsz) if imgsz else imgsz
    return imgsz


def check_channels(data: Mapping[str, Any] | None) -> None:
    """Raise ConfigError when the data.yaml names image ``channels`` other than 3: pixpool's
    ring carries uint8 (B, 3, S, S) RGB images, decoded as colour whatever the file holds."""
    channels = 3 if data is None else data.get("channels", 3)
    if channels != 3:
        raise ConfigError(
            f"data.yaml channels={channels!r} is not supported with pixpool as the data stream: its ring carries "
            "3-channel RGB images (a grayscale file is decoded to 3 equal channels); train grayscale or "
            "multispectral sets on Ultralytics' own loader, or remove channels: to train them as RGB",
            field="channels",
            value=channels,
        )


def augment_config(args: Mapping[str, Any], *, data: Mapping[str, Any] | None = None) -> AugmentConfig:
    """The ``AugmentConfig`` of Ultralytics' ``args`` (after ``check_supported``).

    ``data``: the dataset dict Ultralytics resolved from ``data=``. For pose, a dataset
    without ``flip_idx`` trains without flips, as Ultralytics' own route decides
    (``v8_transforms`` sets ``fliplr`` and ``flipud`` to 0: a mirrored person needs left and
    right keypoints swapped). A value pixpool's ranges refuse raises ConfigError naming the
    Ultralytics key."""
    check_supported(args)
    check_channels(data)
    spec = spec_of(args)
    keys = {**AUGMENT_KEYS, **SEGMENT_KEYS} if spec.has_masks else AUGMENT_KEYS
    fields = {field: args[key] for key, field in keys.items() if key in args}
    if "imgsz" in fields:
        fields["imgsz"] = train_imgsz(fields["imgsz"])
    if spec.has_keypoints and data is not None:
        flip_idx = data.get("flip_idx") or []
        kpt_shape = data.get("kpt_shape")
        if not flip_idx:
            if any(float(fields.get(k, getattr(AugmentConfig, k))) > 0 for k in ("fliplr", "flipud")):
                log.warning(
                    "pixpool: the data.yaml names no flip_idx; training without fliplr and flipud, as Ultralytics does"
                )
            fields["fliplr"] = fields["flipud"] = 0.0
        elif kpt_shape and len(flip_idx) != int(kpt_shape[0]):
            raise ConfigError(
                f"data.yaml flip_idx has {len(flip_idx)} entries but kpt_shape {list(kpt_shape)} has "
                f"{int(kpt_shape[0])} keypoints; give one flip_idx entry per keypoint",
                field="flip_idx",
                value=list(flip_idx),
            )
    fields["train_route"] = True
    return _build(lambda: AugmentConfig.from_dict(fields), keys)


def stream_settings(
    args: Mapping[str, Any],
    *,
    batch_size: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    data: Mapping[str, Any] | None = None,
) -> StreamSettings:
    """This rank's ``StreamSettings``: Ultralytics' ``args``, ``batch_size`` per rank (Ultralytics
    gives each DDP rank ``batch // world_size``; default ``batch``), shard ``rank`` of ``world_size``;
    ``data`` as for ``augment_config``."""
    augment = augment_config(args, data=data)
    batch = args.get("batch", 16) if batch_size is None else batch_size
    if not _whole(batch):
        raise ConfigError(
            f"Ultralytics setting batch={batch!r}: AutoBatch is resolved by Ultralytics' trainer before it builds "
            "the training loader; give the size it chose (batch_size=) or a whole batch=",
            field="batch",
            value=batch,
        )
    seed = args.get("seed", 0)
    return _build(
        lambda: StreamSettings(
            seed=int(seed), batch_size=int(batch), rank=rank, world_size=world_size, shuffle=True, augment=augment
        ),
        STREAM_KEYS,
    )


def check_served(
    *,
    task: str,
    data: Mapping[str, Any],
    served_task: str,
    served_kpt_shape: Any = None,
    served_flip_idx: Any = None,
    where: str = "the pixpool daemon",
) -> None:
    """Raise ConfigError unless the stream ``where`` serves what a ``task`` trainer on ``data`` needs.

    The daemon renders the targets of the task its dataset was served with (``pixpool serve
    --task``): a segment model on a detect stream would get no masks, a pose model on another
    keypoint layout the wrong columns. ``data``: the dataset dict Ultralytics resolved."""
    spec = spec_of({"task": task})
    if served_task != task:
        raise ConfigError(
            f"{where} serves the {served_task!r} task but the model trains {task!r}; serve the dataset with "
            f"`pixpool serve --task {task}`"
            + (" (its data.yaml names kpt_shape)" if spec.has_keypoints else "")
            + f", or give a {served_task} model",
            field="task",
            value=task,
        )
    if not spec.has_keypoints:
        return
    wanted_shape = [int(v) for v in data.get("kpt_shape") or ()]
    served_shape = [int(v) for v in served_kpt_shape or ()]
    if wanted_shape != served_shape:
        raise ConfigError(
            f"{where} serves keypoints of kpt_shape {served_shape or None} but data= names kpt_shape "
            f"{wanted_shape or None}; serve the same data.yaml",
            field="kpt_shape",
            value=wanted_shape,
        )
    wanted_flip = [int(v) for v in data.get("flip_idx") or ()]
    served_flip = [int(v) for v in served_flip_idx or ()]
    if wanted_flip != served_flip:
        raise ConfigError(
            f"{where} flips keypoints with flip_idx {served_flip or None} but data= names flip_idx "
            f"{wanted_flip or None}; serve the same data.yaml",
            field="flip_idx",
            value=wanted_flip,
        )


def _build(make, names: dict[str, str]):
    try:
        return make()
    except ConfigError as exc:
        key = next((k for k, f in names.items() if f == exc.field), None)
        if key is None:
            raise
        raise ConfigError(
            f"Ultralytics setting {key}={exc.value!r}: {exc.problem.format_map(_Plain())} in pixpool's route (field {exc.field!r})",
            field=key,
            value=exc.value,
        ) from None


class _Plain(dict):
    def __missing__(self, key: str) -> str:
        return key
