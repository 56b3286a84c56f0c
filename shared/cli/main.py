"""The ``pixpool`` command line: a dispatcher over sub-command modules of both sides.

Runs in the user's shell process. This is the one place that knows both sides, and it
knows them by name only: each sub-command is a module, producer commands under
``pixpool.server.commands``, trainer and operator commands under
``pixpool.client.commands``, with ``configure(parser, name)`` and ``run(args) -> int``.
A module is imported only when its sub-command is chosen, so ``pixpool --help`` stays
instant and never imports torch (nor, for a trainer command, the producer's modules).

``digest`` has one parser and two homes: through a daemon it is a trainer-side client;
with ``--reference`` or ``--in-process`` it renders batches itself, on the producer side.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from dataclasses import dataclass, field

from .. import __version__
from ..errors import ConfigError, PixpoolError
from .flags import flag_names


@dataclass(frozen=True)
class Command:
    module: str  # under the ``pixpool`` package
    help: str
    # flag -> module that runs the command when that flag is given
    routes: dict[str, str] = field(default_factory=dict)

    def module_for(self, argv: list[str]) -> str:
        for flag, module in self.routes.items():
            if flag in argv:
                return module
        return self.module


COMMANDS: dict[str, Command] = {
    "synth": Command("server.commands.synth", "write the embedded synthetic dataset (JPEG files + COCO json)"),
    "prepare": Command(
        "server.commands.prepare", "decode a dataset once into a snapshot in the store (float32 or uint8)"
    ),
    "ls": Command("server.commands.snapshots", "list prepared snapshots in the store (/dev/shm, or --store DIR)"),
    "clean": Command("server.commands.snapshots", "remove snapshots and rings no live process maps"),
    "digest": Command(
        "client.commands.digest",
        "print one SHA-256 per batch of a training stream",
        routes={"--reference": "server.commands.digest", "--in-process": "server.commands.digest"},
    ),
    "serve": Command("server.commands.serve", "run the producer daemon in the foreground"),
    "status": Command("client.commands.status", "show the daemon's snapshot, workers and trainers"),
    "keys": Command("server.commands.keys", "make a CURVE key pair for TCP delivery"),
    "memory": Command(
        "client.commands.memory", "what the service and its trainers retain, measured, against uint8 caches"
    ),
    "monitor": Command("client.commands.monitor", "watch the memory footprint and the streams live"),
    "plot": Command("client.commands.plot", "draw a `monitor --record` file as a PNG"),
    "train": Command("client.commands.train", "attach to a running daemon and train the small detector on its stream"),
    "demo": Command("client.commands.demo", "the main job: synthetic data -> snapshot -> daemon -> training steps"),
    "yolo": Command(
        "integrations.ultralytics.command",
        "train an Ultralytics YOLO model on pixpool's stream: yolo train data=... model=... (needs pixpool[ultralytics])",
    ),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pixpool", description="Shared-memory data service for training object detectors."
    )
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
    sub = argparse.ArgumentParser(prog=f"pixpool {known.command}", description=command.help)
    try:
        module = importlib.import_module(f"pixpool.{command.module_for(rest)}")
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
