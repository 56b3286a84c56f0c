"""Keep serving through stalls and worker kills: a stopped worker's batch is re-dispatched,
a slow daemon is waited for, and outside kills of starting workers are no start failures."""

from __future__ import annotations

import os
import signal

import psutil

from helpers.daemon import WAIT_S, ask_status, digest_of, real_daemon, reference_stream, wait_for
from pixpool.client import Client
from pixpool.client.options import ClientOptions
from pixpool.server.readers import load_dataset
from pixpool.shared.stream.config import AugmentConfig, StreamSettings

IMGSZ = 96


def _settings(seed: int = 11) -> StreamSettings:
    return StreamSettings(seed=seed, batch_size=2, augment=AugmentConfig(imgsz=IMGSZ))


def _worker_pids(d) -> list[int]:
    return [w["pid"] for w in ask_status(d)["workers"]]


def test_a_stopped_workers_batch_is_redispatched_and_bytes_are_unchanged(synthetic_data):
    dataset = load_dataset(synthetic_data.coco_json)
    s = _settings()
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=2, straggler_min_s=1.0, job_timeout_s=300.0) as (
        proc,
        d,
    ):
        # A short client timeout: a healthy daemon must deliver well inside it.
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=20.0)) as c:
            it = c.epoch(0)
            got = [digest_of(next(it)) for _ in range(5)]  # enough measured jobs for a deadline
            stopped = _worker_pids(d)[0]
            os.kill(stopped, signal.SIGSTOP)
            try:
                got += [digest_of(b) for b in it]
                st = ask_status(d)
            finally:
                if psutil.pid_exists(stopped):
                    os.kill(stopped, signal.SIGCONT)
        assert got == reference_stream(dataset, s, 0)[0]
        assert st["daemon"]["redispatched_jobs"] >= 1, "the stalled batch came through another way than re-dispatch"
        wait_for(lambda: stopped not in _worker_pids(d), 15, "the losing stalled worker replaced")


def test_a_slow_daemon_is_waited_for_past_timeout_s(synthetic_data):
    """Every worker stopped for longer than the trainer's timeout_s: the daemon still
    answers heartbeats, so the trainer waits instead of dying with DaemonTimeout."""
    dataset = load_dataset(synthetic_data.coco_json)
    s = _settings(seed=12)
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=1) as (proc, d):
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=1.0, heartbeat_interval_s=0.2, slots=2)) as c:
            it = c.epoch(0)
            got = [digest_of(next(it))]
            (worker,) = _worker_pids(d)
            os.kill(worker, signal.SIGSTOP)
            released = []

            def resume_later():
                # A timer thread: resume the worker after three timeouts' worth of waiting.
                import threading

                t = threading.Timer(3.0, lambda: (os.kill(worker, signal.SIGCONT), released.append(True)))
                t.start()
                return t

            timer = resume_later()
            try:
                got += [digest_of(b) for b in it]
            finally:
                timer.cancel()
                if psutil.pid_exists(worker):
                    os.kill(worker, signal.SIGCONT)
        assert released, "the stream finished without waiting for the stopped worker (the test proves nothing)"
        assert got == reference_stream(dataset, s, 0)[0]


def _live_workers(daemon: psutil.Process, exclude: set[int]) -> list[psutil.Process]:
    out = []
    for child in daemon.children():
        try:
            if (
                child.pid not in exclude
                and child.status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(child.cmdline())
            ):
                out.append(child)
        except psutil.Error:
            continue
    return out


def test_killing_every_worker_repeatedly_does_not_stop_the_daemon(synthetic_data):
    dataset = load_dataset(synthetic_data.coco_json)
    s = _settings(seed=13)
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=2) as (proc, d):
        daemon = psutil.Process(proc.pid)
        killed: set[int] = set()
        for _ in range(3):  # kill both, then their replacements while they are still starting
            workers = wait_for(
                lambda: (lambda ws: ws if len(ws) == 2 else None)(_live_workers(daemon, killed)),
                WAIT_S,
                "two new workers",
            )
            for w in workers:
                w.kill()
                killed.add(w.pid)
        wait_for(
            lambda: ask_status(d) and all(w["state"] == "idle" for w in ask_status(d)["workers"]),
            WAIT_S,
            "workers back",
        )
        assert proc.is_alive()
        with Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S)) as c:
            got = [digest_of(b) for b in c.epoch(0)]
        assert got == reference_stream(dataset, s, 0)[0]
