"""Where every random draw comes from: generators derived from (seed, epoch, index) alone.

Part of the stream contract both sides share: runs wherever a sample is rendered
(augmentation workers, the reference pipeline, the digest command) and, for the HSV gains,
in the trainer process.

Derivation (documented because trainers and tests rely on it)::

    SeedSequence(entropy=seed, spawn_key=(stream, epoch, index))  ->  PCG64  ->  Generator

``stream`` separates independent uses of the same (seed, epoch, index):

- ``STREAM_SAMPLE`` (0): every geometric draw of record ``index``'s sample: mosaic
  decision and partners, mosaic centre, affine parameters, copy-paste selection, mixup
  decision, partner and ratio, flips. Its ``bit_generator.state`` after the sample is the
  "generator state" the parity tests compare.
- ``STREAM_HSV`` (1): the three HSV gains of record ``index``'s sample. Kept apart so that
  the trainer can draw the very same gains on the device from ``(seed, epoch, samples)``
  without re-running the geometric route (``pixpool.client.hsv_torch``).
- ``STREAM_SHUFFLE`` (2, index 0): the epoch's permutation of record indices.

``spawn_key`` always has three entries, so no two streams can alias. Nothing here
depends on the process, the worker, or the order samples are rendered in.
"""

from __future__ import annotations

import numpy as np

STREAM_SAMPLE = 0
STREAM_HSV = 1
STREAM_SHUFFLE = 2


def generator(seed: int, epoch: int, index: int, *, stream: int = STREAM_SAMPLE) -> np.random.Generator:
    """A fresh generator for ``(seed, epoch, index)`` in ``stream``."""
    seq = np.random.SeedSequence(entropy=int(seed), spawn_key=(int(stream), int(epoch), int(index)))
    return np.random.Generator(np.random.PCG64(seq))


def sample_generator(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of every geometric draw of record ``index`` in ``epoch``."""
    return generator(seed, epoch, index, stream=STREAM_SAMPLE)


def shuffle_generator(seed: int, epoch: int) -> np.random.Generator:
    """The generator of ``epoch``'s permutation."""
    return generator(seed, epoch, 0, stream=STREAM_SHUFFLE)


def hsv_gains(seed: int, epoch: int, index: int, hsv_h: float, hsv_s: float, hsv_v: float) -> np.ndarray:
    """float64 (3,) multiplicative gains for hue, saturation and value of one sample.

    One ``uniform(-1, 1, 3)`` draw from the sample's HSV stream, scaled by the settings
    and offset by 1; the CPU lookup tables and the torch implementation both use this.
    """
    draw = generator(seed, epoch, index, stream=STREAM_HSV).uniform(-1.0, 1.0, 3)
    return draw * np.array([hsv_h, hsv_s, hsv_v], dtype=np.float64) + 1.0
