"""bench/wire_limits.py: what one oversized message costs the daemon, and what bounding
every request costs on the hot path.

Runs in one process (the attacker and the timer); the daemon runs in a spawned process on
the embedded synthetic dataset at imgsz 160, in a temporary socket directory.

- ``attack``: for each message shape (frames x bytes per frame), the daemon's RSS growth at
  its peak (psutil, sampled every 50 ms while the message is in flight) and once it answered
  the next ``status`` request;
- ``intake``: microseconds per single-frame request read off an inproc ROUTER by
  ``intake.read_request`` against ``recv_multipart`` (what the daemon did before);
- ``keys``: microseconds per ``AuthorizedKeys.current()`` with no change in the folder (what
  every TCP handshake and every liveness tick pays).

Usage: ``python bench/wire_limits.py [--shapes 200x1000000,1500x1000000,1000x61440]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import time

import psutil
import zmq


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def _status(sock) -> None:
    from pixpool.shared.stream import protocol as proto

    sock.send(proto.encode("status"))
    if not sock.poll(30_000):
        raise TimeoutError("the daemon did not answer status within 30 s")
    sock.recv()


def attack(shapes: list[tuple[int, int]]) -> None:
    from pixpool.server.daemon.run import run_daemon, stop_process
    from pixpool.server.synthetic import write_synthetic
    from pixpool.shared.stream.config import DaemonConfig

    work = tempfile.mkdtemp(prefix="pxw-", dir="/tmp")
    data = write_synthetic(os.path.join(work, "data"), num_images=24, seed=0)
    socket_dir = os.path.join(work, "s")
    config = DaemonConfig(data=str(data.coco_json), imgsz=160, workers=1, processes=1, socket_dir=socket_dir)
    proc = mp.get_context("spawn").Process(target=run_daemon, args=(config,))
    proc.start()
    ctx = zmq.Context.instance()
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(f"{socket_dir}/daemon.sock"):
            if time.monotonic() > deadline or not proc.is_alive():
                raise RuntimeError("the daemon did not start")
            time.sleep(0.05)  # polling interval of a bounded wait
        probe = ctx.socket(zmq.DEALER)
        probe.setsockopt(zmq.LINGER, 0)
        probe.connect(f"ipc://{socket_dir}/daemon.sock")
        _status(probe)
        for frames, size in shapes:
            before = peak = _rss(proc.pid)
            peer = ctx.socket(zmq.DEALER)
            peer.setsockopt(zmq.LINGER, 0)
            peer.connect(f"ipc://{socket_dir}/daemon.sock")
            peer.send_multipart([b"\x02" * size] * frames)
            end = time.monotonic() + 10
            answered = False
            while time.monotonic() < end and not answered:
                peak = max(peak, _rss(proc.pid))
                answered = bool(peer.poll(50))
            _status(probe)
            after = _rss(proc.pid)
            outcome = "answered" if answered else "no answer (peer dropped)"
            print(
                f"attack {frames} x {size} B ({frames * size / 2**20:.0f} MiB): "
                f"daemon RSS peak +{(peak - before) / 2**20:.0f} MiB, "
                f"after +{(after - before) / 2**20:.0f} MiB, {outcome}"
            )
            peer.close(linger=0)
        probe.close(linger=0)
    finally:
        stop_process(proc)
        shutil.rmtree(work, ignore_errors=True)


def intake(n: int = 100_000) -> None:
    from pixpool.server.daemon.intake import read_request
    from pixpool.shared.stream import protocol as proto

    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.setsockopt(zmq.RCVHWM, 0)  # no limit: all n requests are queued before the timing
    dealer.setsockopt(zmq.SNDHWM, 0)
    router.bind("inproc://wire-bench")
    dealer.connect("inproc://wire-bench")
    frame = proto.encode("heartbeat", trainer_id=1, token=123456789, data_wait_s=1.5)
    readers = (
        ("recv_multipart", lambda: router.recv_multipart(zmq.NOBLOCK)),
        ("read_request", lambda: read_request(router)),
    )
    for name, read in readers:
        for _ in range(n):
            dealer.send(frame)
        router.poll(1000)
        t0 = time.perf_counter()
        for _ in range(n):
            read()
        print(f"intake {name}: {(time.perf_counter() - t0) / n * 1e6:.2f} us per request")
    router.close(linger=0)
    dealer.close(linger=0)


def keys(n: int = 10_000) -> None:
    from pixpool.server.daemon.authorized import AuthorizedKeys
    from pixpool.shared.transport.endpoint import write_keys

    work = tempfile.mkdtemp(prefix="pxk-", dir="/tmp")
    try:
        write_keys(os.path.join(work, "k"))
        ak = AuthorizedKeys(os.path.join(work, "k"))
        ak.current()
        t0 = time.perf_counter()
        for _ in range(n):
            ak.current()
        print(f"keys AuthorizedKeys.current() unchanged folder of 1 key: {(time.perf_counter() - t0) / n * 1e6:.1f} us")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="200x1000000,1500x1000000,1000x61440,1000x131000")
    args = parser.parse_args()
    attack([tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")])
    intake()
    keys()


if __name__ == "__main__":
    main()
