"""``fit``: the reference detector trains on the daemon's stream, validates, checkpoints and
resumes exactly.

Integration tests: a spawned daemon over the synthetic set; training runs in this process on
the CPU with the "tiny" scale (a few seconds).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from helpers.daemon import WAIT_S, real_daemon
from pixpool.client.options import ClientOptions
from pixpool.client.train.fit import FitConfig, fit
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings

IMGSZ = 64


def _config(tmp_path, name: str, epochs: int, **extra) -> FitConfig:
    return FitConfig(
        epochs=epochs,
        scale="tiny",
        optimizer="AdamW",
        lr=0.002,
        project=str(tmp_path / name),
        progress=False,
        validate=False,
        log_every=1,
        record_digests=True,
        stream=StreamSettings(seed=5, batch_size=8, augment=AugmentConfig(imgsz=IMGSZ, mosaic=0.5)),
        **extra,
    )


def test_resume_continues_the_exact_run(synthetic_data, tmp_path):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        straight = fit(_config(tmp_path, "straight", 2), ClientOptions(socket_dir=d, timeout_s=WAIT_S))
        per_epoch = straight["steps"] // 2
        # Stopped at the end of epoch 0 of a 2-epoch run, as a killed run leaves its last.pt.
        first = fit(_config(tmp_path, "parts", 2, max_steps=per_epoch), ClientOptions(socket_dir=d, timeout_s=WAIT_S))
        last_pt = str(tmp_path / "parts" / "last.pt")
        # Only the checkpoint (and what this call prints and records): every setting comes back.
        resumed = fit(
            FitConfig(resume=last_pt, progress=False, log_every=1, record_digests=True),
            ClientOptions(socket_dir=d, timeout_s=WAIT_S),
        )
        with pytest.raises(ConfigError, match=r"--seed 6 \(field 'stream.seed'; the checkpoint has 5\)"):
            fit(
                dataclasses.replace(_config(tmp_path, "parts", 2, resume=last_pt), stream=StreamSettings(seed=6)),
                ClientOptions(socket_dir=d, timeout_s=WAIT_S),
            )
    assert [r["epoch"] for r in straight["history"]] == [0, 1] and resumed["start_epoch"] == 1
    assert resumed["run_dir"] == str(tmp_path / "parts") and resumed["epochs"] == 2
    assert first["history"][0]["loss"] == straight["history"][0]["loss"]
    assert resumed["history"][0]["data_sha256"] == straight["history"][1]["data_sha256"]  # the same batches...
    assert resumed["history"][0]["data_sha256"] != straight["history"][0]["data_sha256"]  # (each epoch its own)
    # ...and the same state and schedule: the same loss and learning rate, exactly.
    assert resumed["history"][0]["loss"] == straight["history"][1]["loss"]
    assert resumed["history"][0]["lr"] == straight["history"][1]["lr"]
    lines = (tmp_path / "parts" / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [0, 1]
    assert (tmp_path / "parts" / "best.pt").is_file() and resumed["checkpoint"].endswith("last.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts", "straight"]  # no folder for the refused run


def test_validation_reports_coco_map(synthetic_data, tmp_path):
    with real_daemon(synthetic_data.data_yaml, imgsz=IMGSZ, workers=1) as (_, d):  # the data.yaml serves its val: split
        report = fit(
            dataclasses.replace(_config(tmp_path, "val", 1), validate=True),
            ClientOptions(socket_dir=d, timeout_s=WAIT_S),
        )
    row = report["history"][0]
    assert 0.0 <= row["mAP50_95"] <= row["mAP50"] <= 1.0 and row["images"] == 24
    assert set(report) >= {"epochs", "final_loss", "metrics", "checkpoint", "images_per_s", "data_wait_fraction"}


@pytest.mark.slow
def test_the_detector_learns_the_synthetic_shapes(tmp_path):
    """Validation mAP@.5 after 16 epochs (48 images, 128 px, tiny, batches of 4, AdamW 0.003).

    Measured: 0.087, 0.044, 0.124 and 0.056 for stream seeds 0-3 (the demo's 30 epochs of 8 at
    0.002 reached 0.103, 0.080 and 0.058 for seeds 0, 1 and 3), and 0.000 for every epoch before
    the 8th: an untrained detector finds nothing. 0.03 is well above that chance level and
    well under what training reaches, so the test fails only if learning breaks. Batches of
    4 take more steps from fewer images than the demo's 8, which is what learns in half the
    epochs. Marked ``slow``: still about 30 s on two cores, the longest test of the suite.
    """
    import torch

    from pixpool.server.synthetic import write_synthetic

    data = write_synthetic(tmp_path / "data", num_images=48, seed=0)
    # One torch thread: two intra-op threads on two cores shared with the daemon's worker (and
    # whatever else runs) wait on each other; under load 2 this test took 171 s with them and
    # 51 s with one. fit() sets the process-wide count, so it is put back afterwards.
    threads = torch.get_num_threads()
    try:
        with real_daemon(data.data_yaml, imgsz=128, workers=1) as (_, d):
            config = FitConfig(
                epochs=16,
                scale="tiny",
                optimizer="AdamW",
                lr=0.003,
                project=str(tmp_path / "run"),
                progress=False,
                threads=1,
                stream=StreamSettings(seed=0, batch_size=4, augment=AugmentConfig(imgsz=128)),
            )
            report = fit(config, ClientOptions(socket_dir=d, timeout_s=WAIT_S))
    finally:
        torch.set_num_threads(threads)
    maps = [r["mAP50"] for r in report["history"]]
    assert maps[0] < 0.005 and report["metrics"]["mAP50"] > 0.03, maps
