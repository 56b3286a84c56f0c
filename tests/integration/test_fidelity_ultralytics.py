"""pixpool's stream against Ultralytics' own loader, statistically (bench/vs_ultralytics.py --what fidelity --quick).

Needs Ultralytics: in this interpreter (the CI venv that installs it beside pixpool), or in
the Python named by ``$PIXPOOL_UL_PYTHON`` (a separate venv; its arm never imports
pixpool). Skips with the reason otherwise, and where coco128 is absent. Starts a daemon (2
workers) and two Ultralytics processes; about 15-30 s on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _ultralytics_python() -> str | None:
    if find_spec("ultralytics") is not None:
        return sys.executable
    other = os.environ.get("PIXPOOL_UL_PYTHON")
    if (
        other
        and subprocess.run(
            [other, "-c", "import ultralytics"], capture_output=True, check=False, timeout=120
        ).returncode
        == 0
    ):
        return other
    return None


UL_PYTHON = _ultralytics_python()
pytestmark = [
    pytest.mark.ultralytics,
    pytest.mark.skipif(
        UL_PYTHON is None,
        reason="Ultralytics is not importable here and $PIXPOOL_UL_PYTHON names no Python that has it (pip install torch==2.14.1 torchvision==0.29.1 ultralytics)",
    ),
]


@pytest.fixture
def fidelity():
    sys.path.insert(0, str(BENCH))
    try:
        import _fidelity as fidelity  # bench/_fidelity.py: bench/vs_ultralytics.py --what fidelity

        yield fidelity
    finally:
        sys.path.remove(str(BENCH))


def test_pixpool_stream_matches_ultralytics_loader_within_tolerance(coco128, fidelity, tmp_path):
    args = fidelity.parse_args(
        ["--quick", "--ul-python", UL_PYTHON, "--coco128", str(coco128), "--grid", str(tmp_path / "grid.png")]
    )
    text, rows, _ = fidelity.run(args)
    assert (tmp_path / "grid.png").stat().st_size > 10_000, "the side-by-side grid was not written"
    metrics = {r.metric for r in rows}
    assert {"boxes per image", "fill share per image, HSV off", "R mean per image", "hue gain", "value gain"} <= metrics
    for r in rows:
        if r.metric.startswith("hue change"):
            # An image with no saturated, bright pixel (a mosaic of grey photographs) has no hue
            # to change: it is left out of this row alone, and it is rare.
            assert 243 <= min(r.n_a, r.n_b) and max(r.n_a, r.n_b) <= 256, f"{r.metric}: {r.n_a} and {r.n_b} images"
            continue
        assert r.n_a == r.n_b == 256, f"{r.metric}: compared {r.n_a} against {r.n_b} images, expected 256 each"
    failed = [r for r in rows if not r.passed and r.metric not in fidelity.KNOWN_DIFFERENCES]
    assert not failed, "pixpool differs from Ultralytics' loader beyond tolerance:\n" + text
    # A known difference that no longer shows has been fixed: take it off the list.
    for metric in fidelity.KNOWN_DIFFERENCES:
        assert not all(r.passed for r in rows if r.metric == metric), (
            f"{metric!r} now passes; remove it from bench/_fidelity.py KNOWN_DIFFERENCES"
        )
