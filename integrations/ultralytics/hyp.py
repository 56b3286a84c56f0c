"""Ultralytics' training arguments -> pixpool's stream settings, and what pixpool refuses.

Pure functions over a plain mapping (Ultralytics' ``trainer.args`` as a dict, or the
``key=value`` pairs of the command line merged over its defaults): nothing here imports
Ultralytics, so the mapping is tested field by field where it is not installed.

Ultralytics' detect route and pixpool's route take the same settings under the same names
(``mosaic``, ``degrees``, ``translate``, ``scale``, ``shear``, ``perspective``, ``flipud``,
``fliplr``, ``hsv_h``, ``hsv_s``, ``hsv_v``, ``mixup``, ``copy_paste``, ``close_mosaic``,
``imgsz``); ``batch`` becomes ``batch_size``, ``epochs`` the run length that
``close_mosaic`` counts back from, and ``seed`` the stream's seed. A setting pixpool's route
does not have is refused by name when it is set away from the value that makes it a no-op
(``UNSUPPORTED``); settings that only act in Ultralytics' own code (the optimiser, the loss,
validation, ``multi_scale`` in ``preprocess_batch``) pass through untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...shared.errors import ConfigError
from ...shared.stream.config import AugmentConfig, StreamSettings

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
    "copy_paste": "copy_paste",
    "close_mosaic": "close_mosaic",
    "epochs": "epochs",
}
# Ultralytics key -> StreamSettings field.
STREAM_KEYS: dict[str, str] = {"batch": "batch_size", "seed": "seed"}


def _off(value: Any) -> bool:
    return value in (None, False, 0, 0.0, "", [], ())


# key -> (is the value one pixpool serves?, why not and what to do). Checked in this order.
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "task": (
        lambda v: v in (None, "detect"),
        "pixpool serves the detect task only: its ring carries boxes, not masks, keypoints or oriented boxes (segment, pose, obb, classify train on Ultralytics' own loader)",
    ),
    "cutmix": (_off, "pixpool's route has no CutMix; set cutmix=0"),
    "bgr": (_off, "pixpool's route has no RGB/BGR channel swap; set bgr=0"),
    "copy_paste_mode": (
        lambda v: v in (None, "flip"),
        "pixpool's copy-paste is the 'flip' mode (mirrored instances); set copy_paste_mode=flip",
    ),
    "augmentations": (_off, "custom Albumentations transforms do not run in pixpool's workers; remove augmentations"),
    "rect": (_off, "pixpool streams square imgsz batches; rect=True (rectangular training batches) is not served"),
    "fraction": (
        lambda v: v in (None, 1, 1.0),
        "pixpool serves the whole training set; set fraction=1 (or serve a smaller data.yaml)",
    ),
    "classes": (
        _off,
        "pixpool serves every class of the training set; classes= (a class filter) is not applied to training batches",
    ),
    "cache": (
        lambda v: v in (None, False, "ram", True),
        "pixpool is the training cache; cache=disk writes .npy files pixpool never reads (cache=ram/False only affect Ultralytics' own validation loader)",
    ),
    "quantize": (
        lambda v: v in (None, 16, 32, "fp16", "fp32"),
        "quantisation-aware training calibrates on a second training loader; train without quantize=8 on pixpool",
    ),
    "time": (
        _off,
        "time= re-plans the number of epochs after each one, but pixpool fixes the close_mosaic epoch when the trainer attaches; set epochs=",
    ),
}


def check_supported(args: Mapping[str, Any]) -> None:
    """Raise ConfigError naming the first Ultralytics setting pixpool's stream cannot honour."""
    for key, (accepted, why) in UNSUPPORTED.items():
        if key in args and not accepted(args[key]):
            raise ConfigError(
                f"Ultralytics setting {key}={args[key]!r} is not supported with pixpool as the data stream: {why}",
                field=key,
                value=args[key],
            )
    batch = args.get("batch")
    if batch is not None and (isinstance(batch, bool) or not float(batch).is_integer() or batch < 1):
        raise ConfigError(
            f"Ultralytics setting batch={batch!r} is not supported with pixpool: AutoBatch (batch=-1 or a memory fraction) would size a second loader; give a whole batch size, e.g. batch=16",
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
    imgsz = args.get("imgsz")
    if isinstance(imgsz, (list, tuple)):
        raise ConfigError(
            f"Ultralytics setting imgsz={imgsz!r}: training is square; give one number", field="imgsz", value=imgsz
        )


def augment_config(args: Mapping[str, Any]) -> AugmentConfig:
    """The ``AugmentConfig`` of Ultralytics' ``args`` (after ``check_supported``).

    A value pixpool's ranges refuse raises ConfigError naming the Ultralytics key."""
    check_supported(args)
    fields = {field: args[key] for key, field in AUGMENT_KEYS.items() if key in args}
    fields["augment"] = True
    return _build(lambda: AugmentConfig.from_dict(fields), AUGMENT_KEYS)


def stream_settings(
    args: Mapping[str, Any], *, batch_size: int | None = None, rank: int = 0, world_size: int = 1
) -> StreamSettings:
    """This rank's ``StreamSettings``: Ultralytics' ``args``, ``batch_size`` per rank (Ultralytics
    gives each DDP rank ``batch // world_size``; default ``batch``), shard ``rank`` of ``world_size``."""
    augment = augment_config(args)
    batch = args.get("batch", 16) if batch_size is None else batch_size
    seed = args.get("seed", 0)
    return _build(
        lambda: StreamSettings(
            seed=int(seed), batch_size=int(batch), rank=rank, world_size=world_size, shuffle=True, augment=augment
        ),
        STREAM_KEYS,
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
