"""``pixpool ls`` and ``pixpool clean``: list and remove the caller's pixpool segments in a store.

Both take ``--store DIR`` (default /dev/shm): the directory whose segments they look at.

Runs in the user's shell process. /dev/shm is shared by every user of the machine: both
commands look only at segments whose file belongs to the caller (the uid in the name and
the file's owner; root included) and say how many of other users' they skipped; nothing
here ever unlinks another user's file.

"In use" and "alive" are decided from the store itself (``shared.transport.holds``): every process
that maps a segment holds a lock on its file, seen from any PID namespace or container
that shares the store; a ring's daemon holds its ``CREATOR`` lock and its trainer its
``CONSUMER`` lock. The pid in a ring's name decides nothing (a daemon in a container is PID
1 after every restart). Pids are shown where this PID namespace sees the holders
(``procmem.segment_users``, a description only).

``ls`` lists the caller's snapshots and rings: a ring with its daemon (alive or dead, by its
lock) and its trainer (attached or not), and the temporary files killed writers left
(``shared.transport.publish``). It also names every file it ignored under the caller's names:
another user's file, a FIFO, a directory or a link planted there, a file under a label
index's name that is no index of that snapshot (``snapshot/unit.py``). Nothing in the store
is opened before its type and owner are known (``lstat``, then ``trusted.open_trusted``). ``clean`` is how what a killed process left
behind goes away. It removes, as whole units (a snapshot's three parts together),
snapshots and rings nobody holds, each under a write lock that no holder lets it take
(``holds.remove_unused``); it never removes a segment that a live process maps or holds
open, whatever the flags, and it says who holds each one it keeps. ``--keep-complete``
also keeps complete snapshots (what a restarted daemon re-attaches); ``--all`` also takes
the caller's files under names this release does not recognise (older releases' names).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..shared.transport.store import Store


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    from ..shared.stream.config import DaemonConfig
    from ..shared.stream.flags import add_fields

    add_fields(parser, DaemonConfig, only=("store",))
    if name == "ls":
        parser.add_argument("--json", action="store_true", help="print a JSON list instead of the table")
    else:
        parser.add_argument(
            "names",
            nargs="*",
            metavar="NAME",
            help="only these snapshots/segments (base name pixpool-u<uid>-snap-<fp>, or a segment name)",
        )
        parser.add_argument(
            "--all",
            action="store_true",
            help="also remove your pixpool files whose names this release does not recognise (never one a live process uses)",
        )
        parser.add_argument(
            "--keep-complete",
            action="store_true",
            help="keep complete snapshots (a restarted daemon re-attaches them); remove only stale rings and half-built snapshots",
        )
        parser.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")


def run(args: argparse.Namespace) -> int:
    from ..shared.transport.store import Store

    args.store = Store.of(args.store).checked()
    return _ls(args) if args.command == "ls" else _clean(args)


def split_by_owner(segments: list[str], owners: dict[str, int | None], uid: int) -> tuple[list[str], dict[int, int]]:
    """(the caller's segments, {other uid: count}) (pure). A segment is the caller's when
    its file belongs to ``uid``; one gone meanwhile (owner None) is dropped."""
    mine, others = [], {}
    for seg in segments:
        owner = owners.get(seg)
        if owner is None:
            continue
        if owner == uid:
            mine.append(seg)
        else:
            others[owner] = others.get(owner, 0) + 1
    return mine, others


def others_note(others: dict[int, int]) -> str | None:
    if not others:
        return None
    who = ", ".join(f"uid {uid}: {n}" for uid, n in sorted(others.items()))
    return f"skipped {sum(others.values())} segment(s) of other users ({who}); only their owners (or root, as that user) remove them"


def plan_clean(
    segments: list[str],
    holds: dict,
    *,
    unrecognised: bool = False,
    pids: dict[str, set[int]] | None = None,
    units: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(segments ``clean`` removes, {kept segment: why}) (pure: decisions only).

    ``units``: segment -> the unit it goes with, where that is not its name's group
    (``names.group_of``): a file under a label index's name that is no index of that snapshot
    (``snapshot/unit.py``) is a unit of its own.

    ``holds``: segment -> ``shared.transport.holds.Holds`` (None or absent: gone); ``pids``: segment ->
    pids this namespace sees mapping it, for the reasons only. A snapshot goes as a whole
    when none of its parts is held; a ring when nobody holds it (a live daemon holds every
    ring it serves). A name this release does not parse goes only with ``unrecognised`` and
    when nobody holds it. Nothing held ever goes; the removal itself decides once more.
    """
    from ..shared.transport.names import group_of, parse

    pids, units = pids or {}, units or {}
    groups: dict[str, list[str]] = {}
    for seg in segments:
        groups.setdefault(units.get(seg) or group_of(seg), []).append(seg)
    remove, kept = [], {}
    for _key, segs in groups.items():
        held = [holds[s] for s in segs if holds.get(s) is not None and holds[s].in_use]
        parsed = parse(segs[0])
        if held:
            why = _holders(parsed, held, sorted({p for s in segs for p in pids.get(s, ())}))
        elif parsed is None and not unrecognised:
            why = "name not recognised by this pixpool (--all removes it)"
        else:
            remove.extend(segs)
            continue
        for s in segs:
            kept[s] = why
    return sorted(remove), kept


def _holders(parsed, held: list, pids: list[int]) -> str:
    """Why a held group stays, in words: who holds it (by its locks), and the pids this PID
    namespace sees (none where the holders live in another one)."""
    seen = ", ".join(_describe(p) for p in pids) if pids else "a process in another PID namespace or container"
    if parsed is not None and parsed.kind == "ring":
        daemon = "its daemon is alive" if any(h.creator for h in held) else "its daemon is gone"
        trainer = "its trainer maps it" if any(h.consumer for h in held) else "no trainer maps it"
        return f"in use by {seen} ({daemon}, {trainer})"
    return f"in use by {seen}"


def _describe(pid: int) -> str:
    import psutil

    try:
        return f"pid {pid} ({' '.join(psutil.Process(pid).cmdline()[:3]) or psutil.Process(pid).name()})"
    except psutil.Error:
        return f"pid {pid}"


def _holds(segments: list[str], store: Store) -> dict:
    from ..shared.transport.holds import holds_of

    return {s: holds_of(s, store) for s in segments}


def _own_segments(store: Store) -> tuple[list[str], dict[int, int]]:
    """(the caller's segment files, {other uid: count}): by ``lstat``, so nothing is opened or
    followed; what is no regular file is nobody's segment and is left out (``ignored``)."""
    import stat

    segments = store.segments()
    owners = {}
    for seg in segments:
        try:
            st = os.lstat(store.path(seg))
        except FileNotFoundError:
            continue
        owners[seg] = st.st_uid if stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() else None
    return split_by_owner(segments, owners, os.geteuid())


def ignored(store: Store) -> dict[str, str]:
    """name -> why, for every file under the caller's names that is no segment of the caller's:
    another user's file, a FIFO, a directory or a link planted there, and a file under a label
    index's name that is no index of that snapshot (``snapshot/unit.py``). Nothing is opened
    but the caller's own regular files."""
    from ..server.snapshot import unit
    from ..shared.errors import UntrustedSegmentError
    from ..shared.transport.names import parse, user_prefix
    from ..shared.transport.trusted import check_trusted

    me, mine = os.geteuid(), user_prefix()
    out, bases = {}, set()
    for seg in store.segments():
        parsed = parse(seg)
        if not seg.startswith(mine) or (parsed is not None and parsed.uid != os.geteuid()):
            continue  # another user's name: counted by others_note, theirs to look after
        try:
            check_trusted(seg, os.lstat(store.path(seg)), store=store, any_mode=True)
        except FileNotFoundError:
            continue
        except UntrustedSegmentError as exc:
            out[seg] = str(exc)
            continue
        if parsed is not None and parsed.kind == "snapshot" and parsed.uid == me:
            bases.add(parsed.group)
    for base in bases:
        for seg, why in unit.strays(base, store).items():
            out.setdefault(seg, why)
    return out


def _ls(args: argparse.Namespace) -> int:
    import sys

    from ..server.snapshot import layout
    from ..server.snapshot.handle import list_snapshots
    from ..shared.transport.names import snapshot_parts
    from ..shared.transport.procmem import segment_users

    mine, others = _own_segments(args.store)
    holds = _holds(mine, args.store)
    users = segment_users(args.store)  # pids for people to read; the locks decide
    rows = []
    for info in list_snapshots(store=args.store):
        parts = list(snapshot_parts(info.name).values())
        h = info.header
        dtype = layout.DTYPE_CODES[h.dtype_code].name if h is not None and h.dtype_code in layout.DTYPE_CODES else None
        task = layout.TASK_CODES.get(h.task_code) if h is not None else None
        rows.append({
            "kind": "snapshot", "name": info.name, "records": h.records if h else None,
            "imgsz": h.imgsz if h else None, "dtype": dtype, "task": task,
            "image_nbytes": info.parts.get("img"), "nbytes": info.nbytes, "complete": info.complete,
            "in_use": any(holds.get(seg) is not None and holds[seg].in_use for seg in parts),
            "in_use_by": sorted({p for seg in parts for p in users.get(seg, ())}),
            "creator_pid": h.creator_pid if h else None,
        })  # fmt: skip
    rows += ring_rows(mine, holds, users, args.store)
    rows += debris_rows(mine, holds, args.store)
    strange = ignored(args.store)
    rows += [{"kind": "ignored", "name": name, "why": why} for name, why in sorted(strange.items())]
    for name, why in sorted(strange.items()):
        print(f"ignored {name}: {why}", file=sys.stderr)
    note = others_note(others)
    if note:
        print(note, file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
        return 0
    if not [r for r in rows if r["kind"] != "ignored"]:
        print(f"no pixpool snapshots or rings of yours in {args.store}")
        return 0
    _print_tables(rows)
    return 0


def ring_rows(segments: list[str], holds: dict, users: dict[str, set[int]], store: Store) -> list[dict]:
    """``ls`` rows of the rings among ``segments``: the daemon alive or dead and the trainer
    attached or not, by their locks (``holds``); pids as this namespace sees them."""
    from ..shared.transport.names import parse

    rows = []
    for seg in segments:
        parsed, held = parse(seg), holds.get(seg)
        if parsed is None or parsed.kind != "ring" or held is None:
            continue
        try:
            nbytes = os.stat(store.path(seg)).st_size
        except FileNotFoundError:
            continue
        rows.append({"kind": "ring", "name": seg, "nbytes": nbytes, "daemon": "alive" if held.creator else "dead",
                     "trainer": "attached" if held.consumer else "none", "in_use": held.in_use,
                     "in_use_by": sorted(users.get(seg, ())), "daemon_pid": parsed.daemon_pid})  # fmt: skip
    return rows


def debris_rows(segments: list[str], holds: dict, store: Store) -> list[dict]:
    """``ls`` rows of the temporary files among ``segments`` (``shared.transport.publish``): one
    nobody holds is a killed writer's, and ``clean`` removes it."""
    from ..shared.transport.names import parse

    rows = []
    for seg in segments:
        parsed, held = parse(seg), holds.get(seg)
        if parsed is None or parsed.kind != "debris":
            continue
        try:
            nbytes = os.lstat(store.path(seg)).st_size
        except FileNotFoundError:
            continue
        in_use = held is not None and held.in_use
        rows.append({"kind": "debris", "name": seg, "nbytes": nbytes, "in_use": in_use,
                     "state": "being written" if in_use else "left by a killed writer (pixpool clean removes it)"})  # fmt: skip
    return rows


def _print_tables(rows: list[dict]) -> None:
    from ..shared.text import format_table, human_bytes

    snaps = [r for r in rows if r["kind"] == "snapshot"]
    rings = [r for r in rows if r["kind"] == "ring"]
    debris = [r for r in rows if r["kind"] == "debris"]
    if snaps:
        table = [[r["name"], r["records"] if r["records"] is not None else "?", r["imgsz"] or "?", r["dtype"] or "?",
                  human_bytes(r["nbytes"]),
                  "yes" if r["complete"] else "NO", _in_use_text(r)] for r in snaps]  # fmt: skip
        print(format_table(table, ["snapshot", "records", "imgsz", "dtype", "size", "complete", "in use by"]))
    if rings:
        if snaps:
            print()
        table = [[r["name"], human_bytes(r["nbytes"]), r["daemon"], r["trainer"], _in_use_text(r)] for r in rings]
        print(format_table(table, ["ring", "size", "daemon", "trainer", "in use by"]))
    if debris:
        if snaps or rings:
            print()
        table = [[r["name"], human_bytes(r["nbytes"]), r["state"]] for r in debris]
        print(format_table(table, ["temporary file", "size", "state"]))


def _in_use_text(row: dict) -> str:
    if row["in_use_by"]:
        return ",".join(map(str, row["in_use_by"]))
    return "another PID namespace" if row["in_use"] else "-"


def _stray_units(segments: list[str], store: Store) -> dict[str, str]:
    """segment -> itself, for the caller's files under a label index's name that are no index of
    that snapshot (``snapshot/unit.py``): each goes, or stays, on its own, never with the snapshot."""
    from ..server.snapshot import unit
    from ..shared.transport.names import parse

    bases = {p.group for p in map(parse, segments) if p is not None and p.kind == "snapshot"}
    wanted = set(segments)
    return {seg: seg for base in bases for seg in unit.strays(base, store) if seg in wanted}


def _clean(args: argparse.Namespace) -> int:
    from ..shared.transport.holds import remove_unused
    from ..shared.transport.names import group_of
    from ..shared.transport.procmem import segment_users

    segments, others = _own_segments(args.store)
    if args.names:
        wanted = set(args.names)
        segments = [s for s in segments if s in wanted or group_of(s) in wanted]
    holds = _holds(segments, args.store)
    units = _stray_units(segments, args.store)
    targets, kept = plan_clean(segments, holds, unrecognised=args.all, pids=segment_users(args.store), units=units)
    if args.keep_complete:
        from ..server.snapshot.handle import list_snapshots

        complete = {info.name for info in list_snapshots(store=args.store) if info.complete}
        for t in [t for t in targets if group_of(t) in complete]:
            targets.remove(t)
            kept[t] = "complete snapshot (--keep-complete)"
    verb = "would remove" if args.dry_run else "removed"
    groups: dict[str, list[str]] = {}
    for seg in targets:
        groups.setdefault(units.get(seg) or group_of(seg), []).append(seg)
    for segs in groups.values():
        # The removal decides again, under write locks (``holds.remove_unused``): a process
        # that attached since the plan keeps the whole group.
        outcome = "removed" if args.dry_run else remove_unused(segs, args.store)
        if outcome == "removed":
            for seg in segs:
                print(f"{verb} {seg}")
        elif outcome == "in use":
            for seg in segs:
                kept[seg] = "in use (a process attached it meanwhile)"
    by_reason: dict[str, list[str]] = {}
    for seg, why in kept.items():
        by_reason.setdefault(why, []).append(seg)
    for why, segs in sorted(by_reason.items()):
        print(f"kept {', '.join(sorted(segs))}: {why}")
    note = others_note(others)
    if note:
        print(note)
    if not targets and not kept:
        print("nothing to clean")
    return 0
