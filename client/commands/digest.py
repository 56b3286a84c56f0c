"""``pixpool digest``: one SHA-256 per batch exactly as a trainer receives it from a daemon.

Runs in the user's shell process, as a trainer would: it attaches a ``Client`` to the
daemon at ``--socket-dir``, or, without it, starts a temporary one with ``pixpool serve``
as a child process (its ``DaemonConfig`` from the flags, written by ``flags.to_argv``;
stopped with SIGTERM, which removes its rings and the snapshot it made, before the command
returns). The digests hash the slot bytes as they arrive (a segment batch's mask planes too). ``--reference`` and
``--in-process`` are the producer's paths (``server/commands/digest.py``); both commands
take the parser of ``shared/cli/digest_args.py``. With ``--socket-dir``, DATA names what that
daemon must serve (``shared/stream/served_data.py``): one serving another dataset is refused,
naming both.
"""

from __future__ import annotations

import argparse

from ...shared.cli import digest_args
from ...shared.cli.flags import to_argv
from ...shared.stream import digest, served_data
from ...shared.stream.config import DaemonConfig, StreamSettings


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    digest_args.configure(parser)


def run(args: argparse.Namespace) -> int:
    settings = digest_args.settings_from(args)
    config = None if args.socket_dir is not None else digest_args.daemon_config_from(args, settings)
    # DATA names what a running daemon must serve: digests of another dataset's batches would
    # differ from --reference's for no reason the user could see. The task is not compared:
    # --task has a default, so it cannot tell "not given" from "detect".
    named = (
        (args.val, args.val_images) if settings.split == "val" and args.val is not None else (args.data, args.images)
    )
    expect = None if config is not None else served_data.expect(*named, split=settings.split)
    digests = daemon_digests(
        settings, args.epoch, args.batches, socket_dir=args.socket_dir, config=config, expect=expect
    )
    digest_args.report(args, "daemon", settings, digests)
    return 0


def daemon_digests(
    settings: StreamSettings,
    epoch: int,
    batches: int | None = None,
    *,
    socket_dir: str | None = None,
    config: DaemonConfig | None = None,
    timeout_s: float = 300.0,
    expect=None,
) -> list[str]:
    """One sha256 per batch of ``epoch`` (the first ``batches`` of them, or all).

    ``config`` None: attach to the daemon at ``socket_dir``. Otherwise start a temporary
    daemon from ``config`` (``pixpool serve`` with ``flags.to_argv(config)``), stopped before
    this returns. ``expect`` (``served_data.ExpectedData``): the daemon at ``socket_dir`` must
    serve that data, else ``DatasetMismatchError``.
    """
    if config is None:
        return _collect(settings, epoch, batches, socket_dir, timeout_s, expect)
    from ..child import serve_child

    with serve_child(to_argv(config), timeout_s=timeout_s) as (_, sdir, _):
        return _collect(settings, epoch, batches, sdir, timeout_s)


def _collect(
    settings: StreamSettings, epoch: int, batches: int | None, socket_dir: str | None, timeout_s: float, expect=None
) -> list[str]:
    from ..client import Client

    out = []
    with Client(settings, socket_dir=socket_dir, timeout_s=timeout_s, as_torch=False, expect=expect) as client:
        if batches is not None:
            digest.check_batches(batches, client.num_records, settings, epoch)
        for b in client.epoch(epoch):
            out.append(digest.batch_digest(b.images, b.targets, b.masks))
            if batches is not None and len(out) >= batches:
                break
    return out
