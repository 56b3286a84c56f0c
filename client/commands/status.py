"""``pixpool status`` and ``pixpool monitor``: what the running daemon serves, and its memory.

Runs in the user's shell process, as a client of the daemon's control socket. Prints
tables, or the JSON reply with ``--json``. ``monitor`` repeats that every second and adds
the measured memory (``client/status.py``); ``--once`` prints one frame (tests, scripts).
"""

from __future__ import annotations

import argparse
import json
import time

from ..status import format_memory, format_status, memory, query_status


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--socket-dir", metavar="DIR", default=None, help="the daemon's socket directory")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="how long to wait for the daemon (default 3)")
    parser.add_argument("--json", action="store_true", help="print the raw status as JSON")
    if name == "monitor":
        parser.add_argument("--once", action="store_true", help="print one frame and exit")
        parser.add_argument("--interval-s", type=float, default=1.0, help="refresh interval (default 1)")


def run(args: argparse.Namespace) -> int:
    if args.command == "status":
        st = query_status(args.socket_dir, timeout_s=args.timeout_s)
        print(json.dumps(st, indent=2) if args.json else format_status(st))
        return 0
    while True:
        st = query_status(args.socket_dir, timeout_s=args.timeout_s)
        mem = memory(st)
        if args.json:
            print(json.dumps({**st, "memory": mem}), flush=True)
        else:
            if not args.once:
                print("\x1b[2J\x1b[H", end="")
            print(format_status(st) + "\n\n" + format_memory(mem), flush=True)
        if args.once:
            return 0
        time.sleep(args.interval_s)  # refresh period of a live display
