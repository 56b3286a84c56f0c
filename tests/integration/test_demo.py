"""The main job, ``pixpool demo``, end to end on the synthetic dataset (processes: daemon, workers, trainers)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from pixpool.shared.transport.store import DEFAULT


def test_demo_runs_two_trainers_and_leaves_nothing(tmp_path):
    before = set(DEFAULT.segments())
    # An earlier run's project folder: the demo takes the next free name and leaves it alone.
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "results.jsonl").write_text("earlier\n")
    runs = tmp_path / "runs2"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pixpool.cli",
            "demo",
            "--workdir",
            str(tmp_path),
            "--project",
            str(tmp_path / "runs"),
            "--num-images",
            "16",
            "--imgsz",
            "64",
            "--epochs",
            "2",
            "--batch-size",
            "4",
            "--trainers",
            "2",
            "--workers",
            "1",
            "--timeout-s",
            "240",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "2 trainers attached" in out and "decoded uint8 cache of the same images" in out
    assert f"runs go to {runs}" in out and (tmp_path / "runs" / "results.jsonl").read_text() == "earlier\n"
    # Two trainers, each with a training and a validation stream: counted as the 2 trainers they are.
    assert "if each of the 2 trainers kept its own" in " ".join(out.split()), out  # rich wraps at 80 columns
    # Each trainer validated after each of its epochs, on its own stream, and drew its results.
    # The loss as Ultralytics shows it (box, cls, dfl), then the total the step minimises.
    loss = r"box [\d.]+ cls [\d.]+ dfl [\d.]+ \(total [\d.]+ = sum x batch 4\)"
    lines = re.findall(rf"trainer (\d+) \(seed [01]\): epoch [12]/2 {loss} mAP50 [\d.]+", out)
    assert len(lines) == 4, out
    # The console is the demo's: its steps, the memory table and the epoch lines. The daemon's
    # log (each trainer attached once, numbered 1 and 2 whatever it validates) is in the run folder.
    assert proc.stderr == "", proc.stderr[-3000:]
    assert "pixpool.server" not in out and "INFO" not in out, out
    log = (runs / "daemon.log").read_text()
    assert re.findall(r"trainer (\d+) attached", log) == ["1", "2"] and "validation stream" not in log, log
    assert f"its log: {runs / 'daemon.log'}" in out
    # One numbering: the progress lines name each trainer as the memory table's process rows do.
    table = set(re.findall(r"^\s*\d+\s+trainer (\d+)\s", out, re.MULTILINE))
    assert set(lines) == table and len(table) == 2, out
    for i in (0, 1):
        rows = [json.loads(line) for line in (runs / f"seed-{i}" / "results.jsonl").read_text().splitlines()]
        assert [r["epoch"] for r in rows] == [0, 1] and all("mAP50" in r for r in rows)
        assert (runs / f"seed-{i}" / "results.png").stat().st_size > 10_000 and (
            runs / f"seed-{i}" / "last.pt"
        ).is_file()
    losses = [json.loads((runs / f"seed-{i}" / "results.jsonl").read_text().splitlines()[0])["loss"] for i in (0, 1)]
    assert losses[0] != losses[1]  # different seeds: different models on different streams
    assert "no pixpool segment left" in out
    assert set(DEFAULT.segments()) - before == set()
