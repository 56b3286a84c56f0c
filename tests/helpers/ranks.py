"""Run ``examples/torchrun_ddp.py`` under ``torchrun`` and read what its ranks recorded.

Runs in the pytest process; torchrun and its ranks are child processes, always waited for
(killed as a process group past the timeout).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun_ddp.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
RUN_TIMEOUT_S = 120.0


def example_args(attach: str | list[str], record: Path, *, epochs: int, imgsz: int, batch_size: int) -> list[str]:
    """The example's argv; ``attach`` is a socket directory, or the flags that name a daemon (``--endpoint ... --keys ...``)."""
    where = ["--socket-dir", attach] if isinstance(attach, str) else list(attach)
    return [
        str(EXAMPLE),
        *where,
        "--epochs",
        str(epochs),
        "--imgsz",
        str(imgsz),
        "--batch-size",
        str(batch_size),
        "--scale",
        "tiny",
        "--record",
        str(record),
        "--timeout-s",
        "60",
    ]


def run_group(
    cmd: list[str], *, env: dict | None = None, timeout_s: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; on timeout the whole group is killed."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{cmd[:4]}... did not finish within {timeout_s} s:\n{out[-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_each_index_once(records: list[dict], *, num_records: int, epochs: int, world_size: int) -> None:
    """Per epoch: one record per rank, disjoint shards, every index exactly once overall."""
    for epoch in range(epochs):
        of_epoch = [r for r in records if r["epoch"] == epoch]
        assert sorted(r["rank"] for r in of_epoch) == list(range(world_size)), of_epoch
        counts = Counter(i for r in of_epoch for i in r["indices"])
        assert set(counts) == set(range(num_records)), (
            f"epoch {epoch}: indices missing {set(range(num_records)) - set(counts)}"
        )
        assert set(counts.values()) == {1}, (
            f"epoch {epoch}: indices delivered more than once {[i for i, c in counts.items() if c > 1]}"
        )
