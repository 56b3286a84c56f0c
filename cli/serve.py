"""``pixpool serve DATA``: run the producer daemon in the foreground.

Runs in the user's shell process, which becomes the daemon (systemd, a container or a
terminal manages it). Every flag is a ``DaemonConfig`` field; paths, keys and the address
are checked before the dataset is read. Ctrl-C or SIGTERM stops it cleanly; see
``server/daemon/service.py``.

``--log-file FILE`` (this command's own flag, not a ``DaemonConfig`` field) sends the log to
FILE and keeps only warnings and errors on the console: how ``pixpool demo``, ``pixpool yolo
train`` and ``tune`` run the daemon they start beside their own output (``client/child.py``).
"""

from __future__ import annotations

import argparse

from ..shared.stream.config import DaemonConfig
from ..shared.stream.flags import add_fields, from_args


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    add_fields(parser, DaemonConfig)
    parser.add_argument(
        "--log-file",
        metavar="FILE",
        default=None,
        help="write the log to FILE (appended; debug lines too with `pixpool -v`) and show only warnings and "
        "errors on the console (default: the whole log on the console)",
    )


def log_to_file(path: str) -> None:
    """The root logger's records go to ``path``; the console handlers (``cli/main.py``'s
    ``basicConfig``) keep warnings and errors only."""
    import logging

    from ..shared.errors import ConfigError

    try:
        file_handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"--log-file {path}: cannot open it for writing ({exc.strerror}); name a file in a folder you can write"
        ) from None
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setLevel(logging.WARNING)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(file_handler)


def run(args: argparse.Namespace) -> int:
    import sys

    from ..shared.transport.starting import StartingMark

    config = from_args(DaemonConfig, args)
    # Say "a daemon is starting here" before the daemon's modules load (a second or more on a
    # busy machine): a trainer started just after this command finds the mark and waits.
    starting = StartingMark.take(config.socket_dir)
    try:
        from ..server.daemon.run import run_daemon
        from ..server.snapshot.prepare import PreparationTerminated

        if args.log_file is not None:
            log_to_file(args.log_file)
    except BaseException:
        starting.release(served=False)
        raise
    try:
        run_daemon(config, starting=starting)
    except PreparationTerminated:
        print("pixpool serve: terminated (SIGTERM) before serving; no segment was left behind", file=sys.stderr)
        return 143
    return 0
