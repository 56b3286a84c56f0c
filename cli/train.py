"""``pixpool train``: train the reference detector on a running daemon's stream.

Runs in the trainer's process. Start several beside one ``pixpool serve`` (different
``--seed``; under ``torchrun`` each rank takes its shard from ``RANK``/``WORLD_SIZE``);
``pixpool monitor`` shows the footprint meanwhile. The flags are generated from the fields
of ``FitConfig`` (the run), ``StreamSettings`` (the stream: seed, batch size, HSV placement)
and ``AugmentConfig`` (augmentation), each with its default in ``--help``; the connection
flags (``--socket-dir``, ``--endpoint``, ``--keys``, ``--timeout-s``), ``--data`` / ``--images``
(the dataset the run must train on: a daemon serving another is refused) and ``--json``
are this command's own (``--no-progress``, the older spelling of ``--progress 0``, is accepted
but not listed). Needs the trainer extra (torch).

Every generated flag is parsed with its default suppressed (a flag not given leaves no
attribute; ``from_args`` then takes the field's default), so ``run`` knows which flags were given: ``--resume RUN/last.pt`` alone restores the run's saved settings, and a flag
given that differs from the checkpoint is refused (``client/train/checkpoint.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import signal
import sys

from ..client.train.fit_config import FIT_SET_FIELDS, FitConfig
from ..shared.stream.config import NOT_ULTRALYTICS_DEFAULTS, AugmentConfig, StreamSettings
from ..shared.stream.flags import add_fields, add_negative_alias, defaults_note, from_args
from .epoch_cap import capped

# The stream's flags: those of StreamSettings that neither ``fit`` sets (FIT_SET_FIELDS) nor
# the environment gives (rank and world size: torchrun's RANK/WORLD_SIZE).
STREAM_FLAGS = ("seed", "batch_size", "shuffle", "hsv_on_device")
# dest prefix -> setting path prefix, for the generated flags
# AugmentConfig fields ``fit`` sets (``epochs``): no flag.
_AUG_SET = tuple(p.rsplit(".", 1)[1] for p in FIT_SET_FIELDS if p.startswith("stream.augment."))
_PREFIXES = {"run_": "", "stream_": "stream.", "aug_": "stream.augment."}


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--socket-dir", metavar="DIR", default=None, help="the daemon's socket directory")
    parser.add_argument("--endpoint", default=None, help="tcp://HOST:PORT of a remote daemon (needs --keys)")
    parser.add_argument("--keys", metavar="DIR", default=None, help="CURVE key directory for TCP")
    parser.add_argument(
        "--timeout-s", type=float, default=120.0, help="how long to wait for the daemon's replies (default 120)"
    )
    parser.add_argument(
        "--wait-s",
        type=float,
        default=0.0,
        help="how long to wait for a daemon to appear at --socket-dir (default 0: where none is there, fail within "
        "a second). A daemon that is starting there (`pixpool serve` reading its data or preparing its snapshot) is "
        "waited for anyway, up to 120 s or --wait-s where longer",
    )
    parser.add_argument(
        "--data",
        metavar="DATA",
        default=None,
        help="the dataset to train on (data.yaml, YOLO images folder or COCO json, as `pixpool serve` takes it): a "
        "daemon serving another is refused, naming both (default: train on whatever the daemon serves)",
    )
    parser.add_argument("--images", metavar="DIR", default=None, help="with a COCO json as --data: its images folder")
    parser.add_argument("--json", action="store_true", help="print the final report as JSON (implies --progress 0)")
    add_fields(parser, FitConfig, group="the run (FitConfig)", prefix="run_", suppress_defaults=True)
    add_fields(
        parser,
        StreamSettings,
        group="the stream (StreamSettings)",
        prefix="stream_",
        only=STREAM_FLAGS,
        suppress_defaults=True,
    )
    add_fields(
        parser,
        AugmentConfig,
        group="augmentation (AugmentConfig)",
        group_help=defaults_note(AugmentConfig, NOT_ULTRALYTICS_DEFAULTS, exclude=_AUG_SET),
        prefix="aug_",
        exclude=_AUG_SET,
        suppress_defaults=True,
    )
    add_negative_alias(parser, "--progress", dest="run_progress")
    parser.epilog = STOPPING_EPILOG


def given(args: argparse.Namespace) -> set[str]:
    """The setting paths of the flags given on the command line (``stream.seed``, ``epochs``, ...)."""
    out = set()
    for dest in vars(args):
        for prefix, path in _PREFIXES.items():
            if dest.startswith(prefix):
                out.add(path + dest[len(prefix) :])
    return out


def config_from_args(args: argparse.Namespace) -> FitConfig:
    """The FitConfig of the flags given, every other setting at its default."""
    augment = from_args(AugmentConfig, args, prefix="aug_")
    stream = from_args(StreamSettings, args, prefix="stream_", augment=augment)
    config = from_args(FitConfig, args, prefix="run_", stream=stream)
    if not config.resume:  # a resumed run's epochs are its checkpoint's
        config = dataclasses.replace(config, epochs=capped(config.epochs, "pixpool train"))
    return dataclasses.replace(config, progress=False) if args.json else config


def resume_command(args: argparse.Namespace, checkpoint) -> str:
    """The ``pixpool train`` line that continues the run of ``checkpoint`` against the same daemon
    (the run's settings come back from the checkpoint; only where to find the daemon and data is given)."""
    argv = ["pixpool", "train", "--resume", str(checkpoint)]
    for flag, value in (
        ("--socket-dir", args.socket_dir),
        ("--endpoint", args.endpoint),
        ("--keys", args.keys),
        ("--data", args.data),
        ("--images", args.images),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return shlex.join(argv)


# The exit status of a run a signal stopped: 128 + the signal's number, as a shell reports a
# process the signal killed (and as ``pixpool serve`` exits on SIGTERM).
EXIT_SIGINT, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGTERM
STOPPING_EPILOG = (
    "Ctrl-C (SIGINT) or SIGTERM (kill, systemd, Slurm, Kubernetes) stops the run the same way: the run's "
    "last checkpoint is kept and the line that resumes it printed; exit status 130 for SIGINT, 143 for SIGTERM."
)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that it unwinds the run as Ctrl-C does."""


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise _Terminated()


def run(args: argparse.Namespace) -> int:
    # SIGTERM's default ends the process where it stands: no checkpoint named, no word said.
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run(args)
    except _Terminated:  # before the run began (waiting for the daemon, loading torch, attaching)
        print("pixpool train: terminated (SIGTERM) before the run started; nothing to resume", file=sys.stderr)
        return EXIT_SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    from ..client._torch import require_torch
    from ..client.daemon_socket import await_daemon
    from ..client.options import ClientOptions
    from ..shared.transport import endpoint as ep

    # The settings first (a bad flag is named before anything else), then the daemon, before
    # torch loads (seconds): without a daemon there is nothing to train on.
    config = config_from_args(args)
    options = ClientOptions(
        socket_dir=args.socket_dir,
        endpoint=args.endpoint,
        keys_dir=args.keys,
        timeout_s=args.timeout_s,
        wait_s=args.wait_s,
    )
    await_daemon(args.endpoint or ep.ipc_endpoint(args.socket_dir), wait_s=args.wait_s)
    require_torch("pixpool train")
    from ..client.train.fit import fit
    from ..client.train.loss_text import loss_text

    total = {}

    def started(folder, run: FitConfig) -> None:
        total["epochs"] = run.epochs
        total["batch_size"] = run.stream.batch_size
        if not args.json:
            print(f"run folder {folder}" + (f" (resuming {run.resume})" if run.resume else ""), flush=True)

    def show(row: dict) -> None:
        if not args.json:
            val = f", mAP50 {row['mAP50']:.3f}, mAP50-95 {row['mAP50_95']:.3f}" if "mAP50" in row else ""
            print(
                f"epoch {row['epoch'] + 1}/{total['epochs']}: {loss_text(row, batch_size=total['batch_size'])}{val}, "
                f"{row['images_per_s']:.1f} img/s, "
                f"data wait {100 * row['data_wait_fraction']:.0f}%",
                flush=True,
            )

    from ..client.train.fit import Interrupted

    by_sigterm = {"yes": False}

    def on_sigterm(signum, frame) -> None:
        by_sigterm["yes"] = True
        _on_sigterm(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        report = fit(
            config,
            options,
            given=given(args),
            on_attached=started,
            on_epoch=show,
            data=args.data,
            images=args.images,
        )
    except Interrupted as stop:
        # fit() turns either signal's KeyboardInterrupt into Interrupted; which one it was is noted here.
        print(f"\n{'SIGTERM: ' if by_sigterm['yes'] else ''}{stop}", file=sys.stderr)
        if stop.checkpoint is not None:
            print(f"resume with: {resume_command(args, stop.checkpoint)}", file=sys.stderr)
        else:
            print("nothing to resume: run the same command again to start over", file=sys.stderr)
        return EXIT_SIGTERM if by_sigterm["yes"] else EXIT_SIGINT
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "history"}))
    else:
        print(
            f"run folder {report['run_dir']}: checkpoint {report.get('checkpoint')}; metrics {report['results']} "
            f"(draw them: pixpool plot {report['results']} -o results.png)"
        )
    return 0
