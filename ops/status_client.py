"""What the running daemon serves: the status request and its plain-text table.

Runs in an operator's or trainer's process (``pixpool status``, ``memory``, ``monitor``, the
demo, the benchmarks). Asks the daemon for its status over the local ipc socket and decodes
the reply (``shared.wire.status``). What it costs is ``memory_report.py``'s.
"""

from __future__ import annotations

from ..shared.errors import DaemonTimeout
from ..shared.text import format_table, human_bytes
from ..shared.transport import endpoint as ep
from ..shared.transport.control import request_health, request_status
from ..shared.transport.store import Store
from ..shared.wire.error_codes import error_from
from ..shared.wire.status import Health, Status
from .memory_report import stream_labels


def query_status(socket_dir: str | None = None, *, timeout_s: float = 3.0) -> Status:
    """The status reply of the daemon at ``socket_dir``; DaemonTimeout names where it looked."""
    endpoint = ep.ipc_endpoint(socket_dir)
    status = request_status(endpoint, timeout_s=timeout_s)
    if status is None:
        raise DaemonTimeout(
            f"no pixpool daemon answered at {endpoint} within {timeout_s} s; start one with `pixpool serve DATA` or pass --socket-dir"
        )
    return Status.from_wire(status)


def query_health(socket_dir: str | None = None, *, timeout_s: float = 3.0) -> Health:
    """The ``health`` reply of the daemon at ``socket_dir`` (what the probes ask); DaemonTimeout
    names where it looked."""
    endpoint = ep.ipc_endpoint(socket_dir)
    health = request_health(endpoint, timeout_s=timeout_s)
    if health is None:
        raise DaemonTimeout(
            f"no pixpool daemon answered at {endpoint} within {timeout_s} s; "
            "start one with `pixpool serve DATA` or pass --socket-dir"
        )
    if health["op"] == "error":  # a daemon of a release without ``health``
        raise error_from(health)
    return Health.from_wire(health)


def _or_unknown(value) -> str:
    return "?" if value is None else str(value)


def format_status(st: Status) -> str:
    d, s = st.daemon, st.snapshot
    lines = [
        f"daemon pid {d.pid} on {d.endpoint}{' and tcp ' + d.tcp if d.tcp else ''}, up {d.uptime_s:.0f} s, protocol {d.protocol}, {d.worker_restarts} worker restarts",
        f"snapshot {_or_unknown(s.name)}: {s.records} records at imgsz {s.imgsz}, {_or_unknown(s.dtype)} "
        f"({human_bytes(s.image_bytes or 0)} of images) in {Store.of(d.store)}"
        + (" (re-attached)" if s.reused else ""),
        *[
            f"validation: snapshot {_or_unknown(v.name)}: {v.records} records"
            for k, v in (st.splits or {}).items()
            if k == "val"
        ],
        "",
        format_table(
            [[w.index, w.pid, w.state, w.samples_done, w.busy_s] for w in st.workers],
            ["worker", "pid", "state", "samples done", "busy s"],
        ),
        "",
    ]
    if st.trainers:
        rows = [
            [
                who,
                t.pid,
                t.delivery,
                f"seed={t.settings.seed} batch={t.settings.batch_size} rank={t.settings.rank}/{t.settings.world_size}",
                where,
                t.batches_delivered,
                t.img_per_s,
                f"{t.slots_in_use}/{t.slots}",
                human_bytes(t.ring_nbytes),
            ]
            for t, (who, where) in zip(st.trainers, stream_labels(st.trainers))
        ]
        lines.append(
            format_table(
                rows,
                ["trainer", "pid", "delivery", "settings", "epoch:batch", "delivered", "img/s", "slots in use", "ring"],
            )
        )
        unlisted = st.trainers_unlisted
        if unlisted > 0:
            lines.append(f"({unlisted} more trainers attached, not listed: the reply has a size limit)")
    else:
        lines.append("no trainers attached")
    return "\n".join(lines)
