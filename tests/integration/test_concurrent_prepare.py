"""Two ``pixpool prepare`` runs of the same data at once: the second waits for the first
and re-attaches its snapshot instead of failing or decoding everything again."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers.daemon import WAIT_S, wait_for
from helpers.snapshot import remove_snapshot
from pixpool.client.child import cli_command
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.fingerprint import base_name, fingerprint
from pixpool.shared.transport.names import snapshot_parts
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 640


@pytest.fixture(scope="module")
def big_synthetic(tmp_path_factory):
    """Enough images that a preparation takes long enough to be caught half-way."""
    from pixpool.server.synthetic import write_synthetic

    return write_synthetic(tmp_path_factory.mktemp("big"), num_images=160, seed=3)


def test_the_second_of_two_prepares_waits_and_reattaches(big_synthetic):
    data = str(big_synthetic.coco_json)
    base = base_name(fingerprint(load_dataset(data), imgsz=IMGSZ))
    argv = cli_command("prepare", data, "--imgsz", str(IMGSZ), "--processes", "1", "--json")
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        # Start the second while the first's segments exist but are not complete yet.
        wait_for(
            lambda: first.poll() is not None or snapshot_parts(base)["meta"] in DEFAULT.segments(),
            WAIT_S,
            "first preparation under way",
        )
        if first.poll() is not None:
            pytest.skip(
                "the first preparation finished before the second could start (machine too fast for this dataset)"
            )
        second = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out1, err1 = first.communicate(timeout=WAIT_S * 2)
        out2, err2 = second.communicate(timeout=WAIT_S * 2)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(30)
    try:
        assert first.returncode == 0, err1
        assert second.returncode == 0, err2
        r1, r2 = json.loads(out1), json.loads(out2)
        assert r1["snapshot"] == r2["snapshot"] == base
        assert r1["reused"] is False and r2["reused"] is True, (r1, r2)
    finally:
        remove_snapshot(base)
