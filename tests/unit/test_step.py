"""The training step on the CPU (the CUDA-graph path needs a GPU: bench/gpu_check.py checks it there)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pixpool.client.train.feeder import Feeder
from pixpool.client.train.step import DetectorStep, _param_groups, ema_decay_at, lr_at


def test_lr_warms_up_then_decays_to_its_floor():
    kw = dict(lr=0.01, warmup_steps=10, total_steps=110, final_lr_fraction=0.01)
    assert lr_at(0, **kw) == pytest.approx(0.001) and lr_at(9, **kw) == pytest.approx(0.01)
    assert lr_at(60, **kw) == pytest.approx(0.0001 + 0.0099 * 0.5)  # half way down the cosine
    assert lr_at(110, **kw) == pytest.approx(0.0001) and lr_at(500, **kw) == pytest.approx(0.0001)
    assert lr_at(60, **kw, schedule="linear") == pytest.approx(0.01 - 0.0099 * 0.5)
    assert ema_decay_at(0) == 0 and ema_decay_at(2000) == pytest.approx(0.9999 * (1 - math.exp(-1)))


def test_weight_decay_on_weights_only():
    step = DetectorStep(num_classes=3, batch_size=2, imgsz=64, max_targets=4, total_steps=10, scale="tiny")
    decay, no_decay = _param_groups(step.model, 5e-4)
    assert all(p.ndim > 1 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(step.model.parameters()))


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (4, 3, 64, 64), dtype=np.uint8)
    rows = np.array([[0, 1, 0.5, 0.5, 0.3, 0.3], [1, 2, 0.2, 0.7, 0.2, 0.4], [3, 0, 0.6, 0.4, 0.5, 0.5]], np.float32)
    return images, rows


def test_the_step_learns_moves_the_ema_and_reads_losses_rarely():
    step = DetectorStep(
        num_classes=3,
        batch_size=4,
        imgsz=64,
        max_targets=4,
        total_steps=60,
        scale="tiny",
        optimizer="AdamW",
        lr=0.002,
        warmup_steps=5,
        seed=1,
    )
    images, rows = _batch()
    ema_before = [p.clone() for p in step.ema.parameters()]
    for _ in range(10):
        step.step(images, rows)
    first = step.losses()
    for _ in range(30):
        step.step(images, rows)
    last = step.losses()
    assert last["loss"] < 0.7 * first["loss"] and step.steps == 40
    assert step.losses() is None  # read: nothing summed since
    assert any(not torch.equal(a, b) for a, b in zip(ema_before, step.ema.parameters()))


def test_same_seed_same_model_same_losses():
    runs = []
    for _ in range(2):
        step = DetectorStep(num_classes=3, batch_size=4, imgsz=64, max_targets=4, total_steps=10, scale="tiny", seed=7)
        images, rows = _batch()
        step.load(images, rows)  # the feeder's two halves, as the loop may use them
        step.step()
        step.step(images, rows)
        runs.append(step.losses()["loss"])
    assert runs[0] == runs[1]


def test_the_feeder_refuses_out_of_order_use_and_a_wrong_shape():
    feeder = Feeder(batch_size=2, imgsz=32, max_targets=3, device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="no batch was put"):
        feeder.take()
    feeder.put(torch.zeros(2, 3, 32, 32, dtype=torch.uint8), np.zeros((2, 3, 5), np.float32), np.zeros((2, 3), bool))
    with pytest.raises(RuntimeError, match="already waiting"):
        feeder.put(
            torch.zeros(2, 3, 32, 32, dtype=torch.uint8), np.zeros((2, 3, 5), np.float32), np.zeros((2, 3), bool)
        )
    step = DetectorStep(num_classes=2, batch_size=2, imgsz=64, max_targets=4, total_steps=10, scale="tiny")
    with pytest.raises(ValueError, match=r"\(1, 3, 64, 64\).*\(2, 3, 64, 64\)"):
        step.step(np.zeros((1, 3, 64, 64), np.uint8), np.zeros((0, 6), np.float32))
