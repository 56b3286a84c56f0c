"""``pixpool digest``: one SHA-256 per batch of a training stream.

Runs in the user's shell process. By default it hashes the batches exactly as a trainer
receives them from a daemon: it attaches a ``Client`` to the daemon at ``--socket-dir``, or,
without it, starts a temporary one with ``pixpool serve`` as a child process (its
``DaemonConfig`` from the flags, written by ``flags.to_argv``; stopped with SIGTERM, which
removes its rings and the snapshot it made, before the command returns). With
``--socket-dir``, DATA names what that daemon must serve (``shared/stream/served_data.py``):
one serving another dataset is refused, naming both. ``--reference`` and ``--in-process``
render the batches in this process instead (``server/local_stream.py``). The digests hash
the slot bytes (a segment batch's mask planes too); equal digests from the paths, for the
same flags, are the parity claim made visible.

The flags are generated from ``StreamSettings``, ``AugmentConfig`` and the ``DaemonConfig``
fields of the snapshot and the temporary daemon: every field marked ``changes_bytes``
(``shared/stream/config.py``: what a daemon serves, a bound such as
``--max-instances-per-image`` included), so a setting added there is a digest flag without an
edit here, and the few that say how this command runs (``RUN_FIELDS``). ``--imgsz`` is the
stream's (``AugmentConfig.imgsz``): a snapshot this command prepares, or the temporary daemon
it starts, is made for it (DaemonConfig's default where it is not given); the daemon at
``--socket-dir`` decides it for a stream that names none.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ..shared.errors import ConfigError
from ..shared.stream import digest, flags, served_data
from ..shared.stream.config import NOT_ULTRALYTICS_DEFAULTS, AugmentConfig, DaemonConfig, StreamSettings, changes_bytes
from ..shared.stream.flags import to_argv

if TYPE_CHECKING:
    from ..client.options import ClientOptions

__all__ = ["DAEMON_FIELDS", "configure", "daemon_config_from", "daemon_digests", "report", "run", "settings_from"]

# How long a daemon has to answer ``daemon_digests`` (a temporary one, to start) unless told.
DIGEST_TIMEOUT_S = 300.0
# How the snapshot is made and the temporary daemon runs: no effect on the digests.
RUN_FIELDS = ("processes", "workers", "store", "keep_snapshot")
# The DaemonConfig fields of the snapshot (--in-process) and of the temporary daemon (no
# --socket-dir). imgsz is not among them: --imgsz is the stream's (AugmentConfig), which
# ``daemon_config_from`` hands to the daemon.
DAEMON_FIELDS = tuple(n for n in changes_bytes(DaemonConfig) if n != "imgsz") + RUN_FIELDS


def configure(parser: argparse.ArgumentParser, name: str = "digest") -> None:
    """The flags of ``pixpool digest``: one parser for the daemon's stream and the in-process paths."""
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument(
        "--batches", type=int, default=1, help="how many batches of the epoch to digest (from the first)"
    )
    parser.add_argument("--reference", action="store_true", help="decode per sample in-process, no snapshot")
    parser.add_argument(
        "--socket-dir", default=None, help="digest the stream of the running daemon at this socket directory"
    )
    parser.add_argument("--in-process", action="store_true", help="render from the snapshot in this process, no daemon")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    flags.add_fields(
        parser,
        DaemonConfig,
        group="what is served (DaemonConfig): the snapshot (--in-process), the temporary daemon started without "
        "--socket-dir; with --socket-dir, DATA (or --val with --split val) is what that daemon must serve",
        only=DAEMON_FIELDS,
    )
    flags.add_fields(parser, StreamSettings, group="stream (StreamSettings)")
    flags.add_fields(
        parser,
        AugmentConfig,
        group="augmentation (AugmentConfig)",
        group_help=flags.defaults_note(AugmentConfig, NOT_ULTRALYTICS_DEFAULTS),
        prefix="aug_",
    )


def settings_from(args: argparse.Namespace) -> StreamSettings:
    """The stream the flags describe; its imgsz stays None where ``--imgsz`` is not given."""
    if args.epoch < 0:
        raise ConfigError(f"--epoch {args.epoch} must be >= 0")
    return flags.from_args(StreamSettings, args, augment=flags.from_args(AugmentConfig, args, prefix="aug_"))


def daemon_config_from(args: argparse.Namespace, settings: StreamSettings) -> DaemonConfig:
    """The DaemonConfig of the snapshot or temporary daemon: the flags, at the stream's imgsz
    (DaemonConfig's default where the stream names none)."""
    imgsz = settings.augment.imgsz
    return flags.from_args(DaemonConfig, args, **({} if imgsz is None else {"imgsz": imgsz}))


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


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if args.reference or args.in_process:
        return _run_here(args, settings)
    config = None if args.socket_dir is not None else daemon_config_from(args, settings)
    # DATA names what a running daemon must serve: digests of another dataset's batches would
    # differ from --reference's for no reason the user could see. The task is not compared:
    # --task has a default, so it cannot tell "not given" from "detect".
    named = (
        (args.val, args.val_images) if settings.split == "val" and args.val is not None else (args.data, args.images)
    )
    expect = None if config is not None else served_data.expect(*named, split=settings.split)
    from ..client.options import ClientOptions

    options = ClientOptions(socket_dir=args.socket_dir, timeout_s=DIGEST_TIMEOUT_S, expect=expect)
    digests = daemon_digests(settings, args.epoch, args.batches, options, config=config)
    report(args, "daemon", settings, digests)
    return 0


def _run_here(args: argparse.Namespace, settings: StreamSettings) -> int:
    """``--reference`` / ``--in-process``: render the batches in this process (producer code,
    imported only on this branch so the daemon's-stream path loads none of it)."""
    from ..server import local_stream

    config = daemon_config_from(args, settings)
    # The stream renders at the snapshot's imgsz, as a daemon's trainer that names none would.
    settings = settings.for_imgsz(config.imgsz)
    dataset = local_stream.read_served_split(config, settings.split)
    if args.reference:
        from ..server.snapshot.reference import ReferenceSource

        source = ReferenceSource(dataset, config.imgsz)
        report(args, "reference", settings, local_stream.digest_stream(source, settings, args.epoch, args.batches))
    else:
        digests = local_stream.snapshot_digests(dataset, settings, config, args.epoch, args.batches)
        report(args, "snapshot", settings, digests)
    return 0


def daemon_digests(
    settings: StreamSettings,
    epoch: int,
    batches: int | None = None,
    options: ClientOptions | None = None,
    *,
    config: DaemonConfig | None = None,
) -> list[str]:
    """One sha256 per batch of ``epoch`` (the first ``batches`` of them, or all).

    ``config`` None: attach to the daemon ``options`` names (its ``socket_dir``; its ``expect``,
    a ``served_data.ExpectedData``, the data that daemon must serve, else
    ``DatasetMismatchError``). Otherwise start a temporary daemon from ``config`` (``pixpool
    serve`` with ``flags.to_argv(config)``), given ``options.timeout_s`` to start, and stopped
    before this returns. ``options`` None: the default socket, ``DIGEST_TIMEOUT_S`` to answer.
    """
    from ..client.options import ClientOptions

    options = ClientOptions(timeout_s=DIGEST_TIMEOUT_S) if options is None else options
    if config is None:
        return _collect(settings, epoch, batches, options)
    from ..client.child import serve_child

    with serve_child(to_argv(config), timeout_s=options.timeout_s) as (_, sdir, _):
        return _collect(settings, epoch, batches, options.replace(socket_dir=sdir, endpoint=None, expect=None))


def _collect(settings: StreamSettings, epoch: int, batches: int | None, options: ClientOptions) -> list[str]:
    from ..client.client import Client

    out = []
    with Client.connect(settings, options.replace(as_torch=False)) as client:
        if batches is not None:
            digest.check_batches(batches, client.num_records, settings, epoch)
        for b in client.epoch(epoch):
            out.append(digest.batch_digest(b.images, b.targets, b.masks))
            if batches is not None and len(out) >= batches:
                break
    return out
