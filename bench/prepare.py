"""Preparation speed on coco128: ``prepare_snapshot`` with 1 and 2 processes against a plain
loop of cv2.imread + resize, in the same run.

Runs in one shell process (and the decode pool it spawns). Each round runs the three arms in
an order that alternates between rounds; every prepare starts from nothing (its snapshot is
unlinked right after), so none is a reuse. Reports medians over the rounds.

    python bench/prepare.py [--data JSON] [--images DIR] [--imgsz 640] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco128"


def plain_loop(paths: list[str], imgsz: int) -> float:
    import cv2

    from pixpool.server.decode import resize_long_side

    t0 = time.perf_counter()
    for p in paths:
        img = cv2.imread(p, cv2.IMREAD_COLOR)
        resize_long_side(img, imgsz)
    return time.perf_counter() - t0


def prepare_once(dataset, imgsz: int, processes: int) -> float:
    from pixpool.server.prepare import prepare_snapshot

    t0 = time.perf_counter()
    result = prepare_snapshot(dataset, imgsz=imgsz, processes=processes)
    seconds = time.perf_counter() - t0
    try:
        if result.reused:
            raise RuntimeError(f"{result.snapshot.name} was reused: remove it (pixpool clean) before benchmarking")
    finally:
        result.snapshot.close()
        result.snapshot.owner = True
        result.snapshot.unlink()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT / "annotations" / "instances_train2017.json"))
    parser.add_argument("--images", default=str(DEFAULT / "images" / "train2017"))
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    import cv2

    from pixpool.server.readers import load_dataset

    cv2.setNumThreads(1)
    dataset = load_dataset(args.data, args.images)
    paths = [r.image_path for r in dataset.records]
    arms = {
        "cv2.imread + resize loop (1 core)": lambda: plain_loop(paths, args.imgsz),
        "prepare, 1 process": lambda: prepare_once(dataset, args.imgsz, 1),
        "prepare, 2 processes": lambda: prepare_once(dataset, args.imgsz, 2),
    }
    names = list(arms)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            times[n].append(arms[n]())
    base = statistics.median(times[names[0]])
    n_img = len(paths)
    print(f"{n_img} records at imgsz {args.imgsz}, medians of {args.rounds} alternating rounds")
    print(f"{'arm':36s} {'median s':>9s} {'images/s':>9s} {'vs loop':>8s}   all runs (s)")
    for n in names:
        med = statistics.median(times[n])
        runs = " ".join(f"{t:.2f}" for t in times[n])
        print(f"{n:36s} {med:9.3f} {n_img / med:9.1f} {base / med:7.2f}x   {runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
