"""``pixpool keys DIR``: make the CURVE key pairs TCP delivery needs.

Runs in the user's shell process. Writes ``server.key(_secret)``, ``client.key(_secret)``
and ``authorized/client.key`` (see ``shared/transport/endpoint.py``). Give trainers the client pair
and the server's public key; the daemon reads the server pair and ``authorized/``.
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("dir", metavar="DIR", help="directory to write the keys into (created mode 0700)")
    parser.add_argument("--force", action="store_true", help="replace key pairs that already exist there")


def run(args: argparse.Namespace) -> int:
    from ..shared.transport.endpoint import write_keys

    out = write_keys(args.dir, force=args.force)
    print(f"server key pair: {out['server']} {out['server_secret']}")
    print(f"client key pair: {out['client']} {out['client_secret']}")
    print(f"authorized client keys: {out['authorized']}/")
    print(f"serve with: pixpool serve DATA --tcp HOST:PORT --keys {args.dir}")
    return 0
