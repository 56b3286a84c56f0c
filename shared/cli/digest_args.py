"""The ``pixpool digest`` command line, one parser for both of its homes.

Runs in the user's shell process, on either side: the producer renders batches itself
(``--reference``, ``--in-process``: ``server/commands/digest.py``), a trainer-side client
hashes what a daemon delivers (``client/commands/digest.py``). Both take this parser, so
their flags cannot drift apart; the flags are generated from ``StreamSettings``,
``AugmentConfig`` and the ``DaemonConfig`` fields of the snapshot and the temporary daemon:
every field marked ``changes_bytes`` (``shared/stream/config.py``: what a daemon serves, a
bound such as ``--max-instances-per-image`` included), so a setting added there is a digest
flag without an edit here, and the few that say how this command runs (``RUN_FIELDS``).

``--imgsz`` is the stream's (``AugmentConfig.imgsz``): a snapshot this command prepares, or
the temporary daemon it starts, is made for it (DaemonConfig's default where it is not
given); the daemon at ``--socket-dir`` decides it for a stream that names none.
"""

from __future__ import annotations

import argparse
import json

from ..errors import ConfigError
from ..stream.config import AugmentConfig, DaemonConfig, StreamSettings, changes_bytes
from . import flags

__all__ = ["DAEMON_FIELDS", "configure", "daemon_config_from", "report", "settings_from"]

# How the snapshot is made and the temporary daemon runs: no effect on the digests.
RUN_FIELDS = ("processes", "workers", "store", "keep_snapshot")
# The DaemonConfig fields of the snapshot (--in-process) and of the temporary daemon (no
# --socket-dir). imgsz is not among them: --imgsz is the stream's (AugmentConfig), which
# ``daemon_config_from`` hands to the daemon.
DAEMON_FIELDS = tuple(n for n in changes_bytes(DaemonConfig) if n != "imgsz") + RUN_FIELDS


def configure(parser: argparse.ArgumentParser) -> None:
    """The flags of ``pixpool digest``: the same whichever side runs the chosen path."""
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument(
        "--batches", type=int, default=1, help="how many batches of the epoch to digest (from the first)"
    )
    parser.add_argument("--reference", action="store_true", help="decode per sample in-process, no snapshot")
    parser.add_argument(
        "--socket-dir", default=None, help="digest the stream of the running daemon at this socket directory"
    )
    parser.add_argument("--in-process", action="store_true", help="render from the snapshot in this process, no daemon")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    flags.add_fields(
        parser,
        DaemonConfig,
        group="what is served (DaemonConfig): the snapshot (--in-process), the temporary daemon started without "
        "--socket-dir; with --socket-dir, DATA (or --val with --split val) is what that daemon must serve",
        only=DAEMON_FIELDS,
    )
    flags.add_fields(parser, StreamSettings, group="stream (StreamSettings)")
    flags.add_fields(parser, AugmentConfig, group="augmentation (AugmentConfig; defaults are YOLO's)", prefix="aug_")


def settings_from(args: argparse.Namespace) -> StreamSettings:
    """The stream the flags describe; its imgsz stays None where ``--imgsz`` is not given."""
    if args.epoch < 0:
        raise ConfigError(f"--epoch {args.epoch} must be >= 0")
    return flags.from_args(StreamSettings, args, augment=flags.from_args(AugmentConfig, args, prefix="aug_"))


def daemon_config_from(args: argparse.Namespace, settings: StreamSettings) -> DaemonConfig:
    """The DaemonConfig of the snapshot or temporary daemon: the flags, at the stream's imgsz
    (DaemonConfig's default where the stream names none)."""
    imgsz = settings.augment.imgsz
    return flags.from_args(DaemonConfig, args, **({} if imgsz is None else {"imgsz": imgsz}))


def report(args: argparse.Namespace, path: str, settings: StreamSettings, digests: list[str]) -> None:
    """Print the digests: lines, or one JSON object with ``--json``."""
    if args.json:
        print(
            json.dumps(
                {
                    "path": path,
                    "seed": settings.seed,
                    "epoch": args.epoch,
                    "batch_size": settings.batch_size,
                    "settings": settings.to_dict(),
                    "digests": digests,
                }
            )
        )
    else:
        for b, d in enumerate(digests):
            print(f"epoch {args.epoch} batch {b} {d}")
