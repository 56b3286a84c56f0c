"""The digest of a delivered batch, and the ``pixpool digest`` command line both sides share.

Code both sides import: the producer hashes batches it renders (``--reference`` and
``--in-process``, ``server/commands/digest.py``), a trainer-side client hashes the batches
a daemon delivers (``client/commands/digest.py``); equal digests mean equal bytes. Both
commands take the one parser below, so their flags cannot drift apart.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import numpy as np

from ..cli import flags
from ..errors import ConfigError
from ..transport.names import DEFAULT_STORE
from .config import AugmentConfig, DaemonConfig, StreamSettings, check_value
from .sampler import num_batches


def batch_digest(images: np.ndarray, targets: np.ndarray) -> str:
    """SHA-256 hex over the images' and the packed targets' shapes and bytes."""
    h = hashlib.sha256()
    for array, dtype in ((images, np.uint8), (targets, np.float32)):
        array = np.ascontiguousarray(array, dtype=dtype)
        h.update(repr(array.shape).encode())
        # As flat bytes: a memoryview cast refuses a shape with a zero in it, and a batch of
        # background images packs its targets as (0, 6).
        h.update(array.reshape(-1).view(np.uint8))
    return h.hexdigest()


# -- the ``pixpool digest`` command line, one parser for both of its homes -----------------
def configure(parser: argparse.ArgumentParser) -> None:
    """The flags of ``pixpool digest``: the same whichever side runs the chosen path."""
    parser.add_argument("data", help="COCO json, YOLO data.yaml or YOLO images folder")
    parser.add_argument("--images", default=None, help="COCO images folder (default: next to the json)")
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument(
        "--batches", type=int, default=1, help="how many batches of the epoch to digest (from the first)"
    )
    parser.add_argument("--reference", action="store_true", help="decode per sample in-process, no snapshot")
    parser.add_argument(
        "--socket-dir", default=None, help="digest the stream of the running daemon at this socket directory"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="workers of the temporary daemon started when no --socket-dir is given (default 2)",
    )
    parser.add_argument("--in-process", action="store_true", help="render from the snapshot in this process, no daemon")
    parser.add_argument(
        "--processes", type=int, default=2, help="decode processes when a snapshot must be prepared (default 2)"
    )
    parser.add_argument(
        "--keep-snapshot", action="store_true", help="keep a snapshot this command prepared (--in-process)"
    )
    flags.add_fields(parser, DaemonConfig, only=("dtype",))  # the snapshot a temporary daemon or --in-process prepares
    parser.add_argument(
        "--store",
        metavar="DIR",
        default=DEFAULT_STORE,
        help=f"the store the snapshot lives in (--in-process, and a temporary daemon; default {DEFAULT_STORE})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    flags.add_fields(parser, StreamSettings, group="stream (StreamSettings)")
    flags.add_fields(parser, AugmentConfig, group="augmentation (AugmentConfig; defaults are YOLO's)", prefix="aug_")


def settings_from(args: argparse.Namespace) -> StreamSettings:
    if args.epoch < 0:
        raise ConfigError(f"--epoch {args.epoch} must be >= 0")
    check_value("dtype", "str", args.dtype)
    return flags.from_args(StreamSettings, args, augment=flags.from_args(AugmentConfig, args, prefix="aug_"))


def check_batches(batches: int, num_records: int, settings: StreamSettings, epoch: int) -> None:
    """ConfigError unless ``1 <= batches <=`` the number of batches of this stream's epoch."""
    total = num_batches(num_records, settings, epoch)
    if not 1 <= batches <= total:
        raise ConfigError(
            f"--batches {batches} is out of range: epoch {epoch} of this stream has {total} batches of {settings.batch_size}; use 1 to {total}"
        )


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
