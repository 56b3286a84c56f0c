"""``pixpool memory``, the metrics endpoint, the monitor's record and plot, the memory budget.

Integration tests: a spawned daemon with 2 workers over the synthetic snapshot, trainer
processes that hold their rings (``helpers/trainers.py``); every process is reaped.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.daemon import WAIT_S, ask_status, free_port, real_daemon, wait_for
from helpers.snapshot import created_by_me
from helpers.trainers import holding_trainers
from pixpool.cli import main
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.errors import CapacityError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.names import ring_prefix
from pixpool.shared.transport.procmem import parse_rollup
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 320


def _stream(seed: int, batch_size: int = 8) -> StreamSettings:
    return StreamSettings(seed=seed, batch_size=batch_size, augment=AugmentConfig(imgsz=IMGSZ))


def _memory(capsys, d: str) -> dict:
    assert main(["memory", "--socket-dir", d, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _rollup_pss(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return parse_rollup(f.read())["Pss"]


def test_memory_report_agrees_with_the_kernel_and_counts_rings_once(synthetic_data, capsys):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=2) as (_, d):
        with holding_trainers([_stream(1, 32)], d):  # the first trainer also warms the workers' scratch
            one = _memory(capsys, d)
            with holding_trainers([_stream(2, 32), _stream(3, 32)], d):
                three = _memory(capsys, d)
                direct = {p["pid"]: _rollup_pss(p["pid"]) for p in three["processes"]}
    assert {p["role"] for p in three["processes"]} == {"daemon", "worker", "trainer"}
    assert (
        sum(p["role"] == "trainer" for p in three["processes"]) == 3
        and sum(p["role"] == "worker" for p in three["processes"]) == 2
    )
    for p in three["processes"]:  # the figures are the kernel's, read a moment apart
        assert abs(p["pss_bytes"] - direct[p["pid"]]) <= 0.01 * direct[p["pid"]], p
    assert three["total_pss_bytes"] == three["service_pss_bytes"] + three["trainers_pss_bytes"]
    assert three["image_bytes"] == three["decoded_bytes"] and three["dtype"] == "uint8"  # the default snapshot
    assert three["uint8_caches_bytes"] == 3 * three["decoded_bytes"] and len(three["rings"]) == 3
    ring = three["rings"][1]["bytes"]
    assert {r["slots"] for r in three["rings"]} == {3} and three[
        "ring_bytes_per_trainer"
    ] == ring  # each trainer: one 3-slot ring

    # Two more trainers cost the service their two rings, not two snapshots: its segments grow
    # by exactly the two rings, the one snapshot stays as it was...
    def segments_of(report):
        return sum(
            v["resident_bytes"]
            for k, v in report["segments"].items()
            if k.startswith(report["snapshot"]) or k in {r["ring"] for r in report["rings"]}
        )

    assert segments_of(three) - segments_of(one) == 2 * ring and three["snapshot_bytes"] == one["snapshot_bytes"]
    # ...and the service's PSS by the same, give or take what its processes' own pages move:
    # allocators keep freed batch-sized blocks, and PSS divides shared-library pages among
    # all their mappers, so two more Python processes lower the daemon's and workers' share
    # (measured on 39 MB rings: -4.8 to +8.7 MiB).
    grown = three["service_pss_bytes"] - one["service_pss_bytes"]
    assert abs(grown - 2 * ring) <= 16 << 20, (grown, ring)
    assert (
        three["break_even_trainers"] is None
    )  # at 320 px a 3-slot ring of batch 32 costs more than a uint8 cache of 24 small images


def test_metrics_endpoint_scraped_and_parsed(synthetic_data):
    port = free_port()
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=2, metrics_port=port) as (proc, d):
        with Client.connect(_stream(4), ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            for _ in zip(range(3), c.epoch(0)):
                pass
            st = wait_for(
                lambda: (s := ask_status(d)) and s["trainers"][0]["batches_delivered"] >= 3 and s,
                what="3 batches delivered",
            )
            text = wait_for(
                lambda: (
                    (t := urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
                    and 'pixpool_trainer_batches_total{trainer="1"} 3.0' in t
                    and t
                ),
                what="the tick that publishes them",
            )
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    for name in (
        "pixpool_snapshot_bytes",
        "pixpool_decoded_equivalent_bytes",
        "pixpool_process_pss_bytes",
        "pixpool_ring_bytes",
        "pixpool_trainer_batches_total",
        "pixpool_worker_busy_seconds_total",
        "pixpool_store_free_bytes",
        "pixpool_store_size_bytes",
    ):
        assert name in samples, name
    snap = {s.labels["segment"]: s.value for s in samples["pixpool_snapshot_bytes"]}
    assert set(snap) == set(st["snapshot"]["segments"])
    # Each segment names the snapshot's pixel type, which the dashboard's legend shows.
    assert {s.labels["dtype"] for s in samples["pixpool_snapshot_bytes"]} == {st["snapshot"]["dtype"]} == {"uint8"}
    assert samples["pixpool_decoded_equivalent_bytes"][0].value == st["snapshot"]["decoded_bytes"]
    assert {s.labels["role"] for s in samples["pixpool_process_pss_bytes"]} == {"daemon", "worker", "trainer"}
    assert {s.labels["pid"] for s in samples["pixpool_process_pss_bytes"] if s.labels["role"] == "daemon"} == {
        str(proc.pid)
    }
    assert [s.value for s in samples["pixpool_ring_bytes"]] == [st["trainers"][0]["ring_nbytes"]]
    assert {s.labels["worker"] for s in samples["pixpool_worker_busy_seconds_total"]} == {"0", "1"}
    # The Grafana dashboard in deploy/ asks only for metrics the daemon serves.
    dashboard = (Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json").read_text()
    used = set(re.findall(r"pixpool_[a-z_]+", dashboard))
    assert used and used <= set(samples), used - set(samples)


def test_monitor_records_and_plot_draws_it(synthetic_data, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="pixpool plot needs the plot extra")
    record = tmp_path / "mem.jsonl"
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=2) as (_, d):
        with holding_trainers([_stream(5)], d):
            assert (
                main(["monitor", "--socket-dir", d, "--samples", "3", "--interval-s", "0.1", "--record", str(record)])
                == 0
            )
            frame = capsys.readouterr().out
    assert "break-even" in frame and "trainer 1" in frame
    # Piped (not a terminal): each sentence of the report stays one line, not cut at 80 columns.
    assert any(line.startswith("break-even: ") and line.endswith(")") for line in frame.splitlines()), frame
    lines = record.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["memory"]["trainers"] == 1 for line in lines)
    out = tmp_path / "mem.png"
    assert main(["plot", str(record), "-o", str(out)]) == 0
    from PIL import Image

    with Image.open(out) as im:
        assert im.size == (1200, 500) and len(im.convert("L").getcolors(256)) > 16  # drawn, not blank


def test_memory_budget_refuses_a_ring_and_keeps_serving(synthetic_data):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (_, d):
        with Client.connect(_stream(6), ClientOptions(socket_dir=d, timeout_s=WAIT_S)):
            st = ask_status(d)
        ring = st["trainers"][0]["ring_nbytes"]
        snapshot = sum(st["snapshot"][k] for k in ("image_bytes", "index_bytes", "target_bytes"))
    budget = snapshot + ring + ring // 2  # one ring fits, a second does not
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, memory_budget_nbytes=budget) as (proc, d):
        with Client.connect(_stream(7), ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as first:
            it = first.epoch(0)
            next(it)
            with pytest.raises(
                CapacityError, match=rf"memory budget of {budget} bytes \(in use {snapshot + ring}\).*--memory-budget"
            ):
                Client.connect(_stream(8), ClientOptions(socket_dir=d, timeout_s=WAIT_S))
            assert len(list(it)) >= 1  # the first trainer is still served
            st = ask_status(d)
            assert proc.is_alive() and [t["trainer_id"] for t in st["trainers"]] == [first._ident[0]]
    assert not [n for n in DEFAULT.segments() if n.startswith(ring_prefix(proc.pid)) or n in st["snapshot"]["segments"]]


def test_prepare_over_budget_is_refused_before_allocating(synthetic_data, capsys):
    before = set(DEFAULT.segments())
    assert (
        main(["prepare", str(synthetic_data.coco_json), "--imgsz", "96", "--processes", "1", "--memory-budget", "100K"])
        == 1
    )  # the (uint8) snapshot takes 472 KB
    err = capsys.readouterr().err
    assert "over the memory budget of 102400 bytes" in err and "--memory-budget" in err and "--imgsz (now 96)" in err
    assert created_by_me(before) == []


def test_low_store_is_reported(synthetic_data):
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1, store_warn_free_nbytes=1 << 60) as (_, d):
        st = wait_for(
            lambda: (s := ask_status(d)) and s["daemon"]["store_low"] and s,
            10,
            "the liveness tick that checks the store",
        )
        assert st["daemon"]["store_low"] is True and st["daemon"]["store_warn_free_nbytes"] == 1 << 60
