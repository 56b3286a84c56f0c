"""The route's bytes are the ones recorded in ``bench/digests.json``: every route setting of the
digest matrix (``bench/digest_matrix.py``), on a uint8 and a float32 snapshot and through the
reference pipeline, for the synthetic set and coco128.

A change meant to keep the bytes (a faster kernel, a restructured route) passes unchanged; a
change that redefines them records the matrix again in the same commit (``docs/kernel.md``),
and this test then holds the new definition.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_route_renders_the_recorded_bytes(coco128: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-P", str(ROOT / "bench" / "digest_matrix.py"), "--check", str(ROOT / "bench" / "digests.json"),
         "--coco128", str(coco128 / "annotations" / "instances_train2017.json")],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, f"{last}\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
    assert last.startswith("144 cells, 0 differ"), last
