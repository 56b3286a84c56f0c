"""``StoreWatch``: warn when the store the daemon serves from runs low on free space.

Runs in the daemon process, checked every liveness tick of its loop (``service.py``).
"""

from __future__ import annotations

import logging

from ...shared.transport.store import DEFAULT, Store, free_nbytes, size_nbytes

__all__ = ["StoreWatch"]

log = logging.getLogger(__name__)


class StoreWatch:
    """Warns once when the store's free space falls under a threshold, and once when it recovers.

    The default threshold is a tenth of the store's size: below it, the next preparation or
    ring may be refused and other programs using that file system may fail."""

    def __init__(self, warn_free_nbytes: int | None, store: Store = DEFAULT):
        self.store = store
        self.size_nbytes = size_nbytes(store)
        self.warn_free_nbytes = self.size_nbytes // 10 if warn_free_nbytes is None else warn_free_nbytes
        self.low = False

    def check(self) -> bool:
        """True while free space is under the threshold."""
        free = free_nbytes(self.store)
        low = free < self.warn_free_nbytes
        if low and not self.low:
            log.warning(
                "the store %s has %d bytes free of %d, under the warning threshold of %d; remove old snapshots (`pixpool clean`), "
                "detach trainers, or enlarge it",
                self.store,
                free,
                self.size_nbytes,
                self.warn_free_nbytes,
            )
        elif self.low and not low:
            log.info("the store %s has %d bytes free again (threshold %d)", self.store, free, self.warn_free_nbytes)
        self.low = low
        return low
