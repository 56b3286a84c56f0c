"""What a pixpool Ultralytics run says once at start: the daemon it uses, and where its stream
differs from Ultralytics' own loader in this environment.

Runs in the trainer's process (the launching one: DDP ranks say nothing). Pure functions over
a daemon's ``status`` reply and the importable packages; nothing here imports Ultralytics, so
the unit tests run without it.

``daemon_line``: a run either attaches to the daemon that answers at its socket directory or
starts one; either way the user reads which (socket, pid, snapshot, workers, imgsz, task), so
that a run on someone else's daemon is never silent.

``albumentations_line``: where the ``albumentations`` package is importable, Ultralytics'
training route adds Blur, MedianBlur, ToGray and CLAHE at p=0.01 each (its
``data/augment.py`` ``Albumentations``); pixpool's route does not (docs/ultralytics.md says
why), and says so instead of differing silently.
"""

from __future__ import annotations

import importlib.util

from ...shared.wire.status import Status

__all__ = ["ALBUMENTATIONS_LINE", "albumentations_line", "daemon_line"]

ALBUMENTATIONS_LINE = (
    "pixpool: albumentations is installed: Ultralytics' own loader would add Blur, MedianBlur, ToGray, CLAHE "
    "at p=0.01 each; pixpool's stream does not (docs/ultralytics.md, 'Albumentations')"
)


def albumentations_line(*, find_spec=importlib.util.find_spec) -> str | None:
    """``ALBUMENTATIONS_LINE`` where ``albumentations`` can be imported here, else None.

    ``find_spec`` finds the package without importing it (its import is slow and checks the
    network for updates)."""
    try:
        found = find_spec("albumentations") is not None
    except (ImportError, ValueError):  # a broken install: Ultralytics' own import would fail too
        found = False
    return ALBUMENTATIONS_LINE if found else None


def daemon_line(status: Status | None, *, socket: str, started: bool) -> str:
    """One line naming the daemon at ``socket`` from its ``status`` reply: ``started`` by this
    run, or an already running one this run uses as it is."""
    what = "started daemon" if started else "using the running daemon"
    if status is None:
        pid, count, snap = "?", "?", "snapshot ? (? records, imgsz ?, task ?, ?)"
    else:
        s = status.snapshot
        pid, count = status.daemon.pid, len(status.workers)
        snap = (
            f"snapshot {_said(s.name)} ({s.records} records, imgsz {_said(s.imgsz)}, task {_said(s.task)}, "
            f"{_said(s.dtype)})"
        )
    return f"pixpool: {what} {pid} at {socket}: {snap}, {count} workers" + (
        "; it stops when training ends" if started else "; it keeps running after this run"
    )


def _said(value) -> str:
    return "?" if value is None else str(value)
