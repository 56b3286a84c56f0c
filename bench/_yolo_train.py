"""``bench/vs_ultralytics.py --what train``: the same Ultralytics training fed by Ultralytics' own loader and by pixpool.

Runs in one driver process, with the Python of a venv that has Ultralytics and pixpool
(``pip install pixpool[ultralytics]``); every run is a fresh child process (``--child ARM``), the arms
alternate, and each repeat runs both arms at each concurrency (1 run alone, then 2 runs at
once). Both arms train Ultralytics' ``yolo11n.yaml`` from scratch with the same arguments
(seed, epochs, imgsz, batch, ``close_mosaic``, ``plots=False``, CPU) on coco128, and both
validate with Ultralytics' own validator and loader (inline, no workers).

- ``ultralytics`` arm: Ultralytics' ``DetectionTrainer`` with ``cache=ram`` and ``W``
  dataloader workers for training (Ultralytics sets 0 on a CPU; the bench gives it the same
  number of background processes pixpool gets).
- ``pixpool`` arm: ``PixpoolDetectionTrainer``; the driver starts one daemon per run (``W``
  workers, ``pixpool serve`` as a child) before the trainer(s) start and stops it after; with
  2 concurrent runs both attach to that one daemon.

Measured per run (in the child, from Ultralytics' callbacks): wall time of each training
epoch (``on_train_epoch_start`` -> ``on_train_epoch_end``, validation excluded), the time
spent waiting for the next batch (``on_train_batch_end`` or epoch start -> the next
``on_train_batch_start``, i.e. inside the loader's ``next``), the epoch losses, and the final
mAP50 / mAP50-95 of Ultralytics' final validation. Measured by the driver: the total PSS of
every process of the arm (trainers, their loader workers, the daemon and its workers;
``/proc/PID/smaps_rollup``), sampled every 0.5 s; the peak is reported.

Usage: ``VENV/bin/python bench/vs_ultralytics.py --what train [--epochs 3] [--imgsz 320] [--batch 16]
[--workers 1] [--repeats 5] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import COCO128, MIB, alternate, load, parser, table  # noqa: E402


# -- child: one training run ------------------------------------------------------------
def child(arm: str, opts: argparse.Namespace) -> None:
    from ultralytics import YOLO
    from ultralytics.models.yolo.detect import DetectionTrainer

    from pixpool.integrations.ultralytics.trainer import PixpoolDetectionTrainer

    workers = opts.workers
    record: dict = {"arm": arm, "epochs": [], "pid": os.getpid()}
    clock = {"last": 0.0, "wait": 0.0, "start": 0.0, "batches": 0}

    def epoch_start(trainer) -> None:
        clock.update(last=time.perf_counter(), wait=0.0, start=time.perf_counter(), batches=0)
        record.setdefault("train_start", time.time())

    def batch_start(trainer) -> None:
        clock["wait"] += time.perf_counter() - clock["last"]
        clock["batches"] += 1

    def batch_end(trainer) -> None:
        clock["last"] = time.perf_counter()

    def epoch_end(trainer) -> None:
        seconds = time.perf_counter() - clock["start"]
        losses = {k: float(v) for k, v in (trainer.tloss or {}).items()}
        record["epochs"].append(
            {
                "epoch": trainer.epoch,
                "seconds": seconds,
                "wait_s": clock["wait"],
                "batches": clock["batches"],
                "losses": losses,
            }
        )
        record["train_end"] = time.time()

    base = PixpoolDetectionTrainer if arm == "pixpool" else DetectionTrainer

    class Trainer(base):
        def get_dataloader(self, dataset_path, batch_size=16, rank=0, mode="train"):
            self.args.workers = workers if mode == "train" else 0
            return super().get_dataloader(dataset_path, batch_size, rank, mode)

    model = YOLO("yolo11n.yaml")
    for event, fn in (
        ("on_train_epoch_start", epoch_start),
        ("on_train_batch_start", batch_start),
        ("on_train_batch_end", batch_end),
        ("on_train_epoch_end", epoch_end),
    ):
        model.add_callback(event, fn)
    args = dict(
        data=opts.data,
        epochs=opts.epochs,
        imgsz=opts.imgsz,
        batch=opts.batch,
        close_mosaic=opts.close_mosaic,
        seed=opts.seed,
        device="cpu",
        plots=False,
        val=False,
        project=opts.project,
        name=arm,
        exist_ok=True,
        verbose=False,
    )
    if arm == "ultralytics":
        args["cache"] = "ram"
    t0 = time.perf_counter()
    metrics = model.train(trainer=Trainer, **args)
    record["total_s"] = time.perf_counter() - t0
    results = metrics.results_dict
    record["mAP50"], record["mAP50_95"] = float(results["metrics/mAP50(B)"]), float(results["metrics/mAP50-95(B)"])
    Path(opts.result).write_text(json.dumps(record))


# -- driver -----------------------------------------------------------------------------
def _coco128_yaml(folder: Path) -> Path:
    ann = json.loads((COCO128 / "annotations" / "instances_train2017.json").read_text())
    names = [c["name"] for c in sorted(ann["categories"], key=lambda c: c["id"])]
    path = folder / "coco128.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "path": str(COCO128),
                "train": "images/train2017",
                "val": "images/train2017",
                "names": dict(enumerate(names)),
            }
        )
    )
    return path


class PssSampler:
    """Total PSS of some process trees, every ``interval_s``, in a thread; ``peak`` in bytes."""

    def __init__(self, roots: list[int], interval_s: float = 0.5):
        self.roots, self.interval_s, self.peak, self.samples = list(roots), interval_s, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _pids(self) -> set[int]:
        pids = set()
        for root in self.roots:
            try:
                p = psutil.Process(root)
                pids.add(root)
                pids.update(c.pid for c in p.children(recursive=True))
            except psutil.Error:
                pass
        return pids

    def _run(self) -> None:
        from pixpool.shared.transport.procmem import process_memory

        while not self._stop.wait(self.interval_s):
            total = sum(m.pss for m in process_memory(self._pids()))
            self.samples.append((time.time(), total))
            self.peak = max(self.peak, total)

    def __enter__(self) -> PssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def _run_arm(arm: str, concurrent: int, opts: argparse.Namespace, data: Path, work: Path, tag: str) -> dict:
    from pixpool.client.child import serve_child
    from pixpool.shared.stream.config import DaemonConfig
    from pixpool.shared.stream.flags import to_argv

    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(work / "ycfg")}
    results = [work / f"{tag}-{i}.json" for i in range(concurrent)]
    t0 = time.perf_counter()

    def start_children(extra_env: dict) -> list[subprocess.Popen]:
        return [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    arm,
                    "--result",
                    str(results[i]),
                    "--data",
                    str(data),
                    "--epochs",
                    str(opts.epochs),
                    "--imgsz",
                    str(opts.imgsz),
                    "--batch",
                    str(opts.batch),
                    "--workers",
                    str(opts.workers),
                    "--close-mosaic",
                    str(opts.close_mosaic),
                    "--seed",
                    str(i),
                    "--project",
                    str(work / f"{tag}-{i}"),
                ],
                env={**env, **extra_env},
                stdout=subprocess.DEVNULL,
                stderr=open(work / f"{tag}-{i}.log", "w"),
            )
            for i in range(concurrent)
        ]

    def wait(procs: list[subprocess.Popen]) -> None:
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError(f"{arm} run failed (exit {p.returncode}); see {work}/{tag}-*.log")

    if arm == "pixpool":
        train_yaml = work / f"{tag}-train.yaml"
        d = yaml.safe_load(data.read_text())
        train_yaml.write_text(
            yaml.safe_dump(
                {"train": str(COCO128 / d["train"]), "names": [d["names"][i] for i in range(len(d["names"]))]}
            )
        )
        config = DaemonConfig(data=str(train_yaml), imgsz=opts.imgsz, workers=opts.workers, no_val=True)
        with serve_child(to_argv(config), timeout_s=600) as (daemon, sdir, _):
            procs = start_children({"PIXPOOL_SOCKET_DIR": sdir})
            with PssSampler([daemon.pid] + [p.pid for p in procs]) as pss:
                wait(procs)
    else:
        procs = start_children({})
        with PssSampler([p.pid for p in procs]) as pss:
            wait(procs)
    wall = time.perf_counter() - t0
    records = [json.loads(r.read_text()) for r in results]
    start, end = min(r["train_start"] for r in records), max(r["train_end"] for r in records)
    in_training = [v for t, v in pss.samples if start <= t <= end] or [pss.peak]
    return {"arm": arm, "concurrent": concurrent, "wall_s": wall, "peak_pss": max(in_training), "runs": records}


def _summary(rows: list[dict]) -> list[dict]:
    out = []
    for concurrent in sorted({r["concurrent"] for r in rows}):
        for arm in ("ultralytics", "pixpool"):
            mine = [r for r in rows if r["arm"] == arm and r["concurrent"] == concurrent]
            runs = [run for r in mine for run in r["runs"]]
            epoch_s = [e["seconds"] for run in runs for e in run["epochs"]]
            wait = sum(e["wait_s"] for run in runs for e in run["epochs"]) / sum(epoch_s)
            last = [run["epochs"][-1]["losses"] for run in runs]
            out.append(
                {
                    "arm": arm,
                    "concurrent": concurrent,
                    "repeats": len(mine),
                    "epoch_s_median": statistics.median(epoch_s),
                    "data_wait_share": wait,
                    "peak_pss_mib": statistics.median(r["peak_pss"] for r in mine) / MIB,
                    "mAP50": statistics.mean(run["mAP50"] for run in runs),
                    "mAP50_95": statistics.mean(run["mAP50_95"] for run in runs),
                    "mAP50_each": [round(run["mAP50"], 4) for run in runs],
                    "last_epoch_loss": statistics.mean(sum(loss.values()) for loss in last),
                }
            )
    return out


def _table(summary: list[dict]) -> str:
    header = ["loader", "runs at once", "training epoch (median s)", "waiting for data", "peak total PSS (MiB)",
              "final mAP50", "final mAP50-95", "last-epoch loss"]  # fmt: skip
    rows = [
        [s["arm"], s["concurrent"], f"{s['epoch_s_median']:.2f}", f"{100 * s['data_wait_share']:.1f}%",
         f"{s['peak_pss_mib']:.0f}", f"{s['mAP50']:.4f}", f"{s['mAP50_95']:.4f}", f"{s['last_epoch_loss']:.3f}"]
        for s in summary
    ]  # fmt: skip
    return table(header, rows, left=2)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, "vs_ultralytics.py --what train")
    p.add_argument("--child", choices=["ultralytics", "pixpool"], help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--project", help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help="data.yaml (default: coco128 beside the checkout)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--close-mosaic", type=int, default=1)
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=1, help="Ultralytics' dataloader workers, pixpool's daemon workers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5, help="alternating repeats of both arms at each concurrency")
    p.add_argument("--concurrency", default="1,2")
    p.add_argument("--json", default=None, help="write every measurement here")
    opts = p.parse_args(argv)
    if opts.child:
        child(opts.child, opts)
        return 0
    before = load()
    with tempfile.TemporaryDirectory(prefix="pixpool-ybench-") as tmp:
        work = Path(tmp)
        data = Path(opts.data) if opts.data else _coco128_yaml(work)
        rows = []
        for repeat in range(opts.repeats):
            for concurrent in [int(n) for n in opts.concurrency.split(",")]:
                for arm in alternate(("ultralytics", "pixpool"), repeat):
                    row = _run_arm(arm, concurrent, opts, data, work, f"r{repeat}-c{concurrent}-{arm}")
                    rows.append(row)
                    epochs = [round(e["seconds"], 2) for r in row["runs"] for e in r["epochs"]]
                    print(f"repeat {repeat} {arm} x{concurrent}: {row['wall_s']:.1f} s, peak PSS "
                          f"{row['peak_pss'] / MIB:.0f} MiB, mAP50 {[round(r['mAP50'], 4) for r in row['runs']]}, "
                          f"epochs {epochs}", flush=True)  # fmt: skip
        summary = _summary(rows)
        if opts.json:
            Path(opts.json).write_text(
                json.dumps({"rows": rows, "summary": summary, "load": [before, load()]}, indent=1)
            )
        print(_table(summary))
        print(f"load average before / after: {before} / {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
