"""The augmentation route as the daemon and its workers call it, behind one module name.

Runs in the daemon (batch counts, slot sizing) and in every worker (rendering). The daemon
and its workers receive the route as a module *name* (a string, so it crosses the spawn
boundary without pickling code); the default is this module, which forwards to the
augmentation package (``pixpool.server.augment``). Tests may name another module with the
same four functions to drive the daemon with a stand-in renderer.

A route module provides:

- ``num_batches(num_records, settings, epoch) -> int``
- ``batch_size_of(num_records, settings, epoch, batch) -> int``
- ``max_targets(max_instances, settings) -> int``
- ``render(source, settings, epoch, batch, images_out) -> (targets float32 (n,6), samples int64 (b,))``
  writing the uint8 (b, 3, S, S) images into ``images_out``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np

DEFAULT_ROUTE = __name__


def load(name: str | None) -> ModuleType:
    return importlib.import_module(name or DEFAULT_ROUTE)


def num_batches(num_records: int, settings, epoch: int) -> int:
    from .augment import sampler

    return int(sampler.num_batches(num_records, settings, epoch))


def batch_size_of(num_records: int, settings, epoch: int, batch: int) -> int:
    from .augment import sampler

    return int(len(sampler.batch_samples(num_records, settings, epoch, batch)))


def max_targets(max_instances: int, settings) -> int:
    from .augment.batch import max_targets as _max_targets

    return int(_max_targets(max_instances, settings))


def render(source, settings, epoch: int, batch: int, images_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from .augment.batch import render_batch

    out = render_batch(source, settings, epoch, batch, images_out=images_out)
    if not np.shares_memory(out.images, images_out):
        # The route could not write in place (it should); keep the slot correct anyway.
        images_out[...] = out.images
    return out.targets, out.samples
