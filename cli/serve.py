"""``pixpool serve DATA``: run the producer daemon in the foreground.

Runs in the user's shell process, which becomes the daemon (systemd, a container or a
terminal manages it). Every flag is a ``DaemonConfig`` field; paths, keys and the address
are checked before the dataset is read. Ctrl-C or SIGTERM stops it cleanly; see
``server/daemon/service.py``.
"""

from __future__ import annotations

import argparse

from ..shared.stream.config import DaemonConfig
from ..shared.stream.flags import add_fields, from_args


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    add_fields(parser, DaemonConfig)


def run(args: argparse.Namespace) -> int:
    import sys

    from ..server.daemon.run import run_daemon
    from ..server.snapshot.prepare import PreparationTerminated

    config = from_args(DaemonConfig, args)
    try:
        run_daemon(config)
    except PreparationTerminated:
        print("pixpool serve: terminated (SIGTERM) before serving; no segment was left behind", file=sys.stderr)
        return 143
    return 0
