"""``pixpool status``: what the running daemon serves (snapshot, workers, trainers).

Runs in the user's shell process, as a client of the daemon's control socket. Prints a
table, or the raw status reply as JSON with ``--json``. ``--probe`` (the container probes)
asks for the daemon's ``health`` instead: a reply of a few dozen bytes whatever the number
of trainers, exit status 0 when the daemon says it is healthy, 1 when it says it is not.
"""

from __future__ import annotations

import argparse
import json

from ..ops.status_client import format_status, query_health, query_status
from ..shared.wire.status import as_reply
from ..shared.wire.trainer import Op


def add_daemon_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket-dir", metavar="DIR", default=None, help="the daemon's socket directory")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="how long to wait for the daemon (default 3)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--store",
        metavar="DIR",
        default=None,
        help="where this process sees the daemon's store (default: the path the daemon reports)",
    )


def await_starting_daemon(socket_dir: str | None) -> None:
    """Wait for a daemon that is starting at ``socket_dir`` (``client/daemon_socket.py``: up to
    its ``STARTING_WAIT_S``); where none is there nor starting, ``DaemonNotFound`` within a second."""
    from ..client.daemon_socket import await_daemon
    from ..shared.transport import endpoint as ep

    await_daemon(ep.ipc_endpoint(socket_dir))


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    add_daemon_flags(parser)
    parser.add_argument(
        "--probe",
        action="store_true",
        help="ask only whether the daemon is alive and healthy (for liveness and readiness probes)",
    )


def run(args: argparse.Namespace) -> int:
    if args.probe:
        h = query_health(args.socket_dir, timeout_s=args.timeout_s)
        if args.json:
            print(json.dumps(as_reply(Op.HEALTH, h)))
        else:
            print(
                f"daemon pid {h.pid} {'healthy' if h.healthy else 'UNHEALTHY'}: {h.trainers} trainers, "
                f"{h.workers_ready} workers ready, up {h.uptime_s:.0f} s"
            )
        return 0 if h.healthy else 1
    await_starting_daemon(args.socket_dir)  # not for --probe: a probe asks about now
    st = query_status(args.socket_dir, timeout_s=args.timeout_s)
    print(json.dumps(as_reply(Op.STATUS, st), indent=2) if args.json else format_status(st))
    return 0
