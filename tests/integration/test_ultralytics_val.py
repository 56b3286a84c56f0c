"""Ultralytics' validators reading the daemon's val split, against Ultralytics' own validation loader.

Skipped where Ultralytics is not importable (the normal suite's venv); CI runs this file in
its Ultralytics venv (``-m ultralytics``). Offline, CPU. Per task: detect and segment on
coco128 (its real box and segment labels; skipped without ``../shared``), pose and obb on
``pixpool synth --task pose|obb``, all at imgsz 320 with stride 32, one daemon per task.

- every validation batch (rect shapes, order, letterbox, labels, masks, keypoints, the
  geometry keys) equals Ultralytics' ``build_yolo_dataset(mode="val", rect=True)`` +
  ``build_dataloader`` batch: the images and mask planes byte for byte, classes and batch
  indices exactly, boxes and keypoints within 1e-6 (pixpool's reader holds a box as
  normalised corners, Ultralytics' as the label file's centre and size: the last float32
  bit differs);
- under DDP each rank's batches are those of Ultralytics' ``ContiguousDistributedSampler``;
- the same weights validated by Ultralytics' validator through pixpool's loader and
  through its own give the same metrics (to the printed precision, ``%.3g``) and the same
  validation losses (5 significant digits, as the trainer reports them). The weights are a
  seeded from-scratch model whose class-0 bias on one head level is raised, so it predicts
  boxes of that class there and its metrics are not all zero (detect, segment, pose; obb's
  are, and its losses carry the check).
"""

from __future__ import annotations

import os
import shutil
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "ultralytics",
    reason="Ultralytics is not installed here (pip install 'pixpool[ultralytics]'); CI runs these in its own venv",
)

import torch

from helpers.daemon import real_daemon
from helpers.yolo import coco128_yaml, synth_yaml
from pixpool.client.options import ClientOptions
from pixpool.integrations.ultralytics.val_loader import daemon_val_loader, val_settings
from pixpool.shared.errors import DatasetMismatchError

pytestmark = pytest.mark.ultralytics

IMGSZ = 320
STRIDE = 32
BATCH = 16
# The head levels whose class-0 score is raised (``_weights``): where each set's objects are found.
LEVELS = {"detect": (1,), "segment": (1,), "pose": (0, 1, 2), "obb": (1,)}
MODELS = {
    "detect": "yolo11n.yaml",
    "segment": "yolo11n-seg.yaml",
    "pose": "yolo11n-pose.yaml",
    "obb": "yolo11n-obb.yaml",
}


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path / "ultralytics-config"))


@pytest.fixture(scope="module")
def served(request, tmp_path_factory):
    """``served(task)`` -> (data.yaml, socket dir) of one daemon per task, kept for the module."""
    stack = ExitStack()
    daemons: dict[str, tuple[Path, str]] = {}

    def get(task: str) -> tuple[Path, str]:
        if task not in daemons:
            root = tmp_path_factory.mktemp(f"val-{task}")
            if task in ("detect", "segment"):
                coco128 = request.getfixturevalue("coco128")
                data = coco128_yaml(coco128, root, "labels" if task == "detect" else "labels-seg")
            else:
                data = synth_yaml(root, task)
            _, sdir = stack.enter_context(real_daemon(data, imgsz=IMGSZ, task=task))
            daemons[task] = (data, sdir)
        return daemons[task]

    with stack:
        yield get


def _pixpool_loader(sdir: str, *, rank: int = 0, world_size: int = 1):
    settings = val_settings(
        batch_size=BATCH,
        imgsz=IMGSZ,
        stride=STRIDE,
        rank=rank,
        world_size=world_size,
        mask_ratio=4,
        overlap_mask=True,
    )
    return daemon_val_loader(settings, ClientOptions(socket_dir=sdir, timeout_s=60))


def _ultralytics_dataset(data: Path, task: str):
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    cfg = get_cfg(overrides={"task": task, "imgsz": IMGSZ, "data": str(data)})
    info = check_det_dataset(str(data))
    return build_yolo_dataset(cfg, info["val"], BATCH, info, mode="val", rect=True, stride=STRIDE)


def _ultralytics_loader(data: Path, task: str):
    from ultralytics.data import build_dataloader

    return build_dataloader(_ultralytics_dataset(data, task), BATCH, 0, shuffle=False, rank=-1)


EXACT = ("img", "cls", "batch_idx", "masks", "sem_masks", "im_file", "ori_shape")
CLOSE = ("bboxes", "keypoints")


@pytest.mark.parametrize("task", ["detect", "segment", "pose", "obb"])
def test_val_batches_equal_ultralytics(served, task):
    data, sdir = served(task)
    theirs = list(_ultralytics_loader(data, task))
    ours = list(_pixpool_loader(sdir))
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert sorted(a) == sorted(b), i
        assert a["img"].shape == b["img"].shape, (i, tuple(b["img"].shape))  # the rect batch shape
        for key in EXACT:
            if key not in b:
                continue
            if isinstance(b[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype, (i, key)
                assert torch.equal(a[key], b[key]), (i, key)
            else:
                assert a[key] == b[key], (i, key)
        for key in CLOSE:
            if key in b:
                assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, (i, key)
                torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6)
        for (gain_a, pad_a), (gain_b, pad_b) in zip(a["ratio_pad"], b["ratio_pad"]):
            assert pad_a == pad_b and np.allclose(gain_a, gain_b, rtol=1e-12), i
        assert all(np.array_equal(x, y) for x, y in zip(a["resized_shape"], b["resized_shape"])), i


@pytest.mark.parametrize("world_size", [2, 3])
def test_val_ddp_shards_as_ultralytics(served, world_size):
    """Each rank's batches: the files and shapes of Ultralytics' ``ContiguousDistributedSampler`` share."""
    from torch.utils.data import DataLoader
    from ultralytics.data.build import ContiguousDistributedSampler

    data, sdir = served("detect")
    dataset = _ultralytics_dataset(data, "detect")
    for rank in range(world_size):
        sampler = ContiguousDistributedSampler(dataset, num_replicas=world_size, rank=rank)
        theirs = DataLoader(dataset, batch_size=BATCH, sampler=sampler, collate_fn=dataset.collate_fn)
        expected = [(b["im_file"], tuple(b["img"].shape)) for b in theirs]
        got = [(b["im_file"], tuple(b["img"].shape)) for b in _pixpool_loader(sdir, rank=rank, world_size=world_size)]
        assert got == expected, (rank, world_size)


def _weights(task: str, path: Path) -> Path:
    """A seeded from-scratch model whose class-0 score is raised on some head levels (``LEVELS``,
    module docstring), saved as a checkpoint both validators load."""
    from ultralytics.nn.tasks import DetectionModel, OBBModel, PoseModel, SegmentationModel

    torch.manual_seed(0)
    kinds = {"detect": DetectionModel, "segment": SegmentationModel, "obb": OBBModel}
    if task == "pose":
        model = PoseModel(MODELS[task], nc=2, data_kpt_shape=(5, 3), verbose=False)
    else:
        model = kinds[task](MODELS[task], nc=80 if task in ("detect", "segment") else None, verbose=False)
    for level in LEVELS[task]:
        model.model[-1].cv3[level][-1].bias.data[0] = 4.0
    torch.save({"model": model, "train_args": {}}, path)
    return path


def _validator(task: str):
    from ultralytics.models.yolo.detect import DetectionValidator
    from ultralytics.models.yolo.obb import OBBValidator
    from ultralytics.models.yolo.pose import PoseValidator
    from ultralytics.models.yolo.segment import SegmentationValidator

    return {
        "detect": DetectionValidator,
        "segment": SegmentationValidator,
        "pose": PoseValidator,
        "obb": OBBValidator,
    }[task]


def _val_losses(task: str, args: dict, ckpt: Path, loader) -> list[float]:
    """The mean validation loss items over ``loader``'s batches, as the trainer's validation
    computes them (``model.loss`` on the validator's preprocessed batch)."""
    from ultralytics.cfg import get_cfg

    model = torch.load(ckpt, weights_only=False)["model"].float().eval()
    model.args = get_cfg()
    validator = _validator(task)(args=dict(args))
    validator.device, validator.args.quantize = torch.device("cpu"), None
    total, count = None, 0
    with torch.no_grad():
        for batch in loader:
            batch = validator.preprocess(batch)
            items = model.loss(batch, model(batch["img"]))[1]
            items = torch.stack(list(items.values())) if isinstance(items, dict) else items
            total, count = (items if total is None else total + items), count + 1
    return (total / count).tolist()


@pytest.mark.parametrize("task", ["detect", "segment", "pose", "obb"])
def test_val_metrics_equal_ultralytics(served, task, tmp_path):
    data, sdir = served(task)
    ckpt = _weights(task, tmp_path / "weights.pt")
    args = dict(
        data=str(data),
        imgsz=IMGSZ,
        batch=BATCH,
        plots=False,
        task=task,
        device="cpu",
        rect=True,
        workers=0,
        verbose=False,
        project=str(tmp_path / "runs"),
    )
    V = _validator(task)
    theirs = V(args=dict(args))(model=str(ckpt))
    ours = V(dataloader=_pixpool_loader(sdir), args=dict(args))(model=str(ckpt))
    assert sorted(ours) == sorted(theirs)
    assert {k: f"{v:.3g}" for k, v in ours.items()} == {k: f"{v:.3g}" for k, v in theirs.items()}
    if task != "obb":  # the raised class-0 score finds objects: the metrics are not all zero
        assert any(v > 0 for v in theirs.values()), theirs
    loss_theirs = _val_losses(task, args, ckpt, _ultralytics_loader(data, task))
    loss_ours = _val_losses(task, args, ckpt, _pixpool_loader(sdir))
    assert [f"{v:.5g}" for v in loss_ours] == [f"{v:.5g}" for v in loss_theirs]
    assert not os.path.exists(tmp_path / "runs" / "val" / "labels")  # nothing but metrics was asked for


def test_trainer_validates_from_the_daemon(served, tmp_path, monkeypatch, coco128):
    """``PixpoolDetectionTrainer.get_dataloader(mode="val")`` reads the daemon's val split, its
    batches Ultralytics' own loader's; a daemon serving no val split leaves Ultralytics' loader."""
    from helpers.yolo import detection_trainer
    from pixpool.integrations.ultralytics.val_loader import ValLoader

    data, sdir = served("detect")
    monkeypatch.setenv("PIXPOOL_SOCKET_DIR", sdir)
    trainer = detection_trainer(data, tmp_path, imgsz=IMGSZ, batch=BATCH)
    trainer.model = trainer.get_model(cfg=MODELS["detect"], verbose=False)
    loader = trainer.get_dataloader(trainer.data["val"], batch_size=BATCH, rank=-1, mode="val")
    assert isinstance(loader, ValLoader)
    assert len(loader.dataset) == 128 and len(loader) == 8
    ours, theirs = next(iter(loader)), next(iter(_ultralytics_loader(data, "detect")))
    assert torch.equal(ours["img"], theirs["img"]) and ours["im_file"] == theirs["im_file"]
    other = tmp_path / "other" / "images"  # a val split the daemon does not serve: refused, naming both
    other.mkdir(parents=True)
    shutil.copy(next((data.parent / "images" / "train2017").iterdir()), other)
    with pytest.raises(DatasetMismatchError):
        trainer.get_dataloader(str(other), batch_size=BATCH, rank=-1, mode="val")
    with real_daemon(data, imgsz=IMGSZ, no_val=True) as (_, bare):
        monkeypatch.setenv("PIXPOOL_SOCKET_DIR", bare)
        trainer = detection_trainer(data, tmp_path / "bare", imgsz=IMGSZ, batch=BATCH)
        trainer.model = trainer.get_model(cfg=MODELS["detect"], verbose=False)
        loader = trainer.get_dataloader(trainer.data["val"], batch_size=BATCH, rank=-1, mode="val")
        assert not isinstance(loader, ValLoader)  # Ultralytics' own, said in one warning line
