"""The route over a float32 snapshot against the same route over a uint8 snapshot.

Runs in one process, one OpenCV thread (``cv2.setNumThreads(1)``): img/s per core. Both
snapshots are prepared here from the same dataset and removed at the end. Arms alternate
(A B, B A, ...) over ``--runs`` runs of ``--batches`` batches of 16; medians, and the
per-run ratio. The uint8 arm converts each tile where the route reads it
(``server/augment/kernel.py``); the batches are checked to be byte-identical before timing.

    python bench/route_dtype.py [--data coco128.json] [--imgsz 640] [--runs 7] [--batches 4] [--copy-paste 0.0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

DEFAULT_DATA = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "coco128" / "annotations" / "instances_train2017.json"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--images", default=None)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--copy-paste", type=float, default=0.0)
    p.add_argument("--hsv-on-device", action="store_true")
    args = p.parse_args(argv)

    import cv2
    import numpy as np

    from pixpool.server.augment import render_batch
    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
    from pixpool.shared.stream.config import AugmentConfig, StreamSettings
    from pixpool.shared.stream.digest import batch_digest

    cv2.setNumThreads(1)
    dataset = load_dataset(args.data, args.images)
    st = StreamSettings(
        seed=0,
        batch_size=16,
        hsv_on_device=args.hsv_on_device,
        augment=AugmentConfig(imgsz=args.imgsz, copy_paste=args.copy_paste),
    )
    results = {
        d: prepare_snapshot(dataset, PrepareOptions(imgsz=args.imgsz, processes=2, dtype=d))
        for d in ("float32", "uint8")
    }
    try:
        snaps = {d: r.snapshot for d, r in results.items()}
        out = np.zeros((16, 3, args.imgsz, args.imgsz), np.uint8)
        out.fill(1)  # a ring slot is reused memory: no first-touch faults inside the clock
        for b in range(args.batches):
            a, u = (render_batch(snaps[d], st, 0, b) for d in ("float32", "uint8"))
            if batch_digest(a.images, a.targets) != batch_digest(u.images, u.targets):
                raise SystemExit(f"batch {b} differs between the float32 and the uint8 snapshot")
        times: dict[str, list[float]] = {d: [] for d in snaps}
        names = list(snaps)
        load_before = os.getloadavg()
        for run in range(args.runs):
            for d in names if run % 2 == 0 else names[::-1]:
                t0 = time.perf_counter()
                for b in range(args.batches):
                    render_batch(snaps[d], st, run + 1, b, images_out=out)
                times[d].append((time.perf_counter() - t0) / (16 * args.batches))
        load_after = os.getloadavg()
    finally:
        for r in results.values():
            r.snapshot.close()
            if not r.reused:
                r.snapshot.unlink()
    print(
        f"route on {Path(args.data).name} at {args.imgsz} px (mosaic 1.0, copy-paste {args.copy_paste}, HSV {'on the device' if args.hsv_on_device else 'on the CPU'}), "
        f"{args.batches} batches of 16 per arm per run, {args.runs} alternating runs; load before {'/'.join(f'{x:.2f}' for x in load_before)}, "
        f"after {'/'.join(f'{x:.2f}' for x in load_after)}"
    )
    for d in names:
        ms = statistics.median(times[d]) * 1e3
        print(
            f"  {d:8s} snapshot: {ms:.2f} ms per image ({1e3 / ms:.1f} img/s per core); runs {' '.join(f'{t * 1e3:.2f}' for t in times[d])}"
        )
    ratio = statistics.median(u / f for f, u in zip(times["float32"], times["uint8"], strict=True))
    print(f"  uint8 / float32 time per image, paired per run: median {ratio:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
