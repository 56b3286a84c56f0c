"""The trainer-side training step (CPU eager path; the CUDA-graph path needs a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pixpool.client.train import STRIDE, TrainStep, dense_targets


def test_dense_targets_places_each_box_in_its_centre_cell():
    rows = np.array([[0, 3, 0.5, 0.25, 0.2, 0.1], [1, 0, 0.99, 0.01, 0.05, 0.05]], np.float32)
    dense = dense_targets(rows, batch_size=2, imgsz=64)
    grid = 64 // STRIDE
    assert dense.objectness.sum() == 2
    assert dense.objectness[0, 1, 2] == 1 and dense.classes[0, 1, 2] == 3
    assert dense.objectness[1, 0, grid - 1] == 1 and dense.classes[1, 0, grid - 1] == 0
    np.testing.assert_array_equal(dense.boxes[0, :, 1, 2], rows[0, 2:])
    assert (dense.classes == -100).sum() == 2 * grid * grid - 2


def test_dense_targets_empty_batch():
    dense = dense_targets(np.zeros((0, 6), np.float32), batch_size=3, imgsz=32)
    assert dense.objectness.shape == (3, 2, 2) and dense.objectness.sum() == 0


def test_training_reduces_loss_and_moves_ema():
    torch.manual_seed(0)
    step = TrainStep(num_classes=4, batch_size=2, imgsz=64, lr=1e-2)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (2, 3, 64, 64), dtype=np.uint8)
    rows = np.array([[0, 1, 0.5, 0.5, 0.3, 0.3], [1, 2, 0.2, 0.7, 0.2, 0.4]], np.float32)
    ema_before = [p.clone() for p in step.ema.parameters()]
    losses = [step.step(images, rows) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    assert step.steps == 30
    assert any(not torch.equal(a, b) for a, b in zip(ema_before, step.ema.parameters()))


def test_wrong_batch_shape_is_refused_with_both_shapes():
    step = TrainStep(num_classes=2, batch_size=2, imgsz=32)
    with pytest.raises(ValueError, match=r"\(1, 3, 32, 32\).*\(2, 3, 32, 32\)"):
        step.step(np.zeros((1, 3, 32, 32), np.uint8), np.zeros((0, 6), np.float32))
