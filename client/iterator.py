"""The old home of ``Client``, kept so that ``from pixpool.client.iterator import Client``
(the README's import before this release) still works; it will be removed in the next
release. Import ``Client`` and ``TrainerBatch`` from ``pixpool.client`` instead
(``client/client.py`` holds them).
"""

from .client import Client, TrainerBatch

__all__ = ["Client", "TrainerBatch"]
