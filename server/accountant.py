"""Memory accountant: what the snapshot retains, and what processes hold, measured.

Runs in the CLI (``pixpool prepare``, ``pixpool ls``, ``pixpool clean``) and later in the
live monitor. Nothing is estimated where it can be measured:
- snapshot bytes come from the segment files' sizes in /dev/shm;
- the decoded-uint8 equivalent is the sum of h * w * 3 over the snapshot's index;
- per-process RSS/USS/PSS come from the kernel via psutil (``memory_full_info``), and how
  much of each pid's mapping of pixpool segments is resident from ``/proc/PID/smaps``.

Note on USS: a shared-memory page mapped by exactly one process counts as that process's
*private* memory in smaps (its map count is 1), so the USS of a lone reader includes the
snapshot pages it touched. PSS divides each page among its mappers and is the honest
per-process share; it is reported beside USS.

Parsers (``parse_smaps``, ``parse_maps_line``) are pure functions over text, kept apart
from the file reads so they can be tested on fixed input.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil

from ..shared.names import PREFIX, SHM_DIR, shm_path

_SHM_PREFIX_PATH = os.path.join(SHM_DIR, PREFIX)


# -- snapshot bytes ----------------------------------------------------------------------
def snapshot_bytes(snapshot) -> dict:
    """Bytes per segment of ``snapshot`` (measured from the files) and the uint8 equivalent.

    Keys: ``segments`` (segment name -> bytes), ``image_bytes``, ``meta_bytes`` (header +
    index), ``target_bytes``, ``total_bytes``, ``decoded_bytes`` (same resized images as
    uint8), ``ratio`` (image_bytes / decoded_bytes).
    """
    sizes = {}
    for name in snapshot.segment_names:
        sizes[name] = os.stat(shm_path(name)).st_size
    part = {name.rpartition("-")[2]: size for name, size in sizes.items()}
    index = snapshot.index
    decoded = int((index["height"].astype("i8") * index["width"].astype("i8") * 3).sum())
    return {
        "segments": sizes,
        "image_bytes": part["img"],
        "meta_bytes": part["meta"],
        "target_bytes": part["tgt"],
        "total_bytes": sum(sizes.values()),
        "decoded_bytes": decoded,
        "ratio": part["img"] / decoded if decoded else float("nan"),
    }


# -- /proc parsing (pure) ------------------------------------------------------------------
def parse_maps_line(line: str) -> str | None:
    """Path of a /proc/PID/maps line, or None for an anonymous mapping."""
    fields = line.split(None, 5)
    if len(fields) < 6:
        return None
    path = fields[5].strip()
    if path.endswith(" (deleted)"):
        path = path[: -len(" (deleted)")]
    return path or None


def parse_smaps(text: str) -> dict[str, dict[str, int]]:
    """Per mapped path, summed smaps fields in bytes (``Rss``, ``Pss``, ``Shared_Clean``, ...).

    Anonymous mappings are skipped. Several mappings of one path are summed.
    """
    out: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in text.splitlines():
        if not line:
            continue
        head = line.split(None, 1)[0]
        if "-" in head and not head.endswith(":"):  # a mapping header "start-end perms ..."
            path = parse_maps_line(line)
            current = out.setdefault(path, {}) if path else None
            continue
        if current is None or not head.endswith(":"):
            continue
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            key = head[:-1]
            current[key] = current.get(key, 0) + int(parts[1]) * 1024
    return out


def pixpool_resident(smaps: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The pixpool segments among parsed smaps: segment name -> {rss, pss} bytes."""
    out = {}
    for path, fields in smaps.items():
        if path.startswith(_SHM_PREFIX_PATH):
            out[os.path.basename(path)] = {"rss": fields.get("Rss", 0), "pss": fields.get("Pss", 0)}
    return out


# -- /proc reads ----------------------------------------------------------------------------
def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None


def segment_users() -> dict[str, set[int]]:
    """pixpool segment name -> live pids that map it or hold it open (unreadable pids skipped)."""
    users: dict[str, set[int]] = {}
    me_prefix = _SHM_PREFIX_PATH
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        maps = _read_text(f"/proc/{pid}/maps")
        if maps:
            for line in maps.splitlines():
                if me_prefix in line:
                    path = parse_maps_line(line)
                    if path and path.startswith(me_prefix):
                        users.setdefault(os.path.basename(path), set()).add(pid)
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, PermissionError, ProcessLookupError, OSError):
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.endswith(" (deleted)"):
                target = target[: -len(" (deleted)")]
            if target.startswith(me_prefix):
                users.setdefault(os.path.basename(target), set()).add(pid)
    # A zombie keeps its /proc entry but maps nothing; skip pids that are not running.
    for name, pids in users.items():
        pids.difference_update({p for p in pids if not _alive(p)})
    return {n: p for n, p in users.items() if p}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass
class ProcessMemory:
    pid: int
    name: str
    rss: int
    uss: int
    pss: int
    segments: dict = field(default_factory=dict)  # pixpool segment -> {rss, pss}


def process_memory(pids) -> list[ProcessMemory]:
    """RSS/USS/PSS (kernel, via psutil) and resident pixpool bytes for each readable pid."""
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            info = proc.memory_full_info()
            name = proc.name()
        except psutil.Error:
            continue
        text = _read_text(f"/proc/{pid}/smaps")
        segments = pixpool_resident(parse_smaps(text)) if text else {}
        out.append(ProcessMemory(pid, name, info.rss, info.uss, getattr(info, "pss", 0), segments))
    return out


# -- formatting ---------------------------------------------------------------------------
def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def format_table(rows: list[list], headers: list[str]) -> str:
    """Plain-text table, columns left-aligned, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(r[i], (int, float)) for r in rows) and rows for i in range(len(headers))]
    lines = []
    for k, r in enumerate(cells):
        parts = [c.rjust(w) if numeric[i] and k else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_snapshot_report(snap_bytes: dict, *, records: int | None = None) -> str:
    rows = [[name, n, human_bytes(n)] for name, n in snap_bytes["segments"].items()]
    rows.append(["total retained", snap_bytes["total_bytes"], human_bytes(snap_bytes["total_bytes"])])
    rows.append(["decoded uint8 equivalent", snap_bytes["decoded_bytes"], human_bytes(snap_bytes["decoded_bytes"])])
    text = format_table(rows, ["segment", "bytes", "size"])
    extra = f"float32 images / uint8 equivalent = {snap_bytes['ratio']:.3f}"
    if records is not None:
        extra = f"{records} records; " + extra
    return text + "\n" + extra


def format_process_report(procs: list[ProcessMemory]) -> str:
    rows = []
    for p in procs:
        seg_rss = sum(s["rss"] for s in p.segments.values())
        rows.append([p.pid, p.name, human_bytes(p.rss), human_bytes(p.uss), human_bytes(p.pss), human_bytes(seg_rss)])
    return format_table(rows, ["pid", "name", "rss", "uss", "pss", "pixpool resident"])
