"""The memory figures' arithmetic and parsers, on fixed input (no daemon, no process)."""

from __future__ import annotations

import json
import os

import pytest

from pixpool.ops.memory_report import break_even
from pixpool.shared.stream.flags import parse_size
from pixpool.shared.transport.procmem import parse_rollup, rollup_figures
from pixpool.shared.wire.status import Status

ROLLUP = """\
55d0c0a00000-7ffd6b1e3000 ---p 00000000 00:00 0                          [rollup]
Rss:              102400 kB
Pss:               51200 kB
Pss_Anon:          20480 kB
Shared_Clean:      40960 kB
Private_Clean:     10240 kB
Private_Dirty:     20480 kB
Private_Hugetlb:       0 kB
"""


def test_rollup_is_read_in_bytes():
    fields = parse_rollup(ROLLUP)
    assert fields["Pss"] == 51200 * 1024 and fields["Pss_Anon"] == 20480 * 1024
    assert rollup_figures(fields) == (102400 * 1024, 30720 * 1024, 51200 * 1024)  # rss, uss (private pages), pss


def test_break_even():
    mib = 1 << 20
    # coco128 at 640: fixed 455 MiB snapshot + 250 MiB of processes, 79 MiB rings, 114 MiB uint8 caches
    assert break_even(705 * mib, 79 * mib, 114 * mib) == 21
    assert break_even(705 * mib, 79 * mib, 114 * mib) * 114 >= 705 + 21 * 79
    assert (21 - 1) * 114 < 705 + (21 - 1) * 79  # and not one trainer earlier
    assert break_even(10 * mib, 5 * mib, 4 * mib) is None  # a ring dearer than a cache: never
    assert break_even(10 * mib, None, 4 * mib) is None  # no trainer: no ring measured yet
    assert break_even(0, 1, 4) == 1


def test_sizes():
    assert parse_size("8G") == 8 << 30 and parse_size("512M") == 512 << 20 and parse_size("1.5GiB") == 3 << 29
    assert parse_size("4096") == 4096 and parse_size("10MB") == 10 << 20
    with pytest.raises(Exception, match="expected a size"):
        parse_size("lots")


def _sample(t: float, trainers: int) -> dict:
    ring = 79 << 20
    return {
        "time_unix": t,
        "memory": {
            "snapshot": "pixpool-snap-x",
            "segments": {"pixpool-snap-x-img": {"bytes": 455 << 20, "resident_bytes": 455 << 20}},
            "ring_bytes": trainers * ring,
            "service_pss_bytes": (705 << 20) + trainers * ring,
            "trainers_pss_bytes": trainers * (300 << 20),
            "trainers": trainers,
            "decoded_bytes": 114 << 20,
            "uint8_caches_bytes": trainers * (114 << 20),
            "break_even_trainers": 21,
        },
    }


def test_plot_draws_a_record(tmp_path):
    pytest.importorskip("matplotlib", reason="pixpool plot needs the plot extra")
    from PIL import Image

    from pixpool.ops.plot import plot, read_record

    record = tmp_path / "rec.jsonl"
    record.write_text("".join(json.dumps(_sample(100.0 + i, min(i, 4))) + "\n" for i in range(8)))
    out = plot(read_record(record), tmp_path / "mem.png")
    with Image.open(out) as im:
        assert im.size == (1200, 500) and len(im.convert("L").getcolors(256)) > 16


def test_plot_names_a_bad_line(tmp_path):
    from pixpool.ops.plot import read_record
    from pixpool.shared.errors import ConfigError

    record = tmp_path / "rec.jsonl"
    record.write_text(json.dumps(_sample(1.0, 1)) + "\n{not json\n")
    with pytest.raises(ConfigError, match=rf"{record}:2: not a `pixpool monitor --record` sample"):
        read_record(record)


def test_plot_draws_training_results(tmp_path):
    pytest.importorskip("matplotlib", reason="pixpool plot needs the plot extra")
    from PIL import Image

    from pixpool.ops.plot import plot_any, read_record

    rows = [
        {
            "epoch": e,
            "loss": 100 - 5 * e,
            "box": 3.0,
            "cls": 2.0,
            "dfl": 1.5,
            "lr": 0.01 / (e + 1),
            "data_wait_fraction": 0.05,
            "mAP50": 0.02 * e,
            "mAP50_95": 0.01 * e,
        }
        for e in range(6)
    ]
    record = tmp_path / "results.jsonl"
    record.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot_any(read_record(record), tmp_path / "results.png")
    with Image.open(out) as im:
        assert im.size == (1200, 800) and len(im.convert("L").getcolors(256)) > 16


def _idle_status(store) -> dict:
    """A daemon's status reply with no snapshot segment and no trainer, the daemon being this process."""
    snapshot = {"name": "", "segments": [], "records": 0, "decoded_bytes": 0}
    return {
        "daemon": {"pid": os.getpid(), "store": str(store), "worker_restarts": 0},
        "snapshot": snapshot,
        "splits": {"train": snapshot},
        "workers": [],
        "trainers": [],
    }


def test_memory_report_has_the_store_block(tmp_path):
    from pixpool.ops.memory_report import memory_report
    from pixpool.ops.view import memory_lines

    report = memory_report(Status.from_wire(_idle_status(tmp_path)))
    store, vfs = report["store"], os.statvfs(tmp_path)
    assert store["path"] == str(tmp_path) and store["size_bytes"] == vfs.f_blocks * vfs.f_frsize
    assert json.loads(json.dumps(report))["store"] == store  # what `pixpool memory --json` prints
    text = memory_lines(report).plain
    assert f"{tmp_path}: " in text and "free of" in text


def test_metrics_have_store_names(tmp_path):
    pytest.importorskip("prometheus_client")
    from pixpool.server.daemon.metrics import Metrics, _Collector

    metrics = Metrics("127.0.0.1", 0)  # not started: the collector reads what was published
    metrics.publish(Status.from_wire(_idle_status(tmp_path)))
    families = {f.name: f for f in _Collector(metrics).collect()}
    vfs = os.statvfs(tmp_path)
    size = vfs.f_blocks * vfs.f_frsize
    assert families["pixpool_store_size_bytes"].samples[0].value == size
    for kind in ("free", "size"):
        family = families[f"pixpool_store_{kind}_bytes"]
        assert family.type == "gauge" and len(family.samples) == 1
        assert "Deprecated" not in family.documentation


def test_memory_report_counts_polygon_and_keypoint_bytes_of_every_served_snapshot_once(tmp_path):
    from pixpool.ops.memory_report import memory_report

    status = _idle_status(tmp_path)
    train = {**status["snapshot"], "name": "a", "polygon_bytes": 800, "keypoint_bytes": 6000}
    val = {**status["snapshot"], "name": "b", "polygon_bytes": 80, "keypoint_bytes": 600}
    status.update(snapshot=train, splits={"train": train, "val": val})
    report = memory_report(Status.from_wire(status))
    assert (report["polygon_bytes"], report["keypoint_bytes"]) == (880, 6600)
    status["splits"] = {"train": train, "val": train}  # a data.yaml whose val: is its train: one snapshot
    assert memory_report(Status.from_wire(status))["keypoint_bytes"] == 6000
    status.update(snapshot=_idle_status(tmp_path)["snapshot"], splits=None)  # a daemon that says nothing of them
    assert memory_report(Status.from_wire(status))["polygon_bytes"] == 0
