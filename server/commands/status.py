"""``pixpool status`` and ``pixpool monitor``: what the running daemon serves, and its memory.

Runs in the user's shell process. Asks the daemon for its status over the local ipc socket
(a ``status`` request; the reply is plain msgpack) and prints tables, or the JSON reply with
``--json``. ``monitor`` repeats that every second and adds measured memory: the batch rings
and snapshot segments from /dev/shm and RSS/USS/PSS of the daemon and its workers from the
kernel (``server/accountant.py``); ``--once`` prints one frame (tests, scripts).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from ...shared.errors import DaemonTimeout


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--socket-dir", metavar="DIR", default=None, help="the daemon's socket directory")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="how long to wait for the daemon (default 3)")
    parser.add_argument("--json", action="store_true", help="print the raw status as JSON")
    if name == "monitor":
        parser.add_argument("--once", action="store_true", help="print one frame and exit")
        parser.add_argument("--interval-s", type=float, default=1.0, help="refresh interval (default 1)")


def query_status(socket_dir: str | None = None, *, timeout_s: float = 3.0) -> dict:
    import zmq

    from ...shared import endpoint as ep
    from ...shared import protocol as proto

    endpoint = ep.ipc_endpoint(socket_dir)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(proto.encode("status"))
        if not sock.poll(int(timeout_s * 1000)):
            raise DaemonTimeout(f"no pixpool daemon answered at {endpoint} within {timeout_s} s; start one with `pixpool serve DATA` or pass --socket-dir")
        return proto.decode(sock.recv(), reply=True)
    finally:
        sock.close(linger=0)
        ctx.term()


def memory(status: dict) -> dict:
    """Measured bytes: segments in /dev/shm by kind, and the daemon's and workers' memory."""
    from ...shared.names import list_segments, shm_path
    from .. import accountant

    segs = {}
    for name in list_segments():
        try:
            segs[name] = os.stat(shm_path(name)).st_size
        except FileNotFoundError:
            continue
    roles = {status["daemon"]["pid"]: "daemon"}
    roles.update({w["pid"]: f"worker {w['index']}" for w in status["workers"] if w["pid"]})
    # Local trainers each map their own ring on this machine; remote ones are not ours to measure.
    roles.update({t["pid"]: f"trainer {t['trainer_id']}" for t in status["trainers"] if t["delivery"] == "shm" and t["pid"]})
    procs = accountant.process_memory(list(roles))
    return {
        "ring_bytes": sum(n for k, n in segs.items() if k.startswith("pixpool-ring-")),
        "snapshot_bytes": sum(n for k, n in segs.items() if k in set(status["snapshot"].get("segments", []))),
        "decoded_bytes": int(status["snapshot"].get("decoded_bytes", 0)),
        "trainers": len(status["trainers"]),
        "segments": segs,
        "processes": [{"pid": p.pid, "name": roles.get(p.pid, p.name), "rss": p.rss, "uss": p.uss, "pss": p.pss} for p in procs],
    }


def format_status(st: dict) -> str:
    from ..accountant import format_table, human_bytes

    d, s = st["daemon"], st["snapshot"]
    lines = [
        f"daemon pid {d['pid']} on {d['endpoint']}{' and tcp ' + d['tcp'] if d['tcp'] else ''}, up {d['uptime_s']:.0f} s, protocol {d['protocol']}, {d['worker_restarts']} worker restarts",
        f"snapshot {s.get('name', '?')}: {s['records']} records at imgsz {s['imgsz']}" + (" (re-attached)" if s.get("reused") else ""),
        "",
        format_table([[w["index"], w["pid"], w["state"], w["batches_done"], w["busy_s"]] for w in st["workers"]], ["worker", "pid", "state", "batches done", "busy s"]),
        "",
    ]
    if st["trainers"]:
        rows = [[t["trainer_id"], t["pid"], f"seed={t['settings']['seed']} batch={t['settings']['batch_size']} rank={t['settings']['rank']}/{t['settings']['world_size']}",
                 f"{t['epoch']}:{t['next_batch']}/{t['num_batches']}", t["batches_delivered"], t["img_per_s"], f"{t['slots_in_use']}/{t['slots']}", human_bytes(t["ring_nbytes"])] for t in st["trainers"]]
        lines.append(format_table(rows, ["trainer", "pid", "settings", "epoch:batch", "delivered", "img/s", "slots in use", "ring"]))
    else:
        lines.append("no trainers attached")
    return "\n".join(lines)


def format_memory(mem: dict) -> str:
    from ..accountant import format_table, human_bytes

    rows = [[p["pid"], p["name"], human_bytes(p["rss"]), human_bytes(p["uss"]), human_bytes(p["pss"])] for p in mem["processes"]]
    rows.append(["", "total", human_bytes(sum(p["rss"] for p in mem["processes"])), human_bytes(sum(p["uss"] for p in mem["processes"])),
                 human_bytes(sum(p["pss"] for p in mem["processes"]))])
    text = format_table(rows, ["pid", "process", "rss", "uss", "pss"])
    head = f"shared memory: snapshot {human_bytes(mem['snapshot_bytes'])}, batch rings {human_bytes(mem['ring_bytes'])}"
    decoded, n = mem.get("decoded_bytes", 0), mem.get("trainers", 0)
    if decoded:
        head += f"\ndecoded uint8 cache of the same images: {human_bytes(decoded)}"
        if n:
            head += f" once, {human_bytes(n * decoded)} if each of the {n} trainer(s) kept its own"
        head += " (pss of a process counts its share of every segment it maps)"
    return head + "\n" + text


def run(args: argparse.Namespace) -> int:
    if args.command == "status":
        st = query_status(args.socket_dir, timeout_s=args.timeout_s)
        print(json.dumps(st, indent=2) if args.json else format_status(st))
        return 0
    while True:
        st = query_status(args.socket_dir, timeout_s=args.timeout_s)
        mem = memory(st)
        if args.json:
            print(json.dumps({**st, "memory": mem}), flush=True)
        else:
            if not args.once:
                print("\x1b[2J\x1b[H", end="")
            print(format_status(st) + "\n\n" + format_memory(mem), flush=True)
        if args.once:
            return 0
        time.sleep(args.interval_s)  # refresh period of a live display
