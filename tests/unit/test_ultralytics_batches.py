"""A pixpool batch -> Ultralytics' batch dict, per task, on hand-made tensors.

``batches.to_ultralytics`` imports no Ultralytics code, so these run in every venv; the
comparison with Ultralytics' own ``Format`` + ``collate_fn`` is in
``integration/test_ultralytics_tasks.py``, where Ultralytics is installed.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pixpool.integrations.ultralytics.batches import to_ultralytics
from pixpool.shared.task import task_spec

S = 64
FILES = ["/d/a.jpg", "/d/b.jpg"]


def _shapes(path: str) -> tuple[int, int]:
    return {"/d/a.jpg": (480, 640), "/d/b.jpg": (640, 320)}[path]


def _images() -> torch.Tensor:
    return torch.zeros(2, 3, S, S, dtype=torch.uint8)


def _rows(*extra_columns: list[float]) -> torch.Tensor:
    """Three rows: two of image 0 (classes 3, 7), one of image 1 (class 5), then ``extra_columns``."""
    base = [
        [0, 3, 0.5, 0.5, 0.2, 0.3],
        [0, 7, 0.25, 0.75, 0.1, 0.1],
        [1, 5, 0.6, 0.4, 0.5, 0.25],
    ]
    return torch.tensor([b + list(e) for b, e in zip(base, extra_columns or ([], [], []))], dtype=torch.float32)


def _convert(targets, task="detect", **kw):
    return to_ultralytics(_images(), targets, FILES, imgsz=S, shapes=_shapes, task=task_spec(task), **kw)


def test_detect_dict_is_unchanged():
    targets = _rows()
    out = _convert(targets)
    assert sorted(out) == ["batch_idx", "bboxes", "cls", "im_file", "img", "ori_shape", "ratio_pad", "resized_shape"]
    assert out["batch_idx"].tolist() == [0, 0, 1]
    assert out["cls"].shape == (3, 1) and out["cls"][:, 0].tolist() == [3, 7, 5]
    assert torch.equal(out["bboxes"], targets[:, 2:6])
    assert out["ori_shape"] == ((480, 640), (640, 320)) and out["resized_shape"] == ((S, S), (S, S))
    assert out["ratio_pad"] == ((0.1, 0.1), (0.1, 0.1))


def test_obb_bboxes_are_xywhr_from_the_angle_column():
    targets = _rows([0.3], [1.2], [0.0])
    out = _convert(targets, task="obb")
    assert out["bboxes"].dtype == torch.float32 and out["bboxes"].shape == (3, 5)
    assert torch.equal(out["bboxes"], targets[:, 2:7])
    assert out["bboxes"][:, 4].tolist() == pytest.approx([0.3, 1.2, 0.0])
    targets[0, 6] = 9.0
    assert out["bboxes"][0, 4] == pytest.approx(0.3)  # a copy: the ring slot is reused


def test_pose_keypoints_are_k_by_xy_visibility():
    kpts = [[0.1 * r, 0.2, 2.0, 0.3, 0.4 * r, 0.0] for r in (1, 2, 3)]  # K=2 points (x, y, v) per row
    targets = _rows(*kpts)
    out = _convert(targets, task="pose", kpt_shape=(2, 3))
    k = out["keypoints"]
    assert k.dtype == torch.float32 and k.shape == (3, 2, 3)
    torch.testing.assert_close(k[1], torch.tensor([[0.2, 0.2, 2.0], [0.3, 0.8, 0.0]]))
    assert torch.equal(out["bboxes"], targets[:, 2:6])
    # A (K, 2) dataset's rows carry a visibility too: the keypoints are (n, K, 3) the same.
    assert _convert(targets, task="pose", kpt_shape=(2, 2))["keypoints"].shape == (3, 2, 3)


def _planes(dtype=torch.uint8) -> torch.Tensor:
    masks = torch.zeros(2, 4, 4, dtype=dtype)
    masks[0, 0, :2] = 1  # image 0: instance 1 (class 3) and 2 (class 7)
    masks[0, 1, :] = 2
    masks[1, 2:, 2:] = 1  # image 1: instance 1 (class 5)
    return masks


def test_segment_masks_pass_through_and_sem_masks_carry_the_classes():
    masks = _planes()
    out = _convert(_rows(), task="segment", masks=masks)
    assert out["masks"] is masks  # the ring's planes, no copy
    sem = out["sem_masks"]
    assert sem.dtype == torch.float32 and sem.shape == (2, 4, 4)
    # Covered pixels: the class of their instance. Mask 0: the class of the image's last row,
    # as Ultralytics' ``cls[mask - 1]`` gives it.
    assert sem[0, 0].tolist() == [3, 3, 7, 7]
    assert sem[0, 1].tolist() == [7, 7, 7, 7]
    assert sem[1].tolist() == [[5] * 4] * 4
    assert out["masks"].dtype == torch.uint8
    assert _convert(_rows(), task="segment", masks=_planes(torch.int32))["masks"].dtype == torch.int32


def test_segment_batch_with_an_image_without_instances_is_float_like_ultralytics():
    masks = _planes()
    masks[1] = 0
    targets = _rows()[:2]  # image 1 has no rows
    out = _convert(targets, task="segment", masks=masks)
    assert out["masks"].dtype == torch.float32
    assert torch.equal(out["masks"], masks.float())
    assert out["sem_masks"][1].abs().sum() == 0
    assert out["sem_masks"][0, 0].tolist() == [3, 3, 7, 7]


def test_segment_single_cls_zeroes_the_semantic_classes_too():
    out = _convert(_rows(), task="segment", masks=_planes(), single_cls=True)
    assert out["cls"].abs().sum() == 0 and out["sem_masks"].abs().sum() == 0


def test_segment_batch_of_no_rows_at_all():
    targets = torch.zeros(0, 6)
    out = _convert(targets, task="segment", masks=torch.zeros(2, 4, 4, dtype=torch.uint8))
    assert out["masks"].dtype == torch.float32 and out["sem_masks"].abs().sum() == 0
    assert out["cls"].shape == (0, 1) and out["bboxes"].shape == (0, 4)


def test_rows_of_another_task_are_refused_naming_the_task():
    with pytest.raises(ValueError, match=r"do not fit the 'obb' task's rows of 7 columns.*--task obb"):
        _convert(_rows(), task="obb")
    with pytest.raises(ValueError, match=r"'pose' task's rows of 12 columns"):
        _convert(_rows([0.0] * 3, [0.0] * 3, [0.0] * 3), task="pose", kpt_shape=(2, 3))
    with pytest.raises(ValueError, match="carries no masks.*--task segment"):
        _convert(_rows(), task="segment")
