"""``sweep_store``: remove what dead processes left in the store (rings, temporary files).

Runs in the daemon process: when its listener binds (rings), and every ``SWEEP_EVERY_S`` while
it serves (both). A live daemon maps each of its rings, so a ring nobody holds
(``shared.holds``) is a dead daemon's, whatever the pid in its name (PID 1 in every
container); a writer holds its temporary file until it is published, so one nobody holds is a
killed writer's (``shared.transport.publish.sweep_debris``).
"""

from __future__ import annotations

import logging
import os

from ...shared.transport.store import DEFAULT, Store

__all__ = ["SWEEP_EVERY_S", "sweep_rings", "sweep_store"]

log = logging.getLogger(__name__)

# How often a serving daemon sweeps the store for rings nobody holds: a killed daemon's
# ring goes within this long of its trainer letting go of it (a trainer that moves to a
# new ring removes the old one itself; this covers one that could not).
SWEEP_EVERY_S = 5.0


def sweep_rings(store: Store = DEFAULT) -> list[str]:
    """Remove this user's batch rings that no process holds (``shared.holds.remove_unused``):
    a live daemon holds every ring it serves and a trainer the ring it reads, in any PID
    namespace, so a ring nobody holds is a dead daemon's leftover. Returns the names removed."""
    from ...shared.transport.holds import remove_unused
    from ...shared.transport.names import parse
    from ...shared.transport.trusted import owner_of

    uid = os.geteuid()
    gone = []
    for name in store.segments():
        parsed = parse(name)
        if parsed is None or parsed.kind != "ring" or parsed.uid != uid or owner_of(name, store) != uid:
            continue
        if remove_unused([name], store) == "removed":
            gone.append(name)
    if gone:
        log.warning(
            "removed %d batch ring(s) that no process holds (their daemon died without cleaning up): %s",
            len(gone),
            ", ".join(gone),
        )
    return gone


def sweep_store(store: Store = DEFAULT) -> None:
    """``sweep_rings`` and this user's temporary files that no writer holds."""
    from ...shared.transport.publish import sweep_debris

    sweep_rings(store)
    sweep_debris(store)
