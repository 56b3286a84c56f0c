"""bench/memory.py: what trainers cost in memory with one daemon, what an owned batch costs, what one oversized message costs.

Runs in one process (the measurer); everything measured runs in processes of its own.

- ``trainers`` (default): the total PSS (``/proc/PID/smaps_rollup``) of one pixpool daemon with
  ``--workers`` workers and N trainer processes, against N loaders of the peer, each with its
  own cache. pixpool's figures are ``pixpool memory --json``'s (``ops/memory_report.py``: the
  service with each segment counted once, whole; the trainers; the ring per trainer; the
  break-even against a uint8 cache per trainer). Peers: ``ultralytics`` (default): N
  Ultralytics loaders (``_ultralytics_arm.py hold``: cache='ram' and ``--workers`` workers each,
  PSS of each process and its workers), pixpool's trainers importing torch as a real trainer
  does; ``uint8-cache``: N processes that each decode every image resized into their own uint8
  cache and render a batch with pixpool's route, no torch on either side. Every measured
  process has taken two batches and holds them. Also without file-backed pages (shared
  libraries, whose PSS share depends on who else on the machine maps them).
- ``ownership``: what an owned batch costs against a zero-copy view of the ring slot: three
  loaders on one daemon, read in alternating rounds: ``owned`` (``attach()``'s default: lent
  slots while the user keeps few batches, else copies), ``copy`` (always copied out of the
  slot, ``lend=False``) and ``view`` (``zero_copy=True``: the slot itself, valid until the
  next). img/s, and ms per batch from the ``ready`` message to the batch built (where a copy
  happens) against a plain ``np.copyto`` of the same bytes and the batch's render time.
- ``wire``: one daemon (the synthetic set at 160, one worker): for each message shape (frames x
  bytes), its RSS growth at the peak (sampled every 50 ms) and once it answered the next
  ``status``; then microseconds per request read with the bounded ``read_request`` against
  ``recv_multipart``, and per ``AuthorizedKeys.current()`` with nothing changed.

    python bench/memory.py --what trainers [--peer ultralytics|uint8-cache] [--dtype float32,uint8] [--trainers 1,4]
    python bench/memory.py --what ownership [--rounds 7] [--epochs-per-round 2]
    python bench/memory.py --what wire [--shapes 200x1000000,1500x1000000,1000x61440,1000x131000]
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
import _ultralytics_arm as ul  # noqa: E402

MIB = common.MIB


# -- trainers: the holders ------------------------------------------------------------------------
def hold(spec: dict) -> None:
    """A measured process (``--hold SPEC``): a pixpool trainer or a uint8-cache loader that takes
    two batches, prints its pid, and holds until a line arrives on stdin."""
    if spec["kind"] == "uint8-cache":
        from pixpool.server.augment import render_batch
        from pixpool.server.readers import load_dataset
        from pixpool.shared.stream.config import AugmentConfig, StreamSettings

        source = common.Uint8CacheSource(load_dataset(spec["data"]), spec["imgsz"])
        settings = StreamSettings(
            seed=spec["seed"], batch_size=spec["batch"], augment=AugmentConfig(imgsz=spec["imgsz"])
        )
        kept = [render_batch(source, settings, 0, b) for b in range(2)]
    elif spec["torch"]:  # what a trainer runs: torch, owned batches
        import torch

        import pixpool.client

        torch.set_num_threads(1)
        if spec.get("go"):  # a trainer whose imports are done before the clock starts (a joining trainer)
            print(json.dumps({"ready": os.getpid()}), flush=True)
            sys.stdin.readline()
        t_attach = time.time()
        loader = pixpool.client.attach(spec["socket_dir"], batch_size=spec["batch"], seed=spec["seed"],
                                       imgsz=spec["imgsz"], timeout_s=common.WAIT_S, wait_s=spec.get("wait_s", 0.0),
                                       **ul.PIXPOOL_ROUTES["detect"])  # fmt: skip
        if spec.get("consume"):
            _consume(loader, t_attach)
            return
        it = iter(loader)
        kept = [next(it) for _ in range(2)]
    elif spec["kind"] == "torch-only":  # what a trainer's imports alone cost: torch and pixpool's client
        import torch

        import pixpool.client  # noqa: F401

        torch.set_num_threads(1)
        kept = []
    else:
        from pixpool.client import Client
        from pixpool.client.options import ClientOptions
        from pixpool.shared.stream.config import AugmentConfig, StreamSettings

        settings = StreamSettings(
            seed=spec["seed"], batch_size=spec["batch"], augment=AugmentConfig(imgsz=spec["imgsz"])
        )
        client = Client.connect(
            settings, ClientOptions(socket_dir=spec["socket_dir"], timeout_s=common.WAIT_S, as_torch=False)
        )
        it = client.epoch(0)
        kept = [next(it) for _ in range(2)]
    time.sleep(1.0)  # let the workers fill this trainer's ring before the reading
    print(json.dumps({"pid": os.getpid(), "batches": len(kept)}), flush=True)
    sys.stdin.readline()


def _stream(loader):
    """A trainer's batches without end: epoch after epoch."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def _consume(loader, t_attach: float) -> None:
    """Read at full speed (touching each batch's pixels, as a training step's first read does)
    until a line arrives on stdin; the pid line says when attach() began and when the first batch
    was in (``time.time()``: the measurer compares them with the moment it started things)."""
    it = _stream(loader)
    int(next(it)[0][0, 0, 0, 0])
    t_first = time.time()
    print(json.dumps({"pid": os.getpid(), "t_attach": t_attach, "t_first": t_first}), flush=True)
    while not select.select([sys.stdin], [], [], 0)[0]:
        int(next(it)[0][0, 0, 0, 0])
    sys.stdin.readline()
    loader.close()


@contextlib.contextmanager
def holders(argvs: list[list[str]]):
    """Start every command, wait until each printed its pid line (it holds), yield the processes;
    then a line to each and a bounded wait."""
    procs = [subprocess.Popen(a, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for a in argvs]  # fmt: skip
    try:
        for p in procs:
            if not p.stdout.readline():
                raise RuntimeError(f"a measured process exited with {p.wait(common.WAIT_S)} before it held: {' '.join(p.args[:4])}")  # fmt: skip
        yield procs
    finally:
        _stop(procs)


def _pss(pids: list[int]) -> tuple[int, int]:
    """(total PSS, its file-backed part) of ``pids``."""
    figures = [common.rollup(p) for p in pids]
    return sum(f.get("Pss", 0) for f in figures), sum(f.get("Pss_File", 0) for f in figures)


def _hold_argv(spec: dict) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--hold", json.dumps(spec)]


def pixpool_rows(args, data: Path, dtype: str) -> list[dict]:
    """One daemon serving ``dtype``; for each trainer count, the figures while the trainers hold."""
    from pixpool.ops.memory_report import memory_report
    from pixpool.ops.status_client import query_status

    rows = []
    fields = {"data": str(data), "imgsz": args.imgsz, "dtype": dtype, "no_val": True, "keep_snapshot": False}
    with common.daemon(workers=args.workers, **fields) as (d, _):
        for n in args.trainers:
            spec = {"kind": "pixpool", "torch": args.peer == "ultralytics", "socket_dir": d, "batch": args.batch, "imgsz": args.imgsz}  # fmt: skip
            with holders([_hold_argv({**spec, "seed": s}) for s in range(n)]) as procs:
                st = query_status(d)
                rep = memory_report(st)
                pids = [st.daemon.pid, *(w.pid for w in st.workers if w.pid), *(p.pid for p in procs)]
                _, file_pss = _pss(pids)
            rows.append({"dtype": dtype, "trainers": n, "snapshot": rep["snapshot_bytes"], "service": rep["service_pss_bytes"],
                         "pixpool_trainers": rep["trainers_pss_bytes"], "total": rep["total_pss_bytes"],
                         "no_files": rep["total_pss_bytes"] - file_pss, "ring": rep["ring_bytes"] / n,
                         "break_even": rep["break_even_trainers"]})  # fmt: skip
    return rows


def peer_pss(args, data_dir: Path, n: int) -> tuple[int, int]:
    """(total PSS, without file pages) of ``n`` loaders of the peer, each holding two batches."""
    if args.peer == "ultralytics":
        argv = [args.ul_python, str(Path(ul.__file__).resolve()), "hold", "--data-dir", str(data_dir),
                "--workers", str(args.workers), "--batch", str(args.batch), "--imgsz", str(args.imgsz)]  # fmt: skip
        argvs = [argv] * n
    else:
        spec = {"kind": "uint8-cache", "data": str(data_dir / "data.yaml"), "batch": args.batch, "imgsz": args.imgsz}
        argvs = [_hold_argv({**spec, "seed": s}) for s in range(n)]
    with holders(argvs) as procs:
        total, files = _pss([q for p in procs for q in common.tree(p.pid)])
    return total, total - files


def trainers_main(argv: list[str]) -> int:
    """Total PSS of one daemon and N trainers against N loaders with caches of their own (``trainers``)."""
    p = common.parser(trainers_main.__doc__, "memory.py --what trainers")
    p.add_argument("--peer", choices=("ultralytics", "uint8-cache"), default="ultralytics")
    p.add_argument("--dtype", default="float32,uint8", help="snapshot dtypes, an arm each")
    p.add_argument("--trainers", default="1,4", help="trainer counts")
    p.add_argument("--workers", type=int, default=2, help="workers of the daemon and of each Ultralytics loader")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument(
        "--ul-python", default=common.UL_PYTHON, help="Python of a venv with Ultralytics (env PIXPOOL_UL_PYTHON)"
    )
    p.add_argument("--write", type=Path, default=None, help="markdown file whose memory block to replace")
    args = p.parse_args(argv)
    args.trainers = [int(n) for n in args.trainers.split(",")]
    peer = f"Ultralytics {common.ul_version(args.ul_python)}" if args.peer == "ultralytics" else "uint8 cache"
    before = common.load()
    root = Path(tempfile.mkdtemp(prefix="pxbench-memory-"))
    try:
        data_dir = common.make_data_dir(root)
        rows = [r for dtype in args.dtype.split(",") for r in pixpool_rows(args, data_dir / "data.yaml", dtype)]
        peers = {n: peer_pss(args, data_dir, n) for n in args.trainers}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = []
    for r in rows:
        total, no_files = peers[r["trainers"]]
        out.append([f"{r['dtype']} ({r['snapshot'] / MIB:.0f} MiB)", r["trainers"], *(f"{r[k] / MIB:.0f}" for k in ("service", "pixpool_trainers", "total", "ring")),
                    f"{total / MIB:.0f}", f"**{r['total'] / total:.2f}x**", f"{r['no_files'] / MIB:.0f}", f"{no_files / MIB:.0f}",
                    f"{r['no_files'] / no_files:.2f}x", r["break_even"] or "never"])  # fmt: skip
    header = ["snapshot", "trainers", "pixpool service", "pixpool trainers", "pixpool total", "ring per trainer",
              f"{args.peer} total", "ratio", "without file pages: pixpool", args.peer, "ratio", "break-even vs uint8 caches"]  # fmt: skip
    loaders = f"{args.workers} workers each" if args.peer == "ultralytics" else "no workers"
    text = "\n".join([
        f"`{args.command}`", "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; coco128 at {args.imgsz}, batch {args.batch}; PSS in MiB: one "
        f"pixpool daemon with {args.workers} workers and N trainers against N loaders of the peer ({peer}, {loaders}), "
        f"every process holding 2 batches; each segment counted once; load average before / after: {before} / {common.load()}.",
        "", common.table(header, out),
    ])  # fmt: skip
    print(text)
    if args.write:
        common.write_section(args.write, f"memory-{args.peer}", text, "## Latest run: memory")
    return 0


# -- scale: memory and start of N trainers on a set of COCO's size ---------------------------------
# Each process started here prints one JSON line when it holds (``_line``) and stops on a line on
# its stdin; its stderr goes to the run's log. Times are ``time.time()`` stamps compared across
# processes of this machine.
def _start(argv: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)


def _line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{' '.join(proc.args[:4])} ... exited with {proc.wait(common.WAIT_S)} before its line (see the log)")  # fmt: skip
    return json.loads(line)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        with contextlib.suppress(BrokenPipeError, OSError):
            p.stdin.write("stop\n")
            p.stdin.flush()
    for p in procs:
        try:
            p.wait(common.WAIT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _go(proc: subprocess.Popen) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()


def _serve(args, dtype: str, store: str, socket_dir: str, log) -> subprocess.Popen:
    """``pixpool serve`` as a user starts it (the CLI beside this Python), keeping its snapshot on exit."""
    exe = Path(sys.executable).parent / "pixpool"
    cmd = [str(exe), "serve", str(args.data / "data.yaml"), "--imgsz", str(args.imgsz), "--dtype", dtype, "--no-val",
           "--workers", str(args.workers), "--store", store, "--socket-dir", socket_dir, "--keep-snapshot"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def _stop_serve(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _split(pids: list[int]) -> dict[str, int]:
    """PSS of ``pids`` in all, and its anonymous, file-backed and shared-memory parts."""
    figures = [common.rollup(p) for p in pids]
    return {k: sum(f.get(field, 0) for f in figures) for k, field in
            (("pss", "Pss"), ("anon", "Pss_Anon"), ("file", "Pss_File"), ("shmem", "Pss_Shmem"))}  # fmt: skip


def _px_reading(args, socket_dir: str, store: str, trainer_pids: list[int]) -> dict:
    """``memory_report`` of the daemon, ``args.samples`` times 1 s apart after ``args.settle_s``,
    the reading of the largest total; the service's own processes without its segments, and the
    trainers' PSS split by kind of page."""
    from pixpool.ops.memory_report import memory_report
    from pixpool.ops.status_client import query_status

    time.sleep(args.settle_s)  # every trainer reading, its ring and prefetch full
    best = None
    for i in range(args.samples):
        if i:
            time.sleep(1.0)
        rep = memory_report(query_status(socket_dir, timeout_s=30.0), store=store)
        own = sum(p["pss_bytes"] - p["segments_pss_bytes"] for p in rep["processes"] if p["role"] != "trainer")
        got = {"total": rep["total_pss_bytes"], "service": rep["service_pss_bytes"], "service_own": own,
               "snapshot": rep["snapshot_bytes"], "ring_per_trainer": rep["ring_bytes_per_trainer"] or 0,
               "trainers": rep["trainers_pss_bytes"], "trainer_pages": _split(trainer_pids), "n": rep["trainers"],
               "decoded": rep["decoded_bytes"],
               "service_procs": [{"role": p["role"], **_split([p["pid"]]), "segments": p["segments_pss_bytes"]}
                                 for p in rep["processes"] if p["role"] != "trainer"]}  # fmt: skip
        if best is None or got["total"] > best["total"]:
            best = got
    return best


def _ul_reading(args, pids: list[int]) -> dict:
    """Total PSS of Ultralytics loaders and their workers: the largest of ``args.samples`` readings."""
    time.sleep(args.settle_s)
    best = None
    for i in range(args.samples):
        if i:
            time.sleep(1.0)
        got = _split([q for p in pids for q in common.tree(p)])
        if best is None or got["pss"] > best["pss"]:
            best = got
    return best


def px_block(args, dtype: str, log) -> dict:
    """One daemon serving ``dtype`` from a cold store, its first trainer started with it; then a
    joining trainer (torch imported before the clock), trainers up to each count, the service
    alone; a restart on the kept snapshot (a waiting trainer); four trainers with a cold daemon."""
    spec = {"kind": "pixpool", "torch": True, "batch": args.batch, "imgsz": args.imgsz, "consume": True, "wait_s": common.WAIT_S}  # fmt: skip
    store, socket_dir = tempfile.mkdtemp(prefix="pxscale-", dir=args.shm), tempfile.mkdtemp(prefix="pxscale-sock-")
    spec["socket_dir"] = socket_dir
    out: dict = {"dtype": dtype, "load": f"{os.getloadavg()[0]:.1f}", "memory": {}}
    trainers: list[subprocess.Popen] = []
    try:
        t0 = time.time()
        daemon = _serve(args, dtype, store, socket_dir, log)
        trainers.append(_start(_hold_argv({**spec, "seed": 0}), log))
        out["cold_1_s"] = _line(trainers[0])["t_first"] - t0
        out["memory"][1] = _px_reading(args, socket_dir, store, [t.pid for t in trainers])
        joiner = _start(_hold_argv({**spec, "seed": 1, "go": True}), log)
        _line(joiner)  # its imports done
        t_go = time.time()
        _go(joiner)
        got = _line(joiner)
        trainers.append(joiner)
        out["join_s"] = got["t_first"] - t_go
        out["memory"][2] = _px_reading(args, socket_dir, store, [t.pid for t in trainers])
        for n in args.trainers:
            if n <= len(trainers):
                continue
            more = [_start(_hold_argv({**spec, "seed": s}), log) for s in range(len(trainers), n)]
            for t in more:
                _line(t)
            trainers += more
            out["memory"][n] = _px_reading(args, socket_dir, store, [t.pid for t in trainers])
        _stop(trainers)
        trainers = []
        bare = _start(_hold_argv({"kind": "torch-only", "torch": False}), log)  # a trainer's imports alone
        _line(bare)
        time.sleep(1.0)
        out["memory"][0] = _px_reading(args, socket_dir, store, [bare.pid])
        _stop([bare])
        _stop_serve(daemon)
        # Restart on the unchanged set: the snapshot kept, a trainer with its imports done waiting.
        waiter = _start(_hold_argv({**spec, "seed": 0, "go": True}), log)
        _line(waiter)
        t0 = time.time()
        daemon = _serve(args, dtype, store, socket_dir, log)
        _go(waiter)
        out["restart_s"] = _line(waiter)["t_first"] - t0
        _stop([waiter])
        _stop_serve(daemon)
        shutil.rmtree(store)
        os.makedirs(store, mode=0o700)
        # Four trainers started together with a cold daemon: until the last has its first batch.
        t0 = time.time()
        daemon = _serve(args, dtype, store, socket_dir, log)
        trainers = [_start(_hold_argv({**spec, "seed": s}), log) for s in range(4)]
        out["cold_4_s"] = max(_line(t)["t_first"] for t in trainers) - t0
        _stop(trainers)
        trainers = []
        _stop_serve(daemon)
    finally:
        _stop(trainers)
        with contextlib.suppress(NameError):
            if daemon.poll() is None:
                _stop_serve(daemon)
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(socket_dir, ignore_errors=True)
    return out


def ul_block(args, log) -> dict:
    """For each count, that many Ultralytics loaders started together: until the last has its first
    batch, and their PSS while every one reads at full speed."""
    out: dict = {"load": f"{os.getloadavg()[0]:.1f}", "start_s": {}, "memory": {}}
    argv = [args.ul_python, str(Path(ul.__file__).resolve()), "hold", "--consume", "--data-dir", str(args.data),
            "--workers", str(args.workers), "--batch", str(args.batch), "--imgsz", str(args.imgsz)]  # fmt: skip
    for n in args.ul_trainers:
        t0 = time.time()
        procs = [_start(argv, log) for _ in range(n)]
        try:
            out["start_s"][n] = max(_line(p)["t_first"] for p in procs) - t0
            out["memory"][n] = _ul_reading(args, [p.pid for p in procs])
        finally:
            _stop(procs)
    return out


def _mib(values) -> str:
    return ", ".join(f"{v / MIB:.0f}" for v in values)


def _med(values) -> float:
    return statistics.median(values)


def _own(reading: dict) -> int:
    """The service's processes without shared memory: their anonymous and file-backed PSS."""
    return sum(p["anon"] + p["file"] for p in reading["service_procs"])


def scale_report(run: dict, *, budget_gib: float = 20.0, scale_to: int | None = None) -> str:
    """The markdown of a ``scale`` run: every pair of every row, then the fits extrapolated."""
    rounds = run["rounds"]
    dtypes = list(dict.fromkeys(b["dtype"] for r in rounds for b in r["pixpool"]))
    # Each reading keeps the index of its round: a row pairs it with that round's Ultralytics
    # reading (a merged run may have a dtype in some rounds only).
    px = {d: [{**b, "round": i} for i, r in enumerate(rounds) for b in r["pixpool"] if b["dtype"] == d] for d in dtypes}
    ul_rows = [r["ultralytics"] for r in rounds]
    ul_counts = sorted({int(n) for u in ul_rows for n in u["memory"]})
    ul_mem = {n: [u["memory"][str(n)]["pss"] for u in ul_rows] for n in ul_counts}
    loads = ", ".join(f"{r['pixpool'][0]['load']}/{r['ultralytics']['load']}" for r in rounds)
    out = [f"`{run['command']}`", "",
           f"{run['when']}; {run.get('machine', '')}; Ultralytics {run['ultralytics']}; load average before / after: "
           f"{run['load_before']} / {run.get('load_after', '?')}; 1-min load as each pair's pixpool / Ultralytics block began: {loads}.", ""]  # fmt: skip
    # Memory.
    rows = []
    for d in dtypes:
        ns = sorted({int(n) for b in px[d] for n in b["memory"] if int(n) > 0})
        for n in ns:
            # The pairs of this row: the rounds that read it (8 trainers, float32: maybe fewer).
            which = [i for i, b in enumerate(px[d]) if str(n) in b["memory"]]
            mem = [px[d][i]["memory"][str(n)] for i in which]
            tot = [m["total"] for m in mem]
            k = len(tot)
            if n in ul_mem:
                u = [ul_mem[n][px[d][i]["round"]] for i in which]
                ratio = [a / b for a, b in zip(tot, u)]
                ul_cells = [_mib(u), f"**{_med(ratio):.2f}x** ({', '.join(f'{x:.2f}' for x in ratio)})"]
            else:
                ul_cells = ["not run (does not fit)", ""]
            rows.append([f"{d} ({_med([m['snapshot'] for m in mem]) / MIB:.0f} MiB)", n, k, _mib(tot), *ul_cells,
                         f"{_med([m['service'] for m in mem]) / MIB:.0f}", f"{_med([_own(m) for m in mem]) / MIB:.0f}",
                         f"{_med([m['ring_per_trainer'] for m in mem]) / MIB:.1f}",
                         f"{_med([m['trainers'] for m in mem]) / n / MIB:.0f}"])  # fmt: skip
    out += ["**Memory** (total PSS, MiB; every process reading batches at full speed; the largest of the readings):", "",
            common.table(["snapshot", "trainers / loaders", "pairs", "pixpool total, each pair", "Ultralytics total, each pair",
                          "ratio per pair: median (each)", "service (median)", "service's own processes", "ring per trainer",
                          "PSS per trainer, own (median)"], rows), ""]  # fmt: skip
    # The service's own processes, without snapshot and rings.
    rows = []
    for d in dtypes:
        for b_i, b in enumerate(px[d]):
            m = b["memory"]["0"]
            procs = m.get("service_procs", [])
            parts = "; ".join(f"{p['role']} {(p['anon'] + p['file']) / MIB:.0f} (anon {p['anon'] / MIB:.0f}, file {p['file'] / MIB:.0f})" for p in procs)  # fmt: skip
            rows.append([d, b_i + 1, f"{_own(m) / MIB:.0f}", parts])
    out += ["**The service's own processes** (daemon + workers: their anonymous and file-backed PSS, i.e. PSS less "
            "every shared-memory page (snapshot, rings), MiB; read with no trainer attached, after the trainers left):", "",
            common.table(["snapshot", "pair", "service's own", "by process"], rows), ""]  # fmt: skip
    # Start.
    rows = []
    u1 = [u["start_s"]["1"] for u in ul_rows] if "1" in ul_rows[0]["start_s"] else None
    u4 = [u["start_s"]["4"] for u in ul_rows] if "4" in ul_rows[0]["start_s"] else None
    for d in dtypes:
        k = len(px[d])
        for label, key, peer in (("first trainer, cold daemon (both started together)", "cold_1_s", u1),
                                 ("4 trainers started together with a cold daemon (until the last's first batch)", "cold_4_s", u4),
                                 ("a trainer joining a running daemon (torch imported; attach to first batch)", "join_s", None),
                                 ("daemon restarted on the unchanged set (a waiting trainer's first batch)", "restart_s", None)):  # fmt: skip
            v = [b[key] for b in px[d]]
            if peer:
                paired = [peer[b["round"]] for b in px[d]]
                ratio = [a / b for a, b in zip(v, paired)]
                cells = [
                    common.runs(paired, ".1f"),
                    f"**{_med(ratio):.2f}x** ({', '.join(f'{x:.2f}' for x in ratio)})",
                ]
            else:
                cells = ["", ""]
            rows.append([f"{label}, {d}", k, common.runs(v, ".2f"), f"{_med(v):.2f}", *cells])
    out += ["**Start** (seconds from the processes' start to a first batch in the trainer; Ultralytics: "
            "process start to its first batch, cache='ram' filled on the way):", "",
            common.table(["start", "pairs", "pixpool, each pair", "median", "Ultralytics, each pair", "ratio per pair: median (each)"], rows), ""]  # fmt: skip
    # What a trainer costs, and the fits.
    rows = []
    fits = []
    n_images = run.get("images")
    target = scale_to or n_images
    budget = budget_gib * (1 << 30)
    for d in dtypes:
        mem = [b["memory"] for b in px[d]]
        hi = max(n for n in (4, 8) if all(str(n) in m for m in mem))  # the largest count every pair read
        slope = [(m[str(hi)]["total"] - m["1"]["total"]) / (hi - 1) for m in mem]
        tr = [m["1"]["trainer_pages"] for m in mem]
        bare = [m["0"]["trainer_pages"] for m in mem]
        rows.append([d, f"1 -> {hi}", _mib(slope), f"{_med([m['1']['ring_per_trainer'] for m in mem]) / MIB:.1f}",
                     f"{_med([t['pss'] for t in tr]) / MIB:.0f} (anon {_med([t['anon'] for t in tr]) / MIB:.0f}, file {_med([t['file'] for t in tr]) / MIB:.0f})",
                     f"{_med([t['pss'] for t in bare]) / MIB:.0f} (anon {_med([t['anon'] for t in bare]) / MIB:.0f}, file {_med([t['file'] for t in bare]) / MIB:.0f})"])  # fmt: skip
        if n_images:
            snap = _med([m["1"]["snapshot"] for m in mem])
            fixed = _med([m["1"]["total"] for m in mem]) - _med(slope) + snap * (target / n_images - 1)
            fits.append([f"pixpool, {d} snapshot", f"{fixed / MIB:.0f}", f"{_med(slope) / MIB:.0f}", int((budget - fixed) // _med(slope))])  # fmt: skip
    hi = max(ul_counts)
    ul_slope = [(u["memory"][str(hi)]["pss"] - u["memory"]["1"]["pss"]) / (hi - 1) if hi > 1 else u["memory"]["1"]["pss"] for u in ul_rows]  # fmt: skip
    rows.append(["Ultralytics loader (2 workers)", f"1 -> {hi}", _mib(ul_slope), "", "", ""])
    out += ["**What one more trainer costs** (MiB): the slope of the total PSS, each pair; a first trainer's own "
            "pages; a process that imported torch and pixpool's client and nothing else:", "",
            common.table(["", "trainers", "slope per trainer, each pair", "ring", "first trainer's own PSS (median)",
                          "torch + pixpool.client alone (median)"], rows), ""]  # fmt: skip
    if n_images:
        decoded = _med([b["memory"]["1"]["decoded"] for b in px[dtypes[0]]])
        # Per loader: the total at the largest count over that count (each loader holds its own
        # cache, so nothing is shared to subtract), its cache grown with the set.
        u_fixed = 0
        u_per = _med([u["memory"][str(hi)]["pss"] / hi for u in ul_rows]) + decoded * (target / n_images - 1)
        fits.append(
            ["Ultralytics cache='ram'", f"{u_fixed / MIB:.0f}", f"{u_per / MIB:.0f}", int((budget - u_fixed) // u_per)]
        )
        out += [f"**How many fit in {budget_gib:g} GiB on a {target:,}-image set** (extrapolated, not measured: "
                f"from the medians above; pixpool: the total with one trainer less one slope, plus the snapshot grown "
                f"by {target / n_images:.2f}x, then the slope per trainer (its ring and process do not grow with the set); "
                f"Ultralytics: the total per loader at {hi} loaders plus its cache grown by the decoded bytes ({decoded / MIB:.0f} MiB at "
                f"{n_images:,} images) x {target / n_images - 1:.2f}):", "",
                common.table(["", "fixed (MiB)", "per trainer (MiB)", "trainers that fit"], fits), ""]  # fmt: skip
    return "\n".join(out)


def scale_main(argv: list[str]) -> int:
    """Memory and start of 1..N trainers reading at full speed from one daemon, on a set of COCO's
    size, against as many Ultralytics loaders (cache='ram'), alternating block by block (``scale``)."""
    p = common.parser(scale_main.__doc__, "memory.py --what scale")
    p.add_argument("--data", type=Path, required=True, help="a YOLO set folder with data.yaml (bench/derive_set.py)")
    p.add_argument("--dtype", default="uint8,float32", help="snapshot dtypes, a daemon each")
    p.add_argument("--trainers", default="1,2,4,8", help="pixpool trainer counts (1, 2 always: the first, the joiner)")
    p.add_argument("--ul-trainers", default="1,2,4", help="Ultralytics loader counts")
    p.add_argument("--pairs", type=int, default=5, help="alternating pairs (rounds)")
    p.add_argument("--float32-pairs", type=int, default=None, help="rounds that run float32 too (default all)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument(
        "--settle-s", type=float, default=2.0, help="reading at full speed this long before a memory reading"
    )
    p.add_argument("--samples", type=int, default=3, help="memory readings 1 s apart; the largest is kept")
    p.add_argument(
        "--shm", default="/dev/shm", help="where the daemons' stores go (a private tmpfs: see docs/benchmarks.md)"
    )
    p.add_argument(
        "--ul-python", default=common.UL_PYTHON, help="Python of a venv with Ultralytics (env PIXPOOL_UL_PYTHON)"
    )
    p.add_argument("--json", type=Path, default=None, help="write every round here as it ends")
    p.add_argument("--log", type=Path, default=Path("/tmp/pxbench-scale.log"), help="the processes' stderr")
    p.add_argument("--report", type=Path, default=None, help="only print the report of a run's --json")
    p.add_argument("--scale-to", type=int, default=5000, help="the set size the fits are extrapolated to")
    args = p.parse_args(argv)
    if args.report:
        print(scale_report(json.loads(args.report.read_text()), scale_to=args.scale_to))
        return 0
    args.trainers = sorted({1, 2, *(int(n) for n in args.trainers.split(","))})
    args.ul_trainers = [int(n) for n in args.ul_trainers.split(",")]
    dtypes = args.dtype.split(",")
    f32_pairs = args.pairs if args.float32_pairs is None else args.float32_pairs
    versions = common.ul_version(args.ul_python)
    machine = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in machine.splitlines() if line.startswith("Model name")), "?")
    images = len(list((args.data / "images" / "train").glob("*")))
    run = {"command": args.command, "ultralytics": versions, "load_before": common.load(), "images": images,
           "machine": f"{model}, {os.cpu_count()} cores, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / (1 << 30):.0f} GiB",
           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": []}  # fmt: skip
    with open(args.log, "a") as log:
        for r in range(args.pairs):
            served = [d for d in dtypes if d != "float32" or r < f32_pairs]
            blocks = {
                "pixpool": lambda served=served: [px_block(args, d, log) for d in served],
                "ultralytics": lambda: ul_block(args, log),
            }
            got = {"order": common.alternate(list(blocks), r)}
            for name in got["order"]:
                got[name] = blocks[name]()
            run["rounds"].append(got)
            run["load_after"] = common.load()
            print(f"round {r + 1}/{args.pairs}: {json.dumps(got, default=float)}", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(run, indent=1, default=float))
    common.dump(run)
    # The report reads a run as its --json has it (counts as string keys), whether written or not.
    print(scale_report(json.loads(json.dumps(run, default=float)), scale_to=args.scale_to))
    return 0


# -- ownership --------------------------------------------------------------------------------------
def _read(loader, epochs: range) -> tuple[float, int]:
    """(seconds, images) to read ``epochs`` of ``loader``, touching every batch, keeping none."""
    images, t0 = 0, time.perf_counter()
    for epoch in epochs:
        loader.set_epoch(epoch)
        for batch in loader:
            int(batch.images[:, 0, 0, 0].sum())  # reads no more than a step's copy would
            images += batch.images.shape[0]
    return time.perf_counter() - t0, images


def _copy_ms(shape: tuple[int, ...]) -> float:
    """A plain ``np.copyto`` of a batch's image bytes into a buffer already touched, median ms."""
    import numpy as np

    src, dst = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8), np.empty(shape, np.uint8)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def ownership_main(argv: list[str]) -> int:
    """Owned batches (lent slots or copies) against zero-copy views of one daemon (``ownership``)."""
    p = common.parser(ownership_main.__doc__, "memory.py --what ownership")
    common.serving_args(p, rounds=7, epochs_per_round=2)
    args = p.parse_args(argv)
    from pixpool.client import attach
    from pixpool.client.loader import Loader, stream_settings
    from pixpool.client.options import ClientOptions
    from pixpool.ops.status_client import query_status

    arms = {"owned": (False, True), "copy": (False, False), "view": (True, True)}  # (zero_copy, lend)
    before = common.load()
    with common.daemon(workers=args.workers, data=args.data, imgsz=args.imgsz) as (d, _):
        options = {"batch_size": args.batch_size, "seed": 0, "imgsz": args.imgsz}
        loaders, timings = {}, {a: {} for a in arms}
        for arm, (zero_copy, lend) in arms.items():
            if lend:
                loaders[arm] = attach(d, timeout_s=300, zero_copy=zero_copy, **options)
            else:
                loaders[arm] = Loader(stream_settings(**options), ClientOptions(socket_dir=d, timeout_s=300, zero_copy=zero_copy, lend=False))  # fmt: skip
            loaders[arm].client.timings = timings[arm]
        _read(loaders["view"], range(1))  # warm-up: the workers import the route on their first job
        epoch = [1]

        def arm_of(name: str):
            def run():
                timings[name].clear()
                seconds, images = _read(loaders[name], range(epoch[0], epoch[0] + args.epochs_per_round))
                epoch[0] += args.epochs_per_round
                return images / seconds, timings[name]["deliver_s"] / timings[name]["batches"]

            return run

        got = common.rounds({name: arm_of(name) for name in arms}, args.rounds)
        st = query_status(d, timeout_s=5.0)
        render_s = sum(w.busy_s for w in st.workers) / max(1, sum(w.samples_done for w in st.workers))
        for loader in loaders.values():
            loader.close()
    rate = {a: [r for r, _ in v] for a, v in got.items()}
    deliver = {a: statistics.median(1e3 * s for _, s in v) for a, v in got.items()}
    common.dump({
        "command": args.command, "load": [before, common.load()], "rounds": args.rounds,
        "img_per_s": {a: round(statistics.median(v), 1) for a, v in rate.items()},
        "img_per_s_rounds": {a: [round(x, 1) for x in v] for a, v in rate.items()},
        "owned_vs_view_paired": common.paired(rate["owned"], rate["view"]),
        "copy_vs_view_paired": common.paired(rate["copy"], rate["view"]),
        "owned_vs_copy_paired": common.paired(rate["owned"], rate["copy"]),
        "deliver_ms_per_batch": {a: round(v, 3) for a, v in deliver.items()},
        "copy_ms_per_batch": round(deliver["copy"] - deliver["view"], 3),
        "np_copyto_ms_per_batch": round(_copy_ms((args.batch_size, 3, args.imgsz, args.imgsz)), 3),
        "render_ms_per_batch": round(1e3 * render_s * args.batch_size, 2),
    })  # fmt: skip
    return 0


# -- wire ---------------------------------------------------------------------------------------------
def _status(sock) -> None:
    from pixpool.shared.wire import trainer as proto

    sock.send(proto.encode("status"))
    if not sock.poll(30_000):
        raise TimeoutError("the daemon did not answer status within 30 s")
    sock.recv()


def attack(shapes: list[tuple[int, int]]) -> list[dict]:
    """For each (frames, bytes per frame): the daemon's RSS growth at the peak and after the next status."""
    import psutil
    import zmq

    from pixpool.server.synthetic import write_synthetic

    out = []
    with tempfile.TemporaryDirectory(prefix="pxbench-wire-") as work:
        data = write_synthetic(os.path.join(work, "data"), num_images=24, seed=0)
        with common.daemon(workers=1, processes=1, data=str(data.coco_json), imgsz=160) as (d, proc):
            rss = psutil.Process(proc.pid).memory_info
            ctx = zmq.Context.instance()
            probe = ctx.socket(zmq.DEALER)
            probe.setsockopt(zmq.LINGER, 0)
            probe.connect(f"ipc://{d}/daemon.sock")
            _status(probe)
            for frames, size in shapes:
                before = peak = rss().rss
                peer = ctx.socket(zmq.DEALER)
                peer.setsockopt(zmq.LINGER, 0)
                peer.connect(f"ipc://{d}/daemon.sock")
                peer.send_multipart([b"\x02" * size] * frames)
                end, answered = time.monotonic() + 10, False
                while time.monotonic() < end and not answered:
                    peak = max(peak, rss().rss)
                    answered = bool(peer.poll(50))
                _status(probe)
                out.append({"frames": frames, "frame_bytes": size, "peak_mib": round((peak - before) / MIB),
                            "after_mib": round((rss().rss - before) / MIB), "answered": answered})  # fmt: skip
                peer.close(linger=0)
            probe.close(linger=0)
    return out


def intake_us(n: int = 100_000) -> dict[str, float]:
    """Microseconds per single-frame request read off an inproc ROUTER, each way."""
    import zmq

    from pixpool.server.daemon.intake import read_request
    from pixpool.shared.wire import trainer as proto

    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.setsockopt(zmq.RCVHWM, 0)  # no limit: all n requests are queued before the timing
    dealer.setsockopt(zmq.SNDHWM, 0)
    router.bind("inproc://wire-bench")
    dealer.connect("inproc://wire-bench")
    frame = proto.encode("heartbeat", trainer_id=1, token=123456789, data_wait_s=1.5)
    out = {}
    for name, read in (("recv_multipart", lambda: router.recv_multipart(zmq.NOBLOCK)), ("read_request", lambda: read_request(router))):  # fmt: skip
        for _ in range(n):
            dealer.send(frame)
        router.poll(1000)
        t0 = time.perf_counter()
        for _ in range(n):
            read()
        out[name] = round((time.perf_counter() - t0) / n * 1e6, 2)
    router.close(linger=0)
    dealer.close(linger=0)
    return out


def keys_us(n: int = 10_000) -> float:
    """Microseconds per ``AuthorizedKeys.current()`` on an unchanged folder of one key."""
    from pixpool.server.daemon.authorized import AuthorizedKeys
    from pixpool.shared.transport.endpoint import write_keys

    with tempfile.TemporaryDirectory(prefix="pxbench-keys-") as work:
        write_keys(os.path.join(work, "k"))
        keys = AuthorizedKeys(os.path.join(work, "k"))
        keys.current()
        t0 = time.perf_counter()
        for _ in range(n):
            keys.current()
        return round((time.perf_counter() - t0) / n * 1e6, 1)


def wire_main(argv: list[str]) -> int:
    """One oversized message against the daemon's memory; the bounded read per request (``wire``)."""
    p = common.parser(wire_main.__doc__, "memory.py --what wire")
    p.add_argument("--shapes", default="200x1000000,1500x1000000,1000x61440,1000x131000", help="FRAMESxBYTES,...")
    args = p.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    before = common.load()
    common.dump({"command": args.command, "attack": attack(shapes), "intake_us_per_request": intake_us(),
                 "authorized_keys_us_per_call": keys_us(), "load": [before, common.load()]})  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--hold"]:
        hold(json.loads(argv[1]))
        return 0
    return common.dispatch(
        {
            "trainers": (trainers_main, "one daemon and N trainers against N loaders with caches of their own"),
            "scale": (
                scale_main,
                "memory and start of N trainers on a set of COCO's size against N Ultralytics loaders",
            ),
            "ownership": (ownership_main, "owned batches (lent or copied) against zero-copy views"),
            "wire": (wire_main, "one oversized message against the daemon's memory; the bounded read's cost"),
        },
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
