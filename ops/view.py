"""One frame of ``pixpool monitor`` (and ``pixpool memory``'s text form), drawn with rich.

Runs in the operator's process. Pure presentation: it takes the daemon's ``status`` reply
and ``memory_report``'s figures and returns rich renderables, at most 80 columns wide;
``pixpool monitor`` refreshes them once a second (``rich.live``), ``--once`` prints one.
``report_console`` is where they are printed: 80 columns on a terminal, and off one (a pipe,
a file, a CI log) no wrapping at all, so that each sentence of the report stays one line.
"""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..shared.text import human_bytes
from ..shared.wire.status import Status
from .memory_report import stream_labels


def report_console(file=None) -> Console:
    """The console ``memory``, ``monitor`` and the demo print on: 80 columns on a terminal (rich
    wraps at words); off a terminal lines are never wrapped, since a reader of a log or ``grep``
    needs a sentence on one line, and a pipe has no width to fit (rich would assume 80)."""
    if Console(file=file).is_terminal:
        return Console(file=file, width=80)
    return Console(file=file, width=_UNWRAPPED, soft_wrap=True)


_UNWRAPPED = 1000  # columns off a terminal: wider than any line of the report; tables keep their own width


def _table(*headers: str) -> Table:
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for h in headers:
        t.add_column(h, overflow="fold")
    return t


def trainers(count: int) -> str:
    """A count of trainers in words: "1 trainer", "11 trainers" (never "trainer 11", which reads like an id)."""
    return f"{count} trainer{'' if count == 1 else 's'}"


def memory_lines(mem: dict) -> Text:
    """Retained against decoded, the break-even line, the store."""
    decoded, n = mem["decoded_bytes"], mem["trainers"]
    out = Text()
    per = mem.get("ring_bytes_per_trainer")
    each = f" ({human_bytes(per)} per trainer)" if per else ""
    validating = mem.get("validation_ring_bytes", 0)
    if validating:  # a validation pass under way: its ring goes when the pass ends
        each += f", {human_bytes(validating)} of them validation"
    out.append(
        f"snapshot retained {human_bytes(mem['snapshot_bytes'])} ({mem['dtype']}), batch rings {human_bytes(mem['ring_bytes'])}{each}\n"
    )
    out.append(f"decoded uint8 cache of the same images: {human_bytes(decoded)} once")
    if n:
        out.append(f", {human_bytes(mem['uint8_caches_bytes'])} if each of the {trainers(n)} kept its own")
    out.append("\n")
    k = mem["break_even_trainers"]
    if k is None:
        out.append(
            "break-even: attach a trainer to measure its ring"
            if not n
            else "break-even: never (a ring costs more than a uint8 cache)",
            style="yellow",
        )
    else:
        now = "reached" if n >= k else "not yet"
        out.append(
            f"break-even: from {trainers(k)} on, less than a uint8 cache each ({n} now: {now})",
            style="green" if n >= k else "yellow",
        )
    out.append(
        f"\nPSS: service {human_bytes(mem['service_pss_bytes'])} (daemon, workers, their segments), "
        f"trainers {human_bytes(mem['trainers_pss_bytes'])}, total {human_bytes(mem['total_pss_bytes'])}\n"
    )
    where = mem["store"]
    out.append(f"{where['path']}: {human_bytes(where['free_bytes'])} free of {human_bytes(where['size_bytes'])}")
    if not where.get("memory", True):
        out.append(
            f" ({where.get('fs_type') or 'disk'}: {human_bytes(mem.get('snapshot_resident_bytes', 0))} of the snapshot in the page cache)"
        )
    return out


def processes_table(mem: dict) -> Table:
    t = _table("pid", "process", "rss", "uss", "pss")
    for p in mem["processes"]:
        who = p["role"] if p["index"] is None else f"{p['role']} {p['index']}"
        t.add_row(
            str(p["pid"]), who, human_bytes(p["rss_bytes"]), human_bytes(p["uss_bytes"]), human_bytes(p["pss_bytes"])
        )
    return t


def trainers_table(st: Status) -> Table | Text:
    if not st.trainers:
        return Text("no trainers attached")
    t = _table("trainer", "pid", "seed/batch", "epoch:batch", "img/s", "wait", "ring")
    for tr, (who, where) in zip(st.trainers, stream_labels(st.trainers)):
        s = tr.settings
        t.add_row(
            who,
            str(tr.pid),
            f"{s.seed}/{s.batch_size} r{s.rank}/{s.world_size}",
            where,
            f"{tr.img_per_s:.1f}",
            f"{100 * tr.wait_share:.0f}%",
            human_bytes(tr.ring_nbytes),
        )
    return t


def workers_table(st: Status) -> Table:
    up = max(st.daemon.uptime_s, 1e-9)
    t = _table("worker", "pid", "state", "samples", "busy")
    for w in st.workers:
        t.add_row(str(w.index), str(w.pid), w.state, str(w.samples_done), f"{100 * w.busy_s / up:.0f}%")
    return t


def frame(st: Status, mem: dict) -> Group:
    d, s = st.daemon, st.snapshot
    head = Text(
        f"pixpool daemon {d.pid} on {d.endpoint}, up {d.uptime_s:.0f} s; snapshot {s.name if s.name is not None else '?'}: "
        f"{s.records} records at {s.imgsz}",
        style="bold",
    )
    return Group(
        head,
        memory_lines(mem),
        Text(""),
        trainers_table(st),
        Text(""),
        workers_table(st),
        Text(""),
        processes_table(mem),
    )
