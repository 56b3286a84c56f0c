"""``pixpool ls`` and ``pixpool clean``: list and remove pixpool segments in /dev/shm.

Runs in the user's shell process. ``clean`` is how what a killed process left behind goes
away: it removes snapshots that no live process maps or holds open, and batch rings whose
daemon pid is dead (and that nobody maps); ``--all`` removes every pixpool segment, in
use or not (processes mapping one keep their mapping until they exit).
"""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    if name == "ls":
        parser.add_argument("--json", action="store_true", help="print a JSON list instead of the table")
    else:
        parser.add_argument("names", nargs="*", metavar="NAME", help="only these snapshots/segments (base name pixpool-snap-<fp>, or a segment name)")
        parser.add_argument("--all", action="store_true", help="also remove segments that live processes map")
        parser.add_argument("--keep-complete", action="store_true",
                            help="keep complete snapshots (a restarted daemon re-attaches them); remove only stale rings and half-built snapshots")
        parser.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")


def run(args: argparse.Namespace) -> int:
    return _ls(args) if args.command == "ls" else _clean(args)


def _ls(args: argparse.Namespace) -> int:
    from ...shared.names import snapshot_parts
    from ...shared.procmem import segment_users
    from ...shared.text import format_table, human_bytes
    from ..snapshot.handle import list_snapshots

    users = segment_users()
    rows = []
    for info in list_snapshots():
        pids = sorted({p for seg in snapshot_parts(info.name).values() for p in users.get(seg, ())})
        h = info.header
        rows.append({
            "name": info.name, "records": h.records if h else None, "imgsz": h.imgsz if h else None,
            "nbytes": info.nbytes, "complete": info.complete, "in_use_by": pids, "creator_pid": h.creator_pid if h else None,
        })  # fmt: skip
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no pixpool snapshots in /dev/shm")
        return 0
    table = [[r["name"], r["records"] if r["records"] is not None else "?", r["imgsz"] or "?", human_bytes(r["nbytes"]),
              "yes" if r["complete"] else "NO", ",".join(map(str, r["in_use_by"])) or "-"] for r in rows]  # fmt: skip
    print(format_table(table, ["snapshot", "records", "imgsz", "size", "complete", "in use by"]))
    return 0


def removable(segments: list[str], users: dict[str, set[int]], *, everything: bool = False) -> list[str]:
    """Which of ``segments`` ``clean`` removes (pure: decisions only).

    A snapshot goes as a whole (all its parts) when none of its parts is used; a ring
    ``pixpool-ring-<pid>-<id>`` when its pid is dead and nobody maps it; any other
    pixpool segment when nobody maps it. ``everything`` removes all.
    """
    from ...shared.names import group_of, parse
    from ...shared.procmem import alive

    if everything:
        return list(segments)
    groups: dict[str, list[str]] = {}
    for seg in segments:
        groups.setdefault(group_of(seg), []).append(seg)
    out = []
    for key, segs in groups.items():
        if any(users.get(s) for s in segs):
            continue
        parsed = parse(key)
        if parsed is not None and parsed.kind == "ring" and alive(parsed.daemon_pid):
            continue
        out.extend(segs)
    return sorted(out)


def _clean(args: argparse.Namespace) -> int:
    from ...shared.names import group_of, list_segments
    from ...shared.procmem import segment_users
    from ...shared.shm import unlink_segment

    segments = list_segments()
    if args.names:
        wanted = set(args.names)
        segments = [s for s in segments if s in wanted or group_of(s) in wanted]
    targets = removable(segments, segment_users(), everything=args.all)
    if args.keep_complete:
        from ..snapshot.handle import list_snapshots

        complete = {info.name for info in list_snapshots() if info.complete}
        targets = [t for t in targets if group_of(t) not in complete]
    kept = sorted(set(segments) - set(targets))
    verb = "would remove" if args.dry_run else "removed"
    for seg in targets:
        if args.dry_run or unlink_segment(seg):
            print(f"{verb} {seg}")
    if kept:
        why = "in use or complete" if args.keep_complete else "in use"
        print(f"kept {len(kept)} segment(s) {why}: {', '.join(kept)} (--all removes them too)")
    if not targets and not kept:
        print("nothing to clean")
    return 0
