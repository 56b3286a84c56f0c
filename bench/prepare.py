"""Preparation speed on coco128: ``prepare_snapshot`` with 1 and 2 processes against a plain
loop of cv2.imread + resize, in the same run.

Runs in one shell process (and the decode pool it spawns). Each round runs the three arms in
an order that alternates between rounds; every prepare starts from nothing (its snapshot is
unlinked right after), so none is a reuse. Reports medians over the rounds, and the load
average before and after (another process busy on the same cores skews every arm).

``--repeat K`` lists every record K times (coco128 x 4 = 512 records; duplicates are
records too, each decoded again), so that scaling past the decode workers' start-up
(0.2-0.5 s, overlapped with the preparing process's own decoding) shows.

    python bench/prepare.py [--data JSON] [--images DIR] [--imgsz 640] [--rounds 5] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco128"


def plain_loop(paths: list[str], imgsz: int) -> float:
    import cv2

    from pixpool.server.snapshot.decode import resize_long_side

    t0 = time.perf_counter()
    for p in paths:
        img = cv2.imread(p, cv2.IMREAD_COLOR)
        resize_long_side(img, imgsz)
    return time.perf_counter() - t0


def prepare_once(dataset, imgsz: int, processes: int) -> float:
    from pixpool.server.snapshot.prepare import prepare_snapshot

    t0 = time.perf_counter()
    result = prepare_snapshot(dataset, imgsz=imgsz, processes=processes)
    seconds = time.perf_counter() - t0
    result.snapshot.close()
    if result.reused:  # someone else's snapshot: never remove it
        raise RuntimeError(f"{result.snapshot.name} was reused, so nothing was timed; remove it (pixpool clean) and run again")
    result.snapshot.unlink()  # ours (result.snapshot owns what prepare created)
    return seconds


def private_copy(dataset, marker_dir: str):
    """The same records under a fingerprint of their own (one extra source file naming this
    run), so the benchmark neither reuses nor removes a snapshot another process prepared
    from the same inputs."""
    from pixpool.shared.records import Dataset

    marker = os.path.join(marker_dir, "bench-prepare-marker.txt")
    with open(marker, "w") as f:
        f.write(f"bench/prepare.py pid {os.getpid()} at {time.time()!r}\n")
    return Dataset(dataset.records, dataset.names, (*dataset.source_files, marker))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT / "annotations" / "instances_train2017.json"))
    parser.add_argument("--images", default=str(DEFAULT / "images" / "train2017"))
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=1, help="list every record K times (default 1)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.rounds < 1:
        parser.error("--repeat and --rounds must be >= 1")

    import tempfile

    import cv2

    from pixpool.server.readers import load_dataset
    from pixpool.shared.records import Dataset

    cv2.setNumThreads(1)
    dataset = load_dataset(args.data, args.images)
    if args.repeat > 1:
        dataset = Dataset(dataset.records * args.repeat, dataset.names, dataset.source_files)
    marker_dir = tempfile.TemporaryDirectory(prefix="pixpool-bench-")
    dataset = private_copy(dataset, marker_dir.name)
    paths = [r.image_path for r in dataset.records]
    arms = {
        "cv2.imread + resize loop (1 core)": lambda: plain_loop(paths, args.imgsz),
        "prepare, 1 process": lambda: prepare_once(dataset, args.imgsz, 1),
        "prepare, 2 processes": lambda: prepare_once(dataset, args.imgsz, 2),
    }
    names = list(arms)
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            times[n].append(arms[n]())
    base = statistics.median(times[names[0]])
    n_img = len(paths)
    load_after = os.getloadavg()
    print(f"{n_img} records (x{args.repeat}) at imgsz {args.imgsz}, medians of {args.rounds} alternating rounds; "
          f"{os.cpu_count()} cores, load average (1/5/15 min) before {_load(load_before)}, after {_load(load_after)}")
    print(f"{'arm':36s} {'median s':>9s} {'images/s':>9s} {'vs loop':>8s}   all runs (s)")
    for n in names:
        med = statistics.median(times[n])
        runs = " ".join(f"{t:.2f}" for t in times[n])
        print(f"{n:36s} {med:9.3f} {n_img / med:9.1f} {base / med:7.2f}x   {runs}")
    one, two = (statistics.median(times[n]) for n in names[1:3])
    print(f"2 processes vs 1: {one / two:.2f}x faster")
    return 0


def _load(avg: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in avg)


if __name__ == "__main__":
    sys.exit(main())
