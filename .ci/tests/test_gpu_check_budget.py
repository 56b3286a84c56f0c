"""bench/gpu_check.py keeps to its time budget: a lent GPU gives a session about 15 minutes in all."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def gpu_check():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("gpu_check_under_test", BENCH / "gpu_check.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def test_the_first_pair_always_runs_and_a_pair_that_would_pass_the_deadline_does_not(gpu_check):
    assert gpu_check.next_pair_fits([], now=1000.0, deadline=0.0)
    assert gpu_check.next_pair_fits([30.0, 50.0], now=100.0, deadline=150.0)
    assert not gpu_check.next_pair_fits([30.0, 50.0], now=100.0, deadline=149.0)


def test_paired_fits_stops_at_the_budget_and_says_so(gpu_check, monkeypatch):
    clock = {"t": 0.0}
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd[cmd.index("--arm") + 1])
        assert kwargs["timeout"] >= 60.0  # never a timeout shorter than an arm could need to start
        clock["t"] += 40.0  # each arm takes 40 s of wall time
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps({"seconds": 40.0}) + "\n")

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: clock["t"])
    out = gpu_check.paired_fits("data.json", 8, 64, 1, 5, "tiny", 1, deadline=200.0)
    # pairs of 80 s: after two (160 s) a third would end at 240 s, past the deadline
    assert out["pairs"] == 2 and out["stopped_by_budget"]
    assert calls == ["pixpool", "dataloader", "dataloader", "pixpool"]  # still alternating
    unbounded = gpu_check.paired_fits("data.json", 8, 64, 1, 3, "tiny", 1)
    assert unbounded["pairs"] == 3 and not unbounded["stopped_by_budget"]
