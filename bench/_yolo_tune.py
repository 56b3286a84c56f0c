"""``bench/vs_ultralytics.py --what tune``: N concurrent Ray Tune trials on one pixpool daemon against the same N trials each with ``cache=ram``.

Runs in one driver process, with the Python of a venv that has Ultralytics, Ray Tune and pixpool
(``pip install 'pixpool[ultralytics,tune]'``). Each search is a fresh child process
(``--child ARM``); the arms alternate, every pair is reported.

- ``ultralytics`` arm: Ultralytics' own ``YOLO(model).tune(use_ray=True, cache="ram", ...)``:
  each trial builds its own dataset and caches every training image in its own memory (and
  its validation images: ``cache`` is one setting), with ``W`` dataloader workers.
- ``pixpool`` arm: ``pixpool.integrations.ultralytics.tune(...)``: one daemon (``W`` workers)
  started by the search, every trial a ``PixpoolDetectionTrainer`` attached to it.

Both: ``yolo11n.yaml`` from scratch, the same epochs, imgsz, batch and search (Ray's random
search over ``SPACE``, ``iterations`` = N trials, all N at once: Ray is started with N x
Ultralytics' CPUs per trial), CPU, ``plots=False``, coco128 or ``--data``. Measured by the driver: the wall
time of the child (Ray's start and stop included, in both arms) and the total PSS of every
process under it (the trials, Ray's own processes, the daemon and its workers;
``/proc/PID/smaps_rollup``) every 0.5 s, whose peak is reported. Each trial's final
mAP50-95 and any trial error come from the child.

Usage: ``VENV/bin/python bench/vs_ultralytics.py --what tune [--trials 3] [--epochs 1]
[--time HOURS] [--imgsz 320] [--batch 16] [--workers 1] [--pairs 5] [--dtype float32]
[--data data.yaml] [--json out.json]``. At scale (the set of ``bench/derive_set.py``, 640),
``--time`` bounds each trial so that a pair takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MIB, alternate, load, parser, table  # noqa: E402
from _yolo_train import PssSampler, _coco128_yaml  # noqa: E402

# The augmentation both arms sweep (what a tuning run of the data path varies).
SPACE = {"mosaic": (0.0, 1.0), "degrees": (0.0, 10.0), "hsv_h": (0.0, 0.05), "scale": (0.2, 0.8)}
ARMS = ("ultralytics", "pixpool")


# -- child: one search -----------------------------------------------------------------------
def child(arm: str, opts: argparse.Namespace) -> None:
    from ray import tune as ray_tune

    from pixpool.integrations.ultralytics.tuning import search_space, summary_lines

    args = dict(
        data=opts.data,
        model="yolo11n.yaml",
        epochs=opts.epochs,
        imgsz=opts.imgsz,
        batch=opts.batch,
        workers=opts.workers,
        device="cpu",
        plots=False,
        iterations=opts.trials,
        search_alg="random",
        project=opts.project,
        name="search",
    )
    if opts.time:
        args["time"] = opts.time  # Ultralytics' own bound on each trial's training, in hours
        # time= re-plans the epochs as it goes, which a stream that fixed its mosaic-closing epoch
        # at attach refuses with close_mosaic; both arms train with mosaic throughout.
        args["close_mosaic"] = 0
    if arm == "pixpool":
        from pixpool.integrations.ultralytics import tune

        results = tune(**args, space=SPACE, concurrent=opts.trials, dtype=opts.dtype)
    else:
        import ray
        from ultralytics import YOLO
        from ultralytics.utils import NUM_THREADS

        # As tune() starts Ray for the pixpool arm: all N trials at once.
        ray.init(num_cpus=opts.trials * NUM_THREADS, include_dashboard=False)
        try:
            model = YOLO(args.pop("model"))
            results = model.tune(use_ray=True, cache="ram", space=search_space(SPACE, ray_tune), **args)
        finally:
            ray.shutdown()
    metrics = [r.metrics.get("metrics/mAP50-95(B)") if r.error is None else None for r in results]
    Path(opts.result).write_text(json.dumps({"mAP50_95": metrics, "trials": summary_lines(results)}))


# -- driver ------------------------------------------------------------------------------------
def _run_arm(arm: str, opts: argparse.Namespace, data: Path, work: Path, tag: str) -> dict:
    result = work / f"{tag}.json"
    cmd = [sys.executable, __file__, "--child", arm, "--result", str(result), "--data", str(data),
           "--trials", str(opts.trials), "--epochs", str(opts.epochs), "--imgsz", str(opts.imgsz),
           "--batch", str(opts.batch), "--workers", str(opts.workers), "--project", str(work / tag),
           "--dtype", opts.dtype, "--time", str(opts.time or 0)]  # fmt: skip
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(work / "ycfg")}
    t0 = time.perf_counter()
    with open(work / f"{tag}.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        with PssSampler([proc.pid]) as pss:
            code = proc.wait()
    wall = time.perf_counter() - t0
    if code != 0:
        tail = (work / f"{tag}.log").read_text(errors="replace")[-3000:]  # the folder goes with the run
        raise RuntimeError(f"{arm} search failed (exit {code}); the end of its log:\n{tail}")
    return {"arm": arm, "wall_s": wall, "peak_pss": pss.peak, **json.loads(result.read_text())}


def _table(rows: list[dict]) -> str:
    header = ["pair", "arm", "wall (s)", "peak total PSS (MiB)", "trials finished", "mAP50-95 of each trial"]
    out = [
        [r["pair"], r["arm"], f"{r['wall_s']:.0f}", f"{r['peak_pss'] / MIB:.0f}",
         f"{sum(m is not None for m in r['mAP50_95'])}/{len(r['mAP50_95'])}",
         " ".join("-" if m is None else f"{m:.4f}" for m in r["mAP50_95"])]
        for r in rows
    ]  # fmt: skip
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        out.append(["median", arm, f"{statistics.median(r['wall_s'] for r in mine):.0f}",
                    f"{statistics.median(r['peak_pss'] for r in mine) / MIB:.0f}", "", ""])  # fmt: skip
    return table(header, out, left=2)


def _per_pair(rows: list[dict]) -> str:
    """pixpool / Ultralytics per pair, wall and peak PSS: the arms of a pair ran back to back."""
    by = {(r["pair"], r["arm"]): r for r in rows}
    pairs = sorted({r["pair"] for r in rows})
    wall = [by[p, "pixpool"]["wall_s"] / by[p, "ultralytics"]["wall_s"] for p in pairs]
    pss = [by[p, "pixpool"]["peak_pss"] / by[p, "ultralytics"]["peak_pss"] for p in pairs]
    return (
        f"pixpool / Ultralytics per pair: wall {statistics.median(wall):.2f}x ({', '.join(f'{x:.2f}' for x in wall)}), "
        f"peak PSS {statistics.median(pss):.2f}x ({', '.join(f'{x:.2f}' for x in pss)})"
    )


def main(argv: list[str] | None = None) -> int:
    from pixpool.shared.stream.config import DEFAULT_SNAPSHOT_DTYPE, SNAPSHOT_DTYPES

    p = parser(__doc__, "vs_ultralytics.py --what tune")
    p.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--project", help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help="data.yaml (default: coco128 beside the checkout)")
    p.add_argument("--trials", type=int, default=3, help="N: trials of each search, all at once")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument(
        "--time", type=float, default=None,
        help="Ultralytics' time= in hours: each trial's training stops there (then it validates)",
    )  # fmt: skip
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument(
        "--workers", type=int, default=1, help="Ultralytics' dataloader workers per trial, pixpool's daemon workers"
    )
    p.add_argument(
        "--dtype", default=DEFAULT_SNAPSHOT_DTYPE, choices=SNAPSHOT_DTYPES, help="the pixpool daemon's snapshot"
    )
    p.add_argument("--pairs", type=int, default=5, help="alternating pairs of both arms")
    p.add_argument("--json", default=None, help="write every measurement here")
    opts = p.parse_args(argv)
    if opts.child:
        child(opts.child, opts)
        return 0
    before = load()
    with tempfile.TemporaryDirectory(prefix="pixpool-tbench-") as tmp:
        work = Path(tmp)
        data = Path(opts.data).resolve() if opts.data else _coco128_yaml(work)
        rows = []
        for pair in range(opts.pairs):
            for arm in alternate(ARMS, pair):
                row = {"pair": pair, **_run_arm(arm, opts, data, work, f"p{pair}-{arm}")}
                rows.append(row)
                print(f"pair {pair} {arm}: {row['wall_s']:.1f} s, peak PSS {row['peak_pss'] / MIB:.0f} MiB, "
                      f"trials: {row['trials']}", flush=True)  # fmt: skip
        if opts.json:
            Path(opts.json).write_text(json.dumps({"rows": rows, "load": [before, load()]}, indent=1))
        print(_table(rows))
        print(_per_pair(rows))
        print(f"pixpool's snapshot: {opts.dtype}; command: {opts.command}")
        print(f"load average before / after: {before} / {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
