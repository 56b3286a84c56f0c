"""Preparation speed: ``prepare_snapshot`` (float32 and uint8, 1 and 2 processes) against a
plain single-process loop of cv2.imread + resize over the same files, in the same run.

Runs in one shell process (and the decode workers it starts). Each round runs every arm in
an order that alternates between rounds; every prepare starts from nothing (its snapshot is
unlinked right after), so none is a reuse. Reports medians over the rounds as ratios against
the loop, and the load average before and after (another process busy on the same cores
skews every arm, and the 2-process arms most: they need both cores). "vs loop" is the
ratio of the medians; "paired" the median of the per-round ratios loop / arm; "cpu s" the
CPU seconds (user + system, this process and its decode workers) an arm used, which a
busy machine inflates far less than the wall time.

``--copies K`` copies every image file K times into a temporary folder (coco128 x 8 = 1024
distinct files, as a 1024-image dataset has: each its own header read, page-cache entry and
record). ``--repeat K`` instead lists every record K times (duplicates are records too,
each decoded again, but their headers are read once).

``--store DIR[,DIR...]`` prepares into another store, or into each of several (an arm each) (a tmpfs mounted with ``huge=always``, say: the
arena is then written through its mapping, ``server/snapshot/arena_pages.py``). ``--stages``
instead times each step of a preparation alone, in this one process, over the same files
(CPU ms per image: header read, the loop's imread, the decoder's decode, resize, centring,
the arena write both ways), and the 2-core floor those steps allow. ``--writers`` times two
processes writing 512 records into the store: one shared file or one per writer, ``pwrite`` or
the mapping (``bench/_arena_writers.py``).

    python bench/prepare.py [--data JSON] [--images DIR] [--imgsz 640] [--rounds 5] [--copies 8]
                            [--dtypes float32,uint8] [--processes 1,2] [--store DIR] [--stages | --writers]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco128"


def cpu_s() -> float:
    """CPU seconds (user + system) of this process and its reaped children so far."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def plain_loop(paths: list[str], imgsz: int) -> tuple[float, float]:
    import cv2

    from pixpool.server.snapshot.decode import resize_long_side

    c0, t0 = cpu_s(), time.perf_counter()
    for p in paths:
        img = cv2.imread(p, cv2.IMREAD_COLOR)
        resize_long_side(img, imgsz)
    return time.perf_counter() - t0, cpu_s() - c0


def prepare_once(dataset, imgsz: int, processes: int, dtype: str, store: str | None, mode: str) -> tuple[float, float]:
    from pixpool.server.snapshot import prepare
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot

    extra = {"store": store} if store else {}
    chosen = prepare.write_mode
    if mode != "auto":  # A/B of the two write paths: the preparing process hands its mode to the workers
        prepare.write_mode = lambda _store: mode
    try:
        c0, t0 = cpu_s(), time.perf_counter()
        result = prepare_snapshot(dataset, PrepareOptions(imgsz=imgsz, processes=processes, dtype=dtype, **extra))
        seconds, cpu = time.perf_counter() - t0, cpu_s() - c0  # the decode workers are reaped by now
    finally:
        prepare.write_mode = chosen
    result.snapshot.close()
    if result.reused:  # someone else's snapshot: never remove it
        raise RuntimeError(
            f"{result.snapshot.name} was reused, so nothing was timed; remove it (pixpool clean) and run again"
        )
    result.snapshot.unlink()  # ours (result.snapshot owns what prepare created)
    return seconds, cpu


def private_copy(dataset, marker_dir: str):
    """The same records under a fingerprint of their own (one extra source file naming this
    run), so the benchmark neither reuses nor removes a snapshot another process prepared
    from the same inputs."""
    from pixpool.shared.stream.records import Dataset

    marker = os.path.join(marker_dir, "bench-prepare-marker.txt")
    with open(marker, "w") as f:
        f.write(f"bench/prepare.py pid {os.getpid()} at {time.time()!r}\n")
    return Dataset(dataset.records, dataset.names, (*dataset.source_files, marker))


def copied(dataset, copies: int, folder: str):
    """Every record ``copies`` times, each copy's image a file of its own in ``folder``."""
    from pixpool.shared.stream.records import Dataset

    records = []
    for k in range(copies):
        for i, rec in enumerate(dataset.records):
            path = os.path.join(folder, f"{k}_{i:06d}{Path(rec.image_path).suffix}")
            shutil.copyfile(rec.image_path, path)
            records.append(dataclasses.replace(rec, image_path=path))
    return Dataset(tuple(records), dataset.names, dataset.source_files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT / "annotations" / "instances_train2017.json"))
    parser.add_argument("--images", default=str(DEFAULT / "images" / "train2017"))
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=1, help="list every record K times (default 1)")
    parser.add_argument(
        "--copies", type=int, default=1, help="copy every image file K times, each a record of its own (default 1)"
    )
    parser.add_argument("--dtypes", default="float32,uint8", help="snapshot dtypes to prepare (default float32,uint8)")
    parser.add_argument("--processes", default="1,2", help="decoder process counts to prepare with (default 1,2)")
    parser.add_argument(
        "--store",
        default=None,
        help="the store to prepare into, or several, comma-separated, an arm each (default /dev/shm)",
    )
    parser.add_argument(
        "--write-modes",
        default="auto",
        help="how the arena is written, one arm each: auto (what the store gets), pwrite, mapping (default auto)",
    )
    parser.add_argument("--stages", action="store_true", help="time each step alone in one process (module docstring)")
    parser.add_argument(
        "--writers", action="store_true", help="two writers into the store, four ways (module docstring)"
    )
    args = parser.parse_args(argv)
    if args.writers:
        from _arena_writers import print_writers

        print_writers(args.store or "/dev/shm", args.rounds)
        return 0
    if args.repeat < 1 or args.rounds < 1 or args.copies < 1:
        parser.error("--repeat, --copies and --rounds must be >= 1")
    dtypes = [d for d in args.dtypes.split(",") if d]
    procs = [int(p) for p in args.processes.split(",") if p]
    modes = [m for m in args.write_modes.split(",") if m]
    if any(m not in ("auto", "pwrite", "mapping") for m in modes):
        parser.error(f"--write-modes takes auto, pwrite and mapping, got {args.write_modes!r}")

    import cv2

    from pixpool.server.readers import load_dataset
    from pixpool.shared.stream.records import Dataset

    cv2.setNumThreads(1)
    dataset = load_dataset(args.data, args.images)
    workdir = tempfile.TemporaryDirectory(prefix="pixpool-bench-")
    if args.copies > 1:
        dataset = copied(dataset, args.copies, workdir.name)
    if args.repeat > 1:
        dataset = Dataset(dataset.records * args.repeat, dataset.names, dataset.source_files)
    dataset = private_copy(dataset, workdir.name)
    paths = [r.image_path for r in dataset.records]
    for p in paths:  # the files into the page cache before anything is timed
        with open(p, "rb") as f:
            f.read()
    if args.stages:
        from _prepare_stages import print_stages

        print_stages(paths, args.imgsz, args.store or "/dev/shm", args.rounds)
        return 0
    loop = "cv2.imread + resize loop (1 core)"
    arms = {loop: lambda: plain_loop(paths, args.imgsz)}
    stores = (args.store or "/dev/shm").split(",")
    for dtype in dtypes:
        for p in procs:
            for store in stores:
                for mode in modes:
                    name = f"prepare {dtype}, {p} process{'es' if p > 1 else ''}"
                    name += (f", {store}" if len(stores) > 1 else "") + ("" if mode == "auto" else f", {mode}")
                    arms[name] = lambda p=p, dtype=dtype, mode=mode, store=store: prepare_once(
                        dataset, args.imgsz, p, dtype, store, mode
                    )
    names = list(arms)
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            seconds, cpu = arms[n]()
            times[n].append(seconds)
            cpus[n].append(cpu)
    load_after = os.getloadavg()
    base = statistics.median(times[loop])
    n_img = len(paths)
    how = f"x{args.copies} copies" if args.copies > 1 else f"x{args.repeat}"
    print(
        f"{n_img} records ({how}) at imgsz {args.imgsz}, medians of {args.rounds} alternating rounds; "
        f"{os.cpu_count()} cores, load average (1/5/15 min) before {_load(load_before)}, after {_load(load_after)}"
    )
    from pixpool.server.snapshot.arena_pages import write_mode

    for store in stores:
        print(f"store {store}: the arena is written with {write_mode(store)}")
    print(
        f"{'arm':46s} {'median s':>9s} {'images/s':>9s} {'vs loop':>8s} {'paired':>8s} {'cpu s':>7s} {'ms cpu/img':>10s}   all runs (s)"
    )
    for n in names:
        med = statistics.median(times[n])
        paired = statistics.median(
            a / b for a, b in zip(times[loop], times[n], strict=True)
        )  # loop / arm, round by round
        cpu = statistics.median(cpus[n])
        runs = " ".join(f"{t:.2f}" for t in times[n])
        print(
            f"{n:46s} {med:9.3f} {n_img / med:9.1f} {base / med:7.2f}x {paired:7.2f}x {cpu:7.2f} {1e3 * cpu / n_img:10.3f}   {runs}"
        )
    return 0


def _load(avg: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in avg)


if __name__ == "__main__":
    sys.exit(main())
