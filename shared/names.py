"""Every shared-memory name pixpool creates is built here, from one prefix, and parsed here.

Code both sides import. A cleanup command can sweep ``/dev/shm/pixpool*`` after a crash
without guessing, and no other module takes a name apart by hand: ``parse`` says what a
segment is.

- A snapshot is three segments ``pixpool-snap-<fp16>-<part>`` (part meta, img, tgt) that
  share the base name ``pixpool-snap-<fp16>``, derived from the input fingerprint.
- A batch ring is ``pixpool-ring-<daemon pid>-<trainer id>``: the pid tells a stale ring
  (its daemon is dead) from a live one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PREFIX = "pixpool"
SHM_DIR = "/dev/shm"

# Snapshot segments: one header+index segment, one image arena, one target segment.
SNAPSHOT_PARTS = ("meta", "img", "tgt")
SNAPSHOT_PREFIX = f"{PREFIX}-snap-"
RING_PREFIX = f"{PREFIX}-ring-"


def snapshot_base(key: str) -> str:
    """Base name ``pixpool-snap-<key>`` of the snapshot whose fingerprint starts with ``key``."""
    if not key or "-" in key or "/" in key:
        raise ValueError(f"invalid snapshot key {key!r}: hex digits, no '-' or '/'")
    return SNAPSHOT_PREFIX + key


def snapshot_parts(base: str) -> dict[str, str]:
    """part -> segment name, for a base name ``pixpool-snap-<key>``."""
    parsed = parse(base + "-meta")
    if parsed is None or parsed.kind != "snapshot":
        raise ValueError(f"not a snapshot base name: {base!r} (expected {SNAPSHOT_PREFIX}<fingerprint>)")
    return {part: f"{base}-{part}" for part in SNAPSHOT_PARTS}


def ring_segment(daemon_pid: int, trainer_id: int) -> str:
    """Name of the batch ring the daemon with ``daemon_pid`` keeps for one trainer."""
    return f"{ring_prefix(daemon_pid)}{trainer_id}"


def ring_prefix(daemon_pid: int) -> str:
    """What every ring of the daemon with ``daemon_pid`` starts with."""
    return f"{RING_PREFIX}{int(daemon_pid)}-"


@dataclass(frozen=True)
class SegmentName:
    """What a pixpool segment name says. ``group`` is what ``clean`` removes as one unit:
    a snapshot's base name, or the ring's own name."""

    name: str
    kind: str  # "snapshot" or "ring"
    group: str
    part: str | None = None  # snapshot part
    daemon_pid: int | None = None  # ring owner
    trainer_id: int | None = None


def parse(name: str) -> SegmentName | None:
    """What ``name`` is, or None where it is no well-formed pixpool snapshot or ring name."""
    if name.startswith(SNAPSHOT_PREFIX):
        base, _, part = name.rpartition("-")
        key = base[len(SNAPSHOT_PREFIX) :]
        if part in SNAPSHOT_PARTS and key and "-" not in key:
            return SegmentName(name, "snapshot", base, part=part)
        return None
    if name.startswith(RING_PREFIX):
        pid, _, tid = name[len(RING_PREFIX) :].partition("-")
        if pid.isdigit() and tid.isdigit():
            return SegmentName(name, "ring", name, daemon_pid=int(pid), trainer_id=int(tid))
    return None


def kind_of(name: str) -> str | None:
    """"snapshot", "ring", or None for a name that is neither."""
    parsed = parse(name)
    return parsed.kind if parsed is not None else None


def group_of(name: str) -> str:
    """The unit ``name`` belongs to: a snapshot's base name, else the name itself."""
    parsed = parse(name)
    return parsed.group if parsed is not None else name


def shm_path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def list_segments() -> list[str]:
    """Names of every segment in /dev/shm that carries the project's prefix."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(PREFIX))
