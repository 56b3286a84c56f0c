"""The reference detector the trainer trains: a YOLOv8-style model, its loss, NMS and mAP.

Everything here runs in the trainer process; the daemon and its workers never import it.

- ``model``: ``Detector`` (Conv-BN-SiLU, C2f, SPPF, PAN neck, decoupled anchor-free DFL head
  at strides 8/16/32), scales ``"n"`` (YOLOv8n) and ``"tiny"`` (CPU tests).
- ``targets``: ``pad_targets``, host side: packed rows -> fixed-shape (B, T, 5) targets and
  a (B, T) mask, so the device step keeps its shapes and can be captured.
- ``boxes``: box formats, IoU, CIoU, anchor points, DFL decoding (torch, no torchvision).
- ``assign``: ``TaskAlignedAssigner``, on the device with fixed shapes and no host reads.
- ``loss``: ``DetectionLoss`` (CIoU + BCE + DFL, YOLOv8 gains and scaling), capturable.
- ``postprocess``: ``decode`` maps to pixel boxes and scores, ``nms`` per image (validation).
- ``metrics``: ``coco_map``, mAP@[.5:.95] and mAP@.5 through pycocotools' COCOeval.

Names are imported on first use, so ``import pixpool.client.train.detect`` does not load torch
(``pad_targets`` and ``coco_map`` need only numpy).
"""

from ....shared._lazy import lazy_exports

_WHERE = {
    "Detector": "model",
    "SCALES": "model",
    "DetectionLoss": "loss",
    "TaskAlignedAssigner": "assign",
    "Assignment": "assign",
    "pad_targets": "targets",
    "decode": "postprocess",
    "nms": "postprocess",
    "coco_map": "metrics",
}

__all__, __getattr__ = lazy_exports(__name__, (), _WHERE)
