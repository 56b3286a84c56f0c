"""bench/gpu_check.py: the GPU checks of the training step, as one script that prints a table.

Run it once on a machine with a CUDA GPU (``python bench/gpu_check.py``); on a CPU-only
machine it runs what it can (eager steps, CPU-fed fits at small sizes) and says which
checks need a GPU. Sections:

1. **graph vs eager**: two ``DetectorStep``s with the same seed, one captured as a CUDA graph
   and replayed, one eager, fed the same batches for ``--steps`` steps: their losses agree
   within bf16 tolerance (relative ``--tolerance``); median ms per step of each.
2. **data wait**: ``fit`` fed by a daemon at ``--batch-size`` / ``--imgsz`` (64 / 640 by
   default) for ``--wait-steps`` steps: the share of the step time spent waiting for data.
3. **paired fits** (paired timing, as in ``docs/benchmarks.md``): the same short fit in fresh processes,
   fed by pixpool and by a torch ``DataLoader`` over a decoded uint8 cache running the same
   route (``_common.Uint8CacheSource``), alternating for ``--pairs`` pairs; wall seconds of
   each and the paired ratio, every pair listed.

The whole script keeps to ``--budget-s`` (default 420 s: a lent GPU gives a session about
15 minutes in all, so one run stays under 8 minutes with room to run it again).
Sections 1 and 2 are bounded by their step counts; section 3 starts a pair only while the
pairs already run say the next one ends inside the budget, and the table says how many ran
and that the budget stopped it. The last row is the script's own wall time.

Its daemons keep the snapshot they prepare (``keep_snapshot``), so that every later arm and run
re-attaches it instead of preparing again; ``pixpool clean`` removes it.

Usage: ``python bench/gpu_check.py [--data coco.json] [--steps 24] [--pairs 5] [--epochs 2] [--budget-s 420]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import COCO128_JSON, BatchDataset, Uint8CacheSource, daemon  # noqa: E402

WAIT_S = 600.0


def graph_vs_eager(steps: int, batch_size: int, imgsz: int, scale: str, tolerance: float) -> dict:
    import numpy as np
    import torch

    from pixpool.client.train.step import DetectorStep

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device: the graph cannot be captured here"}
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(steps):
        images = torch.from_numpy(rng.integers(0, 256, (batch_size, 3, imgsz, imgsz), dtype=np.uint8))
        n = int(rng.integers(1, 6 * batch_size))
        rows = np.zeros((n, 6), np.float32)
        rows[:, 0] = rng.integers(0, batch_size, n)
        rows[:, 1] = rng.integers(0, 80, n)
        rows[:, 2:4] = rng.uniform(0.2, 0.8, (n, 2))
        rows[:, 4:6] = rng.uniform(0.05, 0.3, (n, 2))
        batches.append((images, rows))
    out = {}
    for graph in (True, False):
        step = DetectorStep(
            num_classes=80,
            batch_size=batch_size,
            imgsz=imgsz,
            max_targets=6 * batch_size,
            total_steps=10 * steps,
            device="cuda",
            scale=scale,
            seed=0,
            use_graph=graph,
            warmup_steps=steps,
        )
        losses, times = [], []
        for images, rows in batches:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step.step(images, rows)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(step.losses()["loss"])
        out["graph" if graph else "eager"] = {"losses": losses, "ms_per_step": 1000 * statistics.median(times[4:])}
    # The graph's warm-up steps run eagerly, so the two must agree from the first step on.
    rel = [abs(a - b) / max(abs(b), 1e-9) for a, b in zip(out["graph"]["losses"], out["eager"]["losses"])]
    out["max_relative_difference"] = max(rel)
    out["agree"] = max(rel) <= tolerance
    return out


def data_wait(data: str, batch_size: int, imgsz: int, steps: int, scale: str, workers: int) -> dict:
    import torch

    from pixpool.client.options import ClientOptions
    from pixpool.client.train.fit import FitConfig, fit
    from pixpool.shared.stream.config import AugmentConfig, StreamSettings

    with (
        daemon(workers=workers, data=data, imgsz=imgsz, keep_snapshot=True) as (d, _),
        tempfile.TemporaryDirectory() as run,
    ):
        config = FitConfig(
            epochs=100,
            scale=scale,
            project=run,
            progress=False,
            validate=False,
            max_steps=steps,
            stream=StreamSettings(batch_size=batch_size, augment=AugmentConfig(imgsz=imgsz)),
        )
        report = fit(config, ClientOptions(socket_dir=d, timeout_s=WAIT_S))
    return {
        "device": report["device"],
        "graph": report["graph"],
        "steps": report["steps"],
        "images_per_s": report["images_per_s"],
        "data_wait_fraction": report["data_wait_fraction"],
        "cuda": torch.cuda.is_available(),
    }


def dataloader_fit(data: str, batch_size: int, imgsz: int, epochs: int, scale: str, workers: int) -> float:
    """The same fit fed by a torch DataLoader over a decoded uint8 cache (same route); wall seconds."""
    import torch

    from pixpool.client.train.step import DetectorStep
    from pixpool.server.readers import load_dataset
    from pixpool.shared.stream.config import AugmentConfig, StreamSettings
    from pixpool.shared.stream.sampler import num_batches

    t0 = time.perf_counter()
    dataset = load_dataset(data)
    source = Uint8CacheSource(dataset, imgsz)
    settings = StreamSettings(batch_size=batch_size, drop_last=True, augment=AugmentConfig(imgsz=imgsz, epochs=epochs))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = num_batches(len(source), settings, 0)
    step = DetectorStep(
        num_classes=len(dataset.names),
        batch_size=batch_size,
        imgsz=imgsz,
        max_targets=200,
        total_steps=epochs * steps,
        device=device,
        scale=scale,
        warmup_steps=steps,
    )
    for epoch in range(epochs):
        loader = torch.utils.data.DataLoader(
            BatchDataset(source, settings, epoch), batch_size=None, shuffle=False, num_workers=workers
        )
        for images, targets, _ in loader:
            step.step(images, targets.numpy())
        step.losses()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def next_pair_fits(pair_seconds: list[float], now: float, deadline: float) -> bool:
    """Whether one more pair, as long as the slowest so far, ends by ``deadline`` (monotonic seconds).

    The first pair always runs: without one there is no figure at all, and nothing to project from."""
    return not pair_seconds or now + max(pair_seconds) <= deadline


def paired_fits(
    data: str,
    batch_size: int,
    imgsz: int,
    epochs: int,
    pairs: int,
    scale: str,
    workers: int,
    deadline: float = float("inf"),
) -> dict:
    """Fresh processes, alternating: pixpool (daemon + `pixpool train`) and the DataLoader fit.

    Stops early (``stopped_by_budget``) when the next pair would end after ``deadline``."""
    here = Path(__file__).resolve()
    times = {"pixpool": [], "dataloader": []}
    pair_seconds: list[float] = []
    stopped = False
    for i in range(pairs):
        if not next_pair_fits(pair_seconds, time.monotonic(), deadline):
            stopped = True
            break
        started = time.monotonic()
        for arm in ("pixpool", "dataloader") if i % 2 == 0 else ("dataloader", "pixpool"):
            cmd = [
                sys.executable,
                str(here),
                "--arm",
                arm,
                "--data",
                data,
                "--batch-size",
                str(batch_size),
                "--imgsz",
                str(imgsz),
                "--epochs",
                str(epochs),
                "--scale",
                scale,
                "--workers",
                str(workers),
            ]
            # a hung arm must not hold the lent machine past the budget (it raises TimeoutExpired)
            timeout = min(WAIT_S * 3, max(60.0, deadline - time.monotonic()))
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout
            times[arm].append(json.loads(out.strip().splitlines()[-1])["seconds"])
        pair_seconds.append(time.monotonic() - started)
    ratios = [d / p for p, d in zip(times["pixpool"], times["dataloader"])]
    return {
        "pairs": len(ratios),
        "stopped_by_budget": stopped,
        "seconds": times,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "paired_speedup_median": statistics.median(ratios),
        "paired_speedups": ratios,
    }


def _pixpool_fit_arm(data: str, batch_size: int, imgsz: int, epochs: int, scale: str, workers: int) -> float:
    from pixpool.client.options import ClientOptions
    from pixpool.client.train.fit import FitConfig, fit
    from pixpool.shared.stream.config import AugmentConfig, StreamSettings

    t0 = time.perf_counter()  # the daemon's preparation is inside the timer, as the DataLoader's cache is
    with (
        daemon(workers=workers, data=data, imgsz=imgsz, keep_snapshot=True) as (d, _),
        tempfile.TemporaryDirectory() as run,
    ):
        stream = StreamSettings(batch_size=batch_size, augment=AugmentConfig(imgsz=imgsz))
        fit(FitConfig(epochs=epochs, scale=scale, project=run, progress=False, validate=False, stream=stream), ClientOptions(socket_dir=d, timeout_s=WAIT_S))  # fmt: skip
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(COCO128_JSON))
    p.add_argument("--steps", type=int, default=24)
    p.add_argument(
        "--tolerance", type=float, default=0.05, help="relative loss difference allowed between graph and eager (bf16)"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--wait-steps", type=int, default=40)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--pairs", type=int, default=5, help="alternating pairs, as many as --budget-s allows")
    p.add_argument("--scale", default="n")
    p.add_argument("--workers", type=int, default=None, help="augmentation workers (default: cores - 1)")
    p.add_argument(
        "--budget-s", type=float, default=420.0, help="wall seconds the whole script keeps to (section 3 stops early)"
    )
    p.add_argument("--arm", choices=["pixpool", "dataloader"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    started = time.monotonic()
    import os

    workers = args.workers or max(1, (os.cpu_count() or 2) - 1)
    if args.arm == "pixpool":
        print(
            json.dumps(
                {"seconds": _pixpool_fit_arm(args.data, args.batch_size, args.imgsz, args.epochs, args.scale, workers)}
            )
        )
        return 0
    if args.arm == "dataloader":
        print(
            json.dumps(
                {"seconds": dataloader_fit(args.data, args.batch_size, args.imgsz, args.epochs, args.scale, workers)}
            )
        )
        return 0
    result = {
        "graph_vs_eager": graph_vs_eager(args.steps, min(args.batch_size, 16), args.imgsz, args.scale, args.tolerance),
        "data_wait": data_wait(args.data, args.batch_size, args.imgsz, args.wait_steps, args.scale, workers),
    }
    result["paired_fits"] = paired_fits(
        args.data,
        args.batch_size,
        args.imgsz,
        args.epochs,
        args.pairs,
        args.scale,
        workers,
        deadline=started + args.budget_s,
    )
    result["wall_s"] = time.monotonic() - started
    g, w, f = result["graph_vs_eager"], result["data_wait"], result["paired_fits"]
    print("| check | result |")
    print("| --- | --- |")
    if "skipped" in g:
        print(f"| graph vs eager | skipped: {g['skipped']} |")
    else:
        print(
            f"| graph vs eager, {args.steps} steps | max relative loss difference {g['max_relative_difference']:.2e} ({'agree' if g['agree'] else 'DISAGREE'}); "
            f"{g['graph']['ms_per_step']:.1f} ms/step graph vs {g['eager']['ms_per_step']:.1f} eager |"
        )
    print(
        f"| data wait, batch {args.batch_size} at {args.imgsz}, {w['steps']} steps on {w['device']}{' (graph)' if w['graph'] else ''} | "
        f"{100 * w['data_wait_fraction']:.1f} % of the step time, {w['images_per_s']:.1f} img/s |"
    )
    budget_note = f" (stopped by --budget-s {args.budget_s:.0f})" if f["stopped_by_budget"] else ""
    print(
        f"| paired fits, {f['pairs']} of {args.pairs} pairs of {args.epochs} epochs{budget_note} | pixpool {f['median_s']['pixpool']:.1f} s, DataLoader {f['median_s']['dataloader']:.1f} s, "
        f"paired speed-up {f['paired_speedup_median']:.2f}x ({', '.join(f'{r:.2f}' for r in f['paired_speedups'])}) |"
    )
    print(f"| whole script | {result['wall_s']:.0f} s wall (budget {args.budget_s:.0f} s) |")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
