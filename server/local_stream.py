"""Batches rendered in this process, no daemon: what ``pixpool digest --reference`` and
``--in-process`` hash.

Runs in the user's shell process, on the producer side (it reads the dataset and renders):

- the in-process reference pipeline (``snapshot.reference``: decode per sample, no snapshot);
- the shared-memory snapshot rendered in this process: an existing one for the same dataset and
  imgsz is re-attached, or one is prepared (``DaemonConfig.prepare_options``); a snapshot
  prepared here is removed at exit (also on errors and Ctrl-C) unless ``keep_snapshot``.

Equal digests from these paths and from a daemon's stream (``cli/digest.py``), for the same
flags, are the parity claim made visible.
"""

from __future__ import annotations

from ..shared.errors import ConfigError
from ..shared.stream import digest
from ..shared.stream.config import DaemonConfig, StreamSettings
from ..shared.stream.source import ImageSource

__all__ = ["digest_stream", "read_served_split", "snapshot_digests"]


def digest_stream(source: ImageSource, settings: StreamSettings, epoch: int, batches: int) -> list[str]:
    """SHA-256 hex of the first ``batches`` batches of ``epoch`` (images + packed targets, and
    the mask planes of a segment batch)."""
    from .augment import render_batch

    digest.check_batches(batches, len(source), settings, epoch)
    out = []
    for b in range(batches):
        r = render_batch(source, settings, epoch, b)
        out.append(digest.batch_digest(r.images, r.targets, getattr(r, "masks", None)))
    return out


def read_served_split(config: DaemonConfig, split: str):
    """The Dataset a daemon of ``config`` serves as ``split``, read as that daemon reads it
    (``snapshot.load``: the same split resolution, bounds and task), so that every setting that
    changes what a daemon serves changes these digests alike."""
    from .snapshot.load import read_split, splits

    served = splits(config)
    if split not in served:
        raise ConfigError(
            f"a daemon of these settings serves no {split!r} split (it would serve {sorted(served)}); name the "
            "validation set with --val DATA, or a data.yaml that has val:, or digest --split train",
            field="split",
        )
    dataset, _ = read_split(served[split], config.prepare_options(), warned=set())
    return dataset


def snapshot_digests(dataset, settings: StreamSettings, config: DaemonConfig, epoch: int, batches: int) -> list[str]:
    """Digests rendered from a snapshot of ``dataset`` in this process: it re-attaches an existing
    one for the same dataset and imgsz, or prepares one, removed at the end unless
    ``config.keep_snapshot``."""
    from .snapshot.prepare import prepare_snapshot

    snapshot = prepare_snapshot(dataset, config.prepare_options()).snapshot
    try:
        return digest_stream(snapshot, settings, epoch, batches)
    finally:
        snapshot.release(keep=config.keep_snapshot)
