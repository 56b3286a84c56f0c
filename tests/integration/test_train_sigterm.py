"""``pixpool train`` stopped by SIGTERM (kill, systemd, Slurm, Kubernetes) ends as Ctrl-C does, and
its epoch line shows the loss as an Ultralytics user reads it.

SIGTERM: the run's last checkpoint named, the line that resumes it printed, exit status 143
(128 + 15, as Ctrl-C's is 130), documented in ``--help``. The epoch line: box, cls and dfl on
Ultralytics' scale (its box_loss, cls_loss, dfl_loss), then the total they make.

Integration test: a spawned daemon over the synthetic set; ``pixpool train`` in a subprocess.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from helpers.daemon import WAIT_S, real_daemon
from pixpool.ops.status_client import query_status

IMGSZ = 64
REACH_S = 5 * WAIT_S  # torch's import and epoch 1 on a busy 2-core machine: generous, never a timing claim


def test_sigterm_names_the_checkpoint_and_the_resume_line(synthetic_data, tmp_path):
    help_text = subprocess.run(
        [sys.executable, "-m", "pixpool.cli", "train", "--help"], capture_output=True, text=True, timeout=WAIT_S
    ).stdout
    assert "143 for SIGTERM" in " ".join(help_text.split()), help_text[-600:]
    project = tmp_path / "run"
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        argv = [sys.executable, "-m", "pixpool.cli", "train", "--socket-dir", d, "--model", "tiny"]
        argv += ["--imgsz", str(IMGSZ), "--batch-size", "4", "--epochs", "500", "--val", "0", "--progress", "0"]
        proc = subprocess.Popen(
            [*argv, "--project", str(project)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            deadline = time.monotonic() + REACH_S
            while True:  # in epoch 2, after its first batches: epoch 1's checkpoint exists
                if proc.poll() is not None:
                    pytest.fail(f"pixpool train ended before epoch 2: {proc.communicate()}")
                ours = [t for t in query_status(d).trainers if t.pid == proc.pid and t.split == "train"]
                if ours and ours[0].epoch >= 1 and ours[0].batches_delivered >= 2:
                    break
                if time.monotonic() > deadline:
                    pytest.fail(f"pixpool train did not reach epoch 2 within {REACH_S} s")
                time.sleep(0.05)  # polling the daemon's status, not synchronising on time
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 143, (out, err)
    last = project / "last.pt"
    assert f"SIGTERM: interrupted in epoch 2; the run's last checkpoint is {last}" in err, err
    assert "Traceback" not in err, err
    line = re.search(r"resume with: (.*)", err).group(1)
    assert line == f"pixpool train --resume {last} --socket-dir {d}" and last.is_file()
    # Epoch 1's line: Ultralytics' three terms, each a few units, and the total they make.
    shown = re.search(r"epoch 1/500: box ([\d.]+) cls ([\d.]+) dfl ([\d.]+) \(total ([\d.]+) = sum x batch 4\)", out)
    assert shown, out
    box, cls, dfl, total = map(float, shown.groups())
    assert 0 < box < 20 and 0 < cls < 50 and 0 < dfl < 20, shown.group(0)
    assert abs((box + cls + dfl) * 4 - total) < 0.05 * total, shown.group(0)
