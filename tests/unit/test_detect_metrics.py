"""mAP through pycocotools' COCOeval: perfect, a hand-computed partial case, edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from pixpool.client.train.detect import coco_map
from pixpool.shared.errors import ConfigError


def _as_predictions(gt, scores):
    return [np.column_stack([g[:, 1:5], s, g[:, 0]]) if len(g) else np.zeros((0, 6)) for g, s in zip(gt, scores)]


def test_ground_truth_as_predictions_scores_one():
    rng = np.random.default_rng(0)
    gt = []
    for n in (3, 0, 5, 1):  # image 1 has no boxes
        xy = rng.uniform(0, 200, (n, 2))
        wh = rng.uniform(10, 80, (n, 2))
        gt.append(np.column_stack([rng.integers(0, 4, n), xy, xy + wh]))
    result = coco_map(_as_predictions(gt, [rng.uniform(0.1, 1, len(g)) for g in gt]), gt, image_sizes=[(320, 320)] * 4)
    assert result["mAP50_95"] == pytest.approx(1.0) and result["mAP50"] == pytest.approx(1.0)
    assert result["images"] == 4 and result["boxes"] == 9 and result["detections"] == 9


def test_a_hand_computed_partial_case():
    """Two classes, averaged by COCOeval over the classes and IoU thresholds .50:.05:.95.

    Class 0, image 0: two boxes A and B; detections: A exactly (score 0.9), then a box far
    from both (0.8). At every threshold the ranked list is TP, FP: precision 1 at recall
    0.5, never reaching recall 1. COCO's 101-point interpolation takes the best precision at
    recall >= r for r = 0, 0.01, ..., 1: 1.0 for the 51 points r <= 0.5, 0 for the other 50,
    so AP = 51/101 at every threshold.

    Class 1, image 1: one box [0, 0, 100, 100] and one detection [0, 0, 100, 72]: IoU 0.72,
    a TP at thresholds .50 .. .70 (5 of 10, AP 1) and a FP + miss at .75 .. .95 (AP 0): AP
    1.0 at .5, 0.5 averaged.

    mAP50 = (51/101 + 1) / 2; mAP50_95 = (51/101 + 0.5) / 2."""
    gt = [np.array([[0, 10, 10, 50, 50], [0, 100, 100, 150, 160]], float), np.array([[1, 0, 0, 100, 100]], float)]
    predictions = [
        np.array([[10, 10, 50, 50, 0.9, 0], [200, 200, 240, 240, 0.8, 0]], float),
        np.array([[0, 0, 100, 72, 0.7, 1]], float),
    ]
    result = coco_map(predictions, gt, image_sizes=[(256, 256), (256, 256)])
    assert result["mAP50"] == pytest.approx((51 / 101 + 1) / 2, abs=1e-6)
    assert result["mAP50_95"] == pytest.approx((51 / 101 + 0.5) / 2, abs=1e-6)


def test_no_detections_scores_zero():
    gt = [np.array([[0, 0, 0, 10, 10]], float), np.zeros((0, 5))]
    result = coco_map([np.zeros((0, 6)), np.zeros((0, 6))], gt)
    assert result == {"mAP50_95": 0.0, "mAP50": 0.0, "images": 2, "boxes": 1, "detections": 0}


def test_no_ground_truth_scores_zero():
    result = coco_map([np.array([[0, 0, 10, 10, 0.5, 0]], float)], [np.zeros((0, 5))])
    assert result["mAP50_95"] == 0.0 and result["mAP50"] == 0.0


def test_pycocotools_prints_nothing(capsys):
    gt = [np.array([[0, 0, 0, 10, 10]], float)]
    coco_map(_as_predictions(gt, [np.array([0.5])]), gt)
    assert capsys.readouterr().out == ""


def test_mismatched_lists_are_refused():
    with pytest.raises(ConfigError, match="one of each per image"):
        coco_map([np.zeros((0, 6))], [np.zeros((0, 5))] * 2)
