"""Checkpoints of a training run: what they hold, and how a resumed run gets its settings back.

Runs in the trainer process (``fit``); torch is passed in by the caller, so the rules
(``resumed_config``, ``snapshot_refusal``) are pure and testable without it.

A checkpoint holds the step's state (model, EMA, optimizer, step count), the next epoch,
the RNG states, the best score, the run's settings (``fit_config.flat_settings``: every
non-transient setting by path, the stream's ``imgsz`` as the daemon served it) and the
identity of the snapshot the run trained on (``snapshot_check.identity``).

Resume rule: the checkpoint's settings come back, and the run writes into the checkpoint's
folder. A setting the user gave (a flag on the command line; from Python, a field that
differs from its default) must equal the saved one, else the resume is refused naming the
field, its flag and both values; run-only settings (``--val``, ``--val-batch-size``:
``fit_config.run_only_settings``) and transient ones (``--device``, ``--threads``,
``--progress``) may differ, and the given value holds from then on. ``epochs`` may grow only with ``extend`` (the schedule
is then no longer the one the run began with: ``FitConfig.extend``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ...shared.errors import ConfigError, SnapshotChangedError
from .. import snapshot_check
from .fit_config import FitConfig, flag_of_path, flat_settings, from_flat, run_only_settings

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 2


def save(folder: Path, state: dict, *, improved: bool, torch) -> Path:
    """Write ``last.pt`` (and ``best.pt`` when ``improved``); a killed save never leaves a half-written last.pt."""
    state = {"version": CHECKPOINT_VERSION, **state}
    last, tmp = folder / "last.pt", folder / "last.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, last)
    if improved:
        torch.save(state, folder / "best.pt")
    return last


def load(path: str, torch) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"checkpoint {p} does not exist; pass the last.pt of an earlier run (--resume)", field="resume"
        )
    state = torch.load(p, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
        found = state.get("version") if isinstance(state, dict) else None
        raise ConfigError(
            f"{p} is not a pixpool checkpoint of version {CHECKPOINT_VERSION} (found version {found!r}); "
            "resume it with the pixpool release that wrote it, or start a new run",
            field="resume",
        )
    return state


def resumed_config(config: FitConfig, ckpt: dict, *, given: set[str]) -> FitConfig:
    """``config`` with the checkpoint's settings restored and its folder as ``project`` (module docstring).

    ``given``: the setting paths the user set explicitly. Raises ConfigError naming every
    given setting that differs from the checkpoint (field, flag, both values), for an
    ``epochs`` change without ``extend``, and for a run that has nothing left to train."""
    where = config.resume
    saved = dict(ckpt["settings"])
    now = flat_settings(config)
    unknown = sorted(set(saved) - set(now))
    if unknown:
        log.warning("%s holds settings this pixpool does not know, ignored: %s", where, unknown)
    run_only = run_only_settings()
    changed = {p: now[p] for p in given if p in run_only}
    differ = [
        p
        for p in sorted(given)
        if p in saved and p in now and p != "epochs" and p not in run_only and now[p] != saved[p]
    ]
    folder = Path(where).parent
    if "project" in given and Path(config.project).resolve() != folder.resolve():
        differ.insert(0, "project")
        saved["project"] = str(folder)
        now["project"] = config.project
    if differ:
        listed = ", ".join(
            f"{flag_of_path(p)} {now[p]!r} (field {p!r}; the checkpoint has {saved[p]!r})" for p in differ
        )
        raise ConfigError(
            f"{where} was trained with other settings than given: {listed}. Leave these flags out to continue the "
            "run as it was saved, or start a new run without --resume",
            field=differ[0],
        )
    epochs, next_epoch = saved["epochs"], ckpt["next_epoch"]
    if "epochs" in given and config.epochs != epochs:
        if config.epochs < next_epoch or (not config.extend) or config.epochs < epochs:
            how = (
                "add --extend to train on to it: the LR decay is then recomputed over the new total and "
                "--close-mosaic counts from the new end, so it is not the run that was saved"
                if config.epochs > epochs
                else "a run can only grow (--epochs larger, with --extend)"
            )
            raise ConfigError(
                f"--epochs {config.epochs} (field 'epochs') differs from the checkpoint's {epochs} ({where}); {how}",
                field="epochs",
            )
        epochs = config.epochs
    elif config.extend:
        raise ConfigError(f"--extend needs --epochs larger than the checkpoint's {epochs} ({where})", field="extend")
    if next_epoch >= epochs:
        raise ConfigError(
            f"{where} already finished epoch {next_epoch} of {epochs}; to train on, pass a larger --epochs "
            "with --extend",
            field="epochs",
        )
    transient = {k: v for k, v in flat_settings(config, transient=True).items() if k not in now}
    restored = {**{k: v for k, v in saved.items() if k in now}, **changed}
    return from_flat({**restored, **transient, "epochs": epochs, "project": str(folder)})


def snapshot_refusal(before: dict, after: dict, *, checkpoint: str, endpoint: str) -> SnapshotChangedError:
    """The error a resume stops with when the daemon serves another snapshot than the run trained on."""
    return SnapshotChangedError(
        f"{checkpoint} was trained on ({snapshot_check.describe(before)}), the daemon at {endpoint} serves "
        f"({snapshot_check.describe(after)}): {'; '.join(snapshot_check.differences(before, after))}. Serve the "
        "dataset the run began with to continue it; to go on with this one, resume with --follow-snapshot "
        "(follow_snapshot=True)",
        before=before,
        after=after,
    )


def saved_snapshot(ckpt: dict) -> dict[str, Any] | None:
    """The snapshot identity a checkpoint recorded, or None."""
    snap = ckpt.get("snapshot")
    return snap if isinstance(snap, dict) and snap else None
