"""What the trainer side prints and documents: break-even as a count of trainers, validation
streams not counted as trainers, the target columns of a batch."""

from __future__ import annotations

import os
from pathlib import Path

from pixpool.client.loader import attach
from pixpool.ops.memory_report import memory_report
from pixpool.ops.view import memory_lines
from pixpool.shared.wire.status import Status

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = "(batch_index, class, cx, cy, w, h)"


def _mem(n: int, k: int | None) -> dict:
    return {
        "decoded_bytes": 114 << 20,
        "trainers": n,
        "ring_bytes_per_trainer": 56 << 20 if n else None,
        "snapshot_bytes": 455 << 20,
        "dtype": "float32",
        "ring_bytes": n * (56 << 20),
        "uint8_caches_bytes": n * (114 << 20),
        "break_even_trainers": k,
        "service_pss_bytes": 700 << 20,
        "trainers_pss_bytes": 300 << 20,
        "total_pss_bytes": 1000 << 20,
        "store": {"path": "/dev/shm", "memory": True, "free_bytes": 1 << 30, "size_bytes": 2 << 30},
    }


def test_break_even_reads_as_a_count_of_trainers():
    text = memory_lines(_mem(2, 11)).plain
    assert "break-even: from 11 trainers on" in text and "trainer 11" not in text
    assert "each of the 2 trainers kept its own" in text
    assert "from 1 trainer on" in memory_lines(_mem(1, 1)).plain


def test_a_validation_stream_is_not_counted_as_a_trainer(tmp_path):
    def stream(trainer_id: int, split: str) -> dict:
        return {
            "trainer_id": trainer_id,
            "pid": 0,
            "host": "h",
            "delivery": "shm",
            "ring": f"pixpool-ring-none-{trainer_id}",
            "slots": 3,
            "split": split,
            "settings": {"split": split},
        }

    status = {
        "daemon": {"pid": os.getpid(), "store": str(tmp_path)},
        "snapshot": {"name": "pixpool-snap-x", "decoded_bytes": 1000, "segments": []},
        "workers": [],
        "trainers": [stream(1, "train"), stream(2, "val"), stream(3, "train"), stream(4, "val")],
    }
    report = memory_report(Status.from_wire(status), store=str(tmp_path))
    assert report["trainers"] == 2 and report["uint8_caches_bytes"] == 2000 and len(report["rings"]) == 4


def test_the_target_columns_are_documented():
    assert COLUMNS in attach.__doc__ and "class id" in attach.__doc__
    readme = (ROOT / "README.md").read_text()
    python_section = readme[readme.index("From Python, a training loop") : readme.index("**Past one machine**")]
    assert COLUMNS in python_section
