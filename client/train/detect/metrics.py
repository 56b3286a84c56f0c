"""mAP@[.5:.95] and mAP@.5 of detections against ground truth, through pycocotools' COCOeval.

Runs in the trainer process after a validation pass, on the host (numpy). The ground truth
and the detections are built as COCO dicts in memory (no json files), so the numbers are
the reference COCO numbers: 101-point interpolated precision, averaged over IoU
thresholds 0.50:0.05:0.95 and over the classes present in the ground truth. pycocotools
prints progress to stdout; that is silenced.

Edge cases that COCOeval does not take: no detections at all (``loadRes`` fails on an
empty list) and no ground-truth box at all (COCOeval reports -1) both give 0.0.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

import numpy as np

from ....shared.errors import ConfigError


def coco_map(
    predictions: Sequence[np.ndarray],
    ground_truth: Sequence[np.ndarray],
    *,
    image_sizes: Sequence[tuple[int, int]] | None = None,
    max_dets: int = 100,
) -> dict[str, float]:
    """``predictions``: per image (n, 6) ``x1, y1, x2, y2, score, class``; ``ground_truth``:
    per image (m, 5) ``class, x1, y1, x2, y2``; both in pixels. ``image_sizes`` (height,
    width) per image is recorded in the COCO image entries (COCOeval does not use it for
    boxes). ``max_dets`` is the detection cap per image (COCO's 100).

    Returns ``{"mAP50_95", "mAP50", "images", "boxes", "detections"}``."""
    if len(predictions) != len(ground_truth):
        raise ConfigError(
            f"{len(predictions)} prediction arrays for {len(ground_truth)} ground-truth arrays; pass one of each per image"
        )
    if image_sizes is not None and len(image_sizes) != len(ground_truth):
        raise ConfigError(
            f"{len(image_sizes)} image sizes for {len(ground_truth)} images; pass one (height, width) per image or none"
        )
    gt_rows = [_rows(g, 5, "ground truth", i) for i, g in enumerate(ground_truth)]
    pred_rows = [_rows(p, 6, "predictions", i) for i, p in enumerate(predictions)]

    images, annotations = [], []
    for image_id, rows in enumerate(gt_rows):
        height, width = (
            image_sizes[image_id] if image_sizes is not None else _extent(rows[:, 1:5], pred_rows[image_id][:, :4])
        )
        images.append({"id": image_id, "height": int(height), "width": int(width)})
        for cls, x1, y1, x2, y2 in rows.tolist():
            w, h = x2 - x1, y2 - y1
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(cls),
                    "bbox": [x1, y1, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    detections = [
        {"image_id": image_id, "category_id": int(cls), "bbox": [x1, y1, x2 - x1, y2 - y1], "score": score}
        for image_id, rows in enumerate(pred_rows)
        for x1, y1, x2, y2, score, cls in rows.tolist()
    ]
    result = {
        "mAP50_95": 0.0,
        "mAP50": 0.0,
        "images": len(images),
        "boxes": len(annotations),
        "detections": len(detections),
    }
    if not annotations or not detections:
        return result

    classes = sorted({a["category_id"] for a in annotations} | {d["category_id"] for d in detections})
    dataset = {"images": images, "annotations": annotations, "categories": [{"id": c, "name": str(c)} for c in classes]}
    with contextlib.redirect_stdout(io.StringIO()):
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval

        coco_gt = COCO()
        coco_gt.dataset = dataset
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes(detections)
        evaluator = COCOeval(coco_gt, coco_dt, "bbox")
        evaluator.params.maxDets = [1, 10, max_dets]
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    # stats[0]: AP@[.5:.95], all areas, max_dets; stats[1]: AP@.5. -1 means "no ground truth".
    result["mAP50_95"] = max(float(evaluator.stats[0]), 0.0)
    result["mAP50"] = max(float(evaluator.stats[1]), 0.0)
    return result


def _rows(array: np.ndarray, width: int, what: str, index: int) -> np.ndarray:
    rows = np.asarray(array, dtype=np.float64)
    if rows.size == 0:
        return np.zeros((0, width))
    if rows.ndim != 2 or rows.shape[1] != width:
        raise ConfigError(f"{what} for image {index} has shape {rows.shape}; expected (n, {width})")
    return rows


def _extent(*boxes: np.ndarray) -> tuple[int, int]:
    """(height, width) covering every box, when the caller gives no image size."""
    corners = np.concatenate([b[:, 2:4] for b in boxes]) if any(len(b) for b in boxes) else np.zeros((1, 2))
    return int(np.ceil(corners[:, 1].max(initial=1))), int(np.ceil(corners[:, 0].max(initial=1)))
