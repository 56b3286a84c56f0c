"""The ``pixpool`` command line: a dispatcher over sub-command modules.

Runs in the user's shell process. Each sub-command lives in
``pixpool.server.commands.<module>`` with ``configure(parser)`` and ``run(args) -> int``;
a module is imported only when its sub-command is chosen, so ``pixpool --help`` stays
instant and never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ..shared import __version__
from ..shared.errors import PixpoolError

# name -> (module under pixpool.server.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "synth": ("synth", "write the embedded synthetic dataset (JPEG files + COCO json)"),
    "prepare": ("prepare", "decode a dataset once into a float32 shared-memory snapshot"),
    "ls": ("snapshots", "list prepared snapshots in /dev/shm"),
    "clean": ("snapshots", "remove snapshots and rings no live process maps"),
    "digest": ("digest", "print one SHA-256 per batch of a training stream"),
    "serve": ("serve", "run the producer daemon in the foreground"),
    "status": ("status", "show the daemon's snapshot, workers and trainers"),
    "keys": ("keys", "make a CURVE key pair for TCP delivery"),
    "monitor": ("status", "watch the memory footprint live"),
    "train": ("train", "attach to a running daemon and train the small detector on its stream"),
    "demo": ("demo", "the main job: synthetic data -> snapshot -> daemon -> training steps"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pixpool", description="Shared-memory data service for training object detectors.")
    parser.add_argument("--version", action="version", version=f"pixpool {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    # First pass only finds the sub-command; its own parser is built after importing it.
    known, rest = parser.parse_known_args(argv)
    if known.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.DEBUG if known.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    module = importlib.import_module(f"{__package__}.commands.{COMMANDS[known.command][0]}")
    sub = argparse.ArgumentParser(prog=f"pixpool {known.command}", description=COMMANDS[known.command][1])
    module.configure(sub, known.command)
    args = sub.parse_args(rest)
    args.command = known.command
    try:
        return int(module.run(args) or 0)
    except PixpoolError as exc:
        print(f"pixpool {known.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"pixpool {known.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
