"""Three trainers on one daemon, as three tuning trials are: the workers are shared fairly.

Each trainer (a spawned process) attaches with the same batch size and its own augmentation
(one light route, one mosaic, one mosaic with mixup and rotation: different render costs per
part), waits until all three are attached, then takes the same number of batches as fast
as it can. The scheduler hands parts out round robin (``server/daemon/scheduler.py``), so
the trainers' data waits must stay within 1.5x of each other; and each trainer's wait must
reach the daemon (its heartbeat), where ``pixpool monitor`` and the metrics read it.
"""

from __future__ import annotations

import multiprocessing as mp

from helpers.daemon import ask_status, real_daemon, wait_for
from pixpool.ops.view import trainers_table
from pixpool.shared.wire.status import Status

ROUTES = [dict(mosaic=0.0), dict(mosaic=1.0), dict(mosaic=1.0, mixup=0.5, degrees=10.0)]
EPOCHS = 30  # 24 images, batch 8: 90 batches each (a few seconds: start-up skew small beside it)
TIMEOUT_S = 120.0


def _trainer(socket_dir: str, route: dict, seed: int, start, done, results) -> None:
    from pixpool.client import attach

    with attach(socket_dir, batch_size=8, seed=seed, timeout_s=TIMEOUT_S, **route) as loader:
        start.wait(TIMEOUT_S)  # all three attached: they compete from the same moment
        batches = 0
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            for _ in loader:
                batches += 1
        results.put((seed, batches, loader.client.data_wait_s))
        done.wait(TIMEOUT_S)  # attached until the test has read the daemon's status


def test_three_trainers_wait_alike_and_each_wait_is_reported(synthetic_data):
    ctx = mp.get_context("spawn")
    start, done, results = ctx.Barrier(len(ROUTES) + 1), ctx.Barrier(len(ROUTES) + 1), ctx.Queue()
    with real_daemon(synthetic_data.data_yaml, imgsz=320, workers=2) as (_, sdir):
        procs = [
            ctx.Process(target=_trainer, args=(sdir, route, seed, start, done, results))
            for seed, route in enumerate(ROUTES)
        ]
        for p in procs:
            p.start()
        try:
            start.wait(TIMEOUT_S)
            waits = dict((seed, wait) for seed, _, wait in (results.get(timeout=TIMEOUT_S) for _ in procs))
            # Each trainer's own wait reaches the daemon with its next heartbeat (1 s).
            st = wait_for(
                lambda: (
                    (s := ask_status(sdir))
                    and len(s["trainers"]) == 3
                    and all(t["data_wait_s"] >= 0.9 * waits[t["settings"]["seed"]] for t in s["trainers"])
                    and s
                ),
                timeout_s=30,
                what="each trainer's wait in the daemon's status",
            )
            done.wait(TIMEOUT_S)
        finally:
            for p in procs:
                p.join(TIMEOUT_S)
                if p.is_alive():
                    p.kill()
    assert max(waits.values()) <= 1.5 * min(waits.values()), waits
    assert all(w > 0 for w in waits.values()), waits
    # pixpool monitor's trainer table: one row per trainer, with its wait share.
    assert trainers_table(Status.from_wire(st)).row_count == 3
