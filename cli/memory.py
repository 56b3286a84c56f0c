"""``pixpool memory``: what the service and its trainers retain, once, measured.

Runs in the user's shell process: asks the daemon who is who (``status``), then measures
the segments in the daemon's store and each local process in /proc (``ops/memory_report.py``). ``--json``
prints the figures with the field names documented in ``docs/memory.md``.
"""

from __future__ import annotations

import argparse
import json

from .status import add_daemon_flags


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    add_daemon_flags(parser)


def run(args: argparse.Namespace) -> int:
    from ..ops.memory_report import memory_report
    from ..ops.status_client import query_status
    from ..ops.view import memory_lines, processes_table, report_console
    from .status import await_starting_daemon

    await_starting_daemon(args.socket_dir)
    report = memory_report(query_status(args.socket_dir, timeout_s=args.timeout_s), store=args.store)
    if args.json:
        print(json.dumps(report))
    else:
        console = report_console()
        console.print(memory_lines(report))
        console.print(processes_table(report))
    return 0
