"""bench/serve.py: images/s the daemon delivers into a consuming process, against an
in-process torch DataLoader running the same route over a uint8 decoded cache.

Runs in one process (the consumer); daemons run in spawned processes. All arms run in the
same invocation, alternating round by round; each figure is the median over rounds.

Arms (each with CPU HSV, then again with ``hsv_on_device``: HSV by
``pixpool.client.hsv_torch.apply_hsv`` in the consumer, on CPU here when no GPU):
- ``daemon-1w`` / ``daemon-2w``: a daemon with 1 / 2 workers serving the snapshot; the
  consumer iterates ``Client.epoch`` (torch tensors via ``torch.from_numpy``).
- ``dataloader-0w`` / ``dataloader-2w``: ``torch.utils.data.DataLoader`` (num_workers 0 / 2,
  persistent) over a batch-level dataset calling the same ``render_batch`` on a source that
  keeps every image decoded and resized as uint8 and converts it to centred float32 on use
  (the conventional decoded cache).

Delivery overhead: seconds per batch from the ``ready`` message received to the tensor built
(``Client(timings=...)``), against a plain ``np.copyto`` of the same image bytes, and
against a batch's augmentation time (worker busy seconds per sample from ``pixpool status``,
times the batch size).

Each daemon first serves one unmeasured epoch (its workers import the route on their first
job). Per daemon arm also: ``first_batch_s``, the seconds from ``Client.epoch`` to its first
batch (every worker idle before: how long one batch takes to render when all workers are
free for it), and ``ring_nbytes``, the bytes of the ring the daemon made for the trainer
(what each extra trainer costs the service), from ``pixpool status``.

Usage: ``python bench/serve.py [--data coco.json] [--imgsz 640] [--rounds 3] [--hsv cpu,device]
[--workers 1,2] [--epochs 1] [--no-loader]``. ``bench/serve_ab.py`` runs it against another
checkout's code (a baseline) in alternating fresh processes.

``--delivery``: instead, one daemon (the first of ``--workers``, CURVE keys, TCP on 127.0.0.1) and two
arms alternating round by round against it: ``shm`` (a local trainer reading its ring slots
in place) and ``tcp`` (a remote trainer on the same machine receiving each batch as
CURVE-encrypted frames). Reports img/s (median), bytes per batch over the wire, and the
trainer's CPU seconds per batch in each mode (``resource.getrusage``, ZeroMQ's I/O thread
included) and the daemon process's own (psutil; it encrypts the frames): what a remote rank
costs that a local one does not. On one machine the two arms share its cores with the
workers, so the TCP arm's extra CPU shows up as fewer img/s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

COCO128 = (
    Path(__file__).resolve().parents[1].parent
    / "shared"
    / "data"
    / "coco128"
    / "annotations"
    / "instances_train2017.json"
)


class Uint8CacheSource:
    """ImageSource over a uint8 decoded cache: centre (float32 - FILL_VALUE) on every use."""

    def __init__(self, dataset, imgsz: int):
        from pixpool.server.snapshot.decode import decode_bgr, resize_long_side

        self.dataset, self.imgsz = dataset, imgsz
        self.cache = [resize_long_side(decode_bgr(r.image_path), imgsz) for r in dataset.records]

    def __len__(self) -> int:
        return len(self.cache)

    def image(self, index: int) -> np.ndarray:
        from pixpool.server.snapshot.decode import centre

        return centre(self.cache[index])

    def targets(self, index: int):
        from pixpool.shared.stream.records import Targets

        return Targets.from_record(self.dataset.records[index])


class BatchDataset:
    """torch map-style dataset of whole batches (DataLoader batch_size=None)."""

    def __init__(self, source, settings, epoch: int):
        from pixpool.shared.stream import sampler

        self.source, self.settings, self.epoch = source, settings, epoch
        self.n = sampler.num_batches(len(source), settings, epoch)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, b: int):
        import torch

        from pixpool.server.augment.batch import render_batch

        out = render_batch(self.source, self.settings, self.epoch, b)
        return torch.from_numpy(out.images), torch.from_numpy(out.targets), torch.from_numpy(out.samples)


def _consume(images, settings, epoch, samples):
    """What the trainer does with a batch here: device HSV when asked, touch the tensor."""
    if settings.hsv_on_device:
        from pixpool.client.hsv_torch import apply_hsv

        images = apply_hsv(images, settings, epoch, samples)
    return int(images[0, 0, 0, 0])


def run_daemon_arm(socket_dir: str, settings, epoch: int, timings: dict, epochs: int = 1) -> tuple[float, int]:
    """Seconds and images for ``epochs`` epochs from ``epoch`` on; sets ``timings["first_batch_s"]``
    (the first epoch's first batch, workers idle before) and ``timings["ring_nbytes"]``."""
    from pixpool.client import Client
    from pixpool.ops.status_client import query_status

    n = 0
    with Client(settings, socket_dir=socket_dir, timeout_s=300, as_torch=True, timings=timings) as c:
        st = query_status(socket_dir, timeout_s=10.0)
        timings["ring_nbytes"] = max(t["ring_nbytes"] for t in st["trainers"])
        t0 = time.perf_counter()
        for e in range(epoch, epoch + epochs):
            for b in c.epoch(e):
                if "first_batch_s" not in timings:
                    timings["first_batch_s"] = time.perf_counter() - t0
                # Client applies device HSV itself when settings.hsv_on_device (as_torch).
                int(b.images[0, 0, 0, 0])
                n += len(b.samples)
        return time.perf_counter() - t0, n


def _one_thread(_worker_id: int = 0) -> None:
    # Like the daemon's workers: one OpenCV and one torch thread per process, so the
    # arms compare processes, not thread pools fighting over the same cores.
    import cv2
    import torch

    cv2.setNumThreads(1)
    torch.set_num_threads(1)


def make_loader(source, settings, workers: int):
    import torch

    ds = BatchDataset(source, settings, 0)
    return ds, torch.utils.data.DataLoader(
        ds,
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers else None,
        worker_init_fn=_one_thread if workers else None,
    )


def run_loader_arm(loader, settings) -> tuple[float, int]:
    n = 0
    t0 = time.perf_counter()
    for images, _targets, samples in loader:
        _consume(images, settings, 0, samples.numpy())
        n += len(samples)
    return time.perf_counter() - t0, n


def _start_daemon(data: str, imgsz: int, workers: int) -> tuple[mp.Process, str]:
    from pixpool.server.daemon.run import run_daemon
    from pixpool.shared.stream.config import DaemonConfig

    d = tempfile.mkdtemp(prefix="pxb-")
    config = DaemonConfig(data=data, imgsz=imgsz, workers=workers, socket_dir=d, keep_snapshot=True)
    proc = mp.get_context("spawn").Process(target=run_daemon, args=(config,))
    proc.start()
    return proc, d


def _wait(socket_dir: str, workers: int, timeout_s: float = 300) -> dict:
    from pixpool.ops.status_client import query_status
    from pixpool.shared.errors import DaemonTimeout

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            st = query_status(socket_dir, timeout_s=1.0)
            if all(w["pid"] for w in st["workers"]) and len(st["workers"]) == workers:
                return st
        except DaemonTimeout:
            pass
        time.sleep(0.2)  # polling interval of a bounded wait
    raise TimeoutError(f"daemon in {socket_dir} not ready within {timeout_s} s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(COCO128))
    parser.add_argument("--images", default=None)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--hsv",
        default="cpu,device",
        help="HSV modes to run: cpu, device or both (device HSV runs on the CPU without a GPU)",
    )
    parser.add_argument(
        "--workers", default="1,2", help="daemon worker counts, comma-separated (--delivery: the first)"
    )
    parser.add_argument("--epochs", type=int, default=1, help="epochs per measurement")
    parser.add_argument(
        "--no-loader", action="store_true", help="daemon arms only (no DataLoader arms, no uint8 cache)"
    )
    parser.add_argument(
        "--delivery", action="store_true", help="compare shm and TCP (CURVE) delivery from one daemon instead"
    )
    parser.add_argument("--epochs-per-round", type=int, default=2, help="--delivery: epochs each arm reads per round")
    args = parser.parse_args(argv)
    worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    if args.delivery:
        args.workers = worker_counts[0]
        return delivery_main(args)
    modes = [m.strip() for m in args.hsv.split(",") if m.strip()]
    if not modes or set(modes) - {"cpu", "device"}:
        parser.error(f"--hsv {args.hsv!r}: use cpu, device or cpu,device")

    _one_thread()
    from pixpool.ops.status_client import query_status
    from pixpool.server.daemon.run import stop_process
    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
    from pixpool.shared.stream.config import AugmentConfig, StreamSettings

    dataset = load_dataset(args.data, args.images)
    prep = prepare_snapshot(dataset, PrepareOptions(imgsz=args.imgsz, processes=2))
    snap = prep.snapshot
    cache = None if args.no_loader else Uint8CacheSource(dataset, args.imgsz)
    daemons = {w: _start_daemon(args.data, args.imgsz, w) for w in worker_counts}
    results: dict[str, list[float]] = {}
    deliver: dict[str, list[float]] = {}
    first: dict[str, list[float]] = {}
    ring_nbytes: dict[str, int] = {}
    loaders = {}
    try:
        for w, (_, d) in daemons.items():
            _wait(d, w)
        for hsv_dev in [m == "device" for m in modes]:
            s = StreamSettings(
                seed=0, batch_size=args.batch_size, hsv_on_device=hsv_dev, augment=AugmentConfig(imgsz=args.imgsz)
            )
            tag = "+hsv_on_device" if hsv_dev else ""
            for lw in () if args.no_loader else (0, 2):
                loaders[lw] = make_loader(cache, s, lw)
            for _w, (_, d) in daemons.items():  # warm-up: workers import the route on their first job; not measured
                run_daemon_arm(d, s, 10_000, {}, 1)
            for r in range(args.rounds):
                for w, (_, d) in daemons.items():
                    timings: dict = {}
                    secs, n = run_daemon_arm(d, s, r * args.epochs, timings, args.epochs)
                    results.setdefault(f"daemon-{w}w{tag}", []).append(n / secs)
                    deliver.setdefault(f"daemon-{w}w{tag}", []).append(timings["deliver_s"] / timings["batches"])
                    first.setdefault(f"daemon-{w}w{tag}", []).append(timings["first_batch_s"])
                    ring_nbytes[f"daemon-{w}w{tag}"] = timings["ring_nbytes"]
                for lw, (_, loader) in loaders.items():
                    secs, n = run_loader_arm(loader, s)
                    results.setdefault(f"dataloader-{lw}w{tag}", []).append(n / secs)
            loaders.clear()
        # Augmentation time per batch, from the workers' own accounting (per sample since
        # workers render parts of batches; older daemons count whole batches).
        st = query_status(daemons[max(daemons)][1])
        done = sum(
            w["samples_done"] if "samples_done" in w else w["batches_done"] * args.batch_size for w in st["workers"]
        )
        aug_s = sum(w["busy_s"] for w in st["workers"]) / max(1, done) * args.batch_size
        # A plain copy of the same image bytes.
        src = np.empty((args.batch_size, 3, args.imgsz, args.imgsz), np.uint8)
        src[...] = 7
        dst = np.empty_like(src)
        copies = []
        for _ in range(20):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            copies.append(time.perf_counter() - t0)
    finally:
        for proc, d in daemons.values():
            stop_process(proc, timeout_s=60.0)
            shutil.rmtree(d, ignore_errors=True)
        if not prep.reused:
            snap.unlink()
        snap.close()
    med = {k: statistics.median(v) for k, v in results.items()}
    report = {
        "imgsz": args.imgsz,
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "records": len(dataset),
        "img_per_s": {k: round(v, 1) for k, v in med.items()},
        "img_per_s_runs": {k: [round(x, 1) for x in v] for k, v in results.items()},
        "first_batch_s": {k: round(statistics.median(v), 4) for k, v in first.items()},
        "ring_nbytes": ring_nbytes,
        "ratio_daemon_vs_dataloader_same_workers": {}
        if args.no_loader or not {1, 2} <= set(daemons)
        else {
            tag or "cpu_hsv": {
                "1w_vs_0w": round(med[f"daemon-1w{tag}"] / med[f"dataloader-0w{tag}"], 2),
                "2w_vs_2w": round(med[f"daemon-2w{tag}"] / med[f"dataloader-2w{tag}"], 2),
            }
            for tag in [("+hsv_on_device" if m == "device" else "") for m in modes]
        },
        "deliver_s_per_batch": {k: statistics.median(v) for k, v in deliver.items() if "hsv" not in k},
        "memcpy_s_per_batch": statistics.median(copies),
        "augment_s_per_batch": aug_s,
    }
    report["deliver_vs_augment"] = max(report["deliver_s_per_batch"].values()) / aug_s
    print(json.dumps(report, indent=2))
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _delivery_arm(settings, epochs: range, daemon, **client_options) -> tuple[float, int, float, int, float]:
    """(seconds, images, trainer CPU s, batches, daemon-process CPU s) reading ``epochs`` through one Client."""
    import resource

    from pixpool.client import Client

    n = batches = 0
    with Client(settings, timeout_s=300, as_torch=True, **client_options) as c:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        d0 = _cpu_s(daemon)
        t0 = time.perf_counter()
        for epoch in epochs:
            for b in c.epoch(epoch):
                int(b.images[0, 0, 0, 0])
                n += len(b.samples)
                batches += 1
        secs = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        d1 = _cpu_s(daemon)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return secs, n, cpu, batches, d1 - d0


def delivery_main(args) -> int:
    """shm against TCP (CURVE) delivery from one daemon, alternating; see module docstring."""
    import os

    _one_thread()
    from pixpool.server.daemon.run import run_daemon, stop_process
    from pixpool.shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings
    from pixpool.shared.transport.endpoint import write_keys

    tmp = tempfile.mkdtemp(prefix="pxb-")
    keys = Path(tmp) / "keys"
    write_keys(keys)
    sock_dir = Path(tmp) / "sock"
    port = _free_port()
    config = DaemonConfig(
        data=args.data,
        images=args.images,
        imgsz=args.imgsz,
        workers=args.workers,
        socket_dir=str(sock_dir),
        tcp=f"127.0.0.1:{port}",
        keys_dir=str(keys),
        keep_snapshot=False,
    )
    proc = mp.get_context("spawn").Process(target=run_daemon, args=(config,))
    proc.start()
    s = StreamSettings(seed=0, batch_size=args.batch_size, augment=AugmentConfig(imgsz=args.imgsz))
    arms = {"shm": {"socket_dir": str(sock_dir)}, "tcp": {"endpoint": f"tcp://127.0.0.1:{port}", "keys_dir": str(keys)}}
    rate: dict[str, list[float]] = {k: [] for k in arms}
    cpu: dict[str, list[float]] = {k: [] for k in arms}
    dcpu: dict[str, list[float]] = {k: [] for k in arms}
    try:
        import psutil

        _wait(str(sock_dir), args.workers)
        daemon = psutil.Process(proc.pid)  # the daemon's own process (it encrypts TCP frames), not its workers
        _delivery_arm(s, range(1), daemon, **arms["shm"])  # warm-up: page in the snapshot, start the workers' caches
        epoch = 1
        for r in range(args.rounds):
            order = list(arms) if r % 2 == 0 else list(arms)[::-1]
            for arm in order:
                secs, n, cpu_s, batches, daemon_s = _delivery_arm(
                    s, range(epoch, epoch + args.epochs_per_round), daemon, **arms[arm]
                )
                epoch += args.epochs_per_round
                rate[arm].append(n / secs)
                cpu[arm].append(cpu_s / batches)
                dcpu[arm].append(daemon_s / batches)
    finally:
        stop_process(proc, timeout_s=60.0)
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rate.items()}
    wire = args.batch_size * 3 * args.imgsz * args.imgsz
    report = {
        "imgsz": args.imgsz,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "rounds": args.rounds,
        "epochs_per_round": args.epochs_per_round,
        "load_1min": round(os.getloadavg()[0], 2),
        "img_per_s": {k: round(v, 1) for k, v in med.items()},
        "img_per_s_runs": {k: [round(x, 1) for x in v] for k, v in rate.items()},
        "tcp_vs_shm": round(med["tcp"] / med["shm"], 3),
        # Per round (the two arms ran back to back), then the median: less exposed to load drifting between rounds.
        "tcp_vs_shm_paired_median": round(statistics.median(t / m for t, m in zip(rate["tcp"], rate["shm"])), 3),
        "trainer_cpu_s_per_batch": {k: round(statistics.median(v), 4) for k, v in cpu.items()},
        "daemon_process_cpu_s_per_batch": {k: round(statistics.median(v), 4) for k, v in dcpu.items()},
        "image_bytes_per_batch_over_tcp": wire,
        "bytes_per_batch_over_ipc": "a ~100-byte msgpack 'ready' message; the pixels stay in the ring slot",
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
