"""``Housekeeping``: run the daemon's periodic steps so that an ``OSError`` in one never stops it.

Runs in the daemon process, inside its loop (``service.py``): every liveness tick checks the
snapshot's segments, the workers, the trainers, the authorized keys and the store, and
every ``sweeps.SWEEP_EVERY_S`` lists the store for rings nobody holds. Each of those opens
files or lists folders, and any of them can fail for a while: ``EMFILE`` when a flood of idle
connections has taken the descriptor table, ``ENOMEM``, ``EIO`` on a disk store.
Such a failure says nothing about the data being served, so it must not end the service
for every trainer: the step is skipped this tick, the error is counted (``errors``, per
step; the metrics endpoint publishes them) and logged, and the step runs again next tick.
Logging is bounded: the first failure of a step, then at most one line per
``LOG_EVERY_S`` while it keeps failing, and one line when it works again.
"""

from __future__ import annotations

import errno
import logging
import resource
import time
from collections.abc import Callable

__all__ = ["LOG_EVERY_S", "Housekeeping"]

log = logging.getLogger(__name__)

LOG_EVERY_S = 30.0


class Housekeeping:
    """Counts and logs the failures of the daemon's periodic steps (module docstring)."""

    def __init__(self, *, log_every_s: float = LOG_EVERY_S):
        self.log_every_s = log_every_s
        self.errors: dict[str, int] = {}  # step -> OSErrors since start
        self._failing: dict[str, tuple[int, float]] = {}  # step -> (failures in a row, when last logged)

    @property
    def errors_total(self) -> int:
        return sum(self.errors.values())

    def run(self, step: str, fn: Callable[..., object], *args: object) -> bool:
        """``fn(*args)``; False (counted, logged, to be retried) when it raised an OSError."""
        try:
            fn(*args)
        except OSError as exc:
            self.failed(step, exc)
            return False
        gone = self._failing.pop(step, None)
        if gone is not None:
            log.info("%s works again after %d failure(s) in a row", step, gone[0])
        return True

    def failed(self, step: str, exc: OSError) -> None:
        """Count and (rate-limited) log one failure of ``step``."""
        self.errors[step] = self.errors.get(step, 0) + 1
        now = time.monotonic()
        in_a_row, logged_at = self._failing.get(step, (0, -self.log_every_s))
        in_a_row += 1
        if now - logged_at >= self.log_every_s:
            log.warning(
                "%s failed (%d time(s) in a row, %d since start): %s; the daemon goes on and retries it next tick%s",
                step, in_a_row, self.errors[step], exc, _advice(exc),
            )  # fmt: skip
            logged_at = now
        self._failing[step] = (in_a_row, logged_at)


def _advice(exc: OSError) -> str:
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (
            f". The daemon's descriptors are all in use (limit {soft}, hard {hard}): look for a flood of idle "
            "connections to --tcp or --metrics-port (`ss -tn`), and raise the hard limit "
            "(systemd LimitNOFILE=, docker --ulimit nofile=)"
        )
    return ""
