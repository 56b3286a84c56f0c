"""bench/store.py: images/s a daemon delivers from a disk store, page cache warm and cold,
against the same daemon serving from /dev/shm.

Runs in one process (the consumer); each daemon runs in a spawned process. The dataset is
coco128 listed ``--repeat`` times (duplicates are records too, so the snapshot is that many
times larger), prepared once in each store and kept (``persist``) so every arm re-attaches it.

Arms, alternating round by round (the order rotates), each a fresh daemon with
``--workers`` workers, timed over one epoch from the first ``start`` to the last batch
(worker start-up excluded: the consumer attaches once every worker is ready):
- ``shm``: the snapshot and rings in /dev/shm;
- ``disk-warm``: in a folder on the local disk, every snapshot page in the page cache
  before the daemon starts (read once with ``POSIX_FADV_WILLNEED`` and a read pass);
- ``disk-cold``: the same files dropped from the page cache first with
  ``posix_fadvise(POSIX_FADV_DONTNEED)`` (no process maps them between arms, so the
  kernel drops them; a mapped page would stay), so the epoch reads them from the disk.
Each arm reports how much of the snapshot was resident when it started (``mincore``).

Usage: ``python bench/store.py [--repeat 4] [--rounds 3] [--workers 2] [--disk DIR]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from serve import _wait  # bench/ is this script's sys.path[0]: the same ready-wait as the delivery benchmark

COCO128 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "coco128"


def _repeated_json(src: Path, repeat: int, out: Path) -> Path:
    data = json.loads(src.read_text())
    images, anns = [], []
    for rep in range(repeat):
        images += [{**im, "id": im["id"] + rep * 10**7} for im in data["images"]]
        anns += [
            {**a, "id": a["id"] + rep * 10**8, "image_id": a["image_id"] + rep * 10**7} for a in data["annotations"]
        ]
    out.write_text(json.dumps({**data, "images": images, "annotations": anns}))
    return out


def _files(snap) -> list[str]:
    return [os.path.join(snap.store, n) for n in snap.segment_names]


def _drop(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _warm(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            while os.read(fd, 1 << 24):
                pass
        finally:
            os.close(fd)


def _resident_fraction(paths) -> float:
    from pixpool.shared.transport.store import resident_nbytes

    total = sum(os.path.getsize(p) for p in paths)
    return sum(resident_nbytes(p) for p in paths) / total


def _one_epoch(data: str, images: str, store: str, args) -> tuple[float, int]:
    from pixpool.client import Client
    from pixpool.server.daemon.run import run_daemon, stop_process
    from pixpool.shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings

    d = tempfile.mkdtemp(prefix="pxbs-")
    config = DaemonConfig(
        data=data, images=images, imgsz=args.imgsz, workers=args.workers, socket_dir=d, store=store, keep_snapshot=True
    )
    proc = mp.get_context("spawn").Process(target=run_daemon, args=(config,))
    proc.start()
    try:
        _wait(d, args.workers)
        s = StreamSettings(seed=0, batch_size=args.batch_size, augment=AugmentConfig(imgsz=args.imgsz))
        with Client(s, socket_dir=d, timeout_s=300, as_torch=False) as client:
            n = 0
            t0 = time.perf_counter()
            for b in client.epoch(0):
                int(b.images[0, 0, 0, 0])  # the consumer touches the batch
                n += len(b.samples)
            return time.perf_counter() - t0, n
    finally:
        stop_process(proc, timeout_s=60.0)
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--coco", default=str(COCO128), help="coco128 folder (annotations/instances_train2017.json, images/train2017)"
    )
    parser.add_argument("--repeat", type=int, default=4, help="list the dataset this many times")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--disk", default=None, help="parent folder of the disk store (default /var/tmp; must not be a tmpfs)"
    )
    args = parser.parse_args(argv)

    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot.prepare import PrepareOptions, prepare_snapshot
    from pixpool.shared.transport.store import fs_type, is_memory

    coco = Path(args.coco)
    images = str(coco / "images" / "train2017")
    work = Path(tempfile.mkdtemp(prefix="pxbench-store-"))
    disk = os.path.realpath(tempfile.mkdtemp(prefix="pxstore-", dir=args.disk or "/var/tmp"))
    if is_memory(disk):
        parser.error(f"{disk} is on a {fs_type(disk)}: give --disk a folder on a local disk")
    snaps = []
    results: dict[str, list[float]] = {}
    resident: dict[str, list[float]] = {}
    try:
        data = str(
            _repeated_json(coco / "annotations" / "instances_train2017.json", args.repeat, work / "instances_rep.json")
        )
        dataset = load_dataset(data, images)
        for store in ("/dev/shm", disk):
            prep = prepare_snapshot(
                dataset, PrepareOptions(imgsz=args.imgsz, processes=2, keep_snapshot=True, store=store)
            )
            snaps.append(prep.snapshot)
            snap_nbytes = prep.image_bytes + prep.index_bytes + prep.target_bytes
            prep.snapshot.close()
        disk_files = _files(snaps[1])
        arms = ["shm", "disk-warm", "disk-cold"]
        for r in range(args.rounds):
            for arm in arms[r % 3 :] + arms[: r % 3]:
                if arm == "disk-cold":
                    _drop(disk_files)
                elif arm == "disk-warm":
                    _warm(disk_files)
                files = _files(snaps[0]) if arm == "shm" else disk_files
                resident.setdefault(arm, []).append(_resident_fraction(files))
                secs, n = _one_epoch(data, images, "/dev/shm" if arm == "shm" else disk, args)
                results.setdefault(arm, []).append(n / secs)
    finally:
        for snap in snaps:
            snap.unlink()
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    report = {
        "records": len(dataset),
        "imgsz": args.imgsz,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "rounds": args.rounds,
        "disk_store": disk,
        "disk_fs": fs_type(os.path.dirname(disk)),
        "snapshot_bytes": snap_nbytes,
        "img_per_s": {k: round(v, 1) for k, v in med.items()},
        "img_per_s_all": {k: [round(x, 1) for x in v] for k, v in results.items()},
        "resident_at_start": {k: round(statistics.median(v), 3) for k, v in resident.items()},
        "ratio_vs_shm": {k: round(v / med["shm"], 3) for k, v in med.items()},
        "load": os.getloadavg(),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
