"""The reference detector's architecture: output shapes, the YOLOv8n parameter count, its checks."""

from __future__ import annotations

import math

import pytest
import torch

from pixpool.client.train.detect import Detector
from pixpool.shared.errors import ConfigError


@pytest.mark.parametrize("scale", ["tiny", "n"])
@pytest.mark.parametrize("imgsz", [64, 96])
def test_output_is_one_map_per_stride(scale, imgsz):
    torch.manual_seed(0)
    model = Detector(7, scale=scale)
    out = model(torch.rand(2, 3, imgsz, imgsz))
    assert model.strides == (8, 16, 32) and model.reg_max == 16 and model.num_classes == 7
    assert [tuple(o.shape) for o in out] == [(2, 4 * 16 + 7, imgsz // s, imgsz // s) for s in (8, 16, 32)]


def test_rectangular_input_of_multiples_of_32():
    out = Detector(2, scale="tiny", reg_max=8)(torch.rand(1, 3, 64, 96))
    assert [tuple(o.shape[1:]) for o in out] == [(34, 8, 12), (34, 4, 6), (34, 2, 3)]


@pytest.mark.parametrize("scale,published", [("n", 3_157_200), ("s", 11_166_560), ("m", 25_902_640)])
def test_scales_have_the_published_yolov8_parameter_counts(scale, published):
    # The model summaries of YOLOv8n/s/m at 80 classes count the fixed 16-weight DFL
    # projection conv as a parameter; here it is a constant (boxes.dfl_distances).
    count = sum(p.numel() for p in Detector(80, scale=scale).parameters())
    assert count == published - 16, count


def test_tiny_is_much_smaller_than_n():
    tiny = sum(p.numel() for p in Detector(80, scale="tiny").parameters())
    assert tiny < 1_000_000


def test_class_bias_starts_at_a_small_object_prior():
    model = Detector(80, scale="tiny")
    for cls, stride in zip(model.head.cls, model.strides):
        bias = cls[-1].bias.detach()
        assert torch.allclose(bias, torch.full_like(bias, math.log(5 / 80 / (640 / stride) ** 2)))
        assert torch.sigmoid(bias).max() < 0.01


def test_input_not_a_multiple_of_32_is_refused():
    with pytest.raises(ConfigError, match="multiples of 32"):
        Detector(3, scale="tiny")(torch.rand(1, 3, 48, 64))


def test_unknown_scale_is_refused():
    with pytest.raises(ConfigError, match="scale"):
        Detector(3, scale="huge")
