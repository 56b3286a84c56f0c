"""Benchmark: the training route over the float32 snapshot vs. over a decoded uint8 cache.

Runs in one process, one OpenCV thread (``cv2.setNumThreads(1)``), so img/s is per core.

Arms, timed in the same run, alternating (A B, B A, ...), medians over runs:

- ``snapshot``: the route reading centred float32 images (a prepared snapshot in shared
  memory with ``--shm``, else the same arrays in process memory: the route reads both
  the same way, through read-only views).
- ``uint8 cache``: the same route over a decoded uint8 cache whose ``image(i)`` converts
  and centres per call, what a loader without the prepared snapshot does.
- ``snapshot, HSV on device``: the snapshot arm with ``hsv_on_device=True`` (the workers
  skip HSV; the trainer's GPU does it), the configuration the service is built for.
- ``floor``: one float32 ``warpAffine`` to imgsz x imgsz per image, the unavoidable
  resample, for scale; and the same with a padding channel (4 channels), the form the
  route resamples in because OpenCV's 4-channel float kernel is vectorised.

Per-stage ms per image come from the route's own stage clock (``timings``).

    python bench/augment.py [--data coco128.json] [--imgsz 640] [--runs 5] [--batches 4]
        [--copy-paste 0.5] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np

from pixpool.server.augment import render_batch
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.decode import centre, decode_bgr, resize_long_side
from pixpool.shared.config import AugmentConfig, StreamSettings
from pixpool.shared.records import Targets
from pixpool.shared.sampler import num_batches

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "coco128" / "annotations" / "instances_train2017.json"
STAGES = ["source", "canvas", "warp", "labels", "copy_paste", "mixup", "quantise", "hsv", "pack"]


class _Arrays:
    """ImageSource over in-memory arrays; ``convert`` centres a uint8 cache per call."""

    def __init__(self, images, targets, imgsz: int, convert: bool):
        self._images, self._targets, self.imgsz, self._convert = images, targets, imgsz, convert

    def __len__(self) -> int:
        return len(self._images)

    def image(self, index: int) -> np.ndarray:
        return centre(self._images[index]) if self._convert else self._images[index]

    def targets(self, index: int) -> Targets:
        return self._targets[index]


def _time_arm(source, st: StreamSettings, batches: int, epoch: int) -> tuple[float, int, dict[str, float]]:
    timings: dict[str, float] = {}
    images = 0
    # Touched before the clock starts: a ring slot is reused memory, so first-touch page
    # faults are no part of the route's cost (they used to land in ``pack``).
    out = np.zeros((st.batch_size, 3, st.augment.imgsz, st.augment.imgsz), np.uint8)
    out.fill(1)
    t0 = time.perf_counter()
    for b in range(batches):
        images += len(render_batch(source, st, epoch, b, images_out=out, timings=timings).samples)
    return time.perf_counter() - t0, images, timings


def _time_floor(float_images, imgsz: int, count: int) -> float:
    """Seconds for ``count`` float32 resamples of ``float_images`` (3 or 4 channels)."""
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for k in range(count):
        img = float_images[k % len(float_images)]
        a = rng.uniform(0.5, 1.5)
        m = np.array([[a, 0, rng.uniform(-50, 50)], [0, a, rng.uniform(-50, 50)]])
        cv2.warpAffine(img, m, (imgsz, imgsz), flags=cv2.INTER_LINEAR, borderValue=(0, 0, 0))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--images", default=None)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--batches", type=int, default=4, help="batches of 16 per arm per run")
    p.add_argument("--copy-paste", type=float, default=0.0)
    p.add_argument("--mixup", type=float, default=0.0)
    p.add_argument("--shm", action="store_true", help="read from a real prepared snapshot in /dev/shm")
    p.add_argument("--write", default=None, help="markdown file whose augment section to replace")
    args = p.parse_args(argv)
    cv2.setNumThreads(1)

    dataset = load_dataset(args.data, args.images)
    u8 = [resize_long_side(decode_bgr(r.image_path), args.imgsz) for r in dataset.records]
    targets = [Targets.from_record(r) for r in dataset.records]
    floats = [centre(x) for x in u8]
    padded = [cv2.cvtColor(x, cv2.COLOR_BGR2BGRA) for x in floats]
    for a in (*u8, *floats):
        a.flags.writeable = False
    prepared = None
    if args.shm:
        from pixpool.server.snapshot.prepare import prepare_snapshot

        prepared = prepare_snapshot(dataset, imgsz=args.imgsz, processes=1)
        snap_source = prepared.snapshot
    else:
        snap_source = _Arrays(floats, targets, args.imgsz, convert=False)
    base_source = _Arrays(u8, targets, args.imgsz, convert=True)
    st = StreamSettings(seed=0, batch_size=16, augment=AugmentConfig(imgsz=args.imgsz, copy_paste=args.copy_paste, mixup=args.mixup))
    batches = min(args.batches, num_batches(len(dataset), st, 0))
    try:
        dev = dataclasses.replace(st, hsv_on_device=True)
        arms = {"snapshot": (snap_source, st), "uint8 cache": (base_source, st), "snapshot, HSV on device": (snap_source, dev)}
        results: dict[str, list[tuple[float, int, dict[str, float]]]] = {k: [] for k in arms}
        floor: list[float] = []
        floor4: list[float] = []
        _time_arm(snap_source, st, 1, 99)  # warm-up: page in, allocate scratch
        for run in range(args.runs):
            order = list(arms) if run % 2 == 0 else list(reversed(arms))
            for name in order:
                results[name].append(_time_arm(*arms[name], batches, epoch=run))
            floor.append(_time_floor(floats, args.imgsz, 16 * batches) / (16 * batches))
            floor4.append(_time_floor(padded, args.imgsz, 16 * batches) / (16 * batches))
    finally:
        if prepared is not None:
            prepared.snapshot.close()
            if not prepared.reused:
                prepared.snapshot.unlink()

    table = _table(results, floor, floor4, args, batches)
    print(table)
    if args.write:
        _write_section(Path(args.write), table, f"copy-paste {args.copy_paste}, mixup {args.mixup}")
    return 0


def _table(results, floor: list[float], floor4: list[float], args, batches: int) -> str:
    lines = [
        f"Route on {Path(args.data).name} at {args.imgsz} px (mosaic 1.0, affine defaults, copy-paste {args.copy_paste}, "
        f"mixup {args.mixup}, flips, HSV on CPU), batch 16, {batches} batches per arm per run, {args.runs} alternating runs, "
        f"one process, cv2.setNumThreads(1); medians. Snapshot arm reads "
        + ("a prepared snapshot in /dev/shm" if args.shm else "the centred float32 arrays in process memory")
        + f". Machine: {os.cpu_count()} logical CPUs, shared. "
        f"`python bench/augment.py --runs {args.runs} --batches {args.batches}" + (f" --copy-paste {args.copy_paste}" if args.copy_paste else "") + (" --shm" if args.shm else "") + "`",
        "",
        "| arm | img/s per core | ms/img total | " + " | ".join(STAGES) + " |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in STAGES) + " |",
    ]
    rates = {}
    for name, runs in results.items():
        rate = statistics.median(n / t for t, n, _ in runs)
        rates[name] = rate
        stage = [statistics.median(tm.get(s, 0.0) / n * 1e3 for _, n, tm in runs) for s in STAGES]
        lines.append(f"| {name} | {rate:.1f} | {1e3 / rate:.2f} | " + " | ".join(f"{x:.2f}" for x in stage) + " |")
    f = statistics.median(floor)
    lines.append(f"| floor: one float32 warpAffine | {1 / f:.1f} | {f * 1e3:.2f} | " + " | ".join("" for _ in STAGES) + " |")
    f4 = statistics.median(floor4)
    lines.append(f"| floor, padded to 4 channels (the route's form) | {1 / f4:.1f} | {f4 * 1e3:.2f} | " + " | ".join("" for _ in STAGES) + " |")
    paired = sorted((n1 / t1) / (n2 / t2) for (t1, n1, _), (t2, n2, _) in zip(results["snapshot"], results["uint8 cache"]))
    lines += ["", f"snapshot / uint8-cache throughput, paired per run: median **{statistics.median(paired):.3f}x** "
              f"(range {paired[0]:.3f}-{paired[-1]:.3f}); the snapshot route costs {1e3 / rates['snapshot'] / (f * 1e3):.2f}x "
              f"the single resample ({1e3 / rates['snapshot, HSV on device'] / (f * 1e3):.2f}x with HSV on the device)."]
    return "\n".join(lines)


def _write_section(path: Path, table: str, variant: str) -> None:
    """Replace (or add) this variant's table inside the augment section of ``path``."""
    start, end = f"<!-- augment {variant}: start -->", f"<!-- augment {variant}: end -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{table}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        heading = "## Augmentation route (bench/augment.py)"
        if heading not in text:
            text = text.rstrip() + f"\n\n{heading}\n"
        head, _, tail = text.partition(heading)
        text = head + heading + f"\n\n{block}\n" + tail
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
