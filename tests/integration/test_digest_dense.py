"""``pixpool digest --max-instances-per-image`` on a dense dataset.

Integration test: a YOLO set with one image of more instances than the default bound (1000).
The daemon serves it with ``--max-instances-per-image``; ``pixpool digest`` takes the same
flag on each of its paths (reference, in-process snapshot, temporary daemon) and they agree.
"""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from pixpool.cli import main
from pixpool.shared.stream.config import DEFAULT_MAX_INSTANCES

DENSE = DEFAULT_MAX_INSTANCES + 200


@pytest.fixture(scope="module")
def dense_yaml(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense")
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, count in enumerate((DENSE, 3, 7, 1)):
        cv2.imwrite(str(root / "images" / "train" / f"{i}.jpg"), rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
        centres = rng.uniform(0.1, 0.9, (count, 2))
        lines = [f"{i % 2} {x:.4f} {y:.4f} 0.02 0.03" for x, y in centres]
        (root / "labels" / "train" / f"{i}.txt").write_text("\n".join(lines) + "\n")
    data = root / "data.yaml"
    data.write_text("train: images/train\nnames: [a, b]\n")
    return data


def _digest(capsys, *argv: str) -> tuple[int, dict | str]:
    code = main(["digest", *argv, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


def test_digest_takes_max_instances_per_image_on_every_path(dense_yaml, capsys):
    flags = [
        str(dense_yaml),
        "--batches",
        "2",
        "--batch-size",
        "2",
        "--imgsz",
        "64",
        "--mosaic",
        "0",
        "--processes",
        "1",
    ]
    code, err = _digest(capsys, *flags, "--reference")
    assert code == 1 and "--max-instances-per-image" in err and "0.txt" in err, err  # the dense label file, named
    bound = ["--max-instances-per-image", str(DENSE)]
    code, ref = _digest(capsys, *flags, *bound, "--reference")
    assert code == 0, ref
    code, snap = _digest(capsys, *flags, *bound, "--in-process")
    assert code == 0, snap
    code, daemon = _digest(capsys, *flags, *bound, "--workers", "1")
    assert code == 0, daemon
    assert ref["digests"] == snap["digests"] == daemon["digests"] and len(ref["digests"]) == 2
