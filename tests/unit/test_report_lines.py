"""``pixpool memory``, ``monitor`` and the demo print whole lines when their output is piped
or written to a file: a sentence of the report is one line, never cut at 80 columns."""

from __future__ import annotations

import io

from pixpool.ops.view import frame, memory_lines, processes_table, report_console
from pixpool.shared.wire.status import Status

MEM = {
    "decoded_bytes": 13 << 20,
    "trainers": 2,
    "ring_bytes_per_trainer": 7 << 20,
    "validation_ring_bytes": 17 << 20,
    "snapshot_bytes": 52 << 20,
    "dtype": "float32",
    "ring_bytes": 31 << 20,
    "uint8_caches_bytes": 26 << 20,
    "break_even_trainers": 24,
    "service_pss_bytes": 155 << 20,
    "trainers_pss_bytes": 1001 << 20,
    "total_pss_bytes": 1156 << 20,
    "store": {"path": "/dev/shm", "memory": True, "free_bytes": 1 << 30, "size_bytes": 2 << 30},
    "processes": [
        {"pid": 11, "role": "daemon", "index": None, "rss_bytes": 1, "uss_bytes": 1, "pss_bytes": 1},
        {"pid": 12, "role": "trainer", "index": 1, "rss_bytes": 1, "uss_bytes": 1, "pss_bytes": 1},
    ],
}
STATUS = {
    "daemon": {"pid": 11, "endpoint": "ipc:///tmp/a-rather-long-socket-directory/pixpool/daemon.sock", "uptime_s": 5},
    "snapshot": {"name": "pixpool-u0-snap-0123456789abcdef", "records": 64, "imgsz": 320},
    "trainers": [],
    "workers": [{"index": 0, "pid": 13, "state": "idle", "samples_done": 1, "busy_s": 1.0}],
}


def _printed(*renderables) -> list[str]:
    out = io.StringIO()  # not a terminal, as `pixpool memory | tee mem.txt` or a CI log
    console = report_console(file=out)
    for r in renderables:
        console.print(r)
    return out.getvalue().splitlines()


def test_piped_memory_report_keeps_each_sentence_on_one_line():
    lines = _printed(memory_lines(MEM), processes_table(MEM))
    whole = memory_lines(MEM).plain.splitlines()
    assert max(len(s) for s in whole) > 80  # the case at hand: a line longer than a terminal's 80 columns
    for sentence in whole:
        assert sentence in lines, (sentence, lines)


def test_piped_monitor_frame_keeps_its_head_on_one_line():
    lines = _printed(frame(Status.from_wire(STATUS), MEM))
    head = f"pixpool daemon 11 on {STATUS['daemon']['endpoint']}, up 5 s; snapshot {STATUS['snapshot']['name']}: 64 records at 320"
    assert head in lines, lines
