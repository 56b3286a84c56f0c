"""A stand-in route for the wire tests of each task: rows of the task's width and mask planes.

Imported by name (``helpers.task_renderer``) in the daemon and its workers (``run_daemon``'s
``renderer=``) and in the test process, which renders the expected batches with the same
functions. Everything a sample gets is a function of (epoch, record index) and the source's
task, never of the range a worker renders, so any split of a batch gives the whole batch's
bytes, as the real route must (``server/daemon/renderer.py``):

- the image: a uint8 pattern of the record index and epoch;
- 0 to 3 target rows of ``TaskSpec.target_width`` columns: ``batch_index`` = the position in
  the batch, then seeded values (an obb angle, a pose row's keypoints: whatever the width);
- where the worker passes ``masks_out`` (a segment ring): a seeded plane whose values go up
  to ``PIXPOOL_TEST_MASK_MAX`` (default: the sample's row count), so a test can ask for
  values no uint8 holds.

``PIXPOOL_TEST_ROWS_BOUND`` sets the per-sample bound of ``max_targets`` (default 4): above 255
a segment ring's planes are int32. ``PIXPOOL_TEST_HANG_MARKER``: the first worker to render a
part holding position 0 of batch 1 writes its pid into that file, scribbles over its part of
the slot's images (and the planes it was handed), and hangs, so a test can kill it mid-part.
"""

from __future__ import annotations

import os
import time

import numpy as np

from pixpool.server.daemon.renderer import batch_size_of, num_batches  # noqa: F401  (the route's interface)
from pixpool.shared.stream import sampler

MAX_ROWS = 3


def max_targets(max_instances: int, settings) -> int:
    return int(os.environ.get("PIXPOOL_TEST_ROWS_BOUND", str(MAX_ROWS + 1))) * settings.batch_size


def rows_of(index: int, epoch: int) -> int:
    """Rows of record ``index`` in ``epoch``: 0..3, so some samples have none."""
    return (index * 7 + epoch) % (MAX_ROWS + 1)


def sample(source, epoch: int, index: int, position: int, side: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image uint8 (3, S, S), rows float32 (n, W), plane int64 (side, side)) of one sample."""
    width = source.spec.target_width()
    s = source.imgsz
    image = ((np.arange(3 * s * s, dtype=np.int64) + index * 31 + epoch * 7) % 251).astype(np.uint8)
    rng = np.random.default_rng([epoch, index])
    n = rows_of(index, epoch)
    rows = rng.random((n, width), dtype=np.float32)
    rows[:, 0] = position
    top = int(os.environ.get("PIXPOOL_TEST_MASK_MAX", "0")) or n
    plane = rng.integers(0, top + 1, (side, side))
    return image.reshape(3, s, s), rows, plane


def render_range(source, settings, epoch, batch, start, stop, images_out, masks_out=None):
    marker = os.environ.get("PIXPOOL_TEST_HANG_MARKER")
    if marker and batch == 1 and start == 0:
        try:
            os.close(os.open(marker + ".claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # once: the rerun goes on
        except FileExistsError:
            pass
        else:
            images_out[...] = 255  # a part half written when the worker dies: its rerun must overwrite it
            if masks_out is not None:
                masks_out[...] = 1
            with open(marker + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(marker + ".tmp", marker)  # the pid is complete before the test reads it
            time.sleep(600)  # killed by the test long before this ends
    samples = sampler.batch_samples(len(source), settings, epoch, batch)[start:stop]
    side = 0 if masks_out is None else masks_out.shape[-1]
    rows, counts = [], []
    for i, index in enumerate(samples.tolist()):
        image, r, plane = sample(source, epoch, index, start + i, side)
        images_out[i] = image
        if masks_out is not None:
            masks_out[i] = plane
        rows.append(r)
        counts.append(len(r))
    width = source.spec.target_width()
    targets = np.concatenate(rows) if rows else np.zeros((0, width), np.float32)
    return targets, np.asarray(counts, np.int64), np.asarray(samples, np.int64)


def expected_batch(source, settings, epoch: int, batch: int, mask_side: int, mask_dtype: str = "uint8"):
    """(images, targets, samples, masks or None) of a whole batch, rendered here as one range."""
    size = batch_size_of(len(source), settings, epoch, batch)
    images = np.zeros((size, 3, source.imgsz, source.imgsz), np.uint8)
    masks = np.zeros((size, mask_side, mask_side), mask_dtype) if mask_side else None
    targets, _, samples = render_range(source, settings, epoch, batch, 0, size, images, masks)
    return images, targets, samples, masks
