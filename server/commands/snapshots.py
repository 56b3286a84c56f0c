"""``pixpool ls`` and ``pixpool clean``: list and remove the caller's pixpool segments in a store.

Both take ``--store DIR`` (default /dev/shm): the directory whose segments they look at.

Runs in the user's shell process. /dev/shm is shared by every user of the machine: both
commands look only at segments whose file belongs to the caller (the uid in the name and
the file's owner; root included) and say how many of other users' they skipped; nothing
here ever unlinks another user's file.

``clean`` is how what a killed process left behind goes away. It removes, as whole units
(a snapshot's three parts together), snapshots and rings nobody uses; it never removes a
segment that a live process maps or holds open, nor a ring whose daemon is alive, whatever
the flags, and it names the process that holds each one it keeps. ``--keep-complete``
also keeps complete snapshots (what a restarted daemon re-attaches); ``--all`` also takes
the caller's files under names this release does not recognise (older releases' names).
"""

from __future__ import annotations

import argparse
import json
import os


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    from ...shared.config import DaemonConfig
    from ...shared.flags import add_fields

    add_fields(parser, DaemonConfig, only=("store",))
    if name == "ls":
        parser.add_argument("--json", action="store_true", help="print a JSON list instead of the table")
    else:
        parser.add_argument("names", nargs="*", metavar="NAME", help="only these snapshots/segments (base name pixpool-u<uid>-snap-<fp>, or a segment name)")
        parser.add_argument("--all", action="store_true",
                            help="also remove your pixpool files whose names this release does not recognise (never one a live process uses)")
        parser.add_argument("--keep-complete", action="store_true",
                            help="keep complete snapshots (a restarted daemon re-attaches them); remove only stale rings and half-built snapshots")
        parser.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")


def run(args: argparse.Namespace) -> int:
    from ...shared.store import check_store

    args.store = check_store(args.store)
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


def plan_clean(segments: list[str], users: dict[str, set[int]], *, unrecognised: bool = False, alive=None) -> tuple[list[str], dict[str, str]]:
    """(segments ``clean`` removes, {kept segment: why}) (pure: decisions only).

    A snapshot goes as a whole when none of its parts is used; a ring when its daemon is
    dead and nobody maps it. A name this release does not parse goes only with
    ``unrecognised`` and when nobody maps it. Nothing in use ever goes.
    """
    from ...shared.names import group_of, parse

    if alive is None:
        from ...shared.procmem import alive
    groups: dict[str, list[str]] = {}
    for seg in segments:
        groups.setdefault(group_of(seg), []).append(seg)
    remove, kept = [], {}
    for key, segs in groups.items():
        holders = sorted({p for s in segs for p in users.get(s, ())})
        parsed = parse(segs[0])
        if holders:
            why = "in use by " + ", ".join(_describe(p) for p in holders)
        elif parsed is not None and parsed.kind == "ring" and alive(parsed.daemon_pid):
            why = f"ring of live daemon {_describe(parsed.daemon_pid)}"
        elif parsed is None and not unrecognised:
            why = "name not recognised by this pixpool (--all removes it)"
        else:
            remove.extend(segs)
            continue
        for s in segs:
            kept[s] = why
    return sorted(remove), kept


def _describe(pid: int) -> str:
    import psutil

    try:
        return f"pid {pid} ({' '.join(psutil.Process(pid).cmdline()[:3]) or psutil.Process(pid).name()})"
    except psutil.Error:
        return f"pid {pid}"


def _own_segments(store: str) -> tuple[list[str], dict[int, int]]:
    from ...shared.names import list_segments
    from ...shared.shm import owner_of

    segments = list_segments(store)
    return split_by_owner(segments, {s: owner_of(s, store) for s in segments}, os.geteuid())


def _ls(args: argparse.Namespace) -> int:
    import sys

    from ...shared.names import snapshot_parts
    from ...shared.procmem import segment_users
    from ...shared.text import format_table, human_bytes
    from ..snapshot import layout
    from ..snapshot.handle import list_snapshots

    _, others = _own_segments(args.store)
    users = segment_users(args.store)
    rows = []
    for info in list_snapshots(store=args.store):
        pids = sorted({p for seg in snapshot_parts(info.name).values() for p in users.get(seg, ())})
        h = info.header
        dtype = layout.DTYPE_CODES[h.dtype_code].name if h is not None and h.dtype_code in layout.DTYPE_CODES else None
        rows.append({
            "name": info.name, "records": h.records if h else None, "imgsz": h.imgsz if h else None, "dtype": dtype,
            "image_nbytes": info.parts.get("img"), "nbytes": info.nbytes, "complete": info.complete, "in_use_by": pids, "creator_pid": h.creator_pid if h else None,
        })  # fmt: skip
    note = others_note(others)
    if note:
        print(note, file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print(f"no pixpool snapshots of yours in {args.store}")
        return 0
    table = [[r["name"], r["records"] if r["records"] is not None else "?", r["imgsz"] or "?", r["dtype"] or "?", human_bytes(r["nbytes"]),
              "yes" if r["complete"] else "NO", ",".join(map(str, r["in_use_by"])) or "-"] for r in rows]  # fmt: skip
    print(format_table(table, ["snapshot", "records", "imgsz", "dtype", "size", "complete", "in use by"]))
    return 0


def _clean(args: argparse.Namespace) -> int:
    from ...shared.names import group_of
    from ...shared.procmem import segment_users
    from ...shared.shm import unlink_segment

    segments, others = _own_segments(args.store)
    if args.names:
        wanted = set(args.names)
        segments = [s for s in segments if s in wanted or group_of(s) in wanted]
    targets, kept = plan_clean(segments, segment_users(args.store), unrecognised=args.all)
    if args.keep_complete:
        from ..snapshot.handle import list_snapshots

        complete = {info.name for info in list_snapshots(store=args.store) if info.complete}
        for t in [t for t in targets if group_of(t) in complete]:
            targets.remove(t)
            kept[t] = "complete snapshot (--keep-complete)"
    verb = "would remove" if args.dry_run else "removed"
    for seg in targets:
        if args.dry_run or unlink_segment(seg, args.store):
            print(f"{verb} {seg}")
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
