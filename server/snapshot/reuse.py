"""Re-using what the store (/dev/shm, or ``--store DIR``) already holds: attach a complete snapshot, wait for one another
process is preparing, remove a stale half-built one or one a newer snapshot supersedes.

Runs in the preparing process (``pixpool prepare``, the daemon at start-up), before and
after a preparation (``prepare.py``). It removes only this user's segments that no live
process maps, and never a file it cannot trust (``shared.shm``: another user's, one
others may write).
"""

from __future__ import annotations

import logging
import os

from ...shared.errors import SnapshotError, UntrustedSegmentError
from ...shared.names import shm_path
from ...shared.procmem import segment_users
from ...shared.shm import check_trusted, unlink_segment
from .handle import Snapshot, check_header, list_snapshots, read_header

log = logging.getLogger(__name__)


class BeingPrepared(SnapshotError):
    """Another live process is preparing this very snapshot (``prepare_snapshot`` waits)."""


def existing_snapshot(base: str, names: dict[str, str], *, store: str | None = None) -> Snapshot | None:
    """Attach a complete snapshot of this name; remove a stale incomplete one; raise if in progress."""
    present = [n for n in names.values() if os.path.lexists(shm_path(n, store))]
    if not present:
        return None
    for n in present:
        # A file under this user's name that another user made (or made writable to
        # others) is neither attached nor removed: UntrustedSegmentError says whose it is.
        check_trusted(n, os.lstat(shm_path(n, store)), store=store)
    header = None
    if names["meta"] in present:
        try:
            header = read_header(names["meta"], store)
        except UntrustedSegmentError:
            raise
        except SnapshotError:
            header = None
    if header is not None and header.is_complete and len(present) == 3:
        check_header(base, header)
        return Snapshot.attach(base, store=store)
    users = segment_users(store)
    pids = sorted({p for n in present for p in users.get(n, ())} - {os.getpid()})
    if pids:
        creator = f" (creator pid {header.creator_pid})" if header is not None else ""
        raise BeingPrepared(f"snapshot {base!r} is being prepared by live process(es) {pids}{creator}")
    log.warning("removing stale incomplete snapshot %s (segments %s)", base, present)
    for n in present:
        unlink_segment(n, store)
    return None


def remove_superseded(lineage: str, *, keep: str, store: str | None = None) -> list[str]:
    """Remove this user's complete snapshots of ``lineage`` other than ``keep`` that no
    process maps: a newer one of the same dataset replaced them. Returns their names."""
    users = segment_users(store)
    removed = []
    for info in list_snapshots(store=store):
        if info.name == keep or not info.complete or info.header.lineage != lineage:
            continue
        if any(users.get(seg) for seg in Snapshot(info.name, _lazy=True).segment_names):
            continue
        for seg in Snapshot(info.name, _lazy=True).segment_names:
            unlink_segment(seg, store)
        log.info("removed snapshot %s: superseded by %s (same dataset and imgsz, changed inputs)", info.name, keep)
        removed.append(info.name)
    return removed
