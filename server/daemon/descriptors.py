"""The daemon's file-descriptor limit: raised to the hard limit at start, and said.

Runs in the daemon process, once, when its listener opens (``listener.py``), before any
socket is bound. Every ipc and TCP connection, metrics scrape, worker pipe, ring and
snapshot segment holds a descriptor; the soft ``RLIMIT_NOFILE`` most service managers and
container runtimes start a process with is 1024, while the hard limit they allow is far
higher (systemd: 524288; Docker and containerd: 1048576 or 524288). A process may raise its
soft limit up to its hard limit without privilege, so the daemon does, and logs both: a
deployment whose hard limit is 1024 too is then visible in the log, with the setting to
change (``LimitNOFILE=`` in a systemd unit, ``ulimit -n``, ``--ulimit nofile=`` for Docker).
The workers it spawns inherit the raised limit.
"""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass

__all__ = ["DescriptorLimit", "open_descriptors", "raise_nofile_limit"]

log = logging.getLogger(__name__)

# Where the hard limit is "unlimited", the kernel still refuses a soft limit over
# fs.nr_open (1048576 by default); ask for no more than that.
_NR_OPEN_PATH = "/proc/sys/fs/nr_open"
_NR_OPEN_DEFAULT = 1 << 20


@dataclass(frozen=True)
class DescriptorLimit:
    """The soft limit before and after, and the hard limit."""

    soft_before: int
    soft: int
    hard: int


def raise_nofile_limit() -> DescriptorLimit:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; log what it has."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _nr_open() if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning(
                "could not raise the open-file limit from %d to the hard limit %s (%s); the daemon keeps %d",
                soft, _text(hard), exc, soft,
            )  # fmt: skip
            return DescriptorLimit(soft, soft, hard)
    limit = DescriptorLimit(soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
    if limit.soft <= 1024:
        log.warning(
            "the daemon may hold only %d open files (soft %d, hard limit %s): every connection, scrape, worker "
            "pipe and segment takes one; raise the hard limit (systemd LimitNOFILE=, `ulimit -Hn`, docker "
            "--ulimit nofile=)",
            limit.soft, limit.soft, _text(hard),
        )  # fmt: skip
    else:  # enough: a detail for debugging, nothing an operator acts on
        log.debug("open-file limit: %d (was %d; hard limit %s)", limit.soft, limit.soft_before, _text(hard))
    return limit


def open_descriptors() -> int | None:
    """How many descriptors this process has open now (``/proc/self/fd``); None where unknown."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one the listing itself held
    except OSError:
        return None


def _nr_open() -> int:
    try:
        with open(_NR_OPEN_PATH, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return _NR_OPEN_DEFAULT


def _text(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)
