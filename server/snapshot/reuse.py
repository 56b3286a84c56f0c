"""Re-using what the store (/dev/shm, or ``--store DIR``) already holds: attach a complete snapshot, wait for one another
process is preparing, remove a stale half-built one or one a newer snapshot supersedes.

Runs in the preparing process (``pixpool prepare``, the daemon at start-up), before and
after a preparation (``prepare.py``). It removes only this user's segments that no live
process maps, in any PID namespace (``shared.transport.holds``: a preparation in progress holds its
segments, and so does every process that serves a snapshot), and never a file it cannot
trust (``shared.transport.shm``: another user's, one others may write). What belongs to a
snapshot is decided by owner and content (``unit.py``), so another user's file under one of
its names never keeps it nor goes with it. Temporary files that killed writers left
(``shared.transport.publish``) are swept here too, at every prepare and re-attach.
"""

from __future__ import annotations

import logging
import os

from ...shared.errors import SnapshotError, UntrustedSegmentError
from ...shared.transport.holds import holds_of, remove_unused
from ...shared.transport.names import shm_path
from ...shared.transport.publish import sweep_debris
from ...shared.transport.trusted import check_trusted
from .handle import Snapshot, check_header, label_indexes, list_snapshots, read_header, unit_names

log = logging.getLogger(__name__)


class BeingPrepared(SnapshotError):
    """Another live process is preparing this very snapshot (``prepare_snapshot`` waits)."""


def existing_snapshot(base: str, names: dict[str, str], *, store: str | None = None) -> Snapshot | None:
    """Attach a complete snapshot of this name; remove a stale incomplete one; raise if in progress."""
    sweep_debris(store)
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
    # Held: a live process (in any PID namespace) prepares it; unheld: its preparation was
    # killed. The removal decides again, atomically, in case a preparation just began.
    held = any((h := holds_of(n, store)) is not None and h.in_use for n in present)
    if held or remove_unused([*present, *label_indexes(base, store)], store) == "in use":
        raise BeingPrepared(
            f"snapshot {base!r} is being prepared by live process(es) {_holders(present, store)}"
            f"{f' (creator pid {header.creator_pid})' if header is not None else ''}: "
            "they hold its segments"
        )
    log.warning(
        "removed stale incomplete snapshot %s (segments %s): nobody holds it, its preparation was killed", base, present
    )
    return None


def _holders(names: list[str], store: str | None) -> str:
    """The pids this PID namespace sees mapping ``names``, for the message only (the holds
    decide); holders in another PID namespace are not visible here."""
    from ...shared.transport.procmem import segment_users

    users = segment_users(store)
    pids = sorted({p for n in names for p in users.get(n, ())})
    return str(pids) if pids else "in another PID namespace or container"


def remove_superseded(lineage: str, *, keep: str, store: str | None = None) -> list[str]:
    """Remove this user's complete snapshots of ``lineage`` other than ``keep`` that no
    process maps: a newer one of the same dataset replaced them. Returns their names."""
    removed = []
    for info in list_snapshots(store=store):
        if info.name == keep or not info.complete or info.header.lineage != lineage:
            continue
        # Held by a process anywhere (a daemon in another container serving it): it stays.
        if remove_unused(unit_names(info.name, store), store) != "removed":
            continue
        log.info("removed snapshot %s: superseded by %s (same dataset and imgsz, changed inputs)", info.name, keep)
        removed.append(info.name)
    return removed
