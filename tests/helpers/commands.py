"""Check command lines written into deployment files against the real parsers.

Runs in the pytest process and starts nothing: a ``pixpool ...`` argv is parsed by the
sub-command's own parser (built as ``pixpool.cli.main`` builds it), a ``torchrun ...``
argv by torch's own (``torch.distributed.run.get_args_parser``) and the script it runs by
that script's ``parse_args``. An unknown or abbreviated flag or a bad value raises
``BadCommand`` naming it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Where the Dockerfile's trainer image puts the repository's examples.
IMAGE_EXAMPLES = "/opt/pixpool/examples/"


class BadCommand(ValueError):
    pass


def _strict(parser: argparse.ArgumentParser, where: str) -> argparse.ArgumentParser:
    def error(message: str):
        raise BadCommand(f"{where}: {message}")

    parser.error = error  # argparse would print and exit
    parser.allow_abbrev = False  # a file spells flags out: an abbreviation breaks when a flag is added
    return parser


def parse_pixpool(argv: list[str]) -> argparse.Namespace:
    """``argv`` starts with ``pixpool``; parsed by the sub-command's own parser."""
    from pixpool.cli.main import COMMANDS

    if not argv or argv[0] != "pixpool":
        raise BadCommand(f"{argv}: not a pixpool command line")
    if len(argv) < 2 or argv[1] not in COMMANDS:
        raise BadCommand(f"{argv}: {argv[1:2]} is not a pixpool command; known: {sorted(COMMANDS)}")
    name, rest = argv[1], argv[2:]
    module = importlib.import_module(f"pixpool.cli.{COMMANDS[name].module}")
    parser = _strict(argparse.ArgumentParser(prog=f"pixpool {name}"), " ".join(argv))
    module.configure(parser, name)
    args = parser.parse_args(rest)
    args.command = name
    return args


def _script_parser(path: str):
    local = REPO / "examples" / path[len(IMAGE_EXAMPLES) :] if path.startswith(IMAGE_EXAMPLES) else None
    if local is None or not local.is_file():
        raise BadCommand(
            f"torchrun runs {path}, which is not one of the repository's examples (the trainer image copies examples/ to {IMAGE_EXAMPLES})"
        )
    spec = importlib.util.spec_from_file_location(f"_example_{local.stem}", local)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_args


def parse_torchrun(argv: list[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    """``argv`` starts with ``torchrun``: (torchrun's arguments, the example script's)."""
    from torch.distributed.run import get_args_parser

    if not argv or argv[0] != "torchrun":
        raise BadCommand(f"{argv}: not a torchrun command line")
    outer = _strict(get_args_parser(), " ".join(argv)).parse_args(argv[1:])
    parse_script = _script_parser(outer.training_script)
    try:
        inner = parse_script(outer.training_script_args)
    except SystemExit:
        raise BadCommand(f"{outer.training_script}: refused its arguments {outer.training_script_args}") from None
    return outer, inner


def parse_command(argv: list[str]):
    """Parse a ``pixpool`` or ``torchrun`` argv; anything else is a BadCommand."""
    if argv and argv[0] == "pixpool":
        return parse_pixpool(argv)
    if argv and argv[0] == "torchrun":
        return parse_torchrun(argv)
    raise BadCommand(f"{argv}: deployment files should run pixpool or torchrun")
