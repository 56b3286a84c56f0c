"""Ultralytics' segment, pose and obb trainers on pixpool's stream.

Skipped where Ultralytics is not importable (the normal suite's venv); CI runs this file in
its Ultralytics venv (``-m ultralytics``). Offline as in ``test_ultralytics.py``: from-scratch
model yamls, ``plots=False``, CPU.

- the batch dict of each task against Ultralytics' own ``Format`` + ``collate_fn`` on the
  same instances (keys, dtypes, shapes, values);
- ``pixpool yolo train`` for one epoch at 320 per task (the issue's "done means"): segment
  ``yolo11n-seg.yaml`` on coco128's real segment labels, pose and obb on ``pixpool synth
  --task pose|obb``; Ultralytics' own validator reports the task's metrics;
- a trainer refuses a daemon serving another task, naming both;
- settings pixpool still cannot serve are refused by name before anything starts.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "ultralytics",
    reason="Ultralytics is not installed here (pip install 'pixpool[ultralytics]'); CI runs these in its own venv",
)

import psutil
import torch

from helpers.daemon import real_daemon
from helpers.yolo import coco128_yaml, results_rows, synth_yaml, yolo_train
from pixpool.client.options import ClientOptions
from pixpool.integrations.ultralytics.batches import to_ultralytics
from pixpool.shared.errors import ConfigError
from pixpool.shared.task import task_spec
from pixpool.shared.transport.store import DEFAULT
from pixpool.shared.wire.status import Status

pytestmark = pytest.mark.ultralytics

S = 64  # the hand-made batches' image side
MASK_RATIO = 4


@pytest.fixture
def offline(tmp_path, monkeypatch):
    env = {"YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path / "ultralytics-config")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


# -- the batch dict against Ultralytics' Format + collate_fn ---------------------------------


def _rect(x0, y0, x1, y1) -> list[list[float]]:
    """A rectangle's 4 corners, normalised by S (counter-clockwise from top left)."""
    return [[x0 / S, y0 / S], [x1 / S, y0 / S], [x1 / S, y1 / S], [x0 / S, y1 / S]]


# Per image: (class, polygon corners in pixels). Image 0 has overlapping instances of
# different areas (the overlap plane numbers them by descending area), image 2 none.
IMAGES = [
    [(3, (4, 4, 40, 30)), (7, (10, 10, 20, 20)), (1, (30, 36, 60, 62))],
    [(5, (8, 16, 56, 48))],
    [],
]


def _ultralytics_batch(task: str) -> dict:
    """Ultralytics' ``Format`` per image, then ``YOLODataset.collate_fn``, for ``IMAGES``."""
    from ultralytics.data.augment import Format
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.utils.instance import Instances

    samples = []
    for i, objects in enumerate(IMAGES):
        segments = np.array([_rect(*box) for _, box in objects], dtype=np.float32).reshape(-1, 4, 2)
        xy = segments.reshape(-1, 4, 2)
        boxes = np.concatenate([xy.min(1), xy.max(1)], axis=1) if len(xy) else np.zeros((0, 4), np.float32)
        keypoints = None
        if task == "pose":  # 2 points per instance: the box's top-left corner (visible) and centre (hidden)
            centre = (boxes[:, :2] + boxes[:, 2:]) / 2
            keypoints = np.stack(
                [np.c_[boxes[:, :2], np.full(len(boxes), 2.0)], np.c_[centre, np.zeros(len(boxes))]], axis=1
            ).astype(np.float32)
        instances = Instances(boxes, segments=segments, keypoints=keypoints, bbox_format="xyxy", normalized=True)
        labels = {
            "img": np.full((S, S, 3), 10 * i, dtype=np.uint8),
            "cls": np.array([[c] for c, _ in objects], dtype=np.float32).reshape(-1, 1),
            "instances": instances,
            "im_file": f"/d/{i}.jpg",
            "ori_shape": (S, S),
            "resized_shape": (S, S),
            "ratio_pad": (1.0, 1.0),
        }
        fmt = Format(
            bbox_format="xywh",
            normalize=True,
            return_mask=task == "segment",
            return_keypoint=task == "pose",
            return_obb=task == "obb",
            mask_ratio=MASK_RATIO,
            mask_overlap=True,
            batch_idx=True,
        )
        samples.append(fmt(labels))
    return YOLODataset.collate_fn(samples)


def _pixpool_batch(theirs: dict, task: str, kpt_shape=None) -> dict:
    """What pixpool's stream gives for the same instances (rows in the same order, the ring's
    uint8 mask planes), through ``to_ultralytics``."""
    columns = [theirs["batch_idx"][:, None], theirs["cls"], theirs["bboxes"]]
    if task == "pose":
        columns.append(theirs["keypoints"].reshape(len(theirs["cls"]), -1))
    targets = torch.cat(columns, 1).float()
    masks = theirs["masks"].to(torch.uint8) if task == "segment" else None
    return to_ultralytics(
        theirs["img"],
        targets,
        list(theirs["im_file"]),
        imgsz=S,
        shapes=lambda f: (S, S),
        task=task_spec(task),
        kpt_shape=kpt_shape,
        masks=masks,
    )


@pytest.mark.parametrize("task", ["detect", "segment", "pose", "obb"])
def test_batch_dict_is_ultralytics_format_and_collate(task):
    theirs = _ultralytics_batch(task)
    mine = _pixpool_batch(theirs, task, kpt_shape=(2, 3) if task == "pose" else None)
    assert sorted(mine) == sorted(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert (mine[key].dtype, tuple(mine[key].shape)) == (value.dtype, tuple(value.shape)), key
            torch.testing.assert_close(mine[key], value, rtol=0, atol=0, msg=key)
    if task == "segment":
        # One plane per image at S / mask_ratio; image 2 has no instance, so Ultralytics'
        # batch is float32 and so is ours.
        assert theirs["masks"].shape == (3, S // MASK_RATIO, S // MASK_RATIO)
        assert mine["masks"].dtype == torch.float32
        assert sorted(torch.unique(mine["masks"][0]).tolist()) == [0, 1, 2, 3]
    if task == "obb":
        assert mine["bboxes"].shape == (4, 5)


def test_segment_batch_without_an_empty_image_stays_uint8():
    theirs = _ultralytics_batch("segment")
    keep = theirs["batch_idx"] < 2
    two = {k: v for k, v in theirs.items()}
    two.update(
        {
            "masks": theirs["masks"][:2].to(torch.uint8),
            "sem_masks": theirs["sem_masks"][:2],
            "img": theirs["img"][:2],
            "im_file": theirs["im_file"][:2],
            "batch_idx": theirs["batch_idx"][keep],
            "cls": theirs["cls"][keep],
            "bboxes": theirs["bboxes"][keep],
        }
    )
    mine = _pixpool_batch(two, "segment")
    assert mine["masks"].dtype == torch.uint8  # Ultralytics' polygons2masks_overlap dtype for <= 255 instances
    torch.testing.assert_close(mine["sem_masks"], two["sem_masks"], rtol=0, atol=0)


# -- each trainer through Ultralytics' loss and validator, on a stand-in stream ----------------

# A tiny set per task: 8 images of 96 px, one or two filled rectangles each (two classes).
KPT_SHAPE, FLIP_IDX = [2, 3], [1, 0]


def _write_task_set(root: Path, task: str) -> Path:
    """A YOLO set of ``task`` in Ultralytics' label formats, and its data.yaml."""
    import cv2

    rng = np.random.default_rng(1)
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    side = 96
    for i in range(8):
        img = np.full((side, side, 3), 40, dtype=np.uint8)
        lines = []
        for k in range(1 + i % 2):
            cls = (i + k) % 2
            cx, cy = rng.uniform(28, 68, size=2)
            w, h = rng.uniform(16, 40, size=2)
            angle = rng.uniform(-0.6, 0.6) if task == "obb" else 0.0
            c, s_ = math.cos(angle), math.sin(angle)
            corners = np.array([[-w / 2, -h / 2], [w / 2, -h / 2], [w / 2, h / 2], [-w / 2, h / 2]])
            corners = corners @ np.array([[c, s_], [-s_, c]]) + [cx, cy]
            cv2.fillPoly(img, [corners.round().astype(np.int32)], (200, 80 + 120 * cls, 60))
            norm = (corners / side).clip(0, 1)
            if task == "pose":
                x0, y0 = norm.min(0)
                x1, y1 = norm.max(0)
                kpts = [x0, y0, 2, x1, y1, 1]  # top-left visible, bottom-right occluded
                values = [(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0, *kpts]
            else:
                values = norm.reshape(-1).tolist()
            lines.append(f"{cls} " + " ".join(f"{v:.6f}" for v in values))
        cv2.imwrite(str(root / "images" / "train" / f"im{i}.jpg"), img)
        (root / "labels" / "train" / f"im{i}.txt").write_text("\n".join(lines) + "\n")
    spec = ["train: images/train", "val: images/train", "names:", "  0: red", "  1: yellow"]
    if task == "pose":
        spec += [f"kpt_shape: {KPT_SHAPE}", f"flip_idx: {FLIP_IDX}"]
    (root / "data.yaml").write_text("\n".join(spec) + "\n")
    return root / "data.yaml"


def _stand_in_stream(task: str, trainer_args, data: dict):
    """A class in the place of ``pixpool.client.loader.Loader``: the stream of a daemon serving
    ``task``, its batches those of Ultralytics' own training loader in pixpool's form (target
    rows of ``TaskSpec.target_width`` columns, uint8 mask planes)."""
    from types import SimpleNamespace

    from ultralytics.data import build_dataloader, build_yolo_dataset

    from pixpool.shared.stream.sampler import num_batches

    class Stream:
        def __init__(self, settings, _options=None):
            self.settings = settings
            self.epoch = 0
            self.task = task
            self.kpt_shape = tuple(KPT_SHAPE) if task == "pose" else None
            self.flip_idx = tuple(FLIP_IDX) if task == "pose" else None
            self.spec = task_spec(task, kpt_shape=self.kpt_shape, flip_idx=self.flip_idx)
            self.names = [data["names"][i] for i in range(len(data["names"]))]
            self.dataset = build_yolo_dataset(trainer_args, data["train"], settings.batch_size, data, mode="train")
            self.client = SimpleNamespace(num_records=len(self.dataset))
            self.closed = False

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __len__(self):
            return num_batches(self.client.num_records, self.settings, self.epoch)

        def __iter__(self):
            loader = build_dataloader(self.dataset, self.settings.batch_size, 0, shuffle=True, rank=-1)
            for b in loader:
                columns = [b["batch_idx"][:, None], b["cls"], b["bboxes"]]
                if task == "pose":
                    columns.append(b["keypoints"].reshape(len(b["cls"]), -1))
                masks = b["masks"].to(torch.uint8) if task == "segment" else None
                yield SimpleNamespace(
                    images=b["img"], targets=torch.cat(columns, 1).float(), files=list(b["im_file"]), masks=masks
                )

        def close(self):
            self.closed = True

    return Stream


@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
def test_each_trainer_trains_and_validates_on_a_stream_of_its_task(task, tmp_path, offline, monkeypatch):
    from pixpool.integrations.ultralytics import trainer as trainer_module

    data_yaml = _write_task_set(tmp_path / "ds", task)
    args = {
        "data": str(data_yaml),
        "model": {"segment": "yolo11n-seg.yaml", "pose": "yolo11n-pose.yaml", "obb": "yolo11n-obb.yaml"}[task],
        "imgsz": 64,
        "batch": 4,
        "epochs": 1,
        "workers": 0,
        "device": "cpu",
        "plots": False,
        "project": str(tmp_path / "runs"),
        "name": "t",
        "exist_ok": True,
    }
    trainer = trainer_module.TRAINERS[task](overrides=args)
    assert trainer.args.task == task
    # A daemon answers (no child is started) and the stream is the stand-in.
    monkeypatch.setattr(trainer_module, "daemon_answers", lambda socket_dir: Status.from_wire({"workers": [{}]}))
    monkeypatch.setattr(trainer_module, "Loader", _stand_in_stream(task, trainer.args, trainer.data))
    # The stand-in serves no val split: validation keeps Ultralytics' own loader (test_ultralytics_val.py
    # validates from a real daemon).
    monkeypatch.setattr(trainer, "_own_val_reason", lambda: "the stand-in daemon serves no val split")
    trainer.train()
    with open(trainer.save_dir / "results.csv") as f:
        rows = [{k.strip(): float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    assert len(rows) == 1
    losses = {"segment": "train/seg_loss", "pose": "train/pose_loss", "obb": "train/box_loss"}[task]
    assert math.isfinite(rows[0][losses]) and rows[0][losses] > 0, rows[0]
    metric = {"segment": "metrics/mAP50(M)", "pose": "metrics/mAP50(P)", "obb": "metrics/mAP50(B)"}[task]
    assert 0.0 <= rows[0][metric] <= 1.0, rows[0]  # the task's own validator ran
    assert trainer.train_loader.stream.closed


# -- the stream's batches against Ultralytics' own loader, random steps off -------------------

# The route with every random step off: both loaders then letterbox each image, centred.
PLAIN = {
    k: 0.0
    for k in (
        "mosaic",
        "degrees",
        "translate",
        "scale",
        "shear",
        "perspective",
        "flipud",
        "fliplr",
        "hsv_h",
        "hsv_s",
        "hsv_v",
        "mixup",
        "cutmix",
        "copy_paste",
    )
}


def _ultralytics_loader_batch(data_yaml: Path, task: str, imgsz: int, batch: int) -> dict:
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    cfg = get_cfg(
        overrides={"data": str(data_yaml), "task": task, "imgsz": imgsz, "batch": batch, "workers": 0, **PLAIN}
    )
    data = check_det_dataset(cfg.data)
    dataset = build_yolo_dataset(cfg, data["train"], batch, data, mode="train", stride=32)
    return next(iter(build_dataloader(dataset, batch, 0, shuffle=False, rank=-1)))


def _corners(xywhr: torch.Tensor) -> np.ndarray:
    """(n, 4, 2) corners of normalised xywhr boxes, each box's corners in a fixed order (sorted),
    so that two descriptions of one rectangle (w, h swapped with the angle moved by pi/2) agree."""
    from ultralytics.utils.ops import xywhr2xyxyxyxy

    pts = xywhr2xyxyxyxy(xywhr.double()).numpy()
    return np.stack([p[np.lexsort((p[:, 1], p[:, 0]))] for p in pts]) if len(pts) else pts.reshape(0, 4, 2)


@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
def test_stream_batches_agree_with_ultralytics_loader(task, tmp_path, offline):
    from ultralytics.data.utils import check_det_dataset

    from pixpool.client.loader import Loader
    from pixpool.integrations.ultralytics import hyp
    from pixpool.integrations.ultralytics.loader import TrainLoader

    imgsz, batch = 320, 8
    data_yaml = _synth(tmp_path / "ds", task)
    theirs = _ultralytics_loader_batch(data_yaml, task, imgsz, batch)
    args = {**PLAIN, "task": task, "imgsz": imgsz, "batch": batch}
    settings = hyp.stream_settings(args, data=check_det_dataset(str(data_yaml)))
    settings = dataclasses.replace(settings, shuffle=False)
    with real_daemon(data_yaml, imgsz=imgsz, workers=1, task=task) as (_, sdir):
        loader = TrainLoader(Loader(settings, ClientOptions(socket_dir=sdir, zero_copy=False)))
        try:
            assert loader.task == task
            mine = next(iter(loader))
            mine = {k: v.clone() if hasattr(v, "clone") else v for k, v in mine.items()}
        finally:
            loader.close()
    assert sorted(mine) == sorted(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):  # masks too: float32 where an image of the batch is empty, on both sides
            assert (mine[key].dtype, tuple(mine[key].shape)) == (value.dtype, tuple(value.shape)), key
    assert mine["im_file"] == theirs["im_file"]
    np.testing.assert_array_equal(mine["batch_idx"].numpy(), theirs["batch_idx"].numpy())
    # The two letterbox with different rounding of the offset: positions within 1.5 pixels.
    pixel = 1.5 / imgsz
    if task == "segment":
        _masks_agree(mine, theirs, batch, pixel)
        return
    np.testing.assert_array_equal(mine["cls"].numpy(), theirs["cls"].numpy())
    if task == "obb":
        np.testing.assert_allclose(_corners(mine["bboxes"]), _corners(theirs["bboxes"]), atol=pixel)
    else:
        np.testing.assert_allclose(mine["bboxes"].numpy(), theirs["bboxes"].numpy(), atol=pixel)
    if task == "pose":
        np.testing.assert_array_equal(mine["keypoints"][..., 2].numpy(), theirs["keypoints"][..., 2].numpy())
        seen = mine["keypoints"][..., 2] > 0
        np.testing.assert_allclose(
            mine["keypoints"][..., :2][seen].numpy(), theirs["keypoints"][..., :2][seen].numpy(), atol=pixel
        )


def _masks_agree(mine: dict, theirs: dict, batch: int, pixel: float) -> None:
    """Per image: the same instances (class, box within ``pixel``), each instance's mask pixels
    (its number in the plane is its row's position) mostly the same, the classes at the pixels
    both planes give one instance the same. Rows of nearly equal mask area may be numbered in
    either order (each side measures the area on its own rendering), so rows are matched by box."""
    side = theirs["masks"].shape[-1]
    assert mine["masks"].shape == theirs["masks"].shape == (batch, side, side)
    for i in range(batch):
        rows_m = torch.nonzero(mine["batch_idx"] == i)[:, 0]
        rows_t = torch.nonzero(theirs["batch_idx"] == i)[:, 0]
        plane_m, plane_t = mine["masks"][i].long(), theirs["masks"][i].long()
        assert int(plane_m.max()) == int(plane_t.max()) == len(rows_t), i
        for k_t, r_t in enumerate(rows_t.tolist()):
            dist = (mine["bboxes"][rows_m] - theirs["bboxes"][r_t]).abs().max(dim=1).values
            k_m = int(dist.argmin())
            r_m = int(rows_m[k_m])
            assert float(dist[k_m]) <= pixel and float(mine["cls"][r_m]) == float(theirs["cls"][r_t]), (i, k_t)
            ours, ref = plane_m == k_m + 1, plane_t == k_t + 1
            inter, union = int((ours & ref).sum()), int((ours | ref).sum())
            assert union == 0 or inter / union > 0.6, (i, k_t, inter, union)
        covered = (plane_m > 0) & (plane_t > 0)
        either = int(((plane_m > 0) | (plane_t > 0)).sum())
        assert either == 0 or int(covered.sum()) / either > 0.85, i
        both = covered & (mine["sem_masks"][i] == theirs["sem_masks"][i])
        assert int(both.sum()) >= 0.8 * int(covered.sum()), i  # the same class under most covered pixels


# -- pixpool yolo train, one epoch at 320 per task -----------------------------------------


def _coco128_segment(coco128: Path, root: Path) -> Path:
    """coco128's images with its real segment labels (``labels-seg``) in the YOLO layout both
    loaders read (images/ -> labels/), and a data.yaml with the 80 COCO names."""
    return coco128_yaml(coco128, root, "labels-seg")


def _synth(root: Path, task: str) -> Path:
    """``pixpool synth OUT --task TASK``: the synthetic set of ``task`` and its data.yaml."""
    return synth_yaml(root, task)


# task -> (model yaml, the loss columns of results.csv, the validator's metric columns)
TASK_RUNS = {
    "segment": (
        "yolo11n-seg.yaml",
        ("train/box_loss", "train/seg_loss", "train/cls_loss"),
        ("metrics/mAP50(M)", "metrics/mAP50-95(M)", "metrics/mAP50(B)"),
    ),
    "pose": (
        "yolo11n-pose.yaml",
        ("train/box_loss", "train/pose_loss", "train/cls_loss"),
        ("metrics/mAP50(P)", "metrics/mAP50-95(P)", "metrics/mAP50(B)"),
    ),
    "obb": ("yolo11n-obb.yaml", ("train/box_loss", "train/cls_loss"), ("metrics/mAP50(B)", "metrics/mAP50-95(B)")),
}


@pytest.mark.parametrize("task", sorted(TASK_RUNS))
def test_yolo_train_one_epoch_at_320_per_task(task, tmp_path, offline, request):
    model, losses, metrics = TASK_RUNS[task]
    if task == "segment":  # the coco128 fixture skips where ../shared/data is absent (a fresh clone)
        data = _coco128_segment(request.getfixturevalue("coco128"), tmp_path / "ds")
    else:
        data = _synth(tmp_path / "ds", task)
    project = tmp_path / "runs"
    proc = yolo_train(
        project, offline, 560, data=data, model=model, epochs=1, imgsz=320, batch=16, workers=2, device="cpu"
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "pixpool yolo train: done" in proc.stdout
    assert f"starting a daemon (2 workers, imgsz 320, task {task})" in proc.stderr
    rows = results_rows(project)
    assert [int(r["epoch"]) for r in rows] == [1]
    for key in losses:
        assert math.isfinite(rows[0][key]) and rows[0][key] > 0, (key, rows[0])
    for key in metrics:
        assert 0.0 <= rows[0][key] <= 1.0, (key, rows[0])  # Ultralytics' own validator ran
    assert (project / "run" / "weights" / "best.pt").is_file()
    log = (project / "run" / "pixpool-daemon.log").read_text()  # the daemon it started logs in the run folder
    daemon_pid = int(re.search(r"daemon (\d+) stopped", log).group(1))
    snapshot = re.search(r"snapshot (\S+) removed", log).group(1)
    ring = re.search(r"ring (\S+) removed", log).group(1)
    assert not psutil.pid_exists(daemon_pid)
    assert [seg for seg in DEFAULT.segments() if seg.startswith(snapshot) or seg == ring] == []


# -- refusals ---------------------------------------------------------------------------------


def test_a_segment_trainer_refuses_a_daemon_serving_detect(synthetic_copy, tmp_path, offline, monkeypatch):
    from pixpool.integrations.ultralytics.trainer import PixpoolSegmentationTrainer

    args = {
        "data": str(synthetic_copy / "data.yaml"),
        "model": "yolo11n-seg.yaml",
        "imgsz": 160,
        "batch": 8,
        "epochs": 1,
        "device": "cpu",
        "plots": False,
        "project": str(tmp_path / "runs"),
        "name": "t",
        "exist_ok": True,
    }
    with real_daemon(synthetic_copy / "data.yaml", imgsz=160, workers=1) as (_, sdir):
        monkeypatch.setenv("PIXPOOL_SOCKET_DIR", sdir)
        trainer = PixpoolSegmentationTrainer(overrides=args)
        assert trainer.args.task == "segment"
        with pytest.raises(ConfigError) as info:
            trainer.get_dataloader(trainer.data["train"], batch_size=8, rank=-1, mode="train")
    text = str(info.value)
    assert "serves the 'detect' task but the model trains 'segment'" in text and "--task segment" in text


@pytest.mark.parametrize(
    "pairs, said",
    [
        (["model=yolo11n-cls.yaml"], "task='classify' is not supported with pixpool"),
        (["model=yolo11n-seg.yaml", "overlap_mask=False"], "overlap_mask=False is not supported with pixpool"),
        (["model=yolo11n.yaml", "task=segment"], "task=segment but model=yolo11n.yaml is a detect model"),
        (["model=yolo11n-pose.yaml", "task=obb"], "task=obb but model=yolo11n-pose.yaml is a pose model"),
    ],
    ids=["classify", "overlap-mask-false", "detect-model-segment-task", "pose-model-obb-task"],
)
def test_yolo_train_refuses_what_the_ring_cannot_carry(synthetic_copy, tmp_path, offline, capsys, pairs, said):
    from pixpool.cli import main

    base = {"data": str(synthetic_copy / "data.yaml"), "epochs": "1", "imgsz": "160", "project": str(tmp_path / "runs")}
    base.update(p.split("=", 1) for p in pairs)
    assert main(["yolo", "train", *[f"{k}={v}" for k, v in base.items()]]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and lines[0].startswith("pixpool yolo: error: ") and said in lines[0], err[-2000:]
    children = [p for p in psutil.Process().children() if not any("resource_tracker" in part for part in p.cmdline())]
    assert "starting a daemon" not in err and not children
