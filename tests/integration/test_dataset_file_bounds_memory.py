"""A data.yaml or a COCO json is refused by file and field at its bounds, in little time and
memory, whatever the file asks for.

Integration test: each read runs in a child process under a 1.5 GB address-space limit
(``RLIMIT_AS``) and a deadline, so a reader that follows what a small file asks for (a
``kpt_shape`` of 10^8 keypoints, a YAML alias bomb that expands to 10^9 strings, a json of
millions of categories) fails here with a MemoryError or a timeout instead of eating the
machine. The child prints the DatasetError's text and its peak resident memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers.task_sets import yolo_set

AS_LIMIT_BYTES = 1_500_000_000
DEADLINE_S = 120

_CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from pixpool.server.readers import load_dataset
from pixpool.shared.errors import DatasetError
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
try:
    load_dataset(sys.argv[1], task=sys.argv[2])
    text = None
except DatasetError as exc:
    text = str(exc)
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
print(json.dumps({{"refused": text, "grew_bytes": grew}}))
"""


def _read_in_child(data, task: str) -> dict:
    """What ``load_dataset(data, task=task)`` did in a memory-limited child: the refusal's text
    (None when it read the set) and how far its peak resident memory grew past the imports."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    code = _CHILD.format(limit=AS_LIMIT_BYTES)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(data), task], capture_output=True, text=True, timeout=DEADLINE_S, env=env
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"reading {data} took over {DEADLINE_S} s") from None
    assert done.returncode == 0, f"the reader crashed (rc {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "k, flip", [(100_000_000, [0]), (5_000_000_000, None)], ids=["flip_idx-range", "struct-overflow"]
)
def test_a_huge_kpt_shape_is_refused_naming_the_yaml_and_field(tmp_path, k, flip):
    keys = {"kpt_shape": [k, 3]} | ({"flip_idx": flip} if flip is not None else {})
    data = yolo_set(tmp_path, ["0 0.5 0.5 0.2 0.2\n"], **keys)
    got = _read_in_child(data, "pose")
    assert got["refused"] is not None, got
    assert got["refused"].startswith(f"{data}: 'kpt_shape'"), got
    assert "1024" in got["refused"], got  # the bound, as the wire's MAX_KEYPOINTS
    assert got["grew_bytes"] < 100 << 20, got


def _alias_bomb(levels: int = 9) -> str:
    """A 'billion laughs': each level is a list of 9 aliases of the one before (9^levels strings)."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("field", ["path", "names", "kpt_shape"])
def test_a_yaml_alias_bomb_is_refused_naming_the_yaml(tmp_path, field):
    data = tmp_path / "data.yaml"
    keys = {"path": ".", "train": "images/train", "names": "[a, b]", "kpt_shape": "[1, 3]"}
    keys[field] = "*l8"
    data.write_text(_alias_bomb() + "".join(f"{k}: {v}\n" for k, v in keys.items()))
    assert data.stat().st_size < 1000
    got = _read_in_child(data, "pose")
    assert got["refused"] is not None, got
    assert got["refused"].startswith(f"{data}:2: YAML alias *l0 refused"), got  # the first alias
    assert got["grew_bytes"] < 100 << 20, got


def test_a_coco_json_with_millions_of_categories_is_refused_in_bounded_memory(tmp_path):
    (tmp_path / "images" / "train").mkdir(parents=True)
    path = tmp_path / "annotations" / "instances_train.json"
    path.parent.mkdir()
    n = 2_000_000
    cats = ",".join(f'{{"id":{i},"name":"c{i}"}}' for i in range(n))
    path.write_text(f'{{"images":[],"annotations":[],"categories":[{cats}]}}')
    size = path.stat().st_size
    got = _read_in_child(path, "detect")
    assert got["refused"] is not None, got
    assert got["refused"].startswith(f"{path}: 'categories'"), got
    assert "20000" in got["refused"] and "--max-classes" in got["refused"], got
    # The file's text (read once, decoded once) and a bounded number of categories; every
    # category as a Python dict would be 8x the text and more.
    assert got["grew_bytes"] < 3 * size, (got, size)
