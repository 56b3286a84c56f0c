"""bench/derive_set.py: the set derived from coco128 is byte-deterministic for a seed, its images
distinct photographs at COCO's size, its labels inside them, and a daemon serves it with the same
batch digests as the in-process reference.

Needs coco128 (``PIXPOOL_COCO128``, else ../shared/data/coco128); skipped where it is absent. The
digest test starts a temporary daemon (``pixpool digest``'s default path), which removes its
snapshot and rings at exit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import derive_set
import pytest

COCO128 = derive_set.COCO128
needs_coco128 = pytest.mark.skipif(
    not (COCO128 / "annotations" / "instances_train2017.json").is_file(),
    reason=f"coco128 is not at {COCO128} (PIXPOOL_COCO128, default ../shared/data/coco128 beside the checkout)",
)


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


@needs_coco128
def test_two_runs_of_one_seed_write_identical_files_whatever_the_process_count(tmp_path):
    derive_set.derive_set(tmp_path / "a", train=6, val=2, seed=3, processes=2)
    derive_set.derive_set(tmp_path / "b", train=6, val=2, seed=3, processes=1)
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert len(a) == 6 + 2 + 6 + 2 + 2 + 1  # images, label files, two jsons, data.yaml
    assert a == b
    derive_set.derive_set(tmp_path / "c", train=6, val=2, seed=4, processes=1)
    other = _tree(tmp_path / "c")
    assert all(other[k] != a[k] for k in a if k.endswith(".jpg")), "another seed derives other photographs"


@needs_coco128
def test_images_are_distinct_at_cocos_size_and_their_labels_lie_inside(tmp_path):
    import cv2

    derive_set.derive_set(tmp_path / "s", train=20, val=4, seed=0, processes=1)
    root = tmp_path / "s"
    images = sorted(root.glob("images/*/*.jpg"))
    assert len({hashlib.sha256(p.read_bytes()).digest() for p in images}) == 24
    instances = 0
    for path in images:
        h, w = cv2.imread(str(path)).shape[:2]
        assert max(h, w) == 640
        label = root / "labels" / path.parent.name / f"{path.stem}.txt"
        for line in label.read_text().splitlines():
            cls, cx, cy, bw, bh = line.split()
            assert 0 <= int(cls) < 80
            x0, x1 = float(cx) - float(bw) / 2, float(cx) + float(bw) / 2
            y0, y1 = float(cy) - float(bh) / 2, float(cy) + float(bh) / 2
            assert -1e-5 <= x0 < x1 <= 1 + 1e-5 and -1e-5 <= y0 < y1 <= 1 + 1e-5, (path, line)
            assert float(bw) * w >= derive_set.MIN_SIDE_PX - 1e-3 and float(bh) * h >= derive_set.MIN_SIDE_PX - 1e-3
            instances += 1
    coco = json.loads((root / "annotations" / "instances_train.json").read_text())
    assert len(coco["images"]) == 20 and len(coco["categories"]) == 80
    val = json.loads((root / "annotations" / "instances_val.json").read_text())
    assert len(coco["annotations"]) + len(val["annotations"]) == instances > 0


def test_a_polygon_is_clipped_to_the_crop():
    square = [[-10.0, -10.0], [10.0, -10.0], [10.0, 10.0], [-10.0, 10.0]]
    import numpy as np

    clipped = derive_set.clip_polygon(np.array(square), 0.0, 0.0, 5.0, 20.0)
    assert sorted(map(tuple, clipped.tolist())) == [(0.0, 0.0), (0.0, 10.0), (5.0, 0.0), (5.0, 10.0)]
    assert len(derive_set.clip_polygon(np.array(square), 20.0, 20.0, 30.0, 30.0)) == 0


@needs_coco128
def test_a_served_derived_set_digests_as_the_reference(tmp_path, capsys):
    from pixpool.cli import main

    derive_set.derive_set(tmp_path / "s", train=24, val=8, seed=0, processes=2)
    data = str(tmp_path / "s" / "data.yaml")
    store = tmp_path / "store"
    store.mkdir()
    flags = [data, "--batches", "3", "--batch-size", "8", "--imgsz", "320", "--processes", "1", "--workers", "1"]
    digests = {}
    for path in ("served", "reference"):
        extra = ["--reference"] if path == "reference" else ["--store", str(store)]
        assert main(["digest", *flags, *extra, "--json"]) == 0
        digests[path] = json.loads(capsys.readouterr().out)
    assert digests["served"]["path"] != digests["reference"]["path"]
    assert len(digests["served"]["digests"]) == 3
    assert digests["served"]["digests"] == digests["reference"]["digests"]
    assert not list(store.iterdir()), "the temporary daemon removed its snapshot and rings"
