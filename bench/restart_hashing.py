"""bench/restart_hashing.py: restart to ready where stat vouches for a set's files, and where it does not.

Runs in one process (the measurer, root); daemons run as ``pixpool serve`` subprocesses
(``scale.start_daemon``: from the subprocess's start to the first status listing every worker).
One N-record YOLO set (``scale.build_set``: ``images/train/img_NNNNNN.jpg`` links, label files
as text copies), its links pointing at coco128's 128 images inside the set, each squashed to
32x8 pixels and padded to its original file size with JPEG comment segments (cheap to decode,
as costly to hash as the original), served two ways:

- ``stat``: the set in a folder under ``--work`` (this machine's root file system, ext4 on a
  disk): a restart stats every path; labels are checked by stat once they have been quiet for
  the writeback window, so the timed restarts start after it has passed (``--quiet-s``);
- ``hashed``: the same files as a squashfs image under an overlay with a writable layer (how
  Apptainer images and read-only dataset images are served): every image and label is read
  and hashed at every restart (``server/snapshot/fs_trust.py``).

Each set is prepared once (``pixpool prepare``, 2 processes, imgsz 32, uint8), started once
untimed (it writes, or refreshes, the label index), then restarted ``--restarts`` times. The
images are 128 files read over and over, so the hashed restarts read them from the page cache:
the figure is the hashing's CPU cost; a set of N distinct files on a cold cache also pays their
reading from the device.

    sudo python bench/restart_hashing.py [--records 100000] [--restarts 3] [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
import scale  # noqa: E402


def build(root: Path, records: int, coco128: Path) -> Path:
    """``scale.build_set`` with its links re-pointed, relative, at copies of the images inside
    ``root/src`` (so an image of the folder holds them), and a data.yaml without ``path:``."""
    scale.build_set(root, records, coco128)
    (root / "src").mkdir()
    for img in sorted((coco128 / "images" / "train2017").glob("*.jpg")):
        (root / "src" / img.name).write_bytes(_tiny_of_same_size(img.read_bytes()))
    images = root / "images" / "train"
    for link in os.scandir(images):
        target = os.readlink(link.path)
        os.unlink(link.path)
        os.symlink(os.path.join("..", "..", "src", os.path.basename(target)), link.path)
    text = (root / "data.yaml").read_text().splitlines()
    (root / "data.yaml").write_text("\n".join(line for line in text if not line.startswith("path:")) + "\n")
    return root / "data.yaml"


def _tiny_of_same_size(jpeg: bytes) -> bytes:
    """A 32x8 JPEG of the image padded with comment segments to the original file's size: its
    decode costs next to nothing (a 100k-record set prepares in minutes on two cores), its
    hashing what the original's costs (every byte is read)."""
    import cv2
    import numpy as np

    small = cv2.imencode(".jpg", cv2.resize(cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR), (32, 8),
                                            interpolation=cv2.INTER_AREA))[1].tobytes()  # fmt: skip
    pad, segments = len(jpeg) - len(small), []
    while pad > 4:
        body = min(pad - 4, 65533)  # a segment's length field counts itself: at most 65535
        segments.append(b"\xff\xfe" + (body + 2).to_bytes(2, "big") + b"\0" * body)
        pad -= body + 4
    return small[:2] + b"".join(segments) + small[2:]  # after SOI


def prepare(data: Path, store: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([scale._pixpool(), "prepare", str(data), "--imgsz", "32", "--dtype", "uint8", "--processes", "2",
                    "--no-progress", "--store", store], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - t0


def restarts(data: Path, store: str, work: Path, n: int) -> list[float]:
    """One untimed start (it writes or refreshes the index), then ``n`` timed restarts to ready."""
    out = []
    for r in range(n + 1):
        proc, secs = scale.start_daemon(data, store, 32, 2, str(work / "sock"), work / "serve.log")
        scale.stop_daemon(proc)
        if r:
            out.append(secs)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--restarts", type=int, default=3)
    p.add_argument("--work", default=None, help="a folder on the root file system (default: a new one under /tmp)")
    p.add_argument("--coco128", default=str(common.COCO128))
    p.add_argument("--quiet-s", type=float, default=None, help="wait this long after building before the stat "
                   "restarts (default: the kernel's writeback window, fs_trust.writeback_window_ns)")  # fmt: skip
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("needs root: the hashed set is a squashfs image mounted under an overlay")
    from pixpool.server.snapshot import fs_trust

    window = fs_trust.writeback_window_ns()
    quiet_s = args.quiet_s if args.quiet_s is not None else (window or 0) / 1e9 + 5
    work = Path(args.work or tempfile.mkdtemp(prefix="pxhash-"))
    store = tempfile.mkdtemp(prefix="pxhash-store-", dir="/dev/shm")
    mounted: list[Path] = []
    try:
        t0 = time.perf_counter()
        data = build(work / "set", args.records, Path(args.coco128))
        built_at = time.monotonic()
        print(f"built {args.records} records in {time.perf_counter() - t0:.1f} s", flush=True)
        image = work / "set.sqfs"
        subprocess.run(["mksquashfs", str(work / "set"), str(image), "-noappend", "-quiet", "-no-progress"],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        lower, over = work / "lower", work / "over"
        for d in (lower, over, work / "upper", work / "ovwork"):
            d.mkdir()
        subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro", str(image), str(lower)], check=True)
        mounted.append(lower)
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={work / 'upper'},workdir={work / 'ovwork'}", str(over)], check=True)  # fmt: skip
        mounted.append(over)
        result = {"records": args.records, "load_before": common.load()}
        result["prepare_hashed_s"] = prepare(over / "data.yaml", store)
        result["prepare_stat_s"] = prepare(data, store)
        result["hashed"] = restarts(over / "data.yaml", store, work, args.restarts)
        print(f"hashed restarts: {result['hashed']}", flush=True)
        wait = quiet_s - (time.monotonic() - built_at)
        if wait > 0:
            print(f"waiting {wait:.0f} s for the labels to be quiet for the writeback window", flush=True)
            time.sleep(wait)
        result["stat"] = restarts(data, store, work, args.restarts)
        result["load_after"] = common.load()
        print(result, flush=True)
        print(common.table(
            ["set (records)", "restart to ready, median (runs)"],
            [[f"stat vouches: ext4 on a disk ({args.records})",
              f"{statistics.median(result['stat']):.2f} s ({common.runs(result['stat'], '.2f')})"],
             [f"hashed: overlay over squashfs ({args.records})",
              f"{statistics.median(result['hashed']):.2f} s ({common.runs(result['hashed'], '.2f')})"]],
        ))  # fmt: skip
        print(f"load {result['load_before']} -> {result['load_after']}; prepare: hashed {result['prepare_hashed_s']:.0f}"
              f" s, stat {result['prepare_stat_s']:.0f} s")  # fmt: skip
    finally:
        for m in reversed(mounted):
            subprocess.run(["umount", str(m)], check=False)
        shutil.rmtree(store, ignore_errors=True)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
