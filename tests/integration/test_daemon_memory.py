"""Memory: a second trainer costs its ring and nothing else.

Integration test (spawned daemon with 2 workers, real route, synthetic snapshot at imgsz
320). Figures are measured, not estimated: segment sizes from /dev/shm, and each process's
anonymous memory (heap, anonymous mmaps: where any copy of a batch would live) from the
kernel's ``/proc/PID/smaps_rollup``. PSS is not used for this: it moves whenever another
process on the machine maps or unmaps the same shared libraries (cv2, numpy), which says
nothing about the daemon. The accountant's ``process_memory`` figures are checked too: the
processes it reports are the daemon and its workers, and the segments they map are ours.

Tolerance: anonymous memory of the daemon and its workers grows by about 1.5 MiB over the
first epochs (allocators, caches) and then moves by under 0.1 MiB per epoch (measured over
three warm-up epochs at these settings). We allow 2 MiB, under half a batch slot
(16 x 3 x 320 x 320 = 4.7 MiB): a daemon or worker that kept even half an extra batch per
trainer outside the ring would fail. glibc's malloc, left to itself, raises its mmap
threshold after freeing a large block and then keeps later batch-sized blocks in the heap
(measured: up to 4.9 MB more on some runs, depending on what ran before); the daemon here
runs with a fixed threshold (``MALLOC_MMAP_THRESHOLD_``), so a freed batch-sized array goes
back to the kernel and only what is really kept is counted.
"""

from __future__ import annotations

import os

from helpers.daemon import WAIT_S, ask_status, real_daemon, wait_for
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.names import ring_prefix
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 320
BATCH = 16
TOLERANCE_BYTES = 2 << 20


def _anonymous_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no Anonymous line in /proc/{pid}/smaps_rollup")


def _measure(socket_dir: str) -> dict:
    from pixpool.shared.transport.procmem import process_memory

    st = ask_status(socket_dir)
    pid = st["daemon"]["pid"]
    pids = [pid] + [w["pid"] for w in st["workers"]]
    procs = process_memory(pids)
    assert sorted(p.pid for p in procs) == sorted(pids)
    ours = {n for n in DEFAULT.segments() if n.startswith(ring_prefix(pid))} | set(st["snapshot"]["segments"])
    mapped = set().union(*(p.segments for p in procs))
    heap = sum(_anonymous_bytes(p) for p in pids)
    return {
        "heap": heap,
        "shm": sum(os.stat(DEFAULT.path(n)).st_size for n in ours),
        "status": st,
        "mapped": mapped,
        "ours": ours,
    }


def test_second_trainer_adds_its_ring_and_nothing_else(synthetic_data, monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))  # inherited by the spawned daemon and workers

    def stream(seed):
        return StreamSettings(seed=seed, batch_size=BATCH, augment=AugmentConfig(imgsz=IMGSZ))

    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=2) as (_, d):
        with Client.connect(stream(1), ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as a:
            for e in range(3):  # warm up: workers touch the snapshot, allocators settle
                for _ in a.epoch(e):
                    pass
            # ...also for a second stream: allocators keep the blocks a first second trainer
            # needed (measured up to one batch, 4.9 MB, on some runs). A daemon that kept
            # something per trainer would still grow again with the next one.
            with Client.connect(stream(3), ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as warm:
                for e in range(2):
                    for _ in warm.epoch(e):
                        pass
            before = _measure(d)
            with Client.connect(stream(2), ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as b:
                for e in range(2):
                    for _ in b.epoch(e):
                        pass
                after = _measure(d)
                (ring_b,) = [t["ring_nbytes"] for t in after["status"]["trainers"] if t["trainer_id"] == b._ident[0]]
                (name_b,) = [t["ring"] for t in after["status"]["trainers"] if t["trainer_id"] == b._ident[0]]
            detached = wait_for(
                lambda: (m := _measure(d)) and not any(n.startswith(name_b) for n in m["mapped"]) and m,
                10,
                "workers unmap the detached ring",
            )
    # The daemon and its workers map nothing but this snapshot and these rings.
    assert after["mapped"] <= after["ours"] and name_b in after["mapped"]
    assert after["shm"] - before["shm"] == ring_b  # exactly its ring in /dev/shm
    assert abs(after["heap"] - before["heap"]) <= TOLERANCE_BYTES, (
        f"heap moved by {after['heap'] - before['heap']} bytes with a second trainer"
    )
    assert detached["shm"] == before["shm"]  # its ring is gone once it detaches


def test_total_ring_budget_refuses_an_attach_and_the_daemon_keeps_serving(synthetic_data):
    """Rings share /dev/shm with the snapshot: past the daemon's budget an attach is refused, clearly."""
    import pytest

    from pixpool.shared.errors import PixpoolError

    s = StreamSettings(seed=1, batch_size=2, augment=AugmentConfig(imgsz=160))
    with real_daemon(synthetic_data.coco_json, imgsz=160, workers=1, max_total_ring_nbytes=1) as (proc, d):
        with pytest.raises(
            PixpoolError,
            match=r"the training ring .* exceeds the daemon's ring budget of 1 bytes \(set by --max-total-ring-nbytes\); "
            r"use a smaller batch .*raise max_total_ring_nbytes \(pixpool serve --max-total-ring-nbytes\)",
        ):
            Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S))
        st = ask_status(d)
        assert st["trainers"] == [] and proc.is_alive()
        assert not [n for n in DEFAULT.segments() if n.startswith(ring_prefix(st["daemon"]["pid"]))]
