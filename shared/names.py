"""Every shared-memory name pixpool creates is built here, from one prefix.

A cleanup command can therefore sweep ``/dev/shm/pixpool*`` after a crash without
guessing. Snapshot names derive from the input fingerprint; batch rings carry the daemon's
pid so a stale ring can be told from a live one.
"""

from __future__ import annotations

import os

PREFIX = "pixpool"
SHM_DIR = "/dev/shm"

# Snapshot segments: one header+index segment, one image arena, one target segment.
SNAPSHOT_PARTS = ("meta", "img", "tgt")


def snapshot_segment(fingerprint: str, part: str) -> str:
    """Name of one segment of the snapshot with this fingerprint (no leading slash)."""
    if part not in SNAPSHOT_PARTS:
        raise ValueError(f"unknown snapshot part {part!r}; expected one of {SNAPSHOT_PARTS}")
    return f"{PREFIX}-snap-{fingerprint}-{part}"


def ring_segment(daemon_pid: int, trainer_id: int) -> str:
    """Name of the batch ring the daemon with ``daemon_pid`` keeps for one trainer."""
    return f"{PREFIX}-ring-{daemon_pid}-{trainer_id}"


def shm_path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def list_segments() -> list[str]:
    """Names of every segment in /dev/shm that carries the project's prefix."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(PREFIX))
