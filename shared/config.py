"""Configuration objects: augmentation settings and a trainer's stream settings.

Both are frozen dataclasses that travel as plain dicts (msgpack) between trainer and
daemon; ``from_dict`` validates every field and names the bad one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

FILL_VALUE = 114.0


@dataclass(frozen=True)
class AugmentConfig:
    """The YOLO training route's settings; defaults are the customary YOLO ones."""

    imgsz: int = 640
    mosaic: float = 1.0
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    perspective: float = 0.0
    copy_paste: float = 0.0
    mixup: float = 0.0
    fliplr: float = 0.5
    flipud: float = 0.0
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    # The last `close_mosaic` epochs of `epochs` run without mosaic, copy-paste and mixup.
    close_mosaic: int = 0
    epochs: int = 0
    # False: validation route (letterbox only, no randomness).
    augment: bool = True

    def __post_init__(self) -> None:
        _validate(self)

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

    seed: int = 0
    batch_size: int = 16
    rank: int = 0
    world_size: int = 1
    shuffle: bool = True
    drop_last: bool = False
    start_epoch: int = 0
    hsv_on_device: bool = False
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        _validate(self)
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside world_size {self.world_size}; use 0 <= rank < world_size")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

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


_RANGES: dict[str, tuple[float, float]] = {
    "imgsz": (32, 8192),
    "mosaic": (0.0, 1.0),
    "degrees": (0.0, 180.0),
    "translate": (0.0, 0.9),
    "scale": (0.0, 0.95),
    "shear": (0.0, 90.0),
    "perspective": (0.0, 0.001),
    "copy_paste": (0.0, 1.0),
    "mixup": (0.0, 1.0),
    "fliplr": (0.0, 1.0),
    "flipud": (0.0, 1.0),
    "hsv_h": (0.0, 0.5),
    "hsv_s": (0.0, 1.0),
    "hsv_v": (0.0, 1.0),
    "close_mosaic": (0, 1 << 30),
    "epochs": (0, 1 << 30),
    "seed": (0, (1 << 63) - 1),
    "batch_size": (1, 4096),
    "rank": (0, 1 << 20),
    "world_size": (1, 1 << 20),
    "start_epoch": (0, 1 << 30),
}


def _validate(obj: Any) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        if kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(f"field {f.name!r} must be true or false, got {value!r}")
        elif kind in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"field {f.name!r} must be a number, got {value!r}")
            if kind == "int" and not float(value).is_integer():
                raise ConfigError(f"field {f.name!r} must be a whole number, got {value!r}")
            lo, hi = _RANGES.get(f.name, (float("-inf"), float("inf")))
            if not lo <= value <= hi:
                raise ConfigError(f"field {f.name!r} = {value!r} is out of range; use {lo} to {hi}")


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
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
            if kind == "int" and isinstance(value, float) and value.is_integer():
                value = int(value)
            if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            kwargs[f.name] = value
    return cls(**kwargs)
