"""A full /dev/shm is told apart from a preparation's own files in it.

Integration test, root only: ``helpers.full_store`` runs under ``unshare -m`` with a 64 MiB
tmpfs over /dev/shm (in that mount namespace only: nothing of the machine's /dev/shm is
touched), fills it to the page and prepares there in fresh processes with a decode worker.
A preparation's worker pool keeps POSIX semaphores in /dev/shm (``sem.*``, a page each): the
capacity check must count the snapshot in whole pages and see every file the preparation
makes before its last write, and a store found full at a write must say how much of it the
preparation's own files take, never blame "something else" for them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
IMGSZ = 96


def test_a_store_filled_to_the_page_is_refused_up_front_or_fits_and_a_full_one_is_accounted(synthetic_data):
    if os.geteuid() != 0:
        pytest.skip("needs root: the test mounts a small tmpfs over /dev/shm in a private mount namespace")
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private mount namespace")
    r = subprocess.run(
        ["unshare", "-m", sys.executable, "-m", "helpers.full_store", str(synthetic_data.coco_json), str(IMGSZ)],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if r.returncode != 0 and "unshare failed" in r.stderr:
        pytest.skip(f"cannot make a mount namespace here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    pages, page = out["pages"], out["page"]
    assert out["bytes"] <= pages - page, "the snapshot's bytes must fit where its pages do not, or this shows nothing"
    assert out["own"] > 0, "no preparation files in /dev/shm before the check: nothing to count"

    # (1) One page short of the snapshot's pages: refused at the check, before anything is
    # made, naming the pages it needs and the semaphores the preparation already holds.
    short = out["one_page_short"]
    assert short["error"] is not None and short["left"] == []
    assert f"the snapshot needs {pages} bytes but the store /dev/shm has {pages - page} bytes free" in short["error"]
    assert "POSIX semaphore" in short["error"] and "something else" not in short["error"]

    # (2) Room to the page, but another file takes it midway: the error at the write counts
    # the preparation's own semaphores and segments apart from the other files.
    midway = out["taken_midway"]
    text = midway["error"]
    assert text is not None and "ran out of space" in text and midway["left"] == []
    assert "something else" not in text
    sems = int(re.search(r"its decode processes' (\d+) POSIX semaphore", text).group(1))
    assert sems >= 1
    other = int(re.search(r"other files take (\d+) bytes", text).group(1))
    assert other >= midway["hog"] > 0

    # (3) Exactly the snapshot's pages at the check: it fits, nothing it makes later takes a page.
    assert out["exact"]["error"] is None, out["exact"]["error"]
    assert out["exact"]["left"] == []
