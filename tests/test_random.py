"""Philox4x32-10 (mpt.kernels.random): known answers, stream layout, thread independence."""
import numba
import numpy as np
import pytest
from numba import njit

from mpt.kernels.random import philox4x32, philox_word, random_words, split64

# Random123's kat_vectors, "philox4x32 10" lines: counter (4 words), key (2 words) -> 4 words.
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@njit
def _philox(c, k):
    u = np.uint64
    return philox4x32(u(c[0]), u(c[1]), u(c[2]), u(c[3]), u(k[0]), u(k[1]))


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_known_answers(counter, key, expected):
    assert tuple(int(w) for w in _philox(counter, key)) == expected


def test_stream_layout():
    """Word i of (seed, stream) is word i % 4 of Philox(counter=(i//4 lo, hi, stream lo, hi))."""
    seed, stream = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    words = random_words(seed, stream, 10)
    for i in (0, 3, 9):
        j = i // 4
        counter = (j & 0xFFFFFFFF, j >> 32, stream & 0xFFFFFFFF, stream >> 32)
        key = (seed & 0xFFFFFFFF, seed >> 32)
        assert words[i] == _philox(counter, key)[i % 4]
    assert words[5] == philox_word(split64(seed), split64(stream), 5)


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, (1 << 14) + 6, 3 * (1 << 14) + 1])
def test_any_length_is_a_prefix_of_the_stream(n):
    long = random_words(7, 1, n + 9)
    assert np.array_equal(random_words(7, 1, n), long[:n])


def test_streams_and_seeds_differ():
    base = random_words(1, 0, 64)
    assert not np.array_equal(base, random_words(2, 0, 64))
    assert not np.array_equal(base, random_words(1, 1, 64))


def test_independent_of_thread_count():
    n = 5 * (1 << 14) + 3  # several parallel tasks and a ragged end
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = random_words(11, 4, n)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = random_words(11, 4, n)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(one, two)


@pytest.mark.parametrize("seed, stream, n, match", [
    (-1, 0, 3, "seed"), (1 << 64, 0, 3, "seed"), (0, -2, 3, "stream"), (0, 0, -1, "n"),
])
def test_bad_arguments(seed, stream, n, match):
    with pytest.raises(ValueError, match=match):
        random_words(seed, stream, n)
    with pytest.raises(TypeError, match="seed"):
        random_words(1.5, 0, 3)
