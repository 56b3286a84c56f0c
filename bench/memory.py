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
        loader = pixpool.client.attach(spec["socket_dir"], batch_size=spec["batch"], seed=spec["seed"],
                                       imgsz=spec["imgsz"], timeout_s=common.WAIT_S, **ul.PIXPOOL_ROUTES["detect"])  # fmt: skip
        it = iter(loader)
        kept = [next(it) for _ in range(2)]
    else:
        from pixpool.client import Client
        from pixpool.shared.stream.config import AugmentConfig, StreamSettings

        settings = StreamSettings(
            seed=spec["seed"], batch_size=spec["batch"], augment=AugmentConfig(imgsz=spec["imgsz"])
        )
        client = Client(settings, socket_dir=spec["socket_dir"], timeout_s=common.WAIT_S, as_torch=False)
        it = client.epoch(0)
        kept = [next(it) for _ in range(2)]
    time.sleep(1.0)  # let the workers fill this trainer's ring before the reading
    print(json.dumps({"pid": os.getpid(), "batches": len(kept)}), flush=True)
    sys.stdin.readline()


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
                pids = [st["daemon"]["pid"], *(w["pid"] for w in st["workers"] if w["pid"]), *(p.pid for p in procs)]
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
                loaders[arm] = Loader(stream_settings(**options), socket_dir=d, timeout_s=300, zero_copy=zero_copy, lend=False)  # fmt: skip
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
        render_s = sum(w["busy_s"] for w in st["workers"]) / max(1, sum(w["samples_done"] for w in st["workers"]))
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
            "ownership": (ownership_main, "owned batches (lent or copied) against zero-copy views"),
            "wire": (wire_main, "one oversized message against the daemon's memory; the bounded read's cost"),
        },
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
