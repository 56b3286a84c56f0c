"""Train Ultralytics YOLO models on a pixpool daemon's stream (``pixpool[ultralytics]``).

Detect, segment, pose and obb, each with Ultralytics' own trainer and validator:
``PixpoolDetectionTrainer``, ``PixpoolSegmentationTrainer``, ``PixpoolPoseTrainer``,
``PixpoolOBBTrainer`` (the daemon serves the matching ``--task``).

Ultralytics (AGPL-3.0) is imported only by ``trainer``, ``command``, ``run`` and ``tuning`` of this
package, and only when they are used: ``hyp`` (the hyper-parameter mapping),
``batches``/``loader`` (the batch layout) and ``notices`` (what a run says at start) import
no Ultralytics code.

    from ultralytics import YOLO
    from pixpool.integrations.ultralytics import PixpoolDetectionTrainer

    YOLO("yolo11n.yaml").train(trainer=PixpoolDetectionTrainer, data="coco128.yaml", epochs=3, imgsz=640)

or from the shell, with Ultralytics' ``key=value`` arguments::

    pixpool yolo train data=coco128.yaml model=yolo11n.yaml epochs=3 imgsz=640 batch=16 workers=4

``tune(model=..., data=..., iterations=3, concurrent=3)`` (``pixpool yolo tune``, extra
``pixpool[tune]``): Ultralytics' Ray Tune search with every trial on one daemon (``tuning.py``;
not ``tune.py``, whose import would hide this function behind the module).
"""

from __future__ import annotations

from typing import Any

_TRAINERS = ("PixpoolDetectionTrainer", "PixpoolSegmentationTrainer", "PixpoolPoseTrainer", "PixpoolOBBTrainer")
__all__ = [
    "PixpoolDetectionTrainer",
    "PixpoolOBBTrainer",
    "PixpoolPoseTrainer",
    "PixpoolSegmentationTrainer",
    "PixpoolYOLO",
    "require_ultralytics",
    "train",
    "tune",
]


def require_ultralytics(what: str):
    """``import ultralytics``, or MissingExtraError naming ``what`` and the extra to install."""
    from ...shared.errors import MissingExtraError

    try:
        import ultralytics
    except ImportError as exc:
        raise MissingExtraError(
            f"{what} needs Ultralytics, which is not installed here ({exc}); install the extra: pip install 'pixpool[ultralytics]' "
            "(Ultralytics is AGPL-3.0; on a CPU-only machine install the CPU build of torch first)"
        ) from None
    return ultralytics


def __getattr__(name: str) -> Any:
    if name in _TRAINERS:
        require_ultralytics(f"pixpool.integrations.ultralytics.{name}")
        from . import trainer

        return getattr(trainer, name)
    if name == "train":
        from .run import train

        return train
    if name in ("tune", "PixpoolYOLO"):
        require_ultralytics(f"pixpool.integrations.ultralytics.{name}")
        from . import tuning

        return getattr(tuning, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
