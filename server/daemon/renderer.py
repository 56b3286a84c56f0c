"""The batch renderer as the daemon and its workers call it, behind one module name.

Runs in the daemon (batch counts, slot sizing) and in every worker (rendering). The daemon
and its workers receive the renderer as a module *name* (a string, so it crosses the spawn
boundary without pickling code); the default is this module, which forwards to the
augmentation package (``pixpool.server.augment``) and the stream contract
(``pixpool.shared.stream.sampler``). The name is an explicit parameter of ``run_daemon`` and
``Daemon`` (``renderer=``, default ``DEFAULT_RENDERER``): tests pass a stand-in module with the
same four functions (a wedged renderer, say, ``tests/helpers/stuck_renderer.py``).

A renderer module provides:

- ``num_batches(num_records, settings, epoch) -> int``
- ``batch_size_of(num_records, settings, epoch, batch) -> int``
- ``max_targets(max_instances, settings) -> int``: target rows a batch may have (the ring
  gives each sample position ``ceil(max_targets / batch_size)`` of them)
- ``render_range(source, settings, epoch, batch, start, stop, images_out[, masks_out=]) ->
  (targets float32 (n, W), counts int (stop - start,), samples int64 (stop - start,))``:
  sample positions ``start .. stop`` of the batch, writing their uint8 (stop - start, 3, S, S)
  images into ``images_out``; ``targets`` are their rows in sample order with
  ``batch_index`` = the position in the whole batch, W = ``TaskSpec.target_width`` of the
  source's task, ``counts[i]`` the rows of position ``start + i``. Only for a ring with masks
  (segment) the worker passes ``masks_out`` (stop - start, M, M), zeroed, of the ring's mask
  dtype: the overlap planes go there (the worker copies them into the slot). The bytes must
  not depend on the range: every split of a batch into ranges gives, concatenated, the whole
  batch (the daemon splits by its worker count).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np

from ...shared.stream import sampler

DEFAULT_RENDERER = __name__


def load(name: str) -> ModuleType:
    """The renderer module called ``name`` (imported in the daemon and in each worker)."""
    return importlib.import_module(name)


def num_batches(num_records: int, settings, epoch: int) -> int:
    return int(sampler.num_batches(num_records, settings, epoch))


def batch_size_of(num_records: int, settings, epoch: int, batch: int) -> int:
    return int(len(sampler.batch_samples(num_records, settings, epoch, batch)))


def max_targets(max_instances: int, settings) -> int:
    from ..augment.batch import max_targets as _max_targets

    return int(_max_targets(max_instances, settings))


def render_range(
    source,
    settings,
    epoch: int,
    batch: int,
    start: int,
    stop: int,
    images_out: np.ndarray,
    masks_out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from ..augment.batch import render_range as _render_range

    # The mask keyword only where there are masks: the route of the tasks without them is called as always.
    extra = {} if masks_out is None else {"masks_out": masks_out}
    out = _render_range(source, settings, epoch, batch, start, stop, images_out=images_out, **extra)
    if not np.shares_memory(out.images, images_out):
        # The route could not write in place (it should); keep the slot correct anyway.
        images_out[...] = out.images
    if masks_out is not None:
        masks = getattr(out, "masks", None)
        if masks is None or tuple(masks.shape) != tuple(masks_out.shape):
            raise ValueError(
                f"the route returned masks of shape {None if masks is None else tuple(masks.shape)} for samples "
                f"{start}..{stop} of batch {batch}; the ring's mask planes are {tuple(masks_out.shape)} "
                "(mask_side = imgsz // mask_ratio)"
            )
        if not np.shares_memory(masks, masks_out):
            masks_out[...] = masks
    return out.targets, out.counts, out.samples
