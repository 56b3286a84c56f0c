"""``pixpool plot FILE -o out.png``: draw a ``pixpool monitor --record`` file or a training
run's ``results.jsonl`` (``ops/plot.py``)."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument(
        "file", metavar="FILE", help="JSON lines written by `pixpool monitor --record FILE`, or a run's results.jsonl"
    )
    parser.add_argument("-o", "--out", default="memory.png", help="PNG to write (default memory.png)")


def run(args: argparse.Namespace) -> int:
    from ..ops.plot import plot_any, read_record

    out = plot_any(read_record(args.file), args.out)
    print(f"wrote {out}")
    return 0
