"""``pixpool status``: what the running daemon serves (snapshot, workers, trainers).

Runs in the user's shell process, as a client of the daemon's control socket. Prints a
table, or the raw status reply as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json

from ..status import format_status, query_status


def add_daemon_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket-dir", metavar="DIR", default=None, help="the daemon's socket directory")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="how long to wait for the daemon (default 3)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--store", metavar="DIR", default=None, help="where this process sees the daemon's store (default: the path the daemon reports)")


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    add_daemon_flags(parser)


def run(args: argparse.Namespace) -> int:
    st = query_status(args.socket_dir, timeout_s=args.timeout_s)
    print(json.dumps(st, indent=2) if args.json else format_status(st))
    return 0
