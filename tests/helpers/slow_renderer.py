"""A route for the fault tests: the real one, each part taking at least ``PART_S`` seconds.

A test that must catch a worker in the middle of a part (to SIGSTOP and kill it there) polls
the daemon's status between batches; with the real route a part of a few samples at a small
imgsz is over in milliseconds, so whether a poll ever lands inside one depended on how fast
the kernel was (a faster kernel made it miss). The wait comes after the real render,
before the part is reported, so the bytes are the real route's."""

from __future__ import annotations

import time

from pixpool.server.daemon.renderer import batch_size_of, max_targets, num_batches  # noqa: F401  (the route's interface)
from pixpool.server.daemon.renderer import render_range as _render_range

PART_S = 0.3


def render_range(source, settings, epoch, batch, start, stop, images_out, masks_out=None):
    began = time.monotonic()
    out = _render_range(source, settings, epoch, batch, start, stop, images_out, masks_out)
    time.sleep(max(0.0, PART_S - (time.monotonic() - began)))
    return out
