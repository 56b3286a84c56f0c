"""Every daemon setting that changes what is served is a ``pixpool digest`` flag.

Unit tests: parsers only, no process. The settings are the ``DaemonConfig`` fields whose
metadata says ``changes_bytes``; ``digest_args`` generates its flags from that marker, so a
new such field cannot be forgotten.
"""

from __future__ import annotations

import argparse
import dataclasses

from pixpool.cli import digest as digest_args
from pixpool.shared.stream.config import DaemonConfig, changes_bytes
from pixpool.shared.stream.flags import flag_of


def _digest_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pixpool digest")
    digest_args.configure(parser)
    return parser


def test_every_setting_that_changes_the_bytes_is_a_digest_flag():
    parser = _digest_parser()
    options = {s for a in parser._actions for s in a.option_strings}
    positionals = {a.dest for a in parser._actions if not a.option_strings}
    marked = changes_bytes(DaemonConfig)
    # At least these decide what a daemon serves: its pixels, its targets, or whether it serves the set at all.
    assert {"data", "images", "imgsz", "task", "dtype", "max_instances_per_image", "allow_unlabelled"} <= set(marked)
    fields = {f.name: f for f in dataclasses.fields(DaemonConfig)}
    for name in marked:
        f = fields[name]
        assert (name in positionals) if f.metadata.get("positional") else (flag_of(f) in options), name


def test_the_flags_reach_the_daemon_config():
    parser = _digest_parser()
    args = parser.parse_args(["d.yaml", "--max-instances-per-image", "5000", "--allow-unlabelled", "--dtype", "uint8"])
    settings = digest_args.settings_from(args)
    config = digest_args.daemon_config_from(args, settings)
    assert (config.max_instances_per_image, config.allow_unlabelled, config.dtype) == (5000, True, "uint8")
