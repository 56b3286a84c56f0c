"""The detection loss: padded batched == plain per-image reference, padding-independence,
CIoU by hand, a learning smoke test, and no host synchronisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from pixpool.client.train.detect import DetectionLoss, Detector, pad_targets
from pixpool.client.train.detect.boxes import ciou

REG_MAX = 16
STRIDES = (8, 16, 32)


def _reference_loss(feats, per_image, imgsz, num_classes):
    """YOLOv8's loss written the plain way: one image at a time, only its real boxes (no
    padding, no mask), boolean indexing and Python loops for the assignment."""
    batch = feats[0].shape[0]
    flat = torch.cat([f.flatten(2) for f in feats], 2).transpose(1, 2)
    distribution, logits = flat[..., : 4 * REG_MAX], flat[..., 4 * REG_MAX :]
    points, stride_of = [], []
    for feat, stride in zip(feats, STRIDES):
        for y in range(feat.shape[2]):
            for x in range(feat.shape[3]):
                points.append((x + 0.5, y + 0.5))
                stride_of.append(stride)
    points = torch.tensor(points)
    stride_of = torch.tensor(stride_of, dtype=torch.float32)[:, None]
    anchors = len(points)
    dist = distribution.reshape(batch, anchors, 4, REG_MAX).softmax(-1) @ torch.arange(REG_MAX, dtype=torch.float32)
    pred = torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)  # grid units

    box_sum = cls_sum = dfl_sum = score_total = 0.0
    for b in range(batch):
        gt = torch.as_tensor(per_image[b], dtype=torch.float32).reshape(-1, 5)
        target_scores = torch.zeros(anchors, num_classes)
        target_boxes = torch.zeros(anchors, 4)
        positive = torch.zeros(len(gt), anchors, dtype=torch.bool)
        metric = torch.zeros(len(gt), anchors)
        overlap = torch.zeros(len(gt), anchors)
        labels = gt[:, 0].long()
        gt_xyxy = torch.cat((gt[:, 1:3] - gt[:, 3:5] / 2, gt[:, 1:3] + gt[:, 3:5] / 2), 1) * imgsz
        probs = logits[b].detach().sigmoid()
        pred_pixels = pred[b].detach() * stride_of
        anchor_pixels = points * stride_of
        for j in range(len(gt)):
            x1, y1, x2, y2 = gt_xyxy[j]
            inside = (
                (anchor_pixels[:, 0] > x1)
                & (anchor_pixels[:, 0] < x2)
                & (anchor_pixels[:, 1] > y1)
                & (anchor_pixels[:, 1] < y2)
            )
            idx = inside.nonzero()[:, 0]
            if not len(idx):
                continue
            u = ciou(gt_xyxy[j].expand(len(idx), 4), pred_pixels[idx]).clamp(min=0)
            overlap[j, idx] = u
            metric[j, idx] = probs[idx, labels[j]] ** 0.5 * u**6
            positive[j, idx[metric[j, idx].topk(min(10, len(idx))).indices]] = True
        for a in (positive.sum(0) > 1).nonzero()[:, 0]:
            claimants = positive[:, a].nonzero()[:, 0]
            best = claimants[overlap[claimants, a].argmax()]
            positive[:, a] = False
            positive[best, a] = True
        for j in range(len(gt)):
            mine = positive[j].nonzero()[:, 0]
            if len(mine):
                align = metric[j, mine]
                target_scores[mine, labels[j]] = align * overlap[j, mine].max() / (align.max() + 1e-9)
                target_boxes[mine] = gt_xyxy[j]
        score_total = score_total + target_scores.sum()
        cls_sum = cls_sum + F.binary_cross_entropy_with_logits(logits[b], target_scores, reduction="sum")
        fg = positive.any(0)
        if fg.any():
            weight = target_scores[fg].sum(-1)
            boxes = target_boxes[fg] / stride_of[fg]
            box_sum = box_sum + ((1 - ciou(pred[b][fg], boxes)) * weight).sum()
            ltrb = torch.cat((points[fg] - boxes[:, :2], boxes[:, 2:] - points[fg]), 1).clamp(0, REG_MAX - 1 - 0.01)
            left = ltrb.floor().long()
            bins = distribution[b][fg].reshape(-1, REG_MAX)
            ce_left = F.cross_entropy(bins, left.reshape(-1), reduction="none").reshape(-1, 4)
            ce_right = F.cross_entropy(bins, (left + 1).reshape(-1), reduction="none").reshape(-1, 4)
            near_left = left + 1 - ltrb
            dfl_sum = dfl_sum + ((ce_left * near_left + ce_right * (1 - near_left)).mean(-1) * weight).sum()
    denominator = max(float(score_total), 1.0)
    parts = (
        torch.stack([torch.as_tensor(box_sum) * 7.5, torch.as_tensor(cls_sum) * 0.5, torch.as_tensor(dfl_sum) * 1.5])
        / denominator
    )
    return parts.sum() * batch, parts


def _random_boxes(rng, n, num_classes):
    return np.column_stack(
        [rng.integers(0, num_classes, n), rng.uniform(0.15, 0.85, (n, 2)), rng.uniform(0.05, 0.5, (n, 2))]
    ).astype(np.float32)


def _random_feats(seed, batch, imgsz, num_classes):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, 4 * REG_MAX + num_classes, imgsz // s, imgsz // s, generator=gen) * 2).requires_grad_()
        for s in STRIDES
    ]


def _padded(per_image, max_targets):
    rows = np.concatenate(
        [np.column_stack([np.full(len(g), b, np.float32), g]) for b, g in enumerate(per_image)]
    ).reshape(-1, 6)
    targets, mask = pad_targets(rows, len(per_image), max_targets)
    return torch.from_numpy(targets), torch.from_numpy(mask)


@pytest.mark.parametrize("counts", [(0, 1, 15, 3), (0, 0), (1,), (6, 6, 0, 2)])
def test_padded_batched_loss_equals_the_plain_reference(counts):
    num_classes, imgsz = 5, 128
    rng = np.random.default_rng(sum(counts))
    per_image = [_random_boxes(rng, n, num_classes) for n in counts]
    feats = _random_feats(len(counts), len(counts), imgsz, num_classes)
    targets, mask = _padded(per_image, 20)

    total, parts = DetectionLoss(num_classes)(feats, targets, mask, imgsz)
    grads = torch.autograd.grad(total, feats)
    ref_total, ref_parts = _reference_loss(feats, per_image, imgsz, num_classes)
    ref_grads = torch.autograd.grad(ref_total, feats)

    if sum(counts):
        assert ref_parts[0] > 0 and ref_parts[2] > 0  # the box terms are exercised, not both zero
    torch.testing.assert_close(parts, ref_parts.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(total, ref_total, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_loss_does_not_depend_on_the_number_of_padding_rows():
    num_classes, imgsz = 3, 96
    rng = np.random.default_rng(7)
    per_image = [_random_boxes(rng, n, num_classes) for n in (5, 0, 2)]
    feats = _random_feats(3, 3, imgsz, num_classes)
    loss = DetectionLoss(num_classes)
    few, few_parts = loss(feats, *_padded(per_image, 5), imgsz)
    many, many_parts = loss(feats, *_padded(per_image, 50), imgsz)
    assert few_parts[0] > 0
    torch.testing.assert_close(few, many, rtol=1e-6, atol=0)
    torch.testing.assert_close(few_parts, many_parts, rtol=1e-6, atol=0)


def test_ciou_by_hand():
    a = torch.tensor([0.0, 0.0, 2.0, 2.0])
    # Same box: 1. Shifted by 1 along x: IoU 2/6, enclosing box 3x2 (diagonal^2 13),
    # centre distance^2 1, same aspect ratio (v = 0): 1/3 - 1/13.
    assert ciou(a, a).item() == pytest.approx(1.0, abs=1e-6)
    assert ciou(a, torch.tensor([1.0, 0.0, 3.0, 2.0])).item() == pytest.approx(1 / 3 - 1 / 13, abs=1e-6)
    # Concentric 2x2 and 4x1: intersection 2x1, union 4 + 4 - 2, IoU 1/3; the centres
    # coincide (no distance term); v = 4/pi^2 (atan 4 - atan 1)^2, alpha = v / (v - 1/3 + 1).
    v = 4 / np.pi**2 * (np.arctan(4.0) - np.arctan(1.0)) ** 2
    want = 1 / 3 - v * v / (v + 2 / 3)
    assert ciou(a, torch.tensor([-1.0, 0.5, 3.0, 1.5])).item() == pytest.approx(want, abs=1e-6)


def _synthetic_batch(batch, imgsz, num_classes, seed):
    """Grey images with one to three flat rectangles, colour by class, and their rows."""
    rng = np.random.default_rng(seed)
    colours = np.array([[1.0, 0.1, 0.1], [0.1, 1.0, 0.1], [0.1, 0.1, 1.0]])
    images = np.full((batch, 3, imgsz, imgsz), 0.45, np.float32)
    rows = []
    for b in range(batch):
        for _ in range(rng.integers(1, 4)):
            cls = int(rng.integers(0, num_classes))
            w, h = rng.uniform(0.2, 0.5, 2)
            cx, cy = rng.uniform(w / 2, 1 - w / 2), rng.uniform(h / 2, 1 - h / 2)
            x1, x2 = int((cx - w / 2) * imgsz), int((cx + w / 2) * imgsz)
            y1, y2 = int((cy - h / 2) * imgsz), int((cy + h / 2) * imgsz)
            images[b, :, y1:y2, x1:x2] = colours[cls][:, None, None]
            rows.append([b, cls, (x1 + x2) / 2 / imgsz, (y1 + y2) / 2 / imgsz, (x2 - x1) / imgsz, (y2 - y1) / imgsz])
    return torch.from_numpy(images), np.array(rows, np.float32)


def test_a_few_steps_of_tiny_reduce_the_loss():
    torch.manual_seed(0)
    images, rows = _synthetic_batch(8, 64, 3, seed=0)
    targets, mask = (torch.from_numpy(a) for a in pad_targets(rows, 8, 8))
    model = Detector(3, scale="tiny")
    loss_fn = DetectionLoss(3)
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for _ in range(30):
        total, _ = loss_fn(model(images), targets, mask, 64)
        optimiser.zero_grad()
        total.backward()
        optimiser.step()
        losses.append(total.item())
    assert np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < 0.6 * np.mean(losses[:3]), losses


# Ops that read a tensor's value back to the host or whose output shape depends on the
# data; any of them would make the step impossible to capture as a CUDA graph. Indexing
# with a boolean mask dispatches as plain ``index`` (the nonzero runs inside the kernel),
# so the recorder names it "index(bool)" by its arguments.
_SYNCING_OPS = {
    "_local_scalar_dense",
    "item",
    "is_nonzero",
    "nonzero",
    "nonzero_static",
    "masked_select",
    "equal",
    "allclose",
    "_assert_async",
    "unique",
    "_unique2",
    "index(bool)",
}


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


def _record_ops(fn):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            self.names.add(
                f"{name}(bool)" if name in ("index", "index_put", "index_put_") and _bool_index(args) else name
            )
            return func(*args, **(kwargs or {}))

    with Recorder() as recorder:
        fn()
    return recorder.names


def test_loss_and_backward_make_no_host_synchronising_op():
    """Two checks. (1) Every aten op of the forward loss and its backward is recorded by a
    dispatch mode on real CPU values: none may be a host read or a data-dependent shape.
    The same recorder sees such an op in a deliberately bad function, so the check can fail.
    (2) The whole step runs on the ``meta`` device, where tensors have shapes but no
    values: ``.item()``, ``bool(tensor)``, ``.cpu()`` and ``nonzero`` all raise there."""
    rng = np.random.default_rng(1)
    per_image = [_random_boxes(rng, n, 4) for n in (3, 0)]
    targets, mask = _padded(per_image, 6)
    feats = _random_feats(0, 2, 64, 4)
    loss = DetectionLoss(4)

    def step():
        total, _ = loss(feats, targets, mask, 64)
        total.backward()

    names = _record_ops(step)
    assert {"topk", "scatter", "binary_cross_entropy_with_logits"} & names  # the recorder saw the loss
    assert not names & _SYNCING_OPS, names & _SYNCING_OPS
    assert _record_ops(lambda: feats[0][feats[0] > 0].sum()) & _SYNCING_OPS  # a boolean index is caught

    model = Detector(4, scale="tiny").to("meta")
    total, parts = loss(model(torch.empty(2, 3, 64, 64, device="meta")), targets.to("meta"), mask.to("meta"), 64)
    total.backward()
    assert total.device.type == "meta" and total.shape == () and parts.shape == (3,)
    with pytest.raises(Exception):  # noqa: B017 (torch raises its own types for a meta read, by version)
        bool(mask.to("meta").any())  # the meta guard does fire on a host read


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a CUDA device")
def test_loss_and_backward_capture_as_a_cuda_graph():
    device = torch.device("cuda")
    rng = np.random.default_rng(2)
    targets, mask = (t.to(device) for t in _padded([_random_boxes(rng, n, 4) for n in (4, 1)], 8))
    model = Detector(4, scale="tiny").to(device)
    loss = DetectionLoss(4)
    images = torch.rand(2, 3, 64, 64, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as capture requires
        for _ in range(3):
            model.zero_grad(set_to_none=False)
            total, _ = loss(model(images), targets, mask, 64)
            total.backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        static_total, static_parts = loss(model(images), targets, mask, 64)
        static_total.backward()
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        eager_total, _ = loss(model(images), targets, mask, 64)
    assert torch.isfinite(static_total) and static_parts.shape == (3,)
    assert static_total.item() == pytest.approx(eager_total.item(), rel=1e-3)
