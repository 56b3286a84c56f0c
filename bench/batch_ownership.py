"""bench/batch_ownership.py: what an owned batch costs against a zero-copy view of the ring slot.

Runs in one process (the consumer); the daemon runs in a spawned process. Three arms read the
same daemon, alternating round by round (the order flips each round), each figure the
median over rounds:

- ``owned``: ``attach()`` as it is by default: every batch stays valid for as long as the
  user holds it; while the user keeps few (here: none), its images are a lent slot, released
  once no tensor over it is left (``client/flow.py``, issue 19), else a copy;
- ``copy``: the same owned batches, always copied out of the slot (one host memcpy of the
  images, the targets and indices; ``Loader(..., lend=False)``, what ``attach()`` did before
  issue 19);
- ``view``: ``attach(zero_copy=True)``: the batch is the slot itself, valid until the next.

The consumer touches every batch (sums one byte per image, which reads no more than a
step's copy would) and keeps none. Reported per arm: images/s delivered, and seconds per
batch from the ``ready`` message received to the batch built (``Client(timings=...)``,
which is where the copy happens), against the batch's render time (worker busy seconds per
sample from ``pixpool status``, times the batch size) and a plain ``np.copyto`` of the same
bytes. ``copy_ms_per_batch`` is ``copy`` less ``view``; ``owned`` (lent slots) should cost
what ``view`` costs while the user keeps nothing.

Usage: ``python bench/batch_ownership.py [--data coco.json] [--imgsz 640] [--batch-size 16]
[--workers 2] [--rounds 7] [--epochs-per-round 2]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from serve import _wait  # bench/ is this script's sys.path[0]: the delivery benchmark's ready-wait

COCO128 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "coco128" / "annotations"
COCO128 = COCO128 / "instances_train2017.json"


def _start_daemon(data: str, imgsz: int, workers: int) -> tuple[mp.Process, str]:
    from pixpool.server.daemon.run import run_daemon
    from pixpool.shared.stream.config import DaemonConfig

    d = tempfile.mkdtemp(prefix="pxo-", dir="/tmp")
    config = DaemonConfig(data=data, imgsz=imgsz, workers=workers, socket_dir=d)
    proc = mp.get_context("spawn").Process(target=run_daemon, args=(config,))
    proc.start()
    return proc, d


def run_arm(loader, epochs: list[int]) -> tuple[float, int]:
    """(seconds, images) to read ``epochs`` of ``loader``, touching every batch."""
    images = 0
    t0 = time.perf_counter()
    for epoch in epochs:
        loader.set_epoch(epoch)
        for batch in loader:
            imgs = batch.images
            int(imgs[:, 0, 0, 0].sum())  # read the batch; keep nothing
            images += imgs.shape[0]
    return time.perf_counter() - t0, images


def main(argv=None) -> int:
    from pixpool.client import attach
    from pixpool.client.loader import Loader, stream_settings
    from pixpool.ops.status_client import query_status

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(COCO128))
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--epochs-per-round", type=int, default=2)
    args = parser.parse_args(argv)

    proc, d = _start_daemon(args.data, args.imgsz, args.workers)
    arms = {"owned": (False, True), "copy": (False, False), "view": (True, True)}  # (zero_copy, lend)
    rates: dict[str, list[float]] = {a: [] for a in arms}
    deliver: dict[str, list[float]] = {a: [] for a in arms}
    try:
        _wait(d, args.workers)
        loaders = {}
        timings = {a: {} for a in arms}
        for arm, (zero_copy, lend) in arms.items():
            if lend:
                loaders[arm] = attach(
                    d, batch_size=args.batch_size, seed=0, imgsz=args.imgsz, timeout_s=300, zero_copy=zero_copy
                )
            else:
                settings = stream_settings(batch_size=args.batch_size, seed=0, imgsz=args.imgsz)
                loaders[arm] = Loader(settings, socket_dir=d, timeout_s=300, zero_copy=zero_copy, lend=False)
            loaders[arm].client.timings = timings[arm]
        run_arm(loaders["view"], [0])  # warm-up: the workers import the route on their first job
        epoch = 1
        for r in range(args.rounds):
            order = list(arms) if r % 2 == 0 else list(arms)[::-1]
            for arm in order:
                timings[arm].clear()
                seconds, images = run_arm(loaders[arm], list(range(epoch, epoch + args.epochs_per_round)))
                epoch += args.epochs_per_round
                rates[arm].append(images / seconds)
                deliver[arm].append(timings[arm]["deliver_s"] / timings[arm]["batches"])
        st = query_status(d, timeout_s=5.0)
        done = sum(w["samples_done"] for w in st["workers"])
        render_s = sum(w["busy_s"] for w in st["workers"]) / max(1, done) * args.batch_size
        for loader in loaders.values():
            loader.close()
    finally:
        from pixpool.server.daemon.run import stop_process

        stop_process(proc)
        shutil.rmtree(d, ignore_errors=True)

    shape = (args.batch_size, 3, args.imgsz, args.imgsz)
    src, dst = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8), np.empty(shape, np.uint8)
    copies = []
    for _ in range(20):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copies.append(time.perf_counter() - t0)
    med = {a: statistics.median(v) for a, v in rates.items()}
    dmed = {a: statistics.median(v) for a, v in deliver.items()}
    report = {
        "rounds": args.rounds,
        "epochs_per_round": args.epochs_per_round,
        "batch_size": args.batch_size,
        "imgsz": args.imgsz,
        "workers": args.workers,
        "batch_nbytes": int(np.prod(shape)),
        "img_per_s": {a: round(v, 1) for a, v in med.items()},
        "img_per_s_rounds": {a: [round(x, 1) for x in v] for a, v in rates.items()},
        "owned_vs_view": round(med["owned"] / med["view"], 3),
        "copy_vs_view": round(med["copy"] / med["view"], 3),
        "deliver_ms_per_batch": {a: round(1e3 * v, 3) for a, v in dmed.items()},
        "copy_ms_per_batch": round(1e3 * (dmed["copy"] - dmed["view"]), 3),
        "owned_ms_per_batch_over_view": round(1e3 * (dmed["owned"] - dmed["view"]), 3),
        "np_copyto_ms_per_batch": round(1e3 * statistics.median(copies), 3),
        "render_ms_per_batch": round(1e3 * render_s, 2),
        "wall_ms_per_batch_view": round(1e3 * args.batch_size / med["view"], 2),
    }
    report["copy_vs_render"] = round(report["copy_ms_per_batch"] / report["render_ms_per_batch"], 4)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
