"""pixpool's segment, pose and OBB streams against Ultralytics' own loader for that task,
statistically (bench/vs_ultralytics.py --what fidelity --task TASK --quick).

Needs Ultralytics as tests/integration/test_fidelity_ultralytics.py does (this interpreter or
``$PIXPOOL_UL_PYTHON``) and, for segment, coco128's ``labels-seg``; pose and obb run on
``pixpool synth --task pose|obb``. Each task starts a daemon with 2 workers and one
Ultralytics process; about 1 minute per task on 2 cores. The tolerances are the ones
bench/_fidelity.py fixed before the pixpool arm of these tasks existed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_fidelity_ultralytics import BENCH, UL_PYTHON  # beside this file (pytest puts the folder on sys.path)

pytestmark = [
    pytest.mark.ultralytics,
    pytest.mark.skipif(
        UL_PYTHON is None, reason="Ultralytics is not importable here and $PIXPOOL_UL_PYTHON names none"
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


@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
def test_task_stream_matches_ultralytics_loader_within_tolerance(task, fidelity, request):
    coco128 = request.getfixturevalue("coco128") if task == "segment" else Path("unused")
    if task == "segment" and not (coco128 / "labels-seg" / "train2017").is_dir():
        pytest.skip(f"coco128's segment labels not found at {coco128 / 'labels-seg'}")
    args = fidelity.parse_args(["--quick", "--task", task, "--ul-python", UL_PYTHON, "--coco128", str(coco128)])
    text, rows, _ = fidelity.run_task(args)
    expected = {
        "segment": "mask IoU with its own box",
        "pose": "visible keypoints per instance",
        "obb": "angle (radians)",
    }
    assert expected[task] in {r.metric for r in rows}, text
    for r in rows:  # 2 epochs of 128 images from each arm
        assert r.n_a > 100 and r.n_b > 100, f"{r.metric}: only {r.n_a} / {r.n_b} units compared"
    failed = [r for r in rows if not r.passed]
    assert not failed, f"pixpool's {task} stream differs from Ultralytics' loader beyond tolerance:\n{text}"
