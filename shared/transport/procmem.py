"""What processes hold, measured from the kernel: /proc parsing, segment users, RSS/USS/PSS.

Code both sides import: the monitor and the memory reports measure processes; ``pixpool
clean``/``ls`` show which pids map a segment, as far as this PID namespace sees. Nothing
here decides whether a segment is in use or a daemon alive: /proc shows only this PID
namespace's processes, and that is ``shared.transport.holds``' job (locks on the files themselves).
Nothing is estimated where it can be measured: per-process RSS/USS/PSS come from the
kernel's ``/proc/PID/smaps_rollup``, and how much of each pid's mapping of pixpool
segments is resident (and its PSS share) from ``/proc/PID/smaps``.

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

from .names import PREFIX
from .store import DEFAULT, Store


def _prefix_path(store: Store) -> str:
    """What the path of every pixpool segment of ``store`` starts with (a canonical path:
    the kernel shows mapped files by their real path)."""
    return store.path(PREFIX)


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


def pixpool_resident(smaps: dict[str, dict[str, int]], store: Store = DEFAULT) -> dict[str, dict[str, int]]:
    """The pixpool segments of ``store`` among parsed smaps: segment name -> {rss, pss} bytes."""
    out = {}
    prefix = _prefix_path(store)
    for path, fields in smaps.items():
        if path.startswith(prefix):
            out[os.path.basename(path)] = {"rss": fields.get("Rss", 0), "pss": fields.get("Pss", 0)}
    return out


# -- /proc reads ----------------------------------------------------------------------------
def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None


def segment_users(store: Store = DEFAULT) -> dict[str, set[int]]:
    """pixpool segment name (in ``store``, default /dev/shm) -> live pids that map it or hold
    it open (unreadable pids skipped; only processes in this PID namespace are seen, so this
    describes and measures; ``shared.transport.holds`` decides "in use")."""
    users: dict[str, set[int]] = {}
    me_prefix = _prefix_path(store)
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
    for _name, pids in users.items():
        pids.difference_update({p for p in pids if not alive(p)})
    return {n: p for n, p in users.items() if p}


def pid_namespace() -> str:
    """This process's PID namespace (``pid:[inode]``), "" where it cannot be read. Two
    processes may compare pids only when this is equal and they are on one machine (the
    initial namespace has the same inode on every machine)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie does not: it maps nothing any more)."""
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


def parse_rollup(text: str) -> dict[str, int]:
    """``/proc/PID/smaps_rollup`` fields in bytes (``Rss``, ``Pss``, ``Private_Dirty``, ...)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].endswith(":") and parts[2] == "kB":
            out[parts[0][:-1]] = int(parts[1]) * 1024
    return out


def rollup_figures(fields: dict[str, int]) -> tuple[int, int, int]:
    """(rss, uss, pss) from parsed smaps_rollup; USS is the private pages (clean, dirty, hugetlb)."""
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0) + fields.get("Private_Hugetlb", 0)
    return fields.get("Rss", 0), uss, fields.get("Pss", 0)


def process_memory(pids, store: Store = DEFAULT) -> list[ProcessMemory]:
    """RSS/USS/PSS from the kernel's ``/proc/PID/smaps_rollup`` and each pid's resident
    pixpool segments (``/proc/PID/smaps``), for every pid that can be read."""
    out = []
    for pid in pids:
        rollup = _read_text(f"/proc/{pid}/smaps_rollup")
        if rollup is None:
            continue
        try:
            name = psutil.Process(pid).name()
        except psutil.Error:
            continue
        text = _read_text(f"/proc/{pid}/smaps")
        segments = pixpool_resident(parse_smaps(text), store) if text else {}
        rss, uss, pss = rollup_figures(parse_rollup(rollup))
        out.append(ProcessMemory(pid, name, rss, uss, pss, segments))
    return out
