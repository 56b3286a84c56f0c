"""``pixpool digest --reference`` / ``--in-process``: digests of batches rendered right here.

Runs in the user's shell process, on the producer side (it reads the dataset and renders):

- ``--reference``: the in-process reference pipeline (decode per sample, no snapshot);
- ``--in-process``: render from the shared-memory snapshot in this process: it re-attaches
  an existing one for the same dataset and imgsz, or prepares one
  (``DaemonConfig.prepare_options``); a snapshot it prepared itself is removed at exit
  (also on errors and Ctrl-C) unless ``--keep-snapshot``.

Without either flag the command is the trainer's (``client/commands/digest.py``: the
batches as a daemon delivers them); both take the parser of ``shared/cli/digest_args.py``,
and equal digests from the paths, for the same flags, are the parity claim made visible.
"""

from __future__ import annotations

import argparse

from ...shared.cli import digest_args
from ...shared.errors import ConfigError
from ...shared.stream import digest
from ...shared.stream.config import DaemonConfig, StreamSettings
from ...shared.stream.source import ImageSource


def digest_stream(source: ImageSource, settings: StreamSettings, epoch: int, batches: int) -> list[str]:
    """SHA-256 hex of the first ``batches`` batches of ``epoch`` (images + packed targets, and
    the mask planes of a segment batch)."""
    from ..augment import render_batch

    digest.check_batches(batches, len(source), settings, epoch)
    out = []
    for b in range(batches):
        r = render_batch(source, settings, epoch, b)
        out.append(digest.batch_digest(r.images, r.targets, getattr(r, "masks", None)))
    return out


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    digest_args.configure(parser)


def run(args: argparse.Namespace) -> int:
    settings = digest_args.settings_from(args)
    config = digest_args.daemon_config_from(args, settings)
    # The stream renders at the snapshot's imgsz, as a daemon's trainer that names none would.
    settings = settings.for_imgsz(config.imgsz)
    dataset = read_served_split(config, settings.split)
    if args.reference:
        from ..snapshot.reference import ReferenceSource

        digests = digest_stream(ReferenceSource(dataset, config.imgsz), settings, args.epoch, args.batches)
        path = "reference"
    else:
        digests = _digest_snapshot(dataset, settings, config, args)
        path = "snapshot"
    digest_args.report(args, path, settings, digests)
    return 0


def read_served_split(config: DaemonConfig, split: str):
    """The Dataset a daemon of ``config`` serves as ``split``, read as that daemon reads it
    (``snapshot.load``: the same split resolution, bounds and task), so that every setting that
    changes what a daemon serves changes these digests alike."""
    from ..snapshot.load import read_split, splits

    served = splits(config)
    if split not in served:
        raise ConfigError(
            f"a daemon of these settings serves no {split!r} split (it would serve {sorted(served)}); name the "
            "validation set with --val DATA, or a data.yaml that has val:, or digest --split train",
            field="split",
        )
    data, images, _ = served[split]
    dataset, _ = read_split(config, data, images, split, warned=set())
    return dataset


def _digest_snapshot(dataset, settings: StreamSettings, config: DaemonConfig, args: argparse.Namespace) -> list[str]:
    from ..snapshot.prepare import prepare_snapshot

    snapshot = prepare_snapshot(dataset, config.prepare_options()).snapshot
    try:
        return digest_stream(snapshot, settings, args.epoch, args.batches)
    finally:
        snapshot.release(keep=config.keep_snapshot)
