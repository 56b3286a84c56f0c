"""bench/label_bounds.py: what reading YOLO label files costs, refused and accepted.

Runs in one process per case (a fresh interpreter, so each peak RSS is that case's alone):
- ``runaway``: an images folder whose one label file holds ``--lines`` box lines (the issue's
  1M lines) read with the default ``--max-instances-per-image``: seconds until refused, peak
  RSS, and the refusal's first line;
- ``class_id``: one label line with class id ``--class-id`` in an images folder (no names):
  the same figures (before the bound: a million names, or a MemoryError);
- ``coco128``: the coco128 labels read for detect, ``--rounds`` times: the median seconds of
  a whole read (the normal path, to see streaming line by line costs nothing there).

Usage: ``python bench/label_bounds.py [--lines 1000000] [--class-id 1000000] [--rounds 5]``
prints one json line per case.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COCO128 = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco128"


def _synthetic(root: Path, label: bytes) -> Path:
    from pixpool.server.synthetic import write_synthetic

    data = write_synthetic(root, num_images=4, seed=0)
    (data.labels_dir / "synth_0001.txt").write_bytes(label)
    return data.images_dir


def _timed_read(path: Path) -> dict:
    from pixpool.server.readers import load_dataset
    from pixpool.shared.errors import DatasetError

    t0 = time.perf_counter()
    try:
        dataset = load_dataset(path)
        outcome = f"read: {len(dataset)} records, {len(dataset.names)} class names"
    except (DatasetError, MemoryError) as exc:  # the refusal is the measurement
        outcome = f"{type(exc).__name__}: {str(exc)[:300]}"
    seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": round(seconds, 3), "peak_rss_mb": round(peak_mb, 1), "outcome": outcome}


def _case(name: str, args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="pxlb-"))
    try:
        if name == "runaway":
            folder = _synthetic(tmp, b"0 0.5 0.5 0.1 0.1\n" * args.lines)
        elif name == "class_id":
            folder = _synthetic(tmp, f"{args.class_id} 0.5 0.5 0.1 0.1\n".encode())
        else:
            if not (COCO128 / "labels").is_dir():
                return {"case": name, "skipped": f"no coco128 at {COCO128}"}
            from pixpool.server.readers import load_dataset

            load_dataset(COCO128 / "images" / "train2017")  # warm the page cache
            times = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                load_dataset(COCO128 / "images" / "train2017")
                times.append(time.perf_counter() - t0)
            return {"case": name, "median_s": round(statistics.median(times), 4), "rounds": args.rounds}
        return {"case": name, **_timed_read(folder)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--class-id", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--case", choices=("runaway", "class_id", "coco128"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(_case(args.case, args)))
        return
    for case in ("runaway", "class_id", "coco128"):
        argv = [sys.executable, __file__, "--case", case, "--lines", str(args.lines), "--class-id", str(args.class_id),
                "--rounds", str(args.rounds)]  # fmt: skip
        out = subprocess.run(
            argv, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"}
        )
        print(out.stdout.strip() or json.dumps({"case": case, "error": out.stderr.strip()[-500:]}))


if __name__ == "__main__":
    main()
