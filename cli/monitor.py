"""``pixpool monitor``: the memory footprint and the streams, live.

Runs in the user's shell process. Once a second it asks the daemon for its status,
measures memory (``ops/memory_report.py``) and redraws one full-screen frame (rich, 80 columns:
``ops/view.py``). ``--once`` prints a single frame (scripts, tests); ``--json`` prints
status and figures as one JSON line per sample instead; ``--record FILE`` appends each
sample as a JSON line to FILE (``pixpool plot FILE`` draws it).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from .status import add_daemon_flags

if TYPE_CHECKING:
    from ..shared.wire.status import Status


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    add_daemon_flags(parser)
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--interval-s", type=float, default=1.0, help="refresh interval (default 1)")
    parser.add_argument(
        "--record", metavar="FILE", default=None, help="append one JSON line per sample to FILE (for `pixpool plot`)"
    )
    parser.add_argument(
        "--samples", type=int, default=None, help="stop after this many samples (default: until Ctrl-C)"
    )


def sample(args: argparse.Namespace) -> tuple[Status, dict]:
    """The daemon's status and the sample as ``--json`` and ``--record`` write it (the reply, the figures)."""
    from ..ops.memory_report import memory_report
    from ..ops.status_client import query_status
    from ..shared.wire.status import as_reply
    from ..shared.wire.trainer import Op

    st = query_status(args.socket_dir, timeout_s=args.timeout_s)
    return st, {"time_unix": time.time(), **as_reply(Op.STATUS, st), "memory": memory_report(st)}


def _record(path: str | None, s: dict) -> None:
    if path is not None:
        with open(path, "a") as f:
            f.write(json.dumps(s) + "\n")


def _samples(args: argparse.Namespace, limit: int | None):
    n = 0
    while limit is None or n < limit:
        if n:
            time.sleep(args.interval_s)  # refresh period of a periodic display
        yield sample(args)
        n += 1


def run(args: argparse.Namespace) -> int:
    from rich.live import Live

    from ..ops.view import frame, report_console
    from .status import await_starting_daemon

    await_starting_daemon(args.socket_dir)
    console = report_console()
    limit = 1 if args.once else args.samples
    if args.once or args.json or not console.is_terminal:
        for st, s in _samples(args, limit):
            _record(args.record, s)
            if args.json:
                print(json.dumps(s), flush=True)
            else:
                console.print(frame(st, s["memory"]))
        return 0
    with Live(console=console, screen=True, auto_refresh=False) as view:
        for st, s in _samples(args, limit):
            _record(args.record, s)
            view.update(frame(st, s["memory"]), refresh=True)
    return 0
