"""bench/scale.py: a daemon over a COCO-sized YOLO set: cold preparation, restart, memory, attach, status, img/s.

Runs in one process (the measurer); the daemon runs as a ``pixpool serve`` subprocess, each
trainer in a spawned process, so every figure is taken from outside the process it describes.

1. Builds an N-record YOLO set in a temporary folder (``--records``, default 100000):
   ``images/train/img_NNNNNN.jpg`` symlinks to coco128's 128 images in turn, and
   ``labels/train/img_NNNNNN.txt`` text copies of their label files (an image coco128 has no
   label for gets none), and a ``data.yaml`` with 80 class names.
2. Prepares it once (``pixpool prepare --imgsz 64 --dtype uint8``, which keeps it, into a private
   store folder under /dev/shm): the cold preparation time.
3. Starts ``pixpool serve`` on the unchanged prepared set ``--restarts`` times (SIGTERM between
   them): restart-to-ready is from the subprocess's start to the first status reply that shows
   every worker started; the median is reported.
4. On the last daemon: its RSS, USS (private pages, ``/proc/PID/smaps_rollup``) and anonymous
   memory, per record; a trainer's attach (``Client(fetch_files=True)``, what ``attach()`` does:
   the ``attached`` reply, the locality proof and every record's file name), median of
   ``--attaches`` in one trainer process; one ``status`` request's reply size and time
   (median of 5); and the img/s one trainer receives with the daemon's 2 workers over
   ``--batches`` batches of 64.
5. Unless ``--no-full-read``: one more restart with the label indexes removed from the store,
   so the daemon reads every label file (the snapshot is still re-attached by its
   fingerprint): its ready time and memory (a pixpool without label indexes has none to remove).

Usage: ``python bench/scale.py [--records 100000] [--imgsz 64] [--label before] [--write docs/benchmarks.md]``.
``--write`` replaces (or appends) the block for this label and record count in the file.

Where the restart's label index check is compared between two code trees in alternating
pairs, and where labels are checked by their bytes rather than their stat (tmpfs, labels
changed in the last minutes, image file systems), ``bench/label_trust.py`` uses this file's
``start_daemon`` on a set ``--keep`` left.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COCO128 = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "coco128"
WAIT_S = 900.0
MIB = 1 << 20


def build_set(root: Path, records: int, coco128: Path) -> Path:
    """The N-record YOLO set under ``root`` (module docstring, step 1); returns its data.yaml."""
    src_images = sorted((coco128 / "images" / "train2017").glob("*.jpg"))
    if not src_images:
        raise SystemExit(f"no coco128 images in {coco128}/images/train2017 (pass --coco128)")
    labels = []
    for img in src_images:
        lab = coco128 / "labels" / "train2017" / (img.stem + ".txt")
        labels.append(lab.read_text() if lab.is_file() else None)
    images_dir, labels_dir = root / "images" / "train", root / "labels" / "train"
    images_dir.mkdir(parents=True)
    labels_dir.mkdir(parents=True)
    for i in range(records):
        k = i % len(src_images)
        os.symlink(src_images[k], images_dir / f"img_{i:06d}.jpg")
        if labels[k] is not None:
            (labels_dir / f"img_{i:06d}.txt").write_text(labels[k])
    yaml_path = root / "data.yaml"
    names = "\n".join(f"  {i}: c{i}" for i in range(80))
    yaml_path.write_text(f"path: {root}\ntrain: images/train\nnames:\n{names}\n")
    return yaml_path


def _pixpool() -> str:
    exe = Path(sys.executable).parent / "pixpool"
    if not exe.exists():
        raise SystemExit(f"{exe} not found: run this with the venv's python where pixpool is installed")
    return str(exe)


def _status(socket_dir: str, timeout_s: float = 2.0) -> dict:
    from pixpool.ops.status_client import query_status

    return query_status(socket_dir, timeout_s=timeout_s)


def start_daemon(data: Path, store: str, imgsz: int, workers: int, socket_dir: str, log_path: Path):
    """``pixpool serve`` on ``data``; returns (process, seconds until every worker had started)."""
    from pixpool.shared.errors import DaemonTimeout

    cmd = [_pixpool(), "serve", str(data), "--imgsz", str(imgsz), "--dtype", "uint8", "--workers", str(workers),
           "--socket-dir", socket_dir, "--store", store, "--no-val"]  # fmt: skip
    t0 = time.perf_counter()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"pixpool serve exited with {proc.returncode}; see {log_path}")
        try:
            st = _status(socket_dir, timeout_s=1.0)
            if len(st["workers"]) == workers and all(w["pid"] for w in st["workers"]):
                return proc, time.perf_counter() - t0
        except (DaemonTimeout, FileNotFoundError, ConnectionError):
            pass
        time.sleep(0.02)  # polling interval of a bounded wait
    proc.kill()
    raise SystemExit(f"daemon not ready within {WAIT_S} s; see {log_path}")


def stop_daemon(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(60)


def memory_of(pid: int) -> dict:
    from pixpool.shared.transport.procmem import parse_rollup, rollup_figures

    fields = parse_rollup(Path(f"/proc/{pid}/smaps_rollup").read_text())
    rss, uss, _ = rollup_figures(fields)
    return {"rss": rss, "uss": uss, "anon": fields.get("Anonymous", 0)}


def _trainer(socket_dir: str, attaches: int, batches: int, conn) -> None:
    """In a spawned process: ``attaches`` attach/close cycles (seconds each), then one stream's img/s."""
    from pixpool.client import Client
    from pixpool.shared.stream.config import StreamSettings

    settings = StreamSettings(seed=0, batch_size=64)
    times = []
    for _ in range(attaches):
        t0 = time.perf_counter()
        c = Client(settings, socket_dir=socket_dir, timeout_s=WAIT_S, as_torch=False, fetch_files=True)
        times.append(time.perf_counter() - t0)
        files = len(c.files)
        c.close()
    with Client(settings, socket_dir=socket_dir, timeout_s=WAIT_S, as_torch=False) as c:
        it = c.epoch(0)
        next(it)  # the workers' first job imports the route: not measured
        n, t0 = 0, time.perf_counter()
        for _, b in zip(range(batches), it):
            n += len(b.samples)
        secs = time.perf_counter() - t0
        it.close()
    conn.send({"attach_s": times, "files": files, "img_per_s": n / secs})


def measure_trainer(socket_dir: str, attaches: int, batches: int) -> dict:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_trainer, args=(socket_dir, attaches, batches, child))
    proc.start()
    try:
        if not parent.poll(WAIT_S):
            raise SystemExit("the trainer did not report")
        return parent.recv()
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
            proc.join()


def measure_status(socket_dir: str, rounds: int = 5) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        st = _status(socket_dir, timeout_s=30.0)
        times.append(time.perf_counter() - t0)
        size = len(json.dumps(st))
    return statistics.median(times), size


def run(args) -> dict:
    if args.keep:
        work = Path(args.keep)
        store = f"/dev/shm/pxscale-keep-{work.name}"
        work.mkdir(parents=True, exist_ok=True)
        os.makedirs(store, mode=0o700, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="pxscale-"))
        store = tempfile.mkdtemp(prefix="pxscale-store-", dir="/dev/shm")
    socket_dir = str(work / "sock")
    log_path = work / "serve.log"
    out: dict = {
        "records": args.records,
        "imgsz": args.imgsz,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    proc = None
    try:
        t0 = time.perf_counter()
        data = work / "set" / "data.yaml"
        out["kept"] = data.exists()
        if not out["kept"]:
            data = build_set(work / "set", args.records, Path(args.coco128))
        out["build_s"] = time.perf_counter() - t0
        out["load_before"] = os.getloadavg()
        t0 = time.perf_counter()
        subprocess.run([_pixpool(), "prepare", str(data), "--imgsz", str(args.imgsz), "--dtype", "uint8",
                        "--processes", "2", "--no-progress", "--store", store],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        out["prepare_s"] = time.perf_counter() - t0
        ready = []
        for r in range(args.restarts):
            proc, secs = start_daemon(data, store, args.imgsz, 2, socket_dir, log_path)
            ready.append(secs)
            if r < args.restarts - 1:
                stop_daemon(proc)
                proc = None
        out["ready_s_runs"] = ready
        out["ready_s"] = statistics.median(ready)
        time.sleep(1.0)  # let the daemon's first sweep and status ticks settle before reading its memory
        out["memory"] = memory_of(proc.pid)
        out["status_s"], out["status_bytes"] = measure_status(socket_dir)
        trainer = measure_trainer(socket_dir, args.attaches, args.batches)
        out["attach_s_runs"] = trainer["attach_s"]
        out["attach_s"] = statistics.median(trainer["attach_s"])
        out["files"] = trainer["files"]
        out["img_per_s"] = trainer["img_per_s"]
        out["memory_after"] = memory_of(proc.pid)
        if args.full_read:
            # The same restart with the label indexes removed: the dataset is read in full (and
            # the snapshot re-attached by its fingerprint), as every restart was before them.
            stop_daemon(proc)
            proc = None
            indexes = [n for n in os.listdir(store) if "-lix" in n]
            for name in indexes:
                os.unlink(os.path.join(store, name))
            out["indexes_removed"] = len(indexes)
            proc, out["full_read_ready_s"] = start_daemon(data, store, args.imgsz, 2, socket_dir, log_path)
            time.sleep(1.0)
            out["full_read_memory"] = memory_of(proc.pid)
        out["load_after"] = os.getloadavg()
    finally:
        if proc is not None:
            stop_daemon(proc)
        if not args.keep:
            shutil.rmtree(store, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
    return out


def table(r: dict, label: str, command: str) -> str:
    n = r["records"]
    mem, bound = r["memory"], 100 * MIB + 512 * n
    lb = " ".join(f"{v:.2f}" for v in r["load_before"])
    la = " ".join(f"{v:.2f}" for v in r["load_after"])
    rows = [
        ("cold preparation (2 processes)" if not r.get("kept") else "preparation (kept from an earlier run: re-attach)",
         f"{r['prepare_s']:.1f} s"),
        ("restart to ready (median)", f"{r['ready_s']:.2f} s (runs {', '.join(f'{x:.2f}' for x in r['ready_s_runs'])})"),
        ("daemon USS (private pages)", f"{mem['uss'] / MIB:.0f} MiB = {mem['uss'] / n:.0f} B per record (bound {bound / MIB:.0f} MiB)"),
        ("daemon RSS / anonymous", f"{mem['rss'] / MIB:.0f} MiB / {mem['anon'] / MIB:.0f} MiB"),
        ("daemon USS after the trainer", f"{r['memory_after']['uss'] / MIB:.0f} MiB"),
        ("attach with every file name (median)", f"{r['attach_s']:.3f} s (runs {', '.join(f'{x:.3f}' for x in r['attach_s_runs'])}; {r['files']} names)"),
        ("status reply", f"{r['status_bytes']} bytes, {r['status_s'] * 1000:.1f} ms"),
        ("img/s to one trainer, 2 workers, batch 64", f"{r['img_per_s']:.0f}"),
    ]  # fmt: skip
    if "full_read_ready_s" in r:
        fm = r["full_read_memory"]
        rows += [
            (f"restart reading every label ({r['indexes_removed']} label index(es) removed)", f"{r['full_read_ready_s']:.2f} s"),
            ("daemon USS / anonymous after that restart", f"{fm['uss'] / MIB:.0f} MiB / {fm['anon'] / MIB:.0f} MiB = {fm['uss'] / n:.0f} B per record"),
        ]  # fmt: skip
    lines = [
        f"<!-- scale.py {label} {n} -->",
        f"**{label}**, {n} records at {r['imgsz']} px uint8, {r['when']}, load {lb} (before) / {la} (after):",
        f"`{command}`",
        "",
        "| figure | value |",
        "| --- | --- |",
        *(f"| {a} | {b} |" for a, b in rows),
        f"<!-- /scale.py {label} {n} -->",
    ]
    return "\n".join(lines)


def write_block(path: Path, block: str, label: str, n: int) -> None:
    text = path.read_text() if path.exists() else ""
    start, end = f"<!-- scale.py {label} {n} -->", f"<!-- /scale.py {label} {n} -->"
    if start in text and end in text:
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--attaches", type=int, default=5)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--coco128", default=str(COCO128.resolve()))
    parser.add_argument(
        "--no-full-read", dest="full_read", action="store_false",
        help="skip the last restart, made with the label indexes removed (a full read of the labels)",
    )  # fmt: skip
    parser.add_argument(
        "--keep", default=None, metavar="DIR",
        help="build the set in DIR (and its store in /dev/shm/pxscale-keep-NAME) and keep both for the next run, "
        "which then reuses them (its preparation is a re-attach); remove them by hand",
    )  # fmt: skip
    parser.add_argument("--label", default="measured", help="the block's name in the --write file (before, after)")
    parser.add_argument("--write", default=None, help="a markdown file to write the table into")
    args = parser.parse_args(argv)
    command = "python bench/scale.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    r = run(args)
    print(json.dumps(r, indent=2))
    block = table(r, args.label, command)
    print(block)
    if args.write:
        write_block(Path(args.write), block, args.label, args.records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
