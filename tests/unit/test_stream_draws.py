"""The stream's counter-based draws (``shared.stream.rng``): the documented hash, ``Draws``'s
numpy-like methods, and that a sample's draws and HSV gains depend on its key alone."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from helpers.sources import ArraySource
from pixpool.server.augment.batch import SquarePlacement
from pixpool.server.augment.labels import pack
from pixpool.server.augment.record import Reader
from pixpool.shared.stream import rng
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.stream.hsv_tables import tables, tables_for
from pixpool.shared.stream.rng import BLOCK, Draws, draws_for, hsv_gains, hsv_gains_for, sample_generator

MASK = (1 << 64) - 1
G = 0x9E3779B97F4A7C15


def _fmix(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _uniform(seed: int, stream: int, epoch: int, index: int, counter: int) -> float:
    """The module docstring's definition, written again with Python ints."""
    h = 0
    for v in (seed, stream, epoch, index):
        h = _fmix(((h + G) & MASK) ^ v)
    return (_fmix((h + (counter + 1) * G) & MASK) >> 11) * 2.0**-53


def test_splitmix64_finaliser_and_sequence_are_the_known_ones():
    # SplitMix64 from state 0: its published first outputs.
    assert [_fmix((k * G) & MASK) for k in (1, 2, 3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert [rng._fmix((k * G) & MASK) for k in (1, 2, 3)] == [_fmix((k * G) & MASK) for k in (1, 2, 3)]


@pytest.mark.parametrize("seed", [0, 1, 7, (1 << 63) - 1])
def test_values_follow_the_documented_definition(seed):
    for stream in (rng.STREAM_SAMPLE, rng.STREAM_HSV):
        for epoch, index in ((0, 0), (3, 11), (250, 1 << 40)):
            key = rng.key(seed, epoch, index, stream=stream)
            got = rng.uniforms(np.array([key], np.uint64), 0, 70)[0].tolist()
            assert got == [_uniform(seed, stream, epoch, index, c) for c in range(70)]
            assert rng.keys(seed, epoch, [index, index], stream=stream).tolist() == [key, key]


def test_same_key_same_draws_in_any_range_split():
    indices = np.array([5, 0, 17, 3, 9, 12, 4, 8, 1000, 2], np.int64)
    alone = [sample_generator(11, 2, int(i)).random(BLOCK + 40).tolist() for i in indices]
    for parts in (1, 2, 3, 10):
        got = []
        for piece in np.array_split(indices, parts):
            got.extend(d.random(BLOCK + 40).tolist() for d in draws_for(11, 2, piece))
        assert got == alone
    # Precomputed or computed on demand, one value at a time or in blocks: the same values.
    a, b = draws_for(11, 2, [17], count=4)[0], Draws(rng.key(11, 2, 17))
    assert [a.random() for _ in range(BLOCK + 9)] == b.random(BLOCK + 9).tolist() == alone[2][: BLOCK + 9]
    assert a.state == b.state == (rng.key(11, 2, 17), BLOCK + 9)


def test_same_draws_in_another_process():
    code = "from pixpool.shared.stream.rng import sample_generator as g; print(g(3, 4, 5).random(50).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(sample_generator(3, 4, 5).random(50).tolist())


def test_different_streams_differ():
    first = {}
    for seed in (0, 1):
        for stream in (rng.STREAM_SAMPLE, rng.STREAM_HSV, rng.STREAM_SHUFFLE):
            for epoch in (0, 1, 2):
                for index in range(50):
                    key = rng.key(seed, epoch, index, stream=stream)
                    first[(seed, stream, epoch, index)] = rng.uniforms(np.array([key], np.uint64), 0, 2)[0].tolist()
    values = [tuple(v) for v in first.values()]
    assert len(set(values)) == len(values)


def test_uniforms_statistics():
    u = rng.uniforms(rng.keys(0, 0, np.arange(1000)), 0, 100).ravel()  # 1e5 values
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.005  # sd of the mean ~0.0009
    assert abs(u.var() - 1 / 12) < 0.002
    counts = np.bincount((u * 10).astype(int), minlength=10)
    assert counts.min() > 9500 and counts.max() < 10500  # each decile 10000 +- ~95
    # adjacent counters uncorrelated, and adjacent indices at one counter
    grid = u.reshape(1000, 100)
    assert abs(np.corrcoef(grid[:, :-1].ravel(), grid[:, 1:].ravel())[0, 1]) < 0.02
    assert abs(np.corrcoef(grid[:-1].ravel(), grid[1:].ravel())[0, 1]) < 0.02
    # 53 bits: the low bits vary too
    assert len(np.unique((u * 2.0**53).astype(np.int64) & 0xFF)) == 256


def test_beta_is_the_order_statistic_with_the_right_law():
    d = sample_generator(1, 0, 0)
    values = d.random(63).tolist()
    assert sample_generator(1, 0, 0).beta(32, 32) == sorted(values)[31]
    one = sample_generator(1, 0, 0)
    assert one.beta(1.0, 1.0) == values[0] and one.state[1] == 1
    b = np.array([g.beta(32.0, 32.0) for g in draws_for(5, 0, np.arange(20000))])
    assert abs(b.mean() - 0.5) < 0.002 and abs(b.std() - 0.0620) < 0.002  # sd = 1 / (2 sqrt(65))
    with pytest.raises(ValueError):
        sample_generator(0, 0, 0).beta(0.5, 2)


def test_integers_choice_and_permutation():
    d = sample_generator(2, 0, 3)
    u = sample_generator(2, 0, 3).random(200).tolist()
    three = d.integers(0, 7, size=3)
    assert three.dtype == np.int64 and three.tolist() == [int(x * 7) for x in u[:3]]
    one = d.integers(10, 20)
    assert type(one) is int and one == 10 + int(u[3] * 10)
    assert d.integers(5) == int(u[4] * 5)
    items = np.array([4, 8, 15, 16, 23, 42])
    assert d.choice(items) == items[int(u[5] * 6)]
    perm = d.permutation(items)
    assert perm.tolist() == items[np.argsort(u[6:12], kind="stable")].tolist()
    assert sorted(d.permutation(5).tolist()) == [0, 1, 2, 3, 4]
    assert d.state[1] == 17
    assert isinstance(d.random(3), np.ndarray) and d.random(0).shape == (0,)
    many = np.concatenate([g.integers(0, 3, size=100) for g in draws_for(0, 0, np.arange(300))])
    assert set(many.tolist()) == {0, 1, 2} and abs(np.bincount(many).min() - 10000) < 400
    with pytest.raises(ValueError):
        d.integers(3, 3)


def test_copy_paste_selection_keeps_working_on_draws():
    # copy_paste draws with ``rng.random(n) < fraction`` in places and ``permutation``: both kinds
    # of result must be arrays.
    d = sample_generator(0, 0, 0)
    assert (d.random(4) < 0.5).dtype == bool


def test_vectorised_hsv_gains_and_tables_equal_the_per_index_ones():
    indices = np.array([0, 3, 3, 99, 1 << 33], np.int64)
    gains = hsv_gains_for(4, 1, indices, 0.015, 0.7, 0.4)
    assert gains.shape == (5, 3) and gains.dtype == np.float64
    for row, i in zip(gains, indices.tolist()):
        assert row.tobytes() == hsv_gains(4, 1, i, 0.015, 0.7, 0.4).tobytes()
        u = [_uniform(4, rng.STREAM_HSV, 1, i, c) for c in range(3)]
        assert row.tolist() == [(x * 2.0 - 1.0) * s + 1.0 for x, s in zip(u, (0.015, 0.7, 0.4))]
    stacked = tables_for(gains)
    assert stacked.shape == (5, 3, 256) and stacked.dtype == np.uint8
    for row, g in zip(stacked, gains):
        assert row.tobytes() == tables(g).tobytes()
    edge = np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [2.0, 1.7, 0.3], [0.985, 255.0, 1e-3]])
    assert all(a.tobytes() == tables(g).tobytes() for a, g in zip(tables_for(edge), edge))
    g = hsv_gains_for(4, 1, np.arange(20000), 0.015, 0.7, 0.4)
    assert (np.abs(g - 1.0) <= [0.015, 0.7, 0.4]).all()
    assert np.allclose(g.mean(axis=0), 1.0, atol=0.01)


def test_range_draws_are_draws_for_and_hsv_gains_for():
    indices = np.array([0, 3, 3, 99, 1 << 33], np.int64)
    draws, gains = rng.range_draws(4, 1, indices, (0.015, 0.7, 0.4))
    assert gains.tobytes() == hsv_gains_for(4, 1, indices, 0.015, 0.7, 0.4).tobytes()
    alone, none = rng.range_draws(4, 1, indices)
    assert none is None
    for a, b, c in zip(draws, alone, draws_for(4, 1, indices)):
        assert a.state == b.state == c.state
        assert a.take(BLOCK + 3) == b.take(BLOCK + 3) == c.take(BLOCK + 3)
    # the values past the first block, and a fresh generator's
    assert draws[1].random() == sample_generator(4, 1, 3).take(BLOCK + 4)[-1]


def test_a_record_twice_in_a_span_renders_the_same_both_times():
    # The span's precomputed draws serve a record once; its second render makes its own, the same.
    src = ArraySource([(64, 64), (48, 64), (64, 40)], 64, seed=2, instances=3)
    st = StreamSettings(seed=4, batch_size=4, augment=AugmentConfig(imgsz=64, mixup=1.0, copy_paste=0.5))
    records = [1, 2, 1, 1]
    place = SquarePlacement(Reader.of(src), st, 0, np.array(records, np.int64))
    out = np.zeros((len(records), 3, 64, 64), np.uint8)
    labels = place.draw_range(out, None, None)
    assert out[0].tobytes() == out[2].tobytes() == out[3].tobytes() != out[1].tobytes()
    assert pack(labels[0], 64).tobytes() == pack(labels[2], 64).tobytes() == pack(labels[3], 64).tobytes()
