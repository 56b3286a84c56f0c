"""What the running daemon serves and what it costs: the status request and the memory figures.

Runs in an operator's or trainer's process (``pixpool status``/``monitor``, the demo, the
serve benchmark). Asks the daemon for its status over the local ipc socket (the plain
msgpack ``status`` reply) and measures memory itself: the batch rings and snapshot segments
from /dev/shm, RSS/USS/PSS of the daemon, its workers and local trainers from the kernel
(``pixpool.shared.procmem``).
"""

from __future__ import annotations

import os

from ..shared import endpoint as ep
from ..shared import protocol as proto
from ..shared.control import request_status
from ..shared.errors import DaemonTimeout
from ..shared.names import kind_of, list_segments, shm_path
from ..shared.procmem import process_memory
from ..shared.text import format_table, human_bytes


def query_status(socket_dir: str | None = None, *, timeout_s: float = 3.0) -> dict:
    """The status reply of the daemon at ``socket_dir``; DaemonTimeout names where it looked."""
    endpoint = ep.ipc_endpoint(socket_dir)
    status = request_status(endpoint, timeout_s=timeout_s)
    if status is None:
        raise DaemonTimeout(f"no pixpool daemon answered at {endpoint} within {timeout_s} s; start one with `pixpool serve DATA` or pass --socket-dir")
    return status


def memory(status: dict) -> dict:
    """Measured bytes: segments in /dev/shm by kind, and the daemon's and workers' memory."""
    segs = {}
    for name in list_segments():
        try:
            segs[name] = os.stat(shm_path(name)).st_size
        except FileNotFoundError:
            continue
    roles = {status["daemon"]["pid"]: "daemon"}
    roles.update({w["pid"]: f"worker {w['index']}" for w in status["workers"] if w["pid"]})
    # Local trainers each map their own ring on this machine; remote ones are not ours to measure.
    roles.update({t["pid"]: f"trainer {t['trainer_id']}" for t in status["trainers"] if t["delivery"] == proto.DELIVERY_SHM and t["pid"]})
    procs = process_memory(list(roles))
    return {
        "ring_bytes": sum(n for k, n in segs.items() if kind_of(k) == "ring"),
        "snapshot_bytes": sum(n for k, n in segs.items() if k in set(status["snapshot"].get("segments", []))),
        "decoded_bytes": int(status["snapshot"].get("decoded_bytes", 0)),
        "trainers": len(status["trainers"]),
        "segments": segs,
        "processes": [{"pid": p.pid, "name": roles.get(p.pid, p.name), "rss": p.rss, "uss": p.uss, "pss": p.pss} for p in procs],
    }


def format_status(st: dict) -> str:
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
