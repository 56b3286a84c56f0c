"""Decoding the head's maps and torch-only NMS against a straightforward O(n^2) reference."""

from __future__ import annotations

import pytest
import torch

from pixpool.client.train.detect import decode, nms, postprocess
from pixpool.client.train.detect.boxes import box_iou
from pixpool.shared.errors import ConfigError


def _iou(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _reference_nms(boxes, scores, *, conf_thres, iou_thres, max_det):
    """Every (box, class) above the threshold, by score (ties in box-then-class order);
    keep one unless a kept box of its class overlaps it by more than iou_thres."""
    candidates = [
        (float(scores[a, c]), a, c)
        for a in range(len(boxes))
        for c in range(scores.shape[1])
        if scores[a, c] > conf_thres
    ]
    candidates.sort(key=lambda t: -t[0])
    kept = []
    for score, a, c in candidates:
        if len(kept) == max_det:
            break
        box = boxes[a].tolist()
        if all(kc != c or _iou(box, kb) <= iou_thres for _, kb, kc in kept):
            kept.append((score, box, c))
    return torch.tensor([[*b, s, c] for s, b, c in kept], dtype=torch.float32).reshape(-1, 6)


def _random_scene(seed, *, anchors=150, classes=3):
    gen = torch.Generator().manual_seed(seed)
    # Centres clustered on a 10 px lattice so that many boxes overlap, as a detector's do.
    centres = (torch.rand(anchors, 2, generator=gen) * 60 + 20).round(decimals=-1) + torch.randn(
        anchors, 2, generator=gen
    ) * 3
    sizes = torch.rand(anchors, 2, generator=gen) * 20 + 5
    boxes = torch.cat((centres - sizes / 2, centres + sizes / 2), 1)
    # Scores rounded to two decimals: ties happen, and the order among them must match.
    scores = (torch.rand(anchors, classes, generator=gen) ** 2).round(decimals=2)
    return boxes, scores


def _greedy_nms(boxes, scores, *, conf_thres, iou_thres, max_det, max_candidates=30000):
    """The one-box-at-a-time NMS that ``postprocess._nms_image`` was before it ran in blocks:
    the reference its blocks must reproduce exactly (same candidates, same IoU function)."""
    anchor, label = (scores > conf_thres).nonzero(as_tuple=True)
    candidate_scores = scores[anchor, label]
    order = candidate_scores.sort(descending=True, stable=True).indices[:max_candidates]
    cand_boxes, cand_scores, cand_labels = boxes[anchor[order]], candidate_scores[order], label[order]
    alive = torch.ones(len(order), dtype=torch.bool)
    kept: list[int] = []
    while len(kept) < max_det:
        alive_index = alive.nonzero()
        if not len(alive_index):
            break
        first = int(alive_index[0, 0])
        kept.append(first)
        same_class = cand_labels == cand_labels[first]
        overlap = box_iou(cand_boxes[first : first + 1], cand_boxes)[0]
        alive &= ~(same_class & (overlap > iou_thres))
        alive[first] = False
    keep = torch.tensor(kept, dtype=torch.long)
    return torch.cat((cand_boxes[keep], cand_scores[keep, None], cand_labels[keep, None].to(boxes.dtype)), 1)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "anchors,classes,conf_thres,iou_thres,max_det",
    [(3000, 4, 0.001, 0.7, 300), (3000, 2, 0.01, 0.5, 300), (2500, 3, 0.001, 0.3, 40), (600, 80, 0.2, 0.7, 300)],
)
@pytest.mark.parametrize("block", [1024, 37])
def test_blocked_nms_keeps_the_boxes_of_the_greedy_walk(
    monkeypatch, block, seed, anchors, classes, conf_thres, iou_thres, max_det
):
    monkeypatch.setattr(postprocess, "_BLOCK", block)
    # Thousands of candidates: several blocks, suppression across blocks, the max_det cut
    # inside a block, and (iou 0.3) long chains of suppression within one block.
    boxes, scores = _random_scene(seed, anchors=anchors, classes=classes)
    got = nms(boxes[None], scores[None], conf_thres=conf_thres, iou_thres=iou_thres, max_det=max_det)[0]
    want = _greedy_nms(boxes, scores, conf_thres=conf_thres, iou_thres=iou_thres, max_det=max_det)
    assert len(want) > 10
    assert torch.equal(got, want)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("iou_thres,max_det", [(0.5, 300), (0.7, 300), (0.3, 7)])
def test_nms_equals_the_straightforward_reference(seed, iou_thres, max_det):
    boxes, scores = _random_scene(seed)
    got = nms(boxes[None], scores[None], conf_thres=0.25, iou_thres=iou_thres, max_det=max_det)
    assert len(got) == 1
    want = _reference_nms(boxes, scores, conf_thres=0.25, iou_thres=iou_thres, max_det=max_det)
    assert len(want) > 3
    torch.testing.assert_close(got[0], want)


def test_nms_is_class_aware_and_per_image():
    box = torch.tensor([[10.0, 10.0, 30.0, 30.0], [11.0, 10.0, 31.0, 30.0]])
    scores = torch.tensor(
        [[[0.9, 0.0], [0.8, 0.0]], [[0.9, 0.0], [0.0, 0.8]]]
    )  # image 1: the overlap is of another class
    got = nms(torch.stack((box, box)), scores, conf_thres=0.1, iou_thres=0.5)
    assert got[0][:, 5].tolist() == [0.0] and got[0][:, 4].tolist() == pytest.approx([0.9])
    assert got[1][:, 5].tolist() == [0.0, 1.0]


def test_nms_with_nothing_above_the_threshold():
    got = nms(torch.rand(2, 10, 4), torch.full((2, 10, 3), 0.0005), conf_thres=0.001)
    assert [tuple(g.shape) for g in got] == [(0, 6), (0, 6)]


def test_nms_checks_shapes():
    with pytest.raises(ConfigError, match="expected"):
        nms(torch.rand(10, 4), torch.rand(10, 3))


def test_decode_places_peaked_distributions_at_their_bins():
    reg_max, classes, imgsz = 8, 2, 64
    feats = [torch.zeros(1, 4 * reg_max + classes, imgsz // s, imgsz // s) for s in (8, 16, 32)]
    for f in feats:
        f[:, 4 * reg_max :] = 3.0
        for side, bin_ in enumerate((1, 2, 3, 4)):  # left, top, right, bottom distances in cells
            f[:, side * reg_max + bin_] = 50.0
    boxes, scores = decode(feats, (8, 16, 32), reg_max)
    assert boxes.shape == (1, 64 + 16 + 4, 4) and scores.shape == (1, 84, 2)
    assert torch.allclose(scores, torch.sigmoid(torch.tensor(3.0)).expand_as(scores))
    # Anchor 0 of stride 8 sits at pixel (4, 4); anchor 64 (first of stride 16) at (8, 8).
    torch.testing.assert_close(boxes[0, 0], torch.tensor([4 - 8.0, 4 - 16.0, 4 + 24.0, 4 + 32.0]))
    torch.testing.assert_close(boxes[0, 64], torch.tensor([8 - 16.0, 8 - 32.0, 8 + 48.0, 8 + 64.0]))
