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

Which name a snapshot takes (``choose_base``): its names are derived from the fingerprint,
which anyone who can read the dataset can compute, and /dev/shm is sticky, so a file another
user plants under one of them can be removed by nobody but that user or root. Such a name is
left alone and the next of ``fingerprint.candidate_bases`` is taken; the header's full
fingerprint, not the name, says which of them holds this dataset's snapshot, so a re-attach
finds it under whichever name it took.
"""

from __future__ import annotations

import logging
import os

from ...shared.errors import SnapshotError, UntrustedSegmentError
from ...shared.transport.holds import holds_of, remove_unused
from ...shared.transport.names import expected_owner, snapshot_parts
from ...shared.transport.publish import sweep_debris
from ...shared.transport.store import DEFAULT, Store
from ...shared.transport.trusted import check_trusted, describe_owner
from .fingerprint import candidate_bases
from .handle import Snapshot, check_header, label_indexes, list_snapshots, read_header, unit_names

log = logging.getLogger(__name__)


class BeingPrepared(SnapshotError):
    """Another live process is preparing this very snapshot (``prepare_snapshot`` waits)."""


def choose_base(fp: str, *, store: Store = DEFAULT, reported: set | None = None) -> str:
    """The base name the snapshot of fingerprint ``fp`` takes in ``store`` (module docstring):
    of the names no other user's file sits under, the first that holds this user's complete
    snapshot of ``fp``, else the first whose header names ``fp`` (one being prepared, or a killed
    preparation's), else the first with no header of another fingerprint. Every planted file
    passed over is logged, naming it and its owner, once per ``reported`` (a set the caller keeps
    while it asks again, waiting for another preparation); UntrustedSegmentError where every name
    is taken."""
    planted: dict[str, int] = {}  # path -> owner uid
    ranked: list[tuple[int, int, str]] = []  # (rank, position, base): complete of fp 0, of fp 1, free 2
    for position, base in enumerate(candidate_bases(fp)):
        names = snapshot_parts(base)
        foreign = _foreign(names.values(), store)
        if foreign:
            planted.update(foreign)
            continue
        try:
            header = read_header(names["meta"], store)
        except SnapshotError:  # none (yet), or unreadable: ``existing_snapshot`` says what it is
            header = None
        if header is None or not header.fingerprint:
            ranked.append((2, position, base))
        elif header.fingerprint == fp:
            ranked.append((0 if header.is_complete else 1, position, base))
        # else: this user's snapshot of another fingerprint with the same leading digits; not ours to take
    for path, uid in planted.items():
        if reported is not None:
            if (path, uid) in reported:
                continue
            reported.add((path, uid))
        log.warning(
            "%s belongs to %s, not to you: another user created it under a name of your snapshot; "
            "left alone, the snapshot takes another name (ask that user or root to remove it)",
            path,
            describe_owner(uid),
        )
    if not ranked:
        raise UntrustedSegmentError(
            f"every name the snapshot of fingerprint {fp} may take in {store} is taken by another user's "
            f"file: {', '.join(f'{p} ({describe_owner(u)})' for p, u in planted.items())}; ask that user (or root) to "
            "remove them, or use a store only you can write (--store DIR)",
            path=next(iter(planted), None),
        )
    return min(ranked)[2]


def _foreign(names, store: Store) -> dict[str, int]:
    """path -> owner, for each of ``names`` present in ``store`` under another user's ownership
    (never followed: a planted link is its planter's)."""
    out = {}
    for name in names:
        path = store.path(name)
        try:
            uid = os.lstat(path).st_uid
        except FileNotFoundError:
            continue
        if uid != expected_owner(name):
            out[path] = uid
    return out


def existing_snapshot(base: str, names: dict[str, str], *, store: Store = DEFAULT) -> Snapshot | None:
    """Attach a complete snapshot of this name; remove a stale incomplete one; raise if in progress."""
    sweep_debris(store)
    present = [n for n in names.values() if os.path.lexists(store.path(n))]
    if not present:
        return None
    for n in present:
        # A file under this user's name that another user made (or made writable to
        # others) is neither attached nor removed: UntrustedSegmentError says whose it is.
        check_trusted(n, os.lstat(store.path(n)), store=store)
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


def _holders(names: list[str], store: Store) -> str:
    """The pids this PID namespace sees mapping ``names``, for the message only (the holds
    decide); holders in another PID namespace are not visible here."""
    from ...shared.transport.procmem import segment_users

    users = segment_users(store)
    pids = sorted({p for n in names for p in users.get(n, ())})
    return str(pids) if pids else "in another PID namespace or container"


def remove_superseded(lineage: str, *, keep: str, store: Store = DEFAULT) -> list[str]:
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
