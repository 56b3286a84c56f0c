"""bench/scale.py: a daemon at scale: a COCO-sized set, its label index checks, and a trainer on another node.

Runs in one process (the measurer); daemons run as ``pixpool serve`` subprocesses (``set``,
``restart-ab``) or spawned processes (``tcp``), trainers in spawned processes, so every figure
is taken from outside the process it describes.

- ``set`` (default): an N-record YOLO set (``--records``; ``images/train/img_NNNNNN.jpg``
  symlinks to coco128's 128 images in turn, label files as text copies, a data.yaml with 80
  names), prepared once (``pixpool prepare --imgsz 64 --dtype uint8``, 2 processes, kept, in a
  private store folder under /dev/shm): the cold preparation; ``pixpool serve`` restarted on it
  ``--restarts`` times (restart to ready: from the subprocess's start to the first status that
  lists every worker started); on the last daemon its RSS, USS and anonymous memory, a
  low-level trainer's attach that fetches every record's file name at attach
  (``ClientOptions(fetch_files=True)``, median of ``--attaches``), ``pixpool.client.attach()`` as a
  user's script sees it (``--attaches`` fresh processes each, the script importing torch first
  or not, alternating: the plain call, then the first read of ``loader.files`` and the first
  batch, each timed), one ``status`` reply's size and time, and the img/s one trainer receives
  over ``--batches`` batches of 64; unless ``--no-full-read``, one more restart with the label
  indexes removed, so the daemon reads every label file. ``--keep DIR`` builds the set in DIR
  and its store in /dev/shm/pxscale-keep-NAME and keeps both (the next run re-attaches).
  ``--tiny WxH``: the links point at coco128's images squashed to WxH, so a million records
  prepare in minutes and fit /dev/shm (``--tiny 32x8 --imgsz 32``: 768 bytes of pixels each).
- ``restart-ab``: restart to ready on a kept set, two code trees alternating by pairs
  (``--code before=PATH --code after=PATH``: each a folder holding a ``pixpool`` package, put
  first on the daemon's ``PYTHONPATH``), each tree on its own copy of the kept store after one
  warm-up start that writes its index; every timed start must say it re-attached on its label
  index; the index check's own time from each daemon's log.
- ``index-check``: the label index check alone, in this process, on the index in ``--store``:
  ``read_index`` + ``first_change`` as written, and with every label checked by its bytes (what
  a set on tmpfs, or with labels changed in the last minutes, pays).
- ``mmap``: whether a write through a shared mapping moves a file's mtime/ctime, per folder
  (why labels on tmpfs are hashed: ``server/snapshot/fs_trust.py``).
- ``tcp``: what a rank on a node without a daemon pays: one daemon (CURVE keys, TCP on
  127.0.0.1) and two trainers in this process alternating round by round, ``shm`` (ring slots
  read in place) and ``tcp`` (each batch as CURVE-encrypted frames): img/s, and CPU seconds per
  batch of the trainer (getrusage, ZeroMQ's thread included) and of the daemon's own process.

    python bench/scale.py --what set [--records 100000] [--keep DIR] [--restarts 3] [--no-full-read]
    python bench/scale.py --what set --records 1000000 --tiny 32x8 --imgsz 32 [--keep DIR]
    python bench/scale.py --what restart-ab --keep DIR --code before=PATH --code after=PATH [--pairs 5]
    python bench/scale.py --what index-check --store /dev/shm/pxscale-keep-NAME [--rounds 3]
    python bench/scale.py --what mmap /dev/shm /tmp
    python bench/scale.py --what tcp [--rounds 7] [--epochs-per-round 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import mmap
import multiprocessing as mp
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

WAIT_S = 900.0
MIB = common.MIB


# -- set ------------------------------------------------------------------------------------------------
def build_set(root: Path, records: int, coco128: Path, tiny: tuple[int, int] | None = None) -> Path:
    """The N-record YOLO set under ``root`` (module docstring); returns its data.yaml. ``tiny``
    (width, height): the links point at coco128's images squashed to that size, written once
    under ``root/src`` (the labels, normalised, stay valid)."""
    src_images = sorted((coco128 / "images" / "train2017").glob("*.jpg"))
    if not src_images:
        raise SystemExit(f"no coco128 images in {coco128}/images/train2017 (pass --coco128)")
    labels = [(coco128 / "labels" / "train2017" / f"{img.stem}.txt") for img in src_images]
    labels = [lab.read_text() if lab.is_file() else None for lab in labels]
    images_dir, labels_dir = root / "images" / "train", root / "labels" / "train"
    images_dir.mkdir(parents=True)
    labels_dir.mkdir(parents=True)
    if tiny is not None:
        import cv2

        (root / "src").mkdir()
        squashed = []
        for img in src_images:
            squashed.append(root / "src" / img.name)
            cv2.imwrite(str(squashed[-1]), cv2.resize(cv2.imread(str(img)), tiny, interpolation=cv2.INTER_AREA))
        src_images = squashed
    for i in range(records):
        k = i % len(src_images)
        os.symlink(src_images[k], images_dir / f"img_{i:06d}.jpg")
        if labels[k] is not None:
            (labels_dir / f"img_{i:06d}.txt").write_text(labels[k])
    names = "\n".join(f"  {i}: c{i}" for i in range(80))
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nnames:\n{names}\n")
    return root / "data.yaml"


def _pixpool() -> str:
    exe = Path(sys.executable).parent / "pixpool"
    if not exe.exists():
        raise SystemExit(f"{exe} not found: run this with the venv's python where pixpool is installed")
    return str(exe)


def start_daemon(data: Path, store: str, imgsz: int, workers: int, socket_dir: str, log_path: Path, env=None):
    """``pixpool serve`` on ``data``; returns (process, seconds until every worker had started)."""
    cmd = [_pixpool(), "serve", str(data), "--imgsz", str(imgsz), "--dtype", "uint8", "--workers", str(workers),
           "--socket-dir", socket_dir, "--store", store, "--no-val"]  # fmt: skip
    t0 = time.perf_counter()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        common.wait_ready(socket_dir, workers, proc, timeout_s=WAIT_S, poll_s=0.02)
    except (RuntimeError, TimeoutError) as exc:
        stop_daemon(proc)
        raise SystemExit(f"pixpool serve: {exc}; see {log_path}") from exc
    return proc, time.perf_counter() - t0


def stop_daemon(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(60)


def memory_of(pid: int) -> dict:
    from pixpool.shared.transport.procmem import rollup_figures

    fields = common.rollup(pid)
    rss, uss, _ = rollup_figures(fields)
    return {"rss": rss, "uss": uss, "anon": fields.get("Anonymous", 0)}


def _trainer(socket_dir: str, attaches: int, batches: int, conn) -> None:
    """In a spawned process: ``attaches`` attach/close cycles (seconds each), then one stream's img/s."""
    from pixpool.client import Client
    from pixpool.client.options import ClientOptions
    from pixpool.shared.stream.config import StreamSettings

    settings = StreamSettings(seed=0, batch_size=64)
    times = []
    for _ in range(attaches):
        t0 = time.perf_counter()
        c = Client.connect(
            settings, ClientOptions(socket_dir=socket_dir, timeout_s=WAIT_S, as_torch=False, fetch_files=True)
        )
        times.append(time.perf_counter() - t0)
        files = len(c.files)
        c.close()
    with Client.connect(settings, ClientOptions(socket_dir=socket_dir, timeout_s=WAIT_S, as_torch=False)) as c:
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


# One run of ``attach()`` as a user's script sees it, in a fresh process: the plain call timed
# (its imports included, as a script's first attach pays them), then the first read of
# ``loader.files`` (every record's name fetched) and the first batch, each timed after it.
_ATTACH_RUN = """
import json, sys, time
if sys.argv[2] == "torch":
    import torch
import pixpool.client
t0 = time.perf_counter()
loader = pixpool.client.attach(sys.argv[1], batch_size=64, timeout_s=float(sys.argv[3]))
t1 = time.perf_counter()
last = loader.files[len(loader.files) - 1]
t2 = time.perf_counter()
images, targets = next(iter(loader))
t3 = time.perf_counter()
loader.close()
print(json.dumps({"attach_s": t1 - t0, "files_s": t2 - t1, "first_batch_s": t3 - t2, "files": len(loader.files)}))
"""


def measure_attach_api(socket_dir: str, runs: int) -> dict:
    """``runs`` fresh processes per arm, arms alternating: ``pixpool.client.attach()`` where the
    script imported torch first (``torch``), and where it did not (``bare``)."""

    def arm(first: str):
        def run() -> dict:
            cmd = [sys.executable, "-c", _ATTACH_RUN, socket_dir, first, str(WAIT_S)]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=WAIT_S)
            return json.loads(done.stdout.strip().splitlines()[-1])

        return run

    got = common.rounds({"torch": arm("torch"), "bare": arm("bare")}, runs)
    return {name: {k: [r[k] for r in rs] for k in rs[0]} for name, rs in got.items()}


def measure_status(socket_dir: str, rounds: int = 5) -> tuple[float, int]:
    from pixpool.ops.status_client import query_status
    from pixpool.shared.wire.status import as_reply
    from pixpool.shared.wire.trainer import Op

    times, size = [], 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        size = len(json.dumps(as_reply(Op.STATUS, query_status(socket_dir, timeout_s=30.0))))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), size


def kept_store(keep: Path) -> str:
    """The store folder of a set ``--keep`` built."""
    return f"/dev/shm/pxscale-keep-{keep.name}"


def run_set(args) -> dict:
    if args.keep:
        work, store = Path(args.keep), kept_store(Path(args.keep))
        work.mkdir(parents=True, exist_ok=True)
        os.makedirs(store, mode=0o700, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="pxscale-"))
        store = tempfile.mkdtemp(prefix="pxscale-store-", dir="/dev/shm")
    socket_dir, log_path = str(work / "sock"), work / "serve.log"
    out: dict = {
        "records": args.records,
        "imgsz": args.imgsz,
        "tiny": args.tiny,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    proc = None
    try:
        data = work / "set" / "data.yaml"
        out["kept"] = data.exists()
        if not out["kept"]:
            data = build_set(work / "set", args.records, Path(args.coco128), args.tiny)
        out["load_before"] = common.load()
        t0 = time.perf_counter()
        subprocess.run([_pixpool(), "prepare", str(data), "--imgsz", str(args.imgsz), "--dtype", "uint8",
                        "--processes", "2", "--no-progress", "--store", store], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        out["prepare_s"] = time.perf_counter() - t0
        ready = []
        for r in range(args.restarts):
            proc, secs = start_daemon(data, store, args.imgsz, 2, socket_dir, log_path)
            ready.append(secs)
            if r < args.restarts - 1:
                stop_daemon(proc)
                proc = None
        out["ready_s_runs"] = ready
        time.sleep(1.0)  # let the daemon's first sweep and status ticks settle before reading its memory
        out["memory"] = memory_of(proc.pid)
        out["status_s"], out["status_bytes"] = measure_status(socket_dir)
        out["trainer"] = measure_trainer(socket_dir, args.attaches, args.batches)
        out["attach_api"] = measure_attach_api(socket_dir, args.attaches)
        out["memory_after"] = memory_of(proc.pid)
        if args.full_read:  # the label indexes removed: every label file is read (the snapshot re-attached)
            stop_daemon(proc)
            proc = None
            indexes = [n for n in os.listdir(store) if "-lix" in n]
            for name in indexes:
                os.unlink(os.path.join(store, name))
            out["indexes_removed"] = len(indexes)
            proc, out["full_read_ready_s"] = start_daemon(data, store, args.imgsz, 2, socket_dir, log_path)
            time.sleep(1.0)
            out["full_read_memory"] = memory_of(proc.pid)
        out["load_after"] = common.load()
    finally:
        if proc is not None:
            stop_daemon(proc)
        if not args.keep:
            shutil.rmtree(store, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
    return out


def set_table(r: dict, command: str) -> str:
    n, mem, t = r["records"], r["memory"], r["trainer"]
    rows = [
        ["preparation (kept from an earlier run: re-attach)" if r["kept"] else "cold preparation (2 processes)", f"{r['prepare_s']:.1f} s"],
        ["restart to ready (median)", f"{statistics.median(r['ready_s_runs']):.2f} s (runs {common.runs(r['ready_s_runs'], '.2f')})"],
        ["daemon USS (private pages)", f"{mem['uss'] / MIB:.0f} MiB = {mem['uss'] / n:.0f} B per record (bound {(100 * MIB + 512 * n) / MIB:.0f} MiB)"],
        ["daemon RSS / anonymous", f"{mem['rss'] / MIB:.0f} MiB / {mem['anon'] / MIB:.0f} MiB"],
        ["daemon USS after the trainer", f"{r['memory_after']['uss'] / MIB:.0f} MiB"],
        ["a low-level `Client` attach fetching every file name at attach, `fetch_files=True` (median)", f"{statistics.median(t['attach_s']):.3f} s (runs {common.runs(t['attach_s'], '.3f')}; {t['files']} names)"],
        ["status reply", f"{r['status_bytes']} bytes, {r['status_s'] * 1000:.1f} ms"],
        ["img/s to one trainer, 2 workers, batch 64", f"{t['img_per_s']:.0f}"],
    ]  # fmt: skip
    for arm, says in (("torch", "the script imported torch first"), ("bare", "torch not imported yet")):
        a = r["attach_api"][arm]
        for key, what in (
            ("attach_s", "`pixpool.client.attach()`"),
            ("files_s", "then the first read of `loader.files`"),
            ("first_batch_s", "then the first batch"),
        ):
            rows.append(
                [
                    f"{what}, fresh process, {says} (median)",
                    f"{statistics.median(a[key]):.3f} s (runs {common.runs(a[key], '.3f')})",
                ]
            )
    if "full_read_ready_s" in r:
        fm = r["full_read_memory"]
        rows += [
            [f"restart reading every label ({r['indexes_removed']} label index(es) removed)", f"{r['full_read_ready_s']:.2f} s"],
            ["daemon USS / anonymous after that restart", f"{fm['uss'] / MIB:.0f} MiB / {fm['anon'] / MIB:.0f} MiB = {fm['uss'] / n:.0f} B per record"],
        ]  # fmt: skip
    source = "coco128's images" if not r.get("tiny") else "coco128's images squashed to {}x{} px".format(*r["tiny"])
    head = f"{n} records ({source}) at {r['imgsz']} px uint8, {r['when']}, load average before / after: {r['load_before']} / {r['load_after']}"
    return f"`{command}`\n\n{head}\n\n" + common.table(["figure", "value"], rows, left=2)


def _size(text: str) -> tuple[int, int]:
    w, _, h = text.partition("x")
    if not (w.isdigit() and h.isdigit() and int(w) > 0 and int(h) > 0):
        raise argparse.ArgumentTypeError(f"--tiny takes WIDTHxHEIGHT in pixels, e.g. 32x8, got {text!r}")
    return int(w), int(h)


def set_main(argv: list[str]) -> int:
    """A daemon over a COCO-sized YOLO set: preparation, restart, memory, attach, status, img/s (``set``)."""
    p = common.parser(set_main.__doc__, "scale.py --what set")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--imgsz", type=int, default=64)
    p.add_argument("--restarts", type=int, default=3)
    p.add_argument("--attaches", type=int, default=5)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--coco128", default=str(common.COCO128))
    p.add_argument(
        "--tiny",
        type=_size,
        default=None,
        metavar="WxH",
        help="link to coco128's images squashed to WxH (e.g. 32x8 with --imgsz 32: a 1M-record set of ~0.8 GB)",
    )
    p.add_argument(
        "--no-full-read", dest="full_read", action="store_false", help="skip the restart without label indexes"
    )
    p.add_argument(
        "--keep", default=None, metavar="DIR", help="build the set in DIR and keep it and its store (remove by hand)"
    )
    p.add_argument("--label", default="measured", help="the block's name in the --write file")
    p.add_argument("--write", type=Path, default=None, help="a markdown file to write the table into")
    args = p.parse_args(argv)
    r = run_set(args)
    common.dump(r)
    text = set_table(r, args.command)
    print(text)
    if args.write:
        common.write_section(
            args.write, f"scale {args.label} {args.records}", text, f"## Latest run: scale, {args.label}"
        )
    return 0


# -- restart-ab --------------------------------------------------------------------------------------------
def _timed_start(data: Path, store: str, code: str, work: Path, label: str) -> tuple[float, float | None]:
    """(seconds to ready, the label index check's seconds by the daemon's log, or None where it
    does not say it re-attached on its index) of one restart with ``code`` first on PYTHONPATH."""
    log_path = work / f"serve-{label}.log"
    before = log_path.stat().st_size if log_path.exists() else 0
    env = {**os.environ, "PYTHONPATH": code}
    proc, secs = start_daemon(data, store, 64, 2, str(work / f"sock-{label}"), log_path, env=env)
    stop_daemon(proc)
    with open(log_path, "rb") as f:
        f.seek(before)
        text = f.read().decode(errors="replace")
    found = re.search(r"paths unchanged \(([0-9.]+) s\)", text)
    if "re-attached on its label index" not in text or found is None:
        return secs, None
    return secs, float(found.group(1))


def restart_ab_main(argv: list[str]) -> int:
    """Restart to ready on a kept set, two code trees alternating by pairs (``restart-ab``)."""
    p = common.parser(restart_ab_main.__doc__, "scale.py --what restart-ab")
    p.add_argument("--keep", required=True, help="the folder --what set --keep built")
    p.add_argument("--code", action="append", required=True, help="LABEL=PATH (twice)")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument(
        "--keep-stores", action="store_true", help="keep each tree's store (for index-check); remove by hand"
    )
    p.add_argument("--reuse-stores", action="store_true", help="use each tree's store a --keep-stores run left")
    args = p.parse_args(argv)
    work = Path(args.keep)
    data, base = work / "set" / "data.yaml", kept_store(work)
    codes = dict(c.split("=", 1) for c in args.code)
    stores = {label: f"{base}-{label}" for label in codes}
    for store in stores.values():
        if not (args.reuse_stores and os.path.isdir(store)):  # the kept snapshot, never its label indexes
            shutil.rmtree(store, ignore_errors=True)
            os.makedirs(store, mode=0o700)
            for name in (n for n in os.listdir(base) if "-lix" not in n):
                shutil.copy(os.path.join(base, name), os.path.join(store, name))
    out: dict = {"command": args.command, "stores": stores, "load_before": common.load()}
    try:
        for label, code in codes.items():  # warm-up: writes this code's index (a full read)
            out[f"warmup_{label}_s"], _ = _timed_start(data, stores[label], code, work, label)

        def arm(label: str):
            def run():
                secs, check_s = _timed_start(data, stores[label], codes[label], work, label)
                if check_s is None:
                    raise SystemExit(f"{label}: a restart did not re-attach on its label index; see its log")
                return secs, check_s

            return run

        got = common.rounds({label: arm(label) for label in codes}, args.pairs)
    finally:
        if not args.keep_stores:
            for store in stores.values():
                shutil.rmtree(store, ignore_errors=True)
    (a, ra), (b, rb) = got.items()
    out["ready_s_runs"] = {label: [s for s, _ in v] for label, v in got.items()}
    out["ready_s_medians"] = {label: statistics.median(s for s, _ in v) for label, v in got.items()}
    out[f"{b}_minus_{a}_per_pair_s"] = [round(y[0] - x[0], 3) for x, y in zip(ra, rb)]
    out["index_check_s_medians"] = {label: statistics.median(c for _, c in v) for label, v in got.items()}
    out["load_after"] = common.load()
    common.dump(out)
    return 0


# -- index-check -------------------------------------------------------------------------------------------
def index_check_main(argv: list[str]) -> int:
    """The label index check alone, as written and with every label checked by its bytes (``index-check``)."""
    p = common.parser(index_check_main.__doc__, "scale.py --what index-check")
    p.add_argument(
        "--store", required=True, help="a store holding one label index (restart-ab --keep-stores leaves one)"
    )
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    import numpy as np

    from pixpool.server.snapshot import fs_trust, label_index
    from pixpool.shared.transport.store import Store

    store = Store.of(args.store)
    (name,) = [s for s in store.segments() if "-lix" in s]
    index = label_index.read_index(name, store)
    # Every label by its bytes: the same index with its label rows turned to CONTENT.
    paths = index.check_paths.tolist()
    modes = index.check_modes.copy()
    labels = [i for i, path in enumerate(paths) if path.endswith(".txt") and index.check_stats[i, 0] >= 0]
    modes[labels] = label_index.CONTENT
    hashed = np.flatnonzero(modes != label_index.STAT)
    old = {int(i): k for k, i in enumerate(np.flatnonzero(index.check_modes != label_index.STAT))}
    digests = np.zeros((len(hashed), 32), np.uint8)
    for k, i in enumerate(hashed.tolist()):
        digests[k] = (
            index.check_digests[old[i]] if i in old else np.frombuffer(fs_trust.file_digest(paths[i])[0], np.uint8)
        )
    hashed_index = dataclasses.replace(index, check_modes=modes, check_digests=digests)

    def timed(fn, *, unchanged: bool = True):
        def run():
            t0 = time.perf_counter()
            found = fn()
            if unchanged and found is not None:
                raise SystemExit(f"the index check found a change ({found}): the set moved under the benchmark")
            return time.perf_counter() - t0

        return run

    before = common.load()
    arms = {
        "read_s": timed(lambda: label_index.read_index(name, store), unchanged=False),
        "check_s": timed(lambda: label_index.first_change(index)),
        "content_check_s": timed(lambda: label_index.first_change(hashed_index)),
    }
    got = common.rounds(arms, args.rounds)
    modes_count = {m: int((index.check_modes == v).sum()) for m, v in (("stat", label_index.STAT), ("content", label_index.CONTENT), ("listing", label_index.LISTING))}  # fmt: skip
    common.dump({"command": args.command, "index": name, "paths": len(paths), "labels": len(labels), "modes": modes_count,
                 "medians": {k: statistics.median(v) for k, v in got.items()}, "runs": got, "load": [before, common.load()]})  # fmt: skip
    return 0


# -- mmap ---------------------------------------------------------------------------------------------------
def mmap_main(argv: list[str]) -> int:
    """Whether a write through a shared mapping moves a file's times, per folder (``mmap``)."""
    p = common.parser(mmap_main.__doc__, "scale.py --what mmap")
    p.add_argument("folders", nargs="+")
    args = p.parse_args(argv)
    out = {}
    for folder in args.folders:
        fd, path = tempfile.mkstemp(prefix="pxbench-mmap-", dir=folder)
        try:
            os.write(fd, b"0 0.5 0.5 0.1 0.1\n")
            os.fsync(fd)
            m = mmap.mmap(fd, 0)
            times = [(os.stat(path).st_mtime_ns, os.stat(path).st_ctime_ns)]
            for value, flush in ((b"1", True), (b"2", False)):
                time.sleep(0.05)  # a clock tick between the stats (coarse file-system clocks)
                m[0:1] = value
                times.append((os.stat(path).st_mtime_ns, os.stat(path).st_ctime_ns))
                if flush:
                    m.flush()  # msync: written back where the file system has writeback
            m.close()
            out[folder] = {"first_write_moves": times[0] != times[1], "after_msync_moves": times[1] != times[2]}
        finally:
            os.close(fd)
            os.unlink(path)
    common.dump(out)
    return 0


# -- tcp ------------------------------------------------------------------------------------------------------
def _delivery(settings, epochs: range, daemon, **client_options) -> tuple[float, float, float]:
    """(img/s, trainer CPU s per batch, daemon-process CPU s per batch) reading ``epochs`` through one Client."""
    from pixpool.client import Client
    from pixpool.client.options import ClientOptions

    n = batches = 0
    with Client.connect(settings, ClientOptions(timeout_s=300, as_torch=True, **client_options)) as c:
        c0, d0, t0 = common.cpu_s(), sum(daemon.cpu_times()[:2]), time.perf_counter()
        for epoch in epochs:
            for b in c.epoch(epoch):
                int(b.images[0, 0, 0, 0])
                n += len(b.samples)
                batches += 1
        secs, cpu, dcpu = time.perf_counter() - t0, common.cpu_s() - c0, sum(daemon.cpu_times()[:2]) - d0
    return n / secs, cpu / batches, dcpu / batches


def tcp_main(argv: list[str]) -> int:
    """shm against TCP (CURVE) delivery from one daemon, alternating (``tcp``)."""
    p = common.parser(tcp_main.__doc__, "scale.py --what tcp")
    common.serving_args(p, rounds=7, epochs_per_round=4)
    args = p.parse_args(argv)
    import socket

    import psutil
    import torch

    from pixpool.shared.stream.config import AugmentConfig, StreamSettings
    from pixpool.shared.transport.endpoint import write_keys

    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = common.load()
    with tempfile.TemporaryDirectory(prefix="pxbench-tcp-") as tmp:
        keys = Path(tmp) / "keys"
        write_keys(keys)
        fields = {"data": args.data, "imgsz": args.imgsz, "tcp": f"127.0.0.1:{port}", "keys_dir": str(keys)}
        with common.daemon(workers=args.workers, **fields) as (d, proc):
            daemon = psutil.Process(proc.pid)  # the daemon's own process (it encrypts TCP frames), not its workers
            st = StreamSettings(seed=0, batch_size=args.batch_size, augment=AugmentConfig(imgsz=args.imgsz))
            ways = {"shm": {"socket_dir": d}, "tcp": {"endpoint": f"tcp://127.0.0.1:{port}", "keys_dir": str(keys)}}
            _delivery(st, range(1), daemon, **ways["shm"])  # warm-up: the workers' first jobs
            epoch = [1]

            def arm(way: str):
                def run():
                    e = epoch[0]
                    epoch[0] += args.epochs_per_round
                    return _delivery(st, range(e, e + args.epochs_per_round), daemon, **ways[way])

                return run

            got = common.rounds({way: arm(way) for way in ways}, args.rounds)
    rate = {w: [r for r, _, _ in v] for w, v in got.items()}
    common.dump({
        "command": args.command, "load": [before, common.load()],
        "img_per_s": {w: round(statistics.median(v), 1) for w, v in rate.items()},
        "img_per_s_rounds": {w: [round(x, 1) for x in v] for w, v in rate.items()},
        "tcp_vs_shm_paired": common.paired(rate["tcp"], rate["shm"]),
        "trainer_cpu_ms_per_batch": {w: round(1e3 * statistics.median(c for _, c, _ in v), 2) for w, v in got.items()},
        "daemon_cpu_ms_per_batch": {w: round(1e3 * statistics.median(c for _, _, c in v), 2) for w, v in got.items()},
        "image_bytes_per_batch_over_tcp": args.batch_size * 3 * args.imgsz * args.imgsz,
    })  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    return common.dispatch(
        {
            "set": (set_main, "a daemon over a COCO-sized set: preparation, restart, memory, attach, status"),
            "restart-ab": (restart_ab_main, "restart to ready on a kept set, two code trees alternating"),
            "index-check": (index_check_main, "the label index check alone, by stat and by bytes"),
            "mmap": (mmap_main, "whether a mapped write moves a file's times, per folder"),
            "tcp": (tcp_main, "a trainer over TCP (CURVE) against one on shared memory"),
        },
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
