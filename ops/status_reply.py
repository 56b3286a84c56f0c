"""The daemon's ``status`` and ``health`` replies, built from its live state.

Runs in the daemon process (inside its loop, on a ``status`` or ``health`` request, and for
the metrics endpoint). Read-only: it only looks at the daemon, its sessions, scheduler and
supervisor.

The ``status`` reply stays under ``MAX_REPLY_BYTES`` whatever trainers sent: their fields
are bounded at decode (``shared.wire.trainer``), and the trainer list stops at
``TRAINERS_BUDGET_BYTES`` (``daemon.trainers_total`` says how many there are, so a reader
knows some were left out). ``health`` is a few numbers: its cost does not grow with the
sessions, which is what a probe asking every few seconds needs.
"""

from __future__ import annotations

import time

import msgpack

from ..shared import __version__
from ..shared.wire.trainer import MAX_REPLY_BYTES, PROTOCOL_VERSION

# Room for the trainer list in a status reply; the rest (daemon, snapshot, workers) is small.
TRAINERS_BUDGET_BYTES = MAX_REPLY_BYTES // 2


def build_health(d) -> dict:
    """The ``health`` reply: alive (it answered), healthy (serving, not stopping), counts."""
    healthy = d.fatal is None and d._stop_reason is None and d.supervisor.fatal is None
    workers_ready = sum(w.state in ("idle", "busy") for w in d.supervisor.workers)
    return {
        "pid": d.pid,
        "healthy": healthy,
        # A trainer's validation pass (a session on the val split) is no trainer (``memory_report.is_validation``).
        "trainers": sum(1 for t in d.sessions.trainers.values() if t.settings.split == "train"),
        "workers_ready": workers_ready,
        "uptime_s": round(time.monotonic() - d.started, 3),
    }


def build_status(d) -> dict:
    """The ``status`` reply: daemon, snapshot, workers and trainers (plain msgpack types)."""
    now = time.monotonic()
    workers = [
        {
            "index": w.index,
            "pid": w.pid,
            "state": w.state,
            "parts_done": w.parts_done,
            "samples_done": w.samples_done,
            "busy_s": round(w.busy_s, 3),
            "ready_s": round(w.ready_s, 3),
        }
        for w in d.supervisor.workers
    ]
    trainers = []
    listed_nbytes = 0
    for t in d.sessions.trainers.values():
        s = d.scheduler.progress(t.trainer_id)
        entry = {
            "trainer_id": t.trainer_id,
            "pid": t.pid,
            "host": t.host,
            "delivery": t.delivery,
            "pid_watched": t.watch_pid,
            "settings": t.settings_dict,
            "split": t.settings.split,
            "of_trainer": t.of_trainer,  # the trainer a validation stream belongs to (0: none attached)
            "epoch": s.epoch,
            "next_batch": s.next_batch,
            "num_batches": s.num_batches,
            "batches_delivered": s.batches_delivered,
            "images_delivered": s.images_delivered,
            "img_per_s": round(s.img_per_s, 2),
            "slots": s.slots,
            "slots_in_use": s.slots_in_use,
            "ring": t.ring.name,
            "ring_nbytes": t.ring.layout.nbytes,
            # Of which mask planes (segment; 0 otherwise): counted in ring_nbytes, named apart.
            "ring_mask_nbytes": t.ring.layout.slots * t.ring.layout.masks_nbytes,
            "last_seen_s": round(now - t.last_seen, 3),
            "attached_s": round(now - t.attached_at, 3),
            "data_wait_s": round(t.data_wait_s, 3),
        }
        listed_nbytes += len(msgpack.packb(entry, use_bin_type=True))
        if listed_nbytes > TRAINERS_BUDGET_BYTES:
            break
        trainers.append(entry)
    cfg = d.config
    daemon = {
        "pid": d.pid,
        "host": d.host,
        "store": str(d.store),
        "pid_ns": d.pid_ns,
        "version": __version__,
        "protocol": PROTOCOL_VERSION,
        "endpoint": d.endpoint or "",
        "tcp": cfg.tcp or "",
        "uptime_s": round(now - d.started, 3),
        "worker_restarts": d.supervisor.restarts,
        "redispatched_jobs": d.supervisor.redispatched,
        "heartbeat_timeout_s": cfg.heartbeat_timeout_s,
        "memory_budget_nbytes": cfg.memory_budget_nbytes,
        "store_warn_free_nbytes": d.store_watch.warn_free_nbytes,
        "store_low": d.store_watch.low,
        "metrics": f"http://{cfg.metrics_host}:{cfg.metrics_port}/metrics" if cfg.metrics_port else "",
        "trainers_total": len(d.sessions),
        # Periodic steps that failed with an OSError and were retried (``housekeeping.py``), and
        # TCP connections shut down before their handshake (``handshake_guard.py``).
        "housekeeping_errors": d.housekeeping.errors_total,
        "tcp_handshakes_refused": d.listener.guard.refused if d.listener is not None and d.listener.guard else 0,
    }
    splits = {
        split: {
            "records": len(src),
            "imgsz": src.imgsz,
            "max_instances": src.max_instances,
            "task": str(getattr(src, "task", None) or "detect"),
            **d.split_info.get(split, {}),
        }
        for split, src in d.sources.items()
    }
    return {"daemon": daemon, "snapshot": splits["train"], "splits": splits, "workers": workers, "trainers": trainers}
