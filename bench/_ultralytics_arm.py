"""The Ultralytics side of bench/vs_ultralytics.py and bench/memory.py: its own loader, run
with the Python of a venv where Ultralytics is installed (never pixpool's).

Imports Ultralytics, torch, numpy, cv2, yaml and ``_fidelity_stats`` (pure numpy, beside
this file); never pixpool, so it runs against any pixpool checkout. Prints one JSON object
on stdout (the last line); Ultralytics' own log goes to stderr.

The loader is the one Ultralytics' trainer builds: ``build_yolo_dataset`` (cache='ram',
mode 'train', so the training augment pipeline) and ``build_dataloader`` (its
``InfiniteDataLoader``), iterated in this process; the consumer touches each batch's image
tensor, as pixpool's trainer does.

Commands:

- ``throughput --workers W --task detect|segment|pose|obb --epochs E``: one warm-up epoch,
  then img/s over E epochs (the consumer touches the masks too where the task has them).
- ``hold --workers W [--consume]``: a loader that delivered two batches and keeps its workers and
  prefetched batches, for a PSS reading; prints ``{"pid": ..., "t_first": ...}`` (``time.time()``
  at its first batch), then waits for a line on stdin (``--consume``: reading batches meanwhile).
- ``collect --epochs E --seed S --out FILE.npz [--hsv 0]``: the stream's figures
  (``_fidelity_stats.batch_figures``), the HSV gains Ultralytics drew for each image and
  the hue change they caused, and the first 8 images with their boxes, in workers=0 so
  the seeds fix everything. With ``--task segment|pose|obb`` the task's own
  figures too: ``_fidelity_stats.mask_figures`` of its overlap masks,
  ``keypoint_figures`` of its keypoints, the OBB angles (radians, ``xywhr``'s r) with the
  image each belongs to; the task's route settings (``TASK_ROUTES``), HSV on.

How the HSV gains are observed, without copying Ultralytics' code: ``RandomHSV.apply_image``
is wrapped; while it runs, ``numpy.random.uniform`` is replaced by a recorder that calls
the original and keeps what it returned (the gains are drawn there, scaled by
hsv_h/s/v). The wrapper also reads the image before and after and measures the hue change
with OpenCV's 8-bit HSV.

Usage: ``/work/venv-ul/bin/python bench/_ultralytics_arm.py CMD --data-dir DIR ...`` where
DIR holds ``data.yaml`` and ``images/``, ``labels/`` (``_common.make_data_dir`` makes it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")  # no update checks, no downloads
os.environ.setdefault("YOLO_VERBOSE", "False")

import numpy as np

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fidelity_stats as fidelity_stats

DETECT = {
    "mosaic": 1.0,
    "translate": 0.1,
    "scale": 0.5,
    "fliplr": 0.5,
    "flipud": 0.0,
    "hsv_h": 0.015,
    "hsv_s": 0.7,
    "hsv_v": 0.4,
    "degrees": 0.0,
    "shear": 0.0,
    "perspective": 0.0,
    "mixup": 0.0,
    "copy_paste": 0.0,
    "cutmix": 0.0,
}
SEGMENT = {**DETECT, "copy_paste": 0.5}
# The route each task's benchmarks run: segment with copy-paste, as above; pose and
# obb the detect settings (Ultralytics' defaults for them are the detect ones; the pose route
# flips with the dataset's flip_idx, the synthetic obb set has boxes at every angle).
TASK_ROUTES = {"detect": DETECT, "segment": SEGMENT, "pose": DETECT, "obb": DETECT}
TASKS = tuple(TASK_ROUTES)
# The same routes as pixpool's attach options: its AugmentConfig has the same names, less the
# cutmix it lacks (0 in every route here).
PIXPOOL_ROUTES = {task: {k: v for k, v in r.items() if k != "cutmix"} for task, r in TASK_ROUTES.items()}
# Saturation / value below which a pixel's hue is too coarse to measure a shift on.
HUE_MIN_SV = 32
# The real stdout: Ultralytics' log is sent to stderr while a command runs.
_STDOUT = [sys.stdout]


def run(python: str, cmd: str, data_dir: Path, **options) -> dict:
    """From pixpool's side: this file's ``cmd`` run by ``python`` (a venv with Ultralytics), its JSON."""
    from _common import run_json

    argv = [python, str(Path(__file__).resolve()), cmd, "--data-dir", str(data_dir)]
    for k, v in options.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return run_json(argv)


def build_loader(
    data_dir: Path, *, task: str, workers: int, batch: int, imgsz: int, hsv: bool = True, geometry: dict | None = None
):
    import yaml
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset

    spec = yaml.safe_load((data_dir / "data.yaml").read_text())
    names = spec["names"]
    names = dict(enumerate(names)) if isinstance(names, list) else {int(k): v for k, v in names.items()}
    img_path = str(data_dir / spec["train"])
    data = {"names": names, "nc": len(names), "channels": 3, "train": img_path, "val": img_path, "path": str(data_dir)}
    for key in ("kpt_shape", "flip_idx"):  # pose: the keypoint layout and its left/right pairs
        if key in spec:
            data[key] = spec[key]
    hyp = dict(TASK_ROUTES[task])
    hyp.update(geometry or {})  # --geometry: degrees, shear, perspective (the general-affine route)
    if not hsv:
        hyp.update(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    cfg = get_cfg(
        overrides={
            "task": task,
            "imgsz": imgsz,
            "batch": batch,
            "cache": "ram",
            "workers": workers,
            "close_mosaic": 0,
            "plots": False,
            **hyp,
        }
    )
    dataset = build_yolo_dataset(cfg, img_path, batch, data, mode="train")
    loader = build_dataloader(dataset, batch=batch, workers=workers, shuffle=True, rank=-1, device="cpu")
    return dataset, loader


def _touch(batch: dict) -> None:
    """What a trainer reads first: the image tensor, and the mask planes where there are any."""
    int(batch["img"][0, 0, 0, 0])
    if "masks" in batch:
        int(batch["masks"][0, 0, 0])


def _timed_loader(args):
    """The loader ``throughput`` and ``hold`` time: the command line's task, workers, batch,
    imgsz and geometry overrides."""
    _, loader = build_loader(
        args.data_dir,
        task=args.task,
        workers=args.workers,
        batch=args.batch,
        imgsz=args.imgsz,
        geometry=json.loads(args.geometry),
    )
    return loader


def cmd_throughput(args) -> dict:
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    loader = _timed_loader(args)
    for batch in loader:  # warm-up epoch: workers started, first batches prefetched
        _touch(batch)
    n = 0
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        for batch in loader:
            _touch(batch)
            n += batch["img"].shape[0]
    secs = time.perf_counter() - t0
    loader.close()
    return {
        "arm": "ultralytics",
        "task": args.task,
        "workers": args.workers,
        "images": n,
        "seconds": secs,
        "img_per_s": n / secs,
    }


def _batches(loader):
    """Batches without end: epoch after epoch (``InfiniteDataLoader`` restarts no worker)."""
    while True:
        yield from loader


def cmd_hold(args) -> dict:
    import select

    import torch

    torch.set_num_threads(1)
    loader = _timed_loader(args)  # cache='ram': every image decoded and resized here
    it = _batches(loader)
    int(next(it)["img"][0, 0, 0, 0])
    t_first = time.time()  # wall clock: the measurer compares it with the moment it started this process
    int(next(it)["img"][0, 0, 0, 0])
    if not args.consume:
        time.sleep(1.0)  # let the workers fill their prefetch queues before the reading
    print(json.dumps({"pid": os.getpid(), "t_first": t_first}), file=_STDOUT[0], flush=True)
    # --consume: read at full speed, as a training step that waits for nothing else would, until a line arrives
    while args.consume and not select.select([sys.stdin], [], [], 0)[0]:
        _touch(next(it))
    sys.stdin.readline()
    del it
    loader.close()
    return {"pid": os.getpid(), "stopped": True}


class _HSVRecorder:
    """Wraps ``RandomHSV.apply_image``: records the gains drawn and the hue change made."""

    def __init__(self):
        self.gains: list[np.ndarray] = []
        self.hue_shift: list[float] = []

    def install(self) -> None:
        import cv2
        from ultralytics.data import augment

        original = augment.RandomHSV.apply_image
        recorder = self

        def apply_image(transform, labels, params=None):
            before = labels["img"].copy()
            drawn = []
            uniform = np.random.uniform

            def spy(*a, **k):
                value = uniform(*a, **k)
                drawn.append(np.array(value, dtype=np.float64))
                return value

            np.random.uniform = spy
            try:
                out = original(transform, labels, params)
            finally:
                np.random.uniform = uniform
            if drawn:
                r = drawn[0].ravel()[:3]
                recorder.gains.append(1.0 + r * np.array([transform.hgain, transform.sgain, transform.vgain]))
                hb = cv2.cvtColor(before, cv2.COLOR_BGR2HSV)
                ha = cv2.cvtColor(out["img"], cv2.COLOR_BGR2HSV)
                mask = (hb[..., 1] >= HUE_MIN_SV) & (hb[..., 2] >= HUE_MIN_SV)
                recorder.hue_shift.append(fidelity_stats.hue_shift(hb[..., 0], ha[..., 0], mask))
            return out

        augment.RandomHSV.apply_image = apply_image


def cmd_collect(args) -> dict:
    import random

    import torch

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    recorder = _HSVRecorder()
    recorder.install()
    _, loader = build_loader(
        args.data_dir, task=args.task, workers=0, batch=args.batch, imgsz=args.imgsz, hsv=bool(args.hsv)
    )
    parts, task_parts, angles, angle_image, grid, grid_boxes = [], [], [], [], [], []
    seen = 0
    for _ in range(args.epochs):
        for batch in loader:
            images = batch["img"].numpy()
            idx = batch["batch_idx"].numpy().astype(np.int64)
            boxes = batch["bboxes"].numpy()
            parts.append(fidelity_stats.batch_figures(images, idx, boxes[:, :4]))
            if args.task == "segment":
                task_parts.append(fidelity_stats.mask_figures(batch["masks"].numpy(), idx, boxes))
            elif args.task == "pose":
                task_parts.append(fidelity_stats.keypoint_figures(batch["keypoints"].numpy(), boxes))
            elif args.task == "obb":
                angles.append(boxes[:, 4].astype(np.float64))
                angle_image.append(idx + seen)
            seen += images.shape[0]
            for i in range(images.shape[0]):
                if len(grid) < 8:
                    grid.append(images[i])
                    grid_boxes.append(boxes[idx == i, :4])
    figures = fidelity_stats.concat(parts)
    if task_parts:
        figures.update(fidelity_stats.concat(task_parts))
    if args.task == "obb":
        figures.update(obb_angle=np.concatenate(angles), obb_angle_image=np.concatenate(angle_image))
    boxes_of = np.empty(len(grid_boxes), dtype=object)  # ragged: one (k, 4) array per image
    boxes_of[:] = grid_boxes
    np.savez_compressed(
        args.out,
        **figures,
        gains=np.array(recorder.gains).reshape(-1, 3),
        hue_shift=np.array(recorder.hue_shift),
        grid=np.stack(grid),
        grid_boxes=boxes_of,
    )
    return {"arm": "ultralytics", "images": int(figures["fill_share"].size), "out": str(args.out)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("throughput", "hold", "collect"):
        p = sub.add_parser(name)
        p.add_argument("--data-dir", type=Path, required=True)
        p.add_argument("--imgsz", type=int, default=640)
        p.add_argument("--batch", type=int, default=16)
        p.add_argument("--task", choices=TASKS, default="detect")
        p.add_argument("--workers", type=int, default=0)
        p.add_argument("--epochs", type=int, default=3)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--hsv", type=int, default=1)
        p.add_argument("--out", type=Path, default=None)
        p.add_argument("--geometry", default="{}", help="JSON object of degrees / shear / perspective overrides")
        p.add_argument("--consume", action="store_true", help="hold: keep reading batches until the line arrives")
    args = parser.parse_args(argv)
    # Ultralytics logs to stdout; keep stdout for the one JSON line.
    _STDOUT[0] = sys.stdout
    sys.stdout = sys.stderr
    try:
        result = {"throughput": cmd_throughput, "hold": cmd_hold, "collect": cmd_collect}[args.cmd](args)
    finally:
        sys.stdout = _STDOUT[0]
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
