"""Ultralytics' data-path arguments against Ultralytics' own code: each honoured one agrees with
what its loader or trainer does, each refused one stops the trainer at start by name.

Skipped where Ultralytics is not importable; CI runs it in its Ultralytics venv. The pure
side (what ``hyp`` accepts and refuses, the row filter) is ``unit/test_ultralytics_arg_map.py``;
``pixpool yolo train`` with ``time``, AutoBatch and an ``imgsz`` pair on a running daemon is
``test_ultralytics.py::test_yolo_train_says_which_running_daemon_it_uses``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from types import SimpleNamespace

import pytest

pytest.importorskip(
    "ultralytics",
    reason="Ultralytics is not installed here (pip install 'pixpool[ultralytics]'); CI runs these in its own venv",
)

import torch
import yaml

from helpers.daemon import real_daemon
from helpers.yolo import PLAIN, detection_trainer
from pixpool.integrations.ultralytics import hyp
from pixpool.integrations.ultralytics.batches import to_ultralytics
from pixpool.shared.errors import ConfigError

pytestmark = pytest.mark.ultralytics


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
    """Ultralytics offline, its settings in the test's folder."""
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path / "ultralytics-config"))


@pytest.mark.parametrize("imgsz", [[320, 640], [640, 320], [96, 160], [160]])
def test_an_imgsz_pair_trains_at_the_size_ultralytics_trainer_picks(imgsz):
    from ultralytics.utils.checks import check_imgsz

    # BaseTrainer._setup_train: check_imgsz(imgsz, stride=gs, floor=gs, max_dim=1).
    assert hyp.augment_config({"imgsz": imgsz}).imgsz == check_imgsz(imgsz, stride=32, floor=32, max_dim=1)


@pytest.mark.parametrize("value", [1.0, 1, 0.5, 64, [1.0, 0.5], [0.3, 1.0, 0.0], [1]])
def test_the_training_share_of_fraction_is_ultralytics(value):
    from ultralytics.data.utils import get_split_fraction

    assert hyp.train_fraction(value) == get_split_fraction(value, "train")


def _classes_per_file(batches) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for b in batches:
        for i, f in enumerate(b["im_file"]):
            out[f] += b["cls"][b["batch_idx"] == i].flatten().tolist()
    return dict(out)


def test_classes_batches_hold_the_rows_ultralytics_loader_keeps(synthetic_copy, tmp_path, monkeypatch):
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    data_yaml, imgsz, keep = synthetic_copy / "data.yaml", 160, [1, 3]
    cfg = get_cfg(overrides=dict(data=str(data_yaml), imgsz=imgsz, workers=0, classes=keep, **PLAIN))
    data = check_det_dataset(cfg.data)
    dataset = build_yolo_dataset(cfg, data["train"], 8, data, mode="train", stride=32)
    theirs = _classes_per_file(build_dataloader(dataset, 8, 0, shuffle=False, rank=-1))

    trainer = detection_trainer(data_yaml, tmp_path, classes=keep, **PLAIN)
    with real_daemon(data_yaml, imgsz=imgsz, workers=1) as (_, sdir):
        monkeypatch.setenv("PIXPOOL_SOCKET_DIR", sdir)
        trainer.pixpool_socket_dir = sdir
        loader = trainer.get_dataloader(trainer.data["train"], batch_size=8, rank=-1, mode="train")
        try:
            mine = _classes_per_file(list(loader))
            labels = loader.dataset.labels  # Ultralytics' own labels, filtered the same way
        finally:
            loader.close()
    assert sorted(mine) == sorted(theirs) and len(mine) == 24  # every image, background ones too
    for f in theirs:
        assert sorted(mine[f]) == sorted(theirs[f]), f
    kept = [c for v in mine.values() for c in v]
    assert kept and set(kept) <= set(keep)
    everything = [c for lb in labels for c in lb["cls"].flatten().tolist()]
    assert set(everything) <= set(keep)
    # The filter did something: the set has rows of the other classes.
    all_rows = [
        int(line.split()[0])
        for p in (synthetic_copy / "labels" / "train").glob("*.txt")
        for line in p.read_text().splitlines()
        if line.strip()
    ]
    assert set(all_rows) - set(keep)


def test_multi_scale_is_ultralytics_preprocess_on_the_batch_and_leaves_the_slot_alone():
    from ultralytics.models.yolo.detect import DetectionTrainer

    images = torch.randint(0, 255, (2, 3, 160, 160), dtype=torch.uint8)
    slot = images.clone()
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.2], [1, 2, 0.4, 0.4, 0.1, 0.3]], dtype=torch.float32)
    sizes = set()
    for seed in range(8):
        batch = to_ultralytics(images, targets, ["a.jpg", "b.jpg"], imgsz=160, shapes=lambda f: (160, 160))
        trainer = SimpleNamespace(
            device=torch.device("cpu"), args=SimpleNamespace(multi_scale=0.5, imgsz=160), stride=32
        )
        random.seed(seed)
        out = DetectionTrainer.preprocess_batch(trainer, batch)
        h, w = out["img"].shape[2:]
        assert h == w and h % 32 == 0 and 64 <= h <= 256 and out["img"].dtype == torch.float32
        sizes.add(h)
    assert len(sizes) > 1  # the size varies from batch to batch, as it does on Ultralytics' loader
    assert torch.equal(images, slot)  # the ring slot (zero-copy) is never written


def test_a_grayscale_dataset_is_refused_when_the_trainer_is_built(synthetic_copy, tmp_path):
    spec = yaml.safe_load((synthetic_copy / "data.yaml").read_text())
    spec.update(channels=1, path=str(synthetic_copy))
    gray = tmp_path / "gray.yaml"
    gray.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError) as info:
        detection_trainer(gray, tmp_path)
    assert info.value.field == "channels" and "channels=1" in str(info.value)
    assert not (tmp_path / "runs" / "t").exists()  # refused before the run: no run folder left


def test_classes_for_segment_is_refused_when_the_trainer_is_built(synthetic_copy, tmp_path):
    from pixpool.integrations.ultralytics.trainer import PixpoolSegmentationTrainer

    args = dict(data=str(synthetic_copy / "data.yaml"), model="yolo11n-seg.yaml", classes=[0], device="cpu")
    with pytest.raises(ConfigError) as info:
        PixpoolSegmentationTrainer(overrides={**args, "project": str(tmp_path / "runs"), "name": "t", "plots": False})
    assert info.value.field == "classes" and "not supported for segment" in str(info.value)


def test_the_trainer_says_once_that_albumentations_would_change_ultralytics_route(
    synthetic_copy, tmp_path, monkeypatch, caplog
):
    import logging

    from ultralytics.models.yolo.detect import DetectionTrainer

    from pixpool.integrations.ultralytics import notices
    from pixpool.integrations.ultralytics import trainer as trainer_module
    from pixpool.shared.wire.status import Status

    trainer = detection_trainer(synthetic_copy / "data.yaml", tmp_path)
    status = Status.from_wire({"daemon": {"pid": 7}, "snapshot": {"name": "snap"}, "workers": []})
    monkeypatch.setattr(trainer_module, "daemon_answers", lambda socket_dir: status)  # a running daemon
    monkeypatch.setattr(DetectionTrainer, "train", lambda self: "trained")  # Ultralytics' loop: not under test
    real = notices.albumentations_line
    for installed in (True, False):
        spec = object() if installed else None  # what importlib finds for "albumentations"
        monkeypatch.setattr(notices, "albumentations_line", lambda spec=spec: real(find_spec=lambda name: spec))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pixpool"):
            assert trainer.train() == "trained"
        said = [r.getMessage() for r in caplog.records]
        assert said.count(notices.ALBUMENTATIONS_LINE) == (1 if installed else 0), said
        assert any(m.startswith("pixpool: using the running daemon 7 at ") for m in said), said
