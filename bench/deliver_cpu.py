"""bench/deliver_cpu.py: where the CPU of a delivered batch goes, process by process (issue 19 goal 1).

Runs in one process that only starts others. Each run is this file with ``--run`` in a fresh
interpreter: it prepares (or re-attaches) coco128's float32 snapshot at 640, starts a daemon
with W workers (spawned), reads one warm-up epoch in this process as a trainer
(``pixpool.client.attach``, the detect defaults of ``bench/vs_ultralytics.py``, batch 16, HSV on
the CPU, touching each batch's images as that benchmark's consumer does), then times
``--epochs`` epochs and reports, per delivered image, the CPU milliseconds of the daemon, of
each worker (``psutil`` user + system time) and of the trainer (``resource.getrusage``, its
ZeroMQ and heartbeat threads included), the workers' busy fraction (``busy_s`` from
``pixpool status`` over the wall time: how much of the time they had a part to render) and the
gap between batches at an epoch boundary against within an epoch.

With ``--base CHECKOUT`` (e.g. main's commit extracted with ``git archive``, its C kernel built
or copied in) each pair runs the base's code and this checkout's in alternating order, each
with ``PYTHONPATH`` putting that checkout's ``server``/``client``/``shared`` first as the
``pixpool`` package (as ``bench/serve_ab.py`` does); figures are medians over ``--pairs`` and the
ratios are paired. On a shared machine CPU milliseconds per image grow with the load (the
cores' caches and turbo are shared), so read the paired ratios and the shares.

``--route-python`` (with ``--base``): instead, the Python of the route alone, in this one
process: ``render_range`` over the same snapshot (4 batches of 16 per round) with the kernel
call replaced by a no-op in both, this checkout's code against the base's (imported as a
second package, ``pixbase``), ``--rounds`` alternating rounds, CPU ms per image and the
paired ratio.

Usage: ``python bench/deliver_cpu.py [--base CHECKOUT] [--pairs 3] [--workers 2] [--epochs 3]
[--route-python [--rounds 15]]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(workers: int, epochs: int) -> dict:
    """One run in this process (``--run``): the figures of the module docstring."""
    import resource

    import psutil

    sys.path.insert(0, str(HERE))
    import vs_ultralytics as vs

    root = Path(tempfile.mkdtemp(prefix="pxcpu-"))
    data = vs.make_data_dir(root, "detect") / "data.yaml"
    prep = vs.prepare(data, 640)
    proc, d = vs.start_daemon(data, 640, workers, "float32")
    try:
        vs.wait_ready(d, workers, proc)
        import torch

        import pixpool.client
        from pixpool.ops.status_client import query_status

        torch.set_num_threads(1)
        st = query_status(d)
        procs = {"daemon": psutil.Process(st["daemon"]["pid"])}
        procs.update({f"worker{i}": psutil.Process(w["pid"]) for i, w in enumerate(st["workers"])})

        def cpu() -> dict[str, float]:
            own = resource.getrusage(resource.RUSAGE_SELF)
            return {"trainer": own.ru_utime + own.ru_stime, **{k: sum(p.cpu_times()[:2]) for k, p in procs.items()}}

        with pixpool.client.attach(d, batch_size=16, seed=0, imgsz=640, timeout_s=300, **vs.ROUTES["detect"]) as loader:
            for batch in loader:  # warm-up epoch
                int(batch[0][0, 0, 0, 0])
            c0, busy0 = cpu(), [w["busy_s"] for w in query_status(d)["workers"]]
            t0 = time.perf_counter()
            images, stamps = 0, []
            for _ in range(epochs):
                for batch in loader:
                    int(batch[0][0, 0, 0, 0])
                    images += batch[0].shape[0]
                    stamps.append((batch.batch, time.perf_counter()))
            wall = time.perf_counter() - t0
            c1, busy1 = cpu(), [w["busy_s"] for w in query_status(d)["workers"]]
    finally:
        vs.stop_daemon(proc, d)
        vs.release(prep)
        shutil.rmtree(root, ignore_errors=True)
    ms = {k: (c1[k] - c0[k]) / images * 1e3 for k in c0}
    gaps = [(stamps[i][0], stamps[i][1] - stamps[i - 1][1]) for i in range(1, len(stamps))]
    return {
        "img_per_s": images / wall,
        "load": os.getloadavg()[0],
        "ms_per_img": ms,
        "workers_ms_per_img": sum(v for k, v in ms.items() if k.startswith("worker")),
        "total_ms_per_img": sum(ms.values()),
        "busy_fraction": [(b1 - b0) / wall for b0, b1 in zip(busy0, busy1)],
        "gap_ms_within_epoch": statistics.median([g for b, g in gaps if b != 0]) * 1e3,
        "gap_ms_at_epoch_start": statistics.median([g for b, g in gaps if b == 0] or [0.0]) * 1e3,
    }


def route_python(base: Path, rounds: int) -> dict:
    """``--route-python``: the route's Python per image (kernel stubbed), base against this checkout."""
    import importlib

    import numpy as np

    sys.path.insert(0, str(HERE))
    import vs_ultralytics as vs

    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot

    tmp = Path(tempfile.mkdtemp(prefix="pxcpu-route-"))
    _package_root(base.resolve(), tmp, name="pixbase")
    sys.path.insert(0, str(tmp))
    arms = {}
    for arm, pkg in (("base", "pixbase"), ("this", "pixpool")):
        batch = importlib.import_module(f"{pkg}.server.augment.batch")
        kernel = importlib.import_module(f"{pkg}.server.augment.kernel")
        config = importlib.import_module(f"{pkg}.shared.stream.config")
        kernel._kernel.render = lambda *a: None  # the Python around the kernel, not the kernel
        settings = config.StreamSettings(batch_size=16, seed=0, augment=config.AugmentConfig(imgsz=640))
        arms[arm] = (batch, settings)
    data = vs.make_data_dir(tmp / "data", "detect") / "data.yaml"
    prep = prepare_snapshot(load_dataset(str(data)), PrepareOptions(imgsz=640, processes=2))
    out = np.empty((16, 3, 640, 640), np.uint8)

    def run(arm: str, batches: int = 4) -> float:
        batch, settings = arms[arm]
        c0 = time.process_time()
        for b in range(batches):
            batch.render_range(prep.snapshot, settings, 0, b, 0, 16, images_out=out)
        return (time.process_time() - c0) / batches / 16 * 1e3

    try:
        run("base"), run("this")  # warm-up
        ms: dict[str, list[float]] = {"base": [], "this": []}
        for r in range(rounds):
            for arm in ("base", "this") if r % 2 == 0 else ("this", "base"):
                ms[arm].append(run(arm))
    finally:
        if not prep.reused:
            prep.snapshot.unlink()
        prep.snapshot.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "rounds": rounds,
        "load": os.getloadavg()[0],
        "python_ms_per_img": {a: round(statistics.median(v), 3) for a, v in ms.items()},
        "this_over_base_paired": round(statistics.median(t / b for t, b in zip(ms["this"], ms["base"])), 3),
    }


def _package_root(checkout: Path, into: Path, *, name: str = "pixpool") -> Path:
    root = into / name
    root.mkdir(parents=True)
    for side in ("server", "client", "shared"):
        (root / side).symlink_to(checkout / side)
    return into


def _run(path_root: Path | None, args) -> dict:
    env = dict(os.environ)
    if path_root is not None:
        env["PYTHONPATH"] = str(path_root)
    argv = [sys.executable, "-P", str(Path(__file__).resolve()), "--run", "--workers", str(args.workers)]
    out = subprocess.run([*argv, "--epochs", str(args.epochs)], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"deliver_cpu.py --run failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _summary(runs: list[dict]) -> dict:
    keys = runs[0]["ms_per_img"].keys()
    return {
        "img_per_s": round(statistics.median(r["img_per_s"] for r in runs), 1),
        "ms_per_img": {k: round(statistics.median(r["ms_per_img"][k] for r in runs), 3) for k in keys},
        "workers_ms_per_img": round(statistics.median(r["workers_ms_per_img"] for r in runs), 3),
        "total_ms_per_img": round(statistics.median(r["total_ms_per_img"] for r in runs), 3),
        "busy_fraction": round(statistics.median(min(r["busy_fraction"]) for r in runs), 3),
        "gap_ms_within_epoch": round(statistics.median(r["gap_ms_within_epoch"] for r in runs), 1),
        "gap_ms_at_epoch_start": round(statistics.median(r["gap_ms_at_epoch_start"] for r in runs), 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, default=None, help="a baseline checkout, run in alternating pairs")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--route-python", action="store_true", help="the route's Python alone, base against this")
    parser.add_argument("--rounds", type=int, default=15, help="--route-python: alternating rounds")
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.route_python:
        if args.base is None:
            parser.error("--route-python compares against --base CHECKOUT")
        print(json.dumps(route_python(args.base, args.rounds), indent=1))
        return 0
    if args.run:
        print(json.dumps(measure(args.workers, args.epochs)), flush=True)
        return 0
    arms: dict[str, Path | None] = {"this": None}
    with tempfile.TemporaryDirectory(prefix="pxcpu-root-") as tmp:
        if args.base is not None:
            arms = {
                "base": _package_root(args.base.resolve(), Path(tmp) / "base"),
                "this": _package_root(HERE.parent, Path(tmp) / "this"),
            }
        runs: dict[str, list[dict]] = {a: [] for a in arms}
        loads = [os.getloadavg()[0]]
        for r in range(args.pairs):
            order = list(arms) if r % 2 == 0 else list(arms)[::-1]
            for arm in order:
                res = _run(arms[arm], args)
                runs[arm].append(res)
                loads.append(res["load"])
                print(
                    f"pair {r + 1}/{args.pairs} {arm}: {res['img_per_s']:.1f} img/s, "
                    f"{res['total_ms_per_img']:.3f} CPU ms/img, load {res['load']:.2f}",
                    file=sys.stderr,
                    flush=True,
                )
    report = {
        "workers": args.workers,
        "epochs": args.epochs,
        "pairs": args.pairs,
        "load_range": [min(loads), max(loads)],
    }
    report.update({arm: _summary(v) for arm, v in runs.items()})
    if "base" in runs:

        def paired(key: str) -> float:
            return statistics.median(t[key] / b[key] for t, b in zip(runs["this"], runs["base"]))

        report["this_over_base_paired"] = {
            "img_per_s": round(paired("img_per_s"), 3),
            "total_ms_per_img": round(paired("total_ms_per_img"), 3),
            "workers_ms_per_img": round(paired("workers_ms_per_img"), 3),
            "trainer_ms_per_img": round(
                statistics.median(
                    t["ms_per_img"]["trainer"] / b["ms_per_img"]["trainer"] for t, b in zip(runs["this"], runs["base"])
                ),
                3,
            ),
        }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
