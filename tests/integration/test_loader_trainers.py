"""``attach()`` under trainers nobody here wrote: Lightning's ``Trainer.fit`` moves each batch
with its own collection utilities and must get every record once per epoch; a closed loader
says it is closed.

Integration tests: one spawned daemon over the synthetic set (24 records), CPU only.
"""

from __future__ import annotations

import time

import pytest
import torch

from helpers.daemon import WAIT_S, real_daemon
from pixpool.client import attach
from pixpool.client.batch import Batch
from pixpool.shared.errors import ClosedError

IMGSZ = 64
RECORDS = 24


@pytest.fixture(scope="module")
def daemon_dir(synthetic_data):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        yield d


def test_lightning_fits_two_epochs_on_attach_each_record_once_per_epoch(daemon_dir):
    lightning = pytest.importorskip("lightning")

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, stride=4)
            self.head = torch.nn.Linear(4, 1)
            self.seen: dict[int, list[int]] = {}

        def training_step(self, batch, batch_idx):
            assert isinstance(batch, Batch)  # Lightning's device transfer rebuilt it whole
            images, targets = batch
            assert batch.epoch == self.current_epoch and batch.batch == batch_idx
            assert len(batch.files) == images.shape[0] == len(batch.indices)
            self.seen.setdefault(batch.epoch, []).extend(batch.indices.tolist())
            features = self.conv(images.float() / 255).mean(dim=(2, 3))
            return self.head(features).pow(2).mean() + 0 * targets.sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    model = Tiny()
    trainer = lightning.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with attach(daemon_dir, batch_size=5, seed=4, imgsz=IMGSZ, mosaic=0.5, timeout_s=WAIT_S) as loader:
        trainer.fit(model, train_dataloaders=loader)
    assert sorted(model.seen) == [0, 1]
    for epoch, indices in model.seen.items():
        assert sorted(indices) == list(range(RECORDS)), f"epoch {epoch}"
    assert model.seen[0] != model.seen[1]  # shuffled per epoch, as a DataLoader(shuffle=True)


def test_a_closed_loader_says_so(daemon_dir):
    loader = attach(daemon_dir, batch_size=8, seed=1, imgsz=IMGSZ, timeout_s=WAIT_S)
    with loader:
        batches = iter(loader)
        first = next(batches)  # a batch held across close() stays the user's
    assert loader.closed and first.images.shape[0] == 8
    with pytest.raises(ClosedError, match="closed pixpool loader"):
        for _images, _targets in loader:
            pass
    with pytest.raises(ClosedError, match=r"len\(\) of a closed pixpool loader"):
        len(loader)
    with pytest.raises(ClosedError, match="is closed"):
        next(batches)  # the iterator that was running when it closed
    with pytest.raises(ClosedError, match="is closed"):
        loader.client.epoch(0)
    loader.close()  # closing again is harmless


def test_pixpool_train_and_attach_without_a_daemon_fail_at_once(tmp_path, capsys):
    from pixpool.cli import main
    from pixpool.shared.errors import DaemonNotFound

    missing = tmp_path / "no-daemon-here"
    t0 = time.monotonic()
    rc = main(["train", "--socket-dir", str(missing), "--project", str(tmp_path / "run"), "--no-progress"])
    assert rc == 1 and time.monotonic() - t0 < 2.0 + 1.0
    err = capsys.readouterr().err
    assert f"no pixpool daemon at {missing}" in err and f"pixpool serve DATA --socket-dir {missing}" in err
    assert "--wait-s" in err
    t0 = time.monotonic()
    with pytest.raises(DaemonNotFound, match="does not exist"):
        attach(missing, batch_size=4, imgsz=IMGSZ)
    assert time.monotonic() - t0 < 2.0 + 1.0
