"""bench/memory.py: what 1, 2 and 4 trainers cost with one pixpool daemon, against 1, 2 and 4
loaders that each keep their own decoded uint8 cache. Measured, not computed.

Runs in one process (the measurer); everything measured runs in spawned processes.

- pixpool arm: a daemon (2 workers) serving coco128 at 640; N trainer processes attach,
  take one batch of 16 each and hold their rings. Figures: ``pixpool memory --json``
  (``ops/memory_report.py``): ``service_pss_bytes`` (daemon, workers and their segments, each
  segment once), ``trainers_pss_bytes``, ``total_pss_bytes``, ``break_even_trainers``.
- uint8 arm: N loader processes, each decoding every image resized to 640 into its own
  uint8 cache (``bench/serve.py``'s ``Uint8CacheSource``, the conventional decoded cache),
  rendering one batch of 16 with the same route, then holding. Figure: the sum of their
  PSS from ``/proc/PID/smaps_rollup``.

Both kinds of process import numpy and pixpool; the trainers here do not import torch (a
real trainer does, in both arms alike). Usage: ``python bench/memory.py [--data coco.json]
[--imgsz 640] [--trainers 1,2,4] [--write docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import COCO128, Uint8CacheSource  # noqa: E402  (the same cache the serve benchmark uses)

WAIT_S = 300.0
MIB = 1 << 20


def _trainer(settings_dict: dict, socket_dir: str, conn) -> None:
    from pixpool.client import Client
    from pixpool.shared.stream.config import StreamSettings

    with Client(StreamSettings.from_dict(settings_dict), socket_dir=socket_dir, timeout_s=WAIT_S, as_torch=False) as c:
        it = c.epoch(0)
        next(it)
        conn.send("ready")
        conn.poll(WAIT_S)
        it.close()


def _loader(data: str, settings_dict: dict, conn) -> None:
    from pixpool.server.augment import render_batch
    from pixpool.server.readers import load_dataset
    from pixpool.shared.stream.config import StreamSettings

    settings = StreamSettings.from_dict(settings_dict)
    source = Uint8CacheSource(load_dataset(data), settings.augment.imgsz)
    render_batch(source, settings, 0, 0)
    conn.send(int(sum(a.nbytes for a in source.cache)))
    conn.poll(WAIT_S)


def _pss(pid: int) -> int:
    from pixpool.shared.transport.procmem import parse_rollup

    with open(f"/proc/{pid}/smaps_rollup") as f:
        return parse_rollup(f.read())["Pss"]


def _start(ctx, target, args_list):
    procs, conns = [], []
    for args in args_list:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=target, args=(*args, child))
        p.start()
        procs.append(p)
        conns.append(parent)
    got = []
    for c in conns:
        if not c.poll(WAIT_S):
            raise TimeoutError("a measured process did not get ready in time")
        got.append(c.recv())
    return procs, conns, got


def _stop(procs, conns) -> None:
    for c in conns:
        c.send("stop")
    for p in procs:
        p.join(WAIT_S)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(COCO128))
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--trainers", default="1,2,4")
    parser.add_argument("--write", default=None, help="markdown file whose memory section to replace")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.trainers.split(",")]

    from pixpool.ops.memory_report import memory_report
    from pixpool.ops.status_client import query_status
    from pixpool.server.daemon.run import run_daemon, stop_process
    from pixpool.shared.stream.config import AugmentConfig, DaemonConfig, StreamSettings

    ctx = mp.get_context("spawn")
    settings = [
        StreamSettings(seed=i, batch_size=16, augment=AugmentConfig(imgsz=args.imgsz)) for i in range(max(counts))
    ]
    rows = {}
    d = tempfile.mkdtemp(prefix="pxm-")
    daemon = ctx.Process(
        target=run_daemon, args=(DaemonConfig(data=args.data, imgsz=args.imgsz, workers=2, socket_dir=d),)
    )
    daemon.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                query_status(d, timeout_s=1.0)
                break
            except Exception:
                if time.monotonic() > deadline or not daemon.is_alive():
                    raise
                time.sleep(0.2)  # polling interval of a bounded wait for start-up
        for n in counts:
            procs, conns, _ = _start(ctx, _trainer, [(s.to_dict(), d) for s in settings[:n]])
            time.sleep(1.0)  # let the workers' last renders settle before reading the kernel
            rep = memory_report(query_status(d))
            _stop(procs, conns)
            rows.setdefault(n, {}).update(
                service=rep["service_pss_bytes"],
                trainers=rep["trainers_pss_bytes"],
                pixpool=rep["total_pss_bytes"],
                ring=rep["ring_bytes"] / n,
                break_even=rep["break_even_trainers"],
                snapshot=rep["snapshot_bytes"],
                decoded=rep["decoded_bytes"],
            )
    finally:
        stop_process(daemon)
        shutil.rmtree(d, ignore_errors=True)
    for n in counts:
        procs, conns, caches = _start(ctx, _loader, [(args.data, s.to_dict()) for s in settings[:n]])
        rows[n].update(uint8=sum(_pss(p.pid) for p in procs), cache=caches[0])
        _stop(procs, conns)

    lines = [
        f"`python bench/memory.py --trainers {args.trainers}` ({Path(args.data).name} at {args.imgsz} px, batch 16, daemon with 2 workers; "
        f"snapshot {rows[counts[0]]['snapshot'] / MIB:.0f} MiB float32, decoded uint8 {rows[counts[0]]['decoded'] / MIB:.0f} MiB). PSS in MiB, "
        "from `/proc/PID/smaps_rollup`; each segment counted once.",
        "",
        "| trainers | pixpool service | pixpool trainers | pixpool total | per-trainer ring | loaders with own uint8 cache, total | pixpool / uint8 | break-even (measured) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in counts:
        r = rows[n]
        lines.append(
            f"| {n} | {r['service'] / MIB:.0f} | {r['trainers'] / MIB:.0f} | {r['pixpool'] / MIB:.0f} | {r['ring'] / MIB:.0f} | "
            f"{r['uint8'] / MIB:.0f} | {r['pixpool'] / r['uint8']:.2f} | {r['break_even'] or 'never'} |"
        )
    growth = [(rows[b]["service"] - rows[a]["service"]) / (b - a) / MIB for a, b in zip(counts, counts[1:])]
    lines += [
        "",
        "service growth per added trainer: "
        + ", ".join(f"{g:.0f} MiB" for g in growth)
        + f" (a ring is {rows[counts[-1]]['ring'] / MIB:.0f} MiB)",
    ]
    text = "\n".join(lines)
    print(text)
    print(json.dumps({str(k): v for k, v in rows.items()}))
    if args.write:
        _write(Path(args.write), text)
    return 0


def _write(path: Path, text: str) -> None:
    start, end = "<!-- memory: start -->", "<!-- memory: end -->"
    doc = path.read_text()
    block = f"{start}\n{text}\n{end}"
    if start in doc:
        doc = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip() + f"\n\n## Memory (bench/memory.py)\n\n{block}\n"
    path.write_text(doc)


if __name__ == "__main__":
    sys.exit(main())
