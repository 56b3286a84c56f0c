"""The prepared snapshot: decode once, keep in shared memory, attach by name.

Runs in the preparing process (``pixpool prepare``, the daemon at start-up), its decode
workers, and every process that reads a snapshot (augmentation workers, ``pixpool ls``).
Modules: ``layout`` (byte layout, pure arithmetic), ``fingerprint`` (what names a
snapshot), ``decode`` (file -> centred float32), ``prepare`` and ``decode_worker`` (the
all-or-nothing preparation), ``handle`` (``Snapshot``: attach read-only, release),
``reference`` (the no-snapshot source the parity tests compare against).

Names are imported on first use: a spawned decode worker imports ``decode_worker`` and
must not pay for numpy and OpenCV before it has limited their threads.
"""

from importlib import import_module

__all__ = ["prepare_snapshot", "PrepareResult", "PreparationTerminated", "Snapshot", "list_snapshots", "read_header", "ReferenceSource", "fingerprint"]

_WHERE = {
    "prepare_snapshot": "prepare", "PrepareResult": "prepare", "PreparationTerminated": "prepare", "Snapshot": "handle",
    "list_snapshots": "handle", "read_header": "handle", "ReferenceSource": "reference", "fingerprint": "fingerprint",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
