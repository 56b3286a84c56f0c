"""bench/serve_ab.py: ``bench/serve.py``'s daemon arms on this checkout against another
checkout's code (a baseline, e.g. main's commit in a scratch worktree), in alternating
fresh processes; medians and paired ratios.

Runs in one process that only starts others: each run is ``bench/serve.py --rounds 1
--no-loader`` (this file's copy, so both arms are measured the same way) in a fresh
interpreter whose ``PYTHONPATH`` puts one checkout's ``server``/``client``/``shared`` first
as the ``pixpool`` namespace (a temporary folder of symlinks; an installed editable pixpool
comes after it on the import path). Pairs alternate which arm goes first.

Usage: ``python bench/serve_ab.py --base /work/wt-jobs-base [--pairs 5] [-- serve.py flags]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _package_root(checkout: Path, into: Path) -> Path:
    root = into / "pixpool"
    root.mkdir(parents=True)
    for side in ("server", "client", "shared"):
        (root / side).symlink_to(checkout / side)
    return into


def _run(path_root: Path, extra: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(path_root)}
    out = subprocess.run(
        [sys.executable, str(HERE / "serve.py"), "--rounds", "1", "--no-loader", *extra],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"serve.py failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout[out.stdout.index("{") :])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base", required=True, help="the baseline checkout (its server/, client/, shared/ are imported)"
    )
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("rest", nargs="*", help="flags for serve.py, after --")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {"base": [], "candidate": []}
    with tempfile.TemporaryDirectory(prefix="pxab-") as tmp:
        roots = {
            "base": _package_root(Path(args.base).resolve(), Path(tmp) / "base"),
            "candidate": _package_root(HERE.parent, Path(tmp) / "candidate"),
        }
        for i in range(args.pairs):
            for arm in ("base", "candidate") if i % 2 == 0 else ("candidate", "base"):
                runs[arm].append(_run(roots[arm], args.rest))
                print(f"pair {i} {arm}: {runs[arm][-1]['img_per_s']}", file=sys.stderr)
    keys = sorted(runs["base"][0]["img_per_s"])
    report: dict = {"pairs": args.pairs, "serve_flags": args.rest}
    for k in keys:
        b = [r["img_per_s"][k] for r in runs["base"]]
        c = [r["img_per_s"][k] for r in runs["candidate"]]
        fb = [r["first_batch_s"][k] for r in runs["base"]]
        fc = [r["first_batch_s"][k] for r in runs["candidate"]]
        report[k] = {
            "img_per_s": {
                "base": statistics.median(b),
                "candidate": statistics.median(c),
                "paired_ratio": round(statistics.median(y / x for x, y in zip(b, c, strict=True)), 3),
                "base_runs": b,
                "candidate_runs": c,
            },
            "first_batch_s": {
                "base": statistics.median(fb),
                "candidate": statistics.median(fc),
                "paired_ratio": round(statistics.median(y / x for x, y in zip(fb, fc, strict=True)), 3),
            },
            "ring_nbytes": {
                "base": runs["base"][0]["ring_nbytes"][k],
                "candidate": runs["candidate"][0]["ring_nbytes"][k],
            },
            "augment_s_per_batch": {
                "base": statistics.median(r["augment_s_per_batch"] for r in runs["base"]),
                "candidate": statistics.median(r["augment_s_per_batch"] for r in runs["candidate"]),
            },
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
