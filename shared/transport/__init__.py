"""How bytes and messages move: stores, segments, rings, endpoints, and the processes around them.

- ``names``: every segment name, built and parsed from one prefix.
- ``store``, ``shm``, ``holds``: the store directory, one mapped segment, and who holds it.
- ``ring``: a trainer's batch slots.
- ``endpoint`` and ``control``: where a daemon listens, CURVE keys, one-shot requests.
- ``procmem``: what processes hold, measured from the kernel.
- ``spawn``: how children start (never with the working directory on ``sys.path``).
"""

from .._lazy import lazy_exports

_MODULES = ("names", "store", "shm", "holds", "ring", "endpoint", "control", "procmem", "spawn")
# The names most code takes from here, each from its module; imported on first use.
_WHERE = {
    "DEFAULT_STORE": "names",
    "Store": "store",
    "SharedSegment": "shm",
    "Ring": "ring",
    "RingLayout": "ring",
    "ProcessMemory": "procmem",
    "process_memory": "procmem",
}

__all__, __getattr__ = lazy_exports(__name__, _MODULES, _WHERE)
