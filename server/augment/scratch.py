"""Per-thread reusable work buffers for the per-image passes of ``batch.write_image`` and ``hsv``.

Runs in whichever thread renders batches (a worker has one). Each buffer belongs to the
calling thread alone and is only ever used inside one function call: its contents are
unspecified on entry and nothing that outlives the call may point into it (results go
to caller-owned arrays). Reusing them saves an allocation (and the page faults of
first touching a fresh multi-megabyte array) per pass per image.
"""

from __future__ import annotations

import threading

import numpy as np

_local = threading.local()
_MAX_ENTRIES = 32  # ~11 names x shapes per imgsz (3- and 4-channel); bounded footprint


def buffer(name: str, shape: tuple[int, ...], dtype: type | np.dtype) -> np.ndarray:
    """This thread's C-contiguous buffer ``name`` of ``shape`` and ``dtype`` (contents unspecified)."""
    cache = getattr(_local, "buffers", None)
    if cache is None:
        cache = _local.buffers = {}
    key = (name, tuple(shape), np.dtype(dtype).str)
    buf = cache.get(key)
    if buf is None:
        if len(cache) >= _MAX_ENTRIES:
            cache.clear()
        buf = cache[key] = np.empty(shape, dtype=dtype)
    return buf
