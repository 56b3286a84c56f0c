"""The break-even: from how many trainers on a shared service costs less than a decoded cache each.

Code both sides import: ``pixpool plan`` and the daemon's start-up check state it before
anything is decoded (``server/snapshot/planning.py``), ``pixpool memory`` from what the
processes hold (``ops/memory_report.py``); one formula, so the two say the same.
"""

from __future__ import annotations

import math


def break_even(fixed_bytes: float, ring_bytes: float | None, decoded_bytes: float) -> int | None:
    """Smallest N with N x decoded >= fixed + N x ring; None if it never comes (or ring unknown)."""
    if ring_bytes is None or decoded_bytes <= ring_bytes:
        return None
    return max(1, math.ceil(fixed_bytes / (decoded_bytes - ring_bytes)))
