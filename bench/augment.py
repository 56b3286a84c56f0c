"""Benchmark: the fused-kernel route against the OpenCV route it replaced, and a uint8 cache.

Runs in one process, one OpenCV thread (``cv2.setNumThreads(1)``), so img/s is per core.

Arms, timed in the same run, alternating (A B C ..., then reversed), medians over runs:

- ``fused, float32``: this checkout's route (one kernel pass per sample) reading centred
  float32 images (a prepared snapshot with ``--shm``, else the same arrays in memory).
- ``fused, uint8``: the same route reading raw uint8 pixels (a uint8 snapshot's views:
  the kernel converts per tap; same bytes as float32).
- ``fused, HSV on device``: ``hsv_on_device=True`` (the workers skip HSV).
- ``OpenCV route (BASE)``: the route of commit BASE (``--base``, default the last commit
  before the kernel: canvas + ``warpAffine`` + quantise + OpenCV HSV), extracted with
  ``git archive`` into a temporary package and run on the same float32 arrays; and the
  same with HSV on the device. ``--base none`` skips them.
- ``uint8 cache``: the fused route over a cache whose ``image(i)`` converts and centres
  per call, what a loader without the prepared snapshot does.
- ``floor``: one float32 ``warpAffine`` to imgsz x imgsz per image, for scale.

Per-stage ms per image come from each route's own stage clock (``timings``): for the
fused route ``source`` (fetch + draws), ``labels``, ``copy_paste`` (draws + mask),
``kernel`` (every pixel: resample, paste, mixup, fill, quantise, flips, HSV, write).

    python bench/augment.py [--data coco128.json] [--imgsz 640] [--runs 5] [--batches 4]
        [--copy-paste 0.5] [--mixup 0.5] [--degrees 10] [--shear 2] [--perspective 0.0005]
        [--base REF|none] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from pixpool.server.augment import render_batch
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.decode import centre, decode_bgr, resize_long_side
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.records import Targets
from pixpool.shared.stream.sampler import num_batches

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "coco128" / "annotations" / "instances_train2017.json"
STAGES = ["source", "labels", "copy_paste", "mixup", "kernel", "canvas", "warp", "quantise", "hsv", "pack"]
BASE_REF = "bd80f8ab93ab3a131d743b221814265372b542fa"  # the last commit before the fused kernel


def _old_route(ref: str, where: Path):
    """``render_batch`` of commit ``ref``'s route, imported as a private package under ``where``."""
    pkg = where / "pixpool_base"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "server", "shared"], check=True, capture_output=True
    ).stdout
    tar_path = where / "base.tar"
    tar_path.write_bytes(data)
    with tarfile.open(tar_path) as tar:
        tar.extractall(pkg, filter="data")
    sys.path.insert(0, str(where))
    return importlib.import_module("pixpool_base.server.augment.batch").render_batch


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


def _time_arm(
    source, st: StreamSettings, batches: int, epoch: int, render=render_batch
) -> tuple[float, int, dict[str, float]]:
    timings: dict[str, float] = {}
    images = 0
    # Touched before the clock starts: a ring slot is reused memory, so first-touch page
    # faults are no part of the route's cost (they used to land in ``pack``).
    out = np.zeros((st.batch_size, 3, st.augment.imgsz, st.augment.imgsz), np.uint8)
    out.fill(1)
    # CPU time of this process: the machine is shared, and wall time counts the intervals
    # another process held the core (the stage clock below is wall time; see the table).
    c0, t0 = time.process_time(), time.perf_counter()
    for b in range(batches):
        images += len(render(source, st, epoch, b, images_out=out, timings=timings).samples)
    timings["_wall"] = time.perf_counter() - t0
    return time.process_time() - c0, images, timings


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
    p.add_argument("--degrees", type=float, default=0.0, help="rotation: the general-affine path")
    p.add_argument("--shear", type=float, default=0.0, help="shear: the general-affine path too")
    p.add_argument("--perspective", type=float, default=0.0)
    p.add_argument("--base", default=BASE_REF, help="git ref of the OpenCV route to compare, or none")
    p.add_argument("--shm", action="store_true", help="read from a real prepared snapshot in /dev/shm")
    p.add_argument("--write", default=None, help="markdown file whose augment section to replace")
    args = p.parse_args(argv)
    cv2.setNumThreads(1)

    dataset = load_dataset(args.data, args.images)
    u8 = [resize_long_side(decode_bgr(r.image_path), args.imgsz) for r in dataset.records]
    targets = [Targets.from_record(r) for r in dataset.records]
    floats = [centre(x) for x in u8]
    for a in (*u8, *floats):
        a.flags.writeable = False
    prepared = None
    if args.shm:
        from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot

        prepared = prepare_snapshot(dataset, PrepareOptions(imgsz=args.imgsz, processes=1))
        snap_source = prepared.snapshot
    else:
        snap_source = _Arrays(floats, targets, args.imgsz, convert=False)
    raw_source = _Arrays(u8, targets, args.imgsz, convert=False)
    base_source = _Arrays(u8, targets, args.imgsz, convert=True)
    aug = AugmentConfig(
        imgsz=args.imgsz,
        copy_paste=args.copy_paste,
        mixup=args.mixup,
        degrees=args.degrees,
        shear=args.shear,
        perspective=args.perspective,
    )
    st = StreamSettings(seed=0, batch_size=16, augment=aug)
    batches = min(args.batches, num_batches(len(dataset), st, 0))
    tmp = tempfile.TemporaryDirectory(prefix="pixpool-bench-")
    try:
        dev = dataclasses.replace(st, hsv_on_device=True)
        arms = {
            "fused, float32": (snap_source, st, render_batch),
            "fused, uint8": (raw_source, st, render_batch),
            "fused, HSV on device": (snap_source, dev, render_batch),
        }
        if args.base != "none":
            old = _old_route(args.base, Path(tmp.name))
            arms[f"OpenCV route ({args.base[:7]})"] = (snap_source, st, old)
            arms[f"OpenCV route ({args.base[:7]}), HSV on device"] = (snap_source, dev, old)
        arms["uint8 cache (fused route)"] = (base_source, st, render_batch)
        results: dict[str, list[tuple[float, int, dict[str, float]]]] = {k: [] for k in arms}
        floor: list[float] = []
        for name in arms:  # warm-up: page in, first-call allocations
            _time_arm(arms[name][0], arms[name][1], 1, 99, arms[name][2])
        for run in range(args.runs):
            order = list(arms) if run % 2 == 0 else list(reversed(arms))
            for name in order:
                source, settings, render = arms[name]
                results[name].append(_time_arm(source, settings, batches, run, render))
            floor.append(_time_floor(floats, args.imgsz, 16 * batches) / (16 * batches))
    finally:
        tmp.cleanup()
        if prepared is not None:
            prepared.snapshot.close()
            if not prepared.reused:
                prepared.snapshot.unlink()

    load = os.getloadavg()
    table = _table(results, floor, args, batches, load)
    print(table)
    if args.write:
        _write_section(Path(args.write), table, _variant(args))
    return 0


def _variant(args) -> str:
    shear = f", shear {args.shear}" if args.shear else ""  # absent when 0: earlier sections keep their names
    return f"copy-paste {args.copy_paste}, mixup {args.mixup}, degrees {args.degrees}{shear}, perspective {args.perspective}"


def _table(results, floor: list[float], args, batches: int, load) -> str:
    flags = "".join(
        f" --{k} {getattr(args, k.replace('-', '_'))}"
        for k in ("copy-paste", "mixup", "degrees", "shear", "perspective")
        if getattr(args, k.replace("-", "_"))
    )
    lines = [
        f"Route on {Path(args.data).name} at {args.imgsz} px (mosaic 1.0, {_variant(args)}, other hyper-parameters default, flips, "
        f"HSV on CPU unless noted), batch 16, {batches} batches per arm per run, {args.runs} alternating runs, "
        "one process, cv2.setNumThreads(1); medians. Float32 arms read "
        + ("a prepared snapshot in /dev/shm" if args.shm else "the centred float32 arrays in process memory")
        + f". Machine: {os.cpu_count()} logical CPUs, shared; load average {load[0]:.2f} at the end. Totals in CPU time of the process, "
        "stage columns in wall time (they add up to the wall total). "
        f"`python bench/augment.py --runs {args.runs} --batches {args.batches}{flags}"
        + (" --shm" if args.shm else "")
        + "`",
        "",
    ]
    stages = [s for s in STAGES if any(tm.get(s, 0.0) > 0 for runs in results.values() for _, _, tm in runs)]
    lines += [
        "| arm | img/s per core (CPU time) | ms/img (CPU time) | ms/img (wall) | " + " | ".join(stages) + " |",
        "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in stages) + " |",
    ]
    for name, runs in results.items():
        rate = statistics.median(n / t for t, n, _ in runs)
        wall = statistics.median(tm["_wall"] / n for _, n, tm in runs)
        stage = [statistics.median(tm.get(s, 0.0) / n * 1e3 for _, n, tm in runs) for s in stages]
        lines.append(
            f"| {name} | {rate:.1f} | {1e3 / rate:.2f} | {wall * 1e3:.2f} | "
            + " | ".join(f"{x:.2f}" if x else "" for x in stage)
            + " |"
        )
    f = statistics.median(floor)
    lines.append(
        f"| floor: one float32 warpAffine (wall) | | | {f * 1e3:.2f} | " + " | ".join("" for _ in stages) + " |"
    )

    def paired(a: str, b: str) -> str:
        r = sorted((n1 / t1) / (n2 / t2) for (t1, n1, _), (t2, n2, _) in zip(results[a], results[b]))
        return f"**{statistics.median(r):.2f}x** (range {r[0]:.2f}-{r[-1]:.2f})"

    lines.append("")
    old = [k for k in results if k.startswith("OpenCV route") and "device" not in k]
    if old:
        lines.append(
            f"Throughput, paired per run: fused / OpenCV route {paired('fused, float32', old[0])} with HSV on the CPU, "
            f"{paired('fused, HSV on device', old[0] + ', HSV on device')} with HSV on the device; "
        )
    lines.append(
        f"fused float32 / fused uint8 {paired('fused, float32', 'fused, uint8')}; fused / uint8 cache {paired('fused, float32', 'uint8 cache (fused route)')}."
    )
    return "\n".join(lines)


def _write_section(path: Path, table: str, variant: str) -> None:
    """Replace (or add) this variant's table inside the augment section of ``path``."""
    start, end = f"<!-- augment {variant}: start -->", f"<!-- augment {variant}: end -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{table}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        heading = "## Augmentation route: fused kernel (bench/augment.py)"
        if heading not in text:
            text = text.rstrip() + f"\n\n{heading}\n"
        head, _, tail = text.partition(heading)
        text = head + heading + f"\n\n{block}\n" + tail
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
