"""A split read pass after pass, attached afresh for each pass: validation.

Runs in the trainer process. ``fit``'s validation stream (``client/train/fit.py``) and the
Ultralytics validation loader (``integrations/ultralytics/val_loader.py``) attach the daemon's
val split for each pass and detach after it, so that between passes a trainer costs the
service one ring, not two. What one attachment does by itself across a daemon restart
(``client.py``: it attaches again within ``timeout_s`` and stays on the snapshot it began on,
``snapshot_check.py``), a run of separate attachments must do across them, here:

- the first pass waits the run's ``wait_s`` for a daemon that is still starting, as the
  training stream's first attach does; a later pass finds the daemon that served the earlier
  ones gone (killed, restarting) as the training stream would at its next batch, and waits
  for it as the training stream does then: up to ``restart_wait_s`` (the run's ``timeout_s``,
  the training stream's budget for coming back; the run's ``wait_s`` where that is longer);
- the first pass's snapshot (its content fingerprint) is pinned: a later pass on another one
  (the daemon restarted on changed val labels at the same paths) raises
  ``SnapshotChangedError`` naming both, as the training stream does, unless ``follow``
  (``follow_snapshot``): then it warns and pins the new one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..shared.errors import SnapshotChangedError
from . import snapshot_check
from .options import ClientOptions

log = logging.getLogger(__name__)


class PassStreams:
    """Opens one attachment per pass over a split (module docstring).

    ``open_stream(wait_s)`` attaches and returns a ``Loader`` (or anything with ``.client``,
    whose ``snapshot`` and ``endpoint`` are the attachment's, and ``close()``). Of ``options``
    it reads the run's ``wait_s``, ``timeout_s`` (``restart_wait_s``) and ``follow_snapshot``."""

    def __init__(self, open_stream: Callable[[float], Any], options: ClientOptions, *, split: str = "val"):
        self._open = open_stream
        self.wait_s = options.wait_s
        self.restart_wait_s = max(options.wait_s, options.timeout_s)
        self.follow = bool(options.follow_snapshot)
        self.split = split
        self.pinned: dict = {}  # the first pass's snapshot (``snapshot_check.identity``)

    def open(self, *, what: str = "validation pass") -> Any:
        """Attach for one pass (``what`` names it in a refusal); the caller closes it."""
        stream = self._open(self.restart_wait_s if self.pinned else self.wait_s)
        try:
            self._check(stream.client.snapshot, endpoint=stream.client.endpoint, what=what)
        except BaseException:
            stream.close()  # detach: the daemon removes the ring it made for this pass
            raise
        return stream

    def _check(self, now: dict, *, endpoint: str, what: str) -> None:
        before = self.pinned
        if before and snapshot_check.changed(before, now):
            error = refusal(before, now, endpoint=endpoint, split=self.split, what=what)
            if not self.follow:
                raise error
            log.warning("following the daemon onto another snapshot (follow_snapshot=True): %s", error)
        self.pinned = dict(now)


def refusal(before: dict, after: dict, *, endpoint: str, split: str, what: str) -> SnapshotChangedError:
    """The error a pass stops with when the daemon serves another snapshot of ``split`` than
    the run's first pass read."""
    return SnapshotChangedError(
        f"the pixpool daemon at {endpoint} serves another snapshot of its {split} split than this run's first "
        f"pass read: the first pass read ({snapshot_check.describe(before)}), the daemon now serves "
        f"({snapshot_check.describe(after)}): {'; '.join(snapshot_check.differences(before, after))}. This {what} "
        "would measure the model on other data than the earlier passes (a daemon restarted on changed files at the "
        "same paths). Restart the daemon on the dataset this run began with, or start the run again on the new one; "
        "to go on with whatever the daemon serves, attach with follow_snapshot=True (pixpool train --follow-snapshot).",
        before=before,
        after=after,
    )
