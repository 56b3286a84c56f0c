"""The ``pixpool`` command line: a dispatcher over the sub-command modules of this package.

Runs in the user's shell process. ``cli/`` is the one part that knows every side: each
sub-command is a module here with ``configure(parser, name)`` and ``run(args) -> int``, and
imports the side it drives inside ``run``. A module is imported only when its sub-command is
chosen, so ``pixpool --help`` stays instant and never imports torch (nor, for a trainer
command, the producer's modules).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from dataclasses import dataclass
from typing import NoReturn

from ..shared import __version__
from ..shared.errors import ConfigError, PixpoolError
from ..shared.stream.flags import flag_names
from ..shared.text import closest


@dataclass(frozen=True)
class Command:
    module: str  # under ``pixpool.cli``
    help: str


COMMANDS: dict[str, Command] = {
    "synth": Command("synth", "write the embedded synthetic dataset (JPEG files + COCO json)"),
    "prepare": Command("prepare", "decode a dataset once into a snapshot in the store (uint8, or float32)"),
    "ls": Command("snapshots", "list prepared snapshots in the store (/dev/shm, or --store DIR)"),
    "clean": Command("snapshots", "remove snapshots and rings no live process maps"),
    "digest": Command(
        "digest",
        "print one SHA-256 per batch of a training stream",
    ),
    "plan": Command(
        "plan", "what serving DATA will hold (snapshot, rings, uint8 caches) and whether the store has room"
    ),
    "serve": Command("serve", "run the producer daemon in the foreground"),
    "status": Command("status", "show the daemon's snapshot, workers and trainers"),
    "keys": Command("keys", "make a CURVE key pair for TCP delivery"),
    "memory": Command("memory", "what the service and its trainers retain, measured, against uint8 caches"),
    "monitor": Command("monitor", "watch the memory footprint and the streams live"),
    "plot": Command("plot", "draw a `monitor --record` file as a PNG"),
    "train": Command("train", "attach to a running daemon and train the small detector on its stream"),
    "demo": Command("demo", "the main job: synthetic data -> snapshot -> daemon -> training steps"),
    "yolo": Command(
        "yolo",
        "train an Ultralytics YOLO model on pixpool's stream: yolo train data=... model=... (needs pixpool[ultralytics])",
    ),
}


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors take one line and name the closest flag or command.

    argparse prints the whole usage (20 lines for ``pixpool train``) before the error; a
    mistyped flag is better answered with the flag meant."""

    def error(self, message: str) -> NoReturn:
        hint = _hint(message, self)
        self.exit(2, f"{self.prog}: error: {message}{hint} (see `{self.prog} --help`)\n")


def _hint(message: str, parser: argparse.ArgumentParser) -> str:
    """The ``; did you mean ...`` that follows an argparse ``message``: the closest known flag to
    each unknown one (``--X 0`` for ``--no-X`` of a bool), or the closest command to a mistyped one."""
    if message.startswith("unrecognized arguments:"):
        shown = [a for a in parser._actions if a.help != argparse.SUPPRESS]
        flags = {s: a for a in shown for s in a.option_strings}
        meant = []
        for token in message.split(":", 1)[1].split():
            word = token.split("=", 1)[0]
            if not word.startswith("--"):
                continue
            negated = flags.get("--" + word.removeprefix("--no-"))
            if word.startswith("--no-") and negated is not None and negated.metavar == "BOOL":
                meant.append(f"{negated.option_strings[-1]} 0")  # one way to say a bool: --X 0
            elif (near := closest(word, flags)) is not None:
                meant.append(near)
        return f"; did you mean {', '.join(meant)}?" if meant else ""
    chosen = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if chosen:
        near = closest(chosen.group(1), re.findall(r"'([^']*)'", chosen.group(2)))
        return f"; did you mean {near!r}?" if near else ""
    return ""


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pixpool", description="Shared-memory data service for training object detectors.")
    parser.add_argument("--version", action="version", version=f"pixpool {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    # First pass only finds the sub-command; its own parser is built after importing it.
    known, rest = parser.parse_known_args(argv)
    if known.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(
        level=logging.DEBUG if known.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    command = COMMANDS[known.command]
    sub = _Parser(prog=f"pixpool {known.command}", description=command.help)
    try:
        module = importlib.import_module(f"pixpool.cli.{command.module}")
        module.configure(sub, known.command)
        args = sub.parse_args(rest)
        args.command = known.command
        return int(module.run(args) or 0)
    except ConfigError as exc:
        print(f"pixpool {known.command}: error: {exc.cli_message(flag_names(sub))}", file=sys.stderr)
        return 1
    except PixpoolError as exc:
        print(f"pixpool {known.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"pixpool {known.command}: interrupted", file=sys.stderr)
        return 130
