"""Where every random draw comes from: counters hashed with (seed, stream, epoch, index) alone.

Part of the stream contract both sides share: runs wherever a sample is rendered
(augmentation workers, the reference pipeline, the digest command) and, for the HSV gains,
in the trainer process.

Derivation (documented because trainers and tests rely on it). All arithmetic is on
unsigned 64-bit integers, wrapping modulo 2**64; ``fmix`` is SplitMix64's finaliser::

    fmix(x):  x ^= x >> 30;  x *= 0xBF58476D1CE4E5B9
              x ^= x >> 27;  x *= 0x94D049BB133111EB
              x ^= x >> 31
    absorb(h, v) = fmix((h + G) ^ v)                       G = 0x9E3779B97F4A7C15
    key(seed, stream, epoch, index)
        = absorb(absorb(absorb(absorb(0, seed), stream), epoch), index)
    uniform(seed, stream, epoch, index, counter)
        = (fmix(key + (counter + 1) * G) >> 11) * 2**-53   a float64 in [0, 1), 53 random bits

so a key's values are the outputs of a SplitMix64 generator started at ``key``, and any of
them is one evaluation, with no state to carry: a whole range of indices times counters is
one vectorised numpy evaluation (``uniforms``). For a fixed prefix ``absorb`` is a bijection
of its last argument, so two indices (or two epochs, or two streams) never share a key.

``stream`` separates independent uses of the same (seed, epoch, index):

- ``STREAM_SAMPLE`` (0): every geometric draw of record ``index``'s sample, counter 0, 1,
  2, ... in the order the route makes them (``Draws``): mosaic decision and partners, mosaic
  centre, affine parameters, copy-paste selection, mixup decision, partner and ratio, flips.
  ``Draws.state`` after the sample (key, counters used) is the "generator state" the parity
  tests compare.
- ``STREAM_HSV`` (1): the three HSV gains of record ``index``'s sample, counters 0..2. Kept
  apart so that the trainer can compute the very same gains from ``(seed, epoch, samples)``
  without re-running the geometric route (``pixpool.client.hsv_torch``).
- ``STREAM_SHUFFLE`` (2, index 0): the epoch's permutation of record indices, the one use
  that keeps a numpy ``Generator`` (``SeedSequence(entropy=seed, spawn_key=(2, epoch, 0))``
  -> PCG64), once per epoch.

Nothing here depends on the process, the worker, or how a batch is split into ranges: a
sample's draws are a function of (seed, epoch, record index) alone.
"""

from __future__ import annotations

import functools

import numpy as np

STREAM_SAMPLE = 0
STREAM_HSV = 1
STREAM_SHUFFLE = 2

#: Values of a sample's stream computed up front (``draws_for``): enough for a sample without
#: mixup, cutmix or copy-paste (a mosaic and its matrix take 15, the flips 2); later ones are
#: computed in blocks of this size when first asked for.
BLOCK = 32

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
_SCALE = 2.0**-53
# numpy forms of the constants, only ever combined with uint64 arrays (array arithmetic wraps
# silently; numpy's uint64 scalar arithmetic would warn on overflow).
_G64, _M1, _M2 = np.uint64(_GOLDEN), np.uint64(_MUL1), np.uint64(_MUL2)
_S11, _S27, _S30, _S31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)


def _fmix(x: int) -> int:
    """SplitMix64's finaliser on a Python int in [0, 2**64)."""
    x ^= x >> 30
    x = (x * _MUL1) & _MASK
    x ^= x >> 27
    x = (x * _MUL2) & _MASK
    return x ^ (x >> 31)


def _fmix_array(x: np.ndarray) -> np.ndarray:
    """``_fmix`` elementwise on a uint64 array (in place; returned)."""
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


def _absorb(h: int, value: int) -> int:
    return _fmix(((h + _GOLDEN) & _MASK) ^ (int(value) & _MASK))


def key(seed: int, epoch: int, index: int, *, stream: int = STREAM_SAMPLE) -> int:
    """The 64-bit key of ``(seed, stream, epoch, index)`` (the module docstring's ``key``)."""
    return _absorb(_absorb(_absorb(_absorb(0, seed), stream), epoch), index)


def keys(seed: int, epoch: int, indices, *, stream: int = STREAM_SAMPLE) -> np.ndarray:
    """uint64 (n,): ``key`` of each of ``indices`` at once."""
    prefix = _absorb(_absorb(_absorb(0, seed), stream), epoch)
    index = np.asarray(indices, dtype=np.int64).reshape(-1).astype(np.uint64)
    return _fmix_array(np.bitwise_xor(index, np.uint64((prefix + _GOLDEN) & _MASK)))


def uniforms(stream_keys: np.ndarray, start: int, count: int) -> np.ndarray:
    """float64 (n, count): counters ``start .. start + count`` of each of the uint64 (n,) keys."""
    counters = np.arange(start + 1, start + count + 1, dtype=np.uint64) * _G64
    x = _fmix_array(np.asarray(stream_keys, dtype=np.uint64).reshape(-1, 1) + counters)
    return (x >> _S11).astype(np.float64) * _SCALE


class Draws:
    """One sample's stream as a cursor over counters 0, 1, 2, ...: numpy ``Generator``'s
    methods that the route calls, on ``uniform(seed, stream, epoch, index, counter)``.

    ``values``: the stream's first values when already computed (a list the cursor only reads,
    so one list may back several ``Draws``); the rest are computed in blocks of ``BLOCK`` on
    first use. Every method takes the next counters in turn, so the values depend on the key and
    the order of the calls alone.
    """

    __slots__ = ("key", "counter", "_values")

    def __init__(self, stream_key: int, values: list[float] | None = None) -> None:
        self.key = stream_key
        self.counter = 0
        self._values: list[float] = [] if values is None else values

    @property
    def state(self) -> tuple[int, int]:
        """(key, counters used): equal for two ``Draws`` that made the same draws of one stream."""
        return self.key, self.counter

    def _take(self, n: int) -> list[float]:
        c = self.counter
        end = c + n
        if end > len(self._values):
            have = len(self._values)
            more = max(BLOCK, end - have)
            # A new list: a precomputed one may be shared and is never written.
            self._values = self._values + uniforms(np.array([self.key], np.uint64), have, more)[0].tolist()
        self.counter = end
        return self._values[c:end]

    def take(self, n: int) -> list[float]:
        """The next ``n`` values as a list of floats in [0, 1) (``n`` calls of ``random`` at once)."""
        c = self.counter
        end = c + n
        if end <= len(self._values):
            self.counter = end
            return self._values[c:end]
        return self._take(n)

    def random(self, size: int | None = None) -> float | np.ndarray:
        """One float in [0, 1) (``size`` None), else float64 (size,)."""
        if size is None:
            c = self.counter
            if c < len(self._values):
                self.counter = c + 1
                return self._values[c]
            return self._take(1)[0]
        return np.array(self._take(int(size)), dtype=np.float64)

    def integers(self, low: int, high: int | None = None, size: int | None = None) -> int | np.ndarray:
        """Integers in [low, high) (or [0, low) without ``high``): ``floor(u * (high - low)) + low``,
        one value each; an int (``size`` None), else int64 (size,)."""
        if high is None:
            low, high = 0, low
        low, span = int(low), int(high) - int(low)
        if span <= 0:
            raise ValueError(f"integers needs low < high, got [{low}, {low + span})")
        if size is None:
            return int(self.random() * span) + low
        return np.array([int(u * span) + low for u in self._take(int(size))], dtype=np.int64)

    def beta(self, a: float, b: float) -> float:
        """Beta(a, b) for integer ``a, b >= 1``, exactly: the ``a``-th smallest of ``a + b - 1``
        uniforms (their order statistic has that law); ``a + b - 1`` values of the stream."""
        if not (float(a).is_integer() and float(b).is_integer() and a >= 1 and b >= 1):
            raise ValueError(f"beta draws integer a, b >= 1 only, got a={a}, b={b}")
        a, b = int(a), int(b)
        if a + b == 2:
            return self.random()
        return sorted(self._take(a + b - 1))[a - 1]

    def permutation(self, x: int | np.ndarray) -> np.ndarray:
        """``x`` (an array, or ``arange(x)`` for an int) in the order of one uniform each (a
        stable argsort), a new array; ``len(x)`` values."""
        items = np.arange(x) if isinstance(x, (int, np.integer)) else np.asarray(x)
        order = np.argsort(np.array(self._take(len(items)), dtype=np.float64), kind="stable")
        return items[order]

    def choice(self, x: int | np.ndarray):
        """One element of ``x`` (or of ``arange(x)`` for an int), uniformly: one value."""
        if isinstance(x, (int, np.integer)):
            return self.integers(0, int(x))
        items = np.asarray(x)
        return items[self.integers(0, len(items))]


def draws_for(seed: int, epoch: int, indices, *, stream: int = STREAM_SAMPLE, count: int = BLOCK) -> list[Draws]:
    """One ``Draws`` per index of ``indices``, each with its first ``count`` values computed in
    one vectorised evaluation for the whole range; the same draws as ``sample_generator`` of
    each index, whatever the range."""
    stream_keys = keys(seed, epoch, indices, stream=stream)
    rows = uniforms(stream_keys, 0, count).tolist()
    return [Draws(k, row) for k, row in zip(stream_keys.tolist(), rows)]


def range_draws(
    seed: int, epoch: int, indices, hsv: tuple[float, float, float] | None = None
) -> tuple[list[Draws], np.ndarray | None]:
    """(``draws_for`` of ``indices``; with ``hsv`` = (hsv_h, hsv_s, hsv_v) their ``hsv_gains_for``,
    else None): both streams' keys and values in one vectorised evaluation, a range's fixed cost
    halved. Each value is the one ``uniforms`` gives its (key, counter) alone."""
    index = np.asarray(indices, dtype=np.int64).reshape(-1).astype(np.uint64)
    streams = (STREAM_SAMPLE, STREAM_HSV) if hsv is not None else (STREAM_SAMPLE,)
    prefixes = [_prefix(seed, s, epoch) for s in streams]
    stream_keys = _fmix_array(np.bitwise_xor(index[None, :], np.array(prefixes, np.uint64)[:, None]))
    values = uniforms(stream_keys.reshape(-1), 0, BLOCK)
    n = len(index)
    draws = [Draws(k, row) for k, row in zip(stream_keys[0].tolist(), values[:n].tolist())]
    if hsv is None:
        return draws, None
    return draws, (values[n:, :3] * 2.0 - 1.0) * np.array(hsv, dtype=np.float64) + 1.0


@functools.lru_cache(maxsize=64)
def _prefix(seed: int, stream: int, epoch: int) -> int:
    """What ``key`` xors an index with (before its last ``fmix``): the same for a whole range, and
    for every range of an epoch (a worker renders many)."""
    return (_absorb(_absorb(_absorb(0, seed), stream), epoch) + _GOLDEN) & _MASK


def sample_generator(seed: int, epoch: int, index: int) -> Draws:
    """The draws of every geometric draw of record ``index`` in ``epoch`` (computed on first use)."""
    return Draws(key(seed, epoch, index, stream=STREAM_SAMPLE))


def shuffle_generator(seed: int, epoch: int) -> np.random.Generator:
    """The generator of ``epoch``'s permutation."""
    seq = np.random.SeedSequence(entropy=int(seed), spawn_key=(STREAM_SHUFFLE, int(epoch), 0))
    return np.random.Generator(np.random.PCG64(seq))


def hsv_gains_for(seed: int, epoch: int, indices, hsv_h: float, hsv_s: float, hsv_v: float) -> np.ndarray:
    """float64 (n, 3) multiplicative gains for hue, saturation and value of each of ``indices``.

    Counters 0..2 of each sample's HSV stream, ``u * 2 - 1`` (uniform in [-1, 1)), scaled by the
    settings and offset by 1; the CPU lookup tables and the torch implementation both use this.
    """
    u = uniforms(keys(seed, epoch, indices, stream=STREAM_HSV), 0, 3)
    return (u * 2.0 - 1.0) * np.array([hsv_h, hsv_s, hsv_v], dtype=np.float64) + 1.0


def hsv_gains(seed: int, epoch: int, index: int, hsv_h: float, hsv_s: float, hsv_v: float) -> np.ndarray:
    """float64 (3,): ``hsv_gains_for`` of one index."""
    return hsv_gains_for(seed, epoch, [index], hsv_h, hsv_s, hsv_v)[0]
