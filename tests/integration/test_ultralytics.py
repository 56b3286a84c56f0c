"""Ultralytics' trainer on pixpool's stream: ``pixpool yolo train``, the batch layout, DDP shards.

Skipped where Ultralytics is not importable (the normal suite's venv); CI runs this file in
a second venv with ``torch==2.14.1 torchvision==0.29.1 ultralytics``. Everything runs
offline: ``YOLO_OFFLINE=1``, ``YOLO_CONFIG_DIR`` in the test's folder, a from-scratch model
yaml (no weights), ``plots=False`` (no font), CPU (no AMP check).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip(
    "ultralytics",
    reason="Ultralytics is not installed here (pip install 'pixpool[ultralytics]'); CI runs these in its own venv",
)

import psutil
import yaml

from helpers.daemon import real_daemon
from helpers.yolo import PLAIN, results_rows, yolo_train
from helpers.yolo import detection_trainer as _trainer
from pixpool.client.options import ClientOptions
from pixpool.integrations.ultralytics import hyp
from pixpool.shared.errors import ConfigError
from pixpool.shared.stream.config import AugmentConfig
from pixpool.shared.transport.store import DEFAULT

pytestmark = pytest.mark.ultralytics


@pytest.fixture
def offline(tmp_path, monkeypatch):
    env = {"YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path / "ultralytics-config")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def test_ultralytics_defaults_map_onto_pixpool_defaults():
    from ultralytics.utils import DEFAULT_CFG_DICT

    # Every key the mapping names is one of Ultralytics' own settings (``augmentations``, a
    # list of Albumentations transforms, exists only as a Python argument of ``train``).
    assert set(hyp.AUGMENT_KEYS) | set(hyp.SEGMENT_KEYS) | set(hyp.STREAM_KEYS) | set(hyp.UNSUPPORTED) - {
        "augmentations"
    } <= set(DEFAULT_CFG_DICT)
    cfg = hyp.augment_config(DEFAULT_CFG_DICT)
    mine = AugmentConfig().to_dict()
    theirs = cfg.to_dict()
    # imgsz: Ultralytics always names one; pixpool's default (None) is the daemon's.
    assert mine["imgsz"] is None and theirs["imgsz"] == DEFAULT_CFG_DICT["imgsz"]
    assert {k: theirs[k] for k in mine if k not in ("close_mosaic", "epochs", "imgsz")} == {
        k: mine[k] for k in mine if k not in ("close_mosaic", "epochs", "imgsz")
    }
    assert (cfg.close_mosaic, cfg.epochs) == (DEFAULT_CFG_DICT["close_mosaic"], DEFAULT_CFG_DICT["epochs"])
    # The segment defaults (mask_ratio, overlap_mask) are Ultralytics' too.
    segment = hyp.augment_config({**DEFAULT_CFG_DICT, "task": "segment"}).to_dict()
    assert {k: segment[k] for k in mine if k not in ("close_mosaic", "epochs", "imgsz")} == {
        k: mine[k] for k in mine if k not in ("close_mosaic", "epochs", "imgsz")
    }
    assert (segment["mask_ratio"], segment["overlap_mask"]) == (
        DEFAULT_CFG_DICT["mask_ratio"],
        DEFAULT_CFG_DICT["overlap_mask"],
    )


def test_yolo_train_trains_and_validates_offline(synthetic_copy, tmp_path, offline):
    project = tmp_path / "runs"
    proc = yolo_train(
        project,
        offline,
        300,
        data=synthetic_copy / "data.yaml",
        model="yolo11n.yaml",
        epochs=2,
        imgsz=320,
        batch=8,
        workers=1,
        device="cpu",
        close_mosaic=1,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "pixpool yolo train: done" in proc.stdout
    assert "starting a daemon (1 workers, imgsz 320, task detect)" in proc.stderr
    started = re.search(
        r"pixpool: started daemon (\d+) at (\S+): snapshot (\S+) \(\d+ records, imgsz 320, task detect, uint8\), 1 workers",
        proc.stderr,
    )
    assert started, proc.stderr[-4000:]
    rows = results_rows(project)
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    for r in rows:
        for key in ("train/box_loss", "train/cls_loss", "train/dfl_loss"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r)
        for key in ("metrics/mAP50(B)", "metrics/mAP50-95(B)"):
            assert 0.0 <= r[key] <= 1.0, (key, r)  # Ultralytics' validator ran
    assert (project / "run" / "weights" / "best.pt").is_file()
    # Ultralytics knows the task of yolo11n.yaml from its head, as its own `yolo train` does.
    assert "Unable to automatically guess model task" not in proc.stderr, proc.stderr[-4000:]
    # The daemon's log is in the run folder, not on Ultralytics' progress bars.
    assert "INFO pixpool.server." not in proc.stderr, proc.stderr[-4000:]  # its warnings stay
    log = (project / "run" / "pixpool-daemon.log").read_text()
    assert re.findall(r"trainer (\d+) attached", log) == ["1"], log
    # The daemon the command started is gone, with its ring and snapshot.
    daemon_pid = int(re.search(r"daemon (\d+) stopped", log).group(1))
    snapshot = re.search(r"snapshot (\S+) removed", log).group(1)
    ring = re.search(r"ring (\S+) removed", log).group(1)
    assert not psutil.pid_exists(daemon_pid)
    left = [seg for seg in DEFAULT.segments() if seg.startswith(snapshot) or seg == ring]
    assert left == [], left


def test_yolo_train_says_which_running_daemon_it_uses(synthetic_copy, tmp_path, offline):
    """Attached to a running daemon, the command names it (socket, pid, snapshot, workers, imgsz,
    task) and leaves it running. The same run takes time= (Ultralytics' trainer stops after the
    first epoch that passes it), batch=-1 (AutoBatch picks the size before the stream attaches;
    16 on a CPU) and an imgsz pair (trained at its larger side, as Ultralytics' trainer does)."""
    from pixpool.shared.transport import endpoint as ep
    from pixpool.shared.transport.control import request_status

    project = tmp_path / "runs"
    with real_daemon(synthetic_copy / "data.yaml", imgsz=160, workers=1) as (daemon, sdir):
        status = request_status(ep.ipc_endpoint(sdir), timeout_s=10.0)
        proc = yolo_train(
            project,
            offline,
            300,
            data=synthetic_copy / "data.yaml",
            model="yolo11n.yaml",
            epochs=5,
            time=0.0001,  # 0.36 s: over after the first optimiser step
            close_mosaic=0,
            imgsz="[128,160]",
            batch=-1,
            device="cpu",
            socket_dir=sdir,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert daemon.is_alive()  # a daemon the run did not start keeps serving
    text = proc.stderr
    line = next((ln for ln in text.splitlines() if "using the running daemon" in ln), None)
    assert line is not None, text[-4000:]
    snap = status["snapshot"]
    wanted = (
        f"using the running daemon {status['daemon']['pid']} at {ep.socket_path(sdir)}: snapshot {snap['name']} "
        f"({snap['records']} records, imgsz 160, task detect, uint8), 1 workers"
    )
    assert wanted in line, line
    assert "starting a daemon" not in text and "started daemon" not in text
    said = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", proc.stdout + text)  # Ultralytics logs to stdout, in colour
    assert "AutoBatch: intended for GPU devices, using default batch-size 16" in said, said[-4000:]
    assert "1 epochs completed" in said, said[-4000:]
    assert len(results_rows(project)) == 1  # time= ended the run after its first epoch


def test_yolo_train_without_imgsz_takes_the_running_daemons(synthetic_copy, tmp_path, offline):
    """No imgsz= given: the run trains at the size the running daemon serves (160), not at
    Ultralytics' default 640, which that daemon would refuse; the run folder's args.yaml says so."""
    project = tmp_path / "runs"
    with real_daemon(synthetic_copy / "data.yaml", imgsz=160, workers=1) as (_, sdir):
        proc = yolo_train(
            project,
            offline,
            300,
            data=synthetic_copy / "data.yaml",
            model="yolo11n.yaml",
            epochs=1,
            time=0.0001,
            close_mosaic=0,
            batch=8,
            device="cpu",
            socket_dir=sdir,
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "pixpool: imgsz=160, the running daemon's" in proc.stderr, proc.stderr[-4000:]
    args = yaml.safe_load((project / "run" / "args.yaml").read_text())
    assert args["imgsz"] == 160, args


def test_yolo_train_dtype_float32_starts_a_float32_daemon_and_other_dtypes_are_refused(
    synthetic_copy, tmp_path, offline
):
    """dtype=float32 (pixpool's key, not Ultralytics'): the daemon the run starts holds the float32
    snapshot (four times the default uint8's bytes, the same batches); another value is refused by name."""
    project = tmp_path / "runs"
    proc = yolo_train(project, offline, 300, data=synthetic_copy / "data.yaml", model="yolo11n.yaml", epochs=1,
                      time=0.0001, close_mosaic=0, imgsz=160, batch=8, workers=1, device="cpu", dtype="float32")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"pixpool: started daemon \d+ at \S+: snapshot \S+ \(\d+ records, imgsz 160, task detect, float32\)", proc.stderr), proc.stderr[-4000:]  # fmt: skip
    refused = yolo_train(tmp_path / "runs2", offline, 120, data=synthetic_copy / "data.yaml", model="yolo11n.yaml",
                         epochs=1, imgsz=160, device="cpu", dtype="int8")  # fmt: skip
    assert refused.returncode != 0 and "dtype" in refused.stderr and "int8" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "runs2" / "run").exists()


def _ultralytics_batch(data_yaml, imgsz: int, batch: int) -> dict:
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    cfg = get_cfg(overrides=dict(data=str(data_yaml), imgsz=imgsz, batch=batch, workers=0, **PLAIN))
    data = check_det_dataset(cfg.data)
    dataset = build_yolo_dataset(cfg, data["train"], batch, data, mode="train", stride=32)
    return next(iter(build_dataloader(dataset, batch, 0, shuffle=False, rank=-1)))


def test_batches_have_ultralytics_layout_and_values(synthetic_copy, offline):
    from pixpool.client.loader import Loader
    from pixpool.integrations.ultralytics.loader import TrainLoader

    imgsz, batch = 320, 8
    theirs = _ultralytics_batch(synthetic_copy / "data.yaml", imgsz, batch)
    settings = dataclasses.replace(hyp.stream_settings({**PLAIN, "imgsz": imgsz, "batch": batch}), shuffle=False)
    with real_daemon(synthetic_copy / "data.yaml", imgsz=imgsz, workers=1) as (_, sdir):
        loader = TrainLoader(Loader(settings, ClientOptions(socket_dir=sdir, zero_copy=False)))
        try:
            mine = next(iter(loader))
            mine = {k: v.clone() if hasattr(v, "clone") else v for k, v in mine.items()}
        finally:
            loader.close()
    assert sorted(mine) == sorted(theirs)
    for key in ("img", "cls", "bboxes", "batch_idx"):
        assert (mine[key].dtype, tuple(mine[key].shape)) == (theirs[key].dtype, tuple(theirs[key].shape)), key
    assert mine["im_file"] == theirs["im_file"]
    assert mine["ori_shape"] == theirs["ori_shape"] and mine["resized_shape"] == theirs["resized_shape"]
    np.testing.assert_allclose(np.array(mine["ratio_pad"]), np.array(theirs["ratio_pad"]), rtol=1e-9)
    np.testing.assert_array_equal(mine["batch_idx"].numpy(), theirs["batch_idx"].numpy())
    np.testing.assert_array_equal(mine["cls"].numpy(), theirs["cls"].numpy())
    # Normalised cx, cy, w, h: the same boxes to within a pixel (the two resize the image to
    # imgsz with different rounding of the letterbox offset).
    np.testing.assert_allclose(mine["bboxes"].numpy(), theirs["bboxes"].numpy(), atol=1.0 / imgsz)
    assert float(mine["bboxes"].min()) >= 0.0 and float(mine["bboxes"].max()) <= 1.0
    # The same RGB pixels up to resampling (one bilinear resize each, different offsets).
    diff = (mine["img"].float() - theirs["img"].float()).abs()
    assert float(diff.mean()) < 4.0, float(diff.mean())
    means = mine["img"].float().mean(dim=(0, 2, 3)) - theirs["img"].float().mean(dim=(0, 2, 3))
    assert float(means.abs().max()) < 1.0, means  # channel order: RGB in both


def test_ddp_ranks_attach_with_their_rank_and_take_disjoint_shards(synthetic_copy, tmp_path, offline, monkeypatch):
    from pixpool.integrations.ultralytics import trainer as trainer_module

    with real_daemon(synthetic_copy / "data.yaml", imgsz=160, workers=1) as (_, sdir):
        monkeypatch.setenv("PIXPOOL_SOCKET_DIR", sdir)
        seen = {}
        for rank in (0, 1):
            trainer = _trainer(synthetic_copy / "data.yaml", tmp_path)
            monkeypatch.setattr(trainer_module, "RANK", rank)  # as in a rank Ultralytics' DDP launcher spawned
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", "2")
            loader = trainer.train_loader = trainer.get_dataloader(
                trainer.data["train"], batch_size=4, rank=rank, mode="train"
            )  # as _build_train_pipeline does
            try:
                settings = loader.stream.settings
                assert (settings.rank, settings.world_size, settings.batch_size) == (rank, 2, 4)
                assert (settings.augment.epochs, settings.augment.close_mosaic) == (4, 2)
                assert len(loader.sampler) == 12 and len(loader) == 3 and len(loader.dataset) == 24
                # The epoch callback pins the stream to the trainer's epoch.
                trainer.epoch = 3
                trainer_module._pin_epoch(trainer)
                seen[rank] = [f for b in loader for f in b["im_file"]]
                assert loader.stream.epoch == 3
                assert len(loader.dataset.labels) == 24  # Ultralytics' own labels (max_det, class weights)
            finally:
                loader.close()
    assert not set(seen[0]) & set(seen[1])
    assert len(set(seen[0]) | set(seen[1])) == 24


def test_a_daemon_serving_other_classes_is_refused(synthetic_copy, tmp_path, offline, monkeypatch):
    import yaml

    other = tmp_path / "other.yaml"
    spec = yaml.safe_load((synthetic_copy / "data.yaml").read_text())
    spec["names"] = {i: f"class{i}" for i in range(len(spec["names"]))}
    spec["path"] = str(synthetic_copy)
    other.write_text(yaml.safe_dump(spec))
    with real_daemon(synthetic_copy / "data.yaml", imgsz=160, workers=1) as (_, sdir):
        monkeypatch.setenv("PIXPOOL_SOCKET_DIR", sdir)
        trainer = _trainer(other, tmp_path)
        with pytest.raises(ConfigError, match="serves 8 classes"):
            trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")


@pytest.mark.parametrize(
    "extra, named",
    [
        (["bgr=0.5"], "bgr=0.5"),
        (["model=yolo11n-cls.yaml"], "task='classify'"),
        (["fraction=0.5"], "fraction=0.5"),
        (["time=0.5"], "time=0.5 with close_mosaic=10"),  # Ultralytics' default close_mosaic
        (["rect=True"], "rect=True"),
    ],
)
def test_yolo_train_refuses_unsupported_settings_by_name(synthetic_copy, tmp_path, offline, capsys, extra, named):
    from pixpool.cli import main

    pairs = {
        "data": str(synthetic_copy / "data.yaml"),
        "model": "yolo11n.yaml",
        "epochs": "1",
        "imgsz": "160",
        "project": str(tmp_path / "runs"),
    }
    pairs.update(p.split("=", 1) for p in extra)
    assert main(["yolo", "train", *[f"{k}={v}" for k, v in pairs.items()]]) == 1
    err = capsys.readouterr().err
    assert named in err and "not supported with pixpool" in err
    # Refused before any daemon started (multiprocessing's resource tracker lives on by design).
    children = [p for p in psutil.Process().children() if not any("resource_tracker" in part for part in p.cmdline())]
    assert "starting a daemon" not in err and not children


# No network, whatever the machine: a proxy on a closed port refuses every download at once.
_NO_NETWORK = {k: "http://127.0.0.1:9" for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY")}


@pytest.mark.parametrize(
    "pair, said",
    [
        ("epoch=3", "error: epoch=3 is not an Ultralytics setting (did you mean epochs=?)"),
        ("data={tmp}/missing.yaml", "error: data={tmp}/missing.yaml: '{tmp}/missing.yaml' does not exist"),
        ("model=yolo11n.pt", "error: model=yolo11n.pt: the weights could not be downloaded from https://"),
    ],
    ids=["mistyped-key", "missing-data", "offline-weights"],
)
def test_yolo_train_mistakes_end_in_one_line_and_leave_no_run_folder(synthetic_copy, tmp_path, offline, pair, said):
    pair, said = pair.format(tmp=tmp_path), said.format(tmp=tmp_path)
    pairs = {"data": str(synthetic_copy / "data.yaml"), "model": "yolo11n.yaml", "epochs": "1", "imgsz": "64"}
    pairs.update([pair.split("=", 1)])
    argv = [*[f"{k}={v}" for k, v in pairs.items()], "device=cpu", f"project={tmp_path / 'runs'}", "name=run"]
    proc = subprocess.run(
        [sys.executable, "-m", "pixpool.cli", "yolo", "train", *argv],
        env={**os.environ, **offline, **_NO_NETWORK},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("pixpool yolo: error: "), errors
    assert not (tmp_path / "runs" / "run").exists(), "a refused run left its run folder"


@pytest.mark.parametrize("how", ["ctrl-c", "error"])
def test_yolo_train_stops_the_daemon_it_started_on_ctrl_c_and_on_errors(synthetic_copy, tmp_path, offline, how):
    from helpers.daemon import wait_for

    log_path = tmp_path / "stderr.log"
    pairs = [
        f"data={synthetic_copy / 'data.yaml'}",
        "model=yolo11n.yaml",
        "epochs=50",
        "imgsz=160",
        "batch=8",
        "workers=1",
        "device=cpu",
        f"project={tmp_path / 'runs'}",
        "name=run",
        "exist_ok=True",
    ]
    if how == "error":
        pairs.append("optimizer=NoSuchOptimizer")  # Ultralytics raises building it, after the stream attached
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pixpool.cli", "yolo", "train", *pairs],
            env={**os.environ, **offline},
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            # A shell runs background jobs with SIGINT ignored, and Python keeps an inherited
            # SIG_IGN: the run under test must take Ctrl-C as a terminal's foreground job does.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        daemon_log = tmp_path / "runs" / "run" / "pixpool-daemon.log"  # where the daemon it started logs
        ring = wait_for(
            lambda: daemon_log.is_file() and re.search(r"ring (\S+) of \d+ bytes", daemon_log.read_text()),
            timeout_s=120,
            what="the trainer attached",
        ).group(1)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    text = log_path.read_text()
    assert code == (130 if how == "ctrl-c" else 1), text[-3000:]
    started = re.search(r"pixpool: started daemon (\d+) at \S+: snapshot (\S+) ", text)
    daemon_pid, snapshot = int(started.group(1)), started.group(2)
    assert not psutil.pid_exists(daemon_pid) or psutil.Process(daemon_pid).status() == psutil.STATUS_ZOMBIE
    left = [seg for seg in DEFAULT.segments() if seg.startswith(snapshot) or seg == ring]
    assert left == [], left


def test_single_cls_serves_the_dataset_and_zeroes_the_classes(synthetic_copy, tmp_path, offline, monkeypatch):
    import yaml

    trainer = _trainer(synthetic_copy / "data.yaml", tmp_path, single_cls=True)
    assert trainer.data["names"] == {0: "item"}  # Ultralytics' renaming
    # The daemon reads the label files with the dataset's own classes.
    assert trainer._train_split()["names"] == list(
        yaml.safe_load((synthetic_copy / "data.yaml").read_text())["names"].values()
    )
    with real_daemon(synthetic_copy / "data.yaml", imgsz=160, workers=1) as (_, sdir):
        monkeypatch.setenv("PIXPOOL_SOCKET_DIR", sdir)
        trainer.pixpool_socket_dir = sdir
        loader = trainer.get_dataloader(trainer.data["train"], batch_size=8, rank=-1, mode="train")
        try:
            batches = list(loader)
        finally:
            loader.close()
    assert sum(len(b["cls"]) for b in batches) > 0
    assert all(float(b["cls"].abs().sum()) == 0.0 for b in batches)
