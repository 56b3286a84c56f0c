"""The stream contract: what a trainer's batches are, agreed by both sides.

- ``config``: the settings dataclasses (one declaration per setting), validated once.
- ``route``: which route a stream's samples take (training, square or rect validation).
- ``rng``: every random draw derived from (seed, epoch, index) alone.
- ``sampler``: which record indices an epoch delivers, in which batches and shards.
- ``hsv_tables``: the HSV jitter's lookup tables, the same on the CPU and the device.
- ``records`` and ``source``: the record form readers produce and what the route reads.
- ``digest``: the SHA-256 of a delivered batch (equal digests, equal bytes).

Nothing here knows how bytes move (``pixpool.shared.transport``; ``config`` takes only the
default store's path from it), what a message is (``pixpool.shared.wire``) or how a command
line is parsed (``pixpool.cli``).
"""

from .._lazy import lazy_exports

_MODULES = ("config", "route", "rng", "sampler", "hsv_tables", "records", "source", "digest")
# The contract's names, each from its module; imported on first use like the modules themselves.
_WHERE = {
    "AugmentConfig": "config",
    "StreamSettings": "config",
    "DaemonConfig": "config",
    "FILL_VALUE": "config",
    "Route": "route",
    "Dataset": "records",
    "Record": "records",
    "Targets": "records",
    "ImageSource": "source",
    "batch_digest": "digest",
}

__all__, __getattr__ = lazy_exports(__name__, _MODULES, _WHERE)
