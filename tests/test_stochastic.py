"""Stochastic rounding: exact expectation over every random word, determinism, thread independence.

The kernels take the precision ``rbits`` of the random words as a RoundSpec field (32 in
``mpt.round``); enumerating all 2^rbits words at rbits = 12 checks the same code that runs at 32
(where full enumeration runs under ``-m exhaustive``).
"""
import time
from fractions import Fraction

import numba
import numpy as np
import pytest

import mpt
from mpt.formats import get_format
from mpt.kernels import rounding as K
from mpt.kernels.random import random_words
from mpt.reference import rounding as ref

R_BITS = 12


def neighbours(x: float, fmt):
    """(lo, hi, q): the magnitude neighbours of |x| on its binade's grid (exact rationals)."""
    fmt = get_format(fmt)
    v = abs(Fraction(x))
    e = v.numerator.bit_length() - v.denominator.bit_length()
    e -= Fraction(2) ** e > v
    q = Fraction(2) ** (max(e, fmt.emin) - fmt.mantissa_bits)
    lo = (v // q) * q
    return lo, lo + q, q


def sweep_words(x, fmt, rbits):
    """Values of each x rounded with every rbits-bit word: shape (x.size, 2^rbits), float64."""
    fmt = get_format(fmt)
    words = (np.arange(1 << rbits, dtype=np.uint64) << np.uint64(32 - rbits)).astype(np.uint32)
    xs = np.repeat(x, words.size)                                  # (n * 2^r,)
    ws = np.tile(words, x.size)                                    # (n * 2^r,)
    codes = np.empty(xs.size, np.uint64)
    K.round_bits_words(xs.view(np.uint32).astype(np.uint64), ws, codes, K.round_spec(
        fmt, np.float32, rbits=rbits))
    table = np.array([ref.decode_value(c, fmt) for c in range(1 << fmt.bits)])
    return table[codes.astype(np.int64)].reshape(x.size, words.size)


@pytest.mark.parametrize("fmt, deep", [("fp8_e4m3fn", True), ("fp8_e5m2", False),
                                       ("fp6_e2m3fn", True)])
def test_mean_over_all_words_is_exact(fmt, deep):
    """Every fp16 value in range (as float32): over all 2^12 words the result is lo or hi, hi for
    exactly floor((|x| - lo) / q * 2^12) words; so the mean is exactly x when the discarded part
    has <= 12 bits, and below |x| by less than 2^-12 q otherwise (the documented truncation:
    ``deep`` formats reach 13+ discarded bits on fp16's subnormals; e5m2 shares fp16's emin)."""
    f = get_format(fmt)
    x16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    x = x16[np.isfinite(x16) & (np.abs(x16) < f.max)][::7]          # ~9000 values, both signs
    results = sweep_words(x, fmt, R_BITS)                           # (n, 4096)
    exact_mean, biased = 0, 0
    for xi, row in zip(x.tolist(), results):
        lo, hi, q = neighbours(xi, fmt)
        sign = -1 if xi < 0 else 1
        ups = int(np.count_nonzero(row == sign * float(hi)))
        assert ups + int(np.count_nonzero(row == sign * float(lo))) == row.size
        frac = (abs(Fraction(xi)) - lo) / q
        assert ups == (frac * 2**R_BITS).__floor__()
        mean = lo + q * Fraction(ups, 2**R_BITS)
        if (frac * 2**R_BITS).denominator == 1:  # discarded part fits in R_BITS bits
            assert mean == abs(Fraction(xi))
            exact_mean += 1
        else:
            assert 0 < abs(Fraction(xi)) - mean < q / 2**R_BITS
            biased += 1
    assert exact_mean > 1000 and (biased > 10) == deep  # the regimes expected were exercised


def test_public_words_threshold_at_32_bits():
    """At 32 bits: word w rounds up iff w >= 2^32 - floor(frac * 2^32) (checked on both sides)."""
    x = np.array([1 + 2.0**-9, 1 + 3 * 2.0**-10 + 2.0**-23, -(2.0**-8) * 1.375, 300.0],
                 np.float32)
    for xi in x.tolist():
        lo, hi, q = neighbours(xi, "fp8_e4m3fn")
        p = ((abs(Fraction(xi)) - lo) / q * 2**32).__floor__()
        words = np.array([0, 2**32 - p - 1, 2**32 - p, 2**32 - 1], np.uint32)
        got = mpt.decode(mpt.round(np.full(4, xi, np.float32), "e4m3", "stochastic",
                                   random_bits=words), np.float64)
        sign = -1 if xi < 0 else 1
        assert got.tolist() == [sign * float(v) for v in (lo, lo, hi, hi)]


def test_same_seed_same_bits_for_one_and_two_threads():
    x = np.random.default_rng(0).standard_normal(5 * (1 << 14) + 3).astype(np.float32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = mpt.round(x, "bf16", "stochastic", seed=42, stream=7)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = mpt.round(x, "bf16", "stochastic", seed=42, stream=7)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(one.view(np.uint16), two.view(np.uint16))


def test_seeded_equals_explicit_generator_words():
    x = np.random.default_rng(1).standard_normal((3, 1000)).astype(np.float64)
    seeded = mpt.round(x, "fp16", "stochastic", seed=2**63 + 5, stream=3)
    explicit = mpt.round(x, "fp16", "stochastic",
                         random_bits=random_words(2**63 + 5, 3, x.size).reshape(x.shape))
    assert np.array_equal(seeded.view(np.uint16), explicit.view(np.uint16))
    other = mpt.round(x, "fp16", "stochastic", seed=2**63 + 5, stream=4)
    assert not np.array_equal(seeded.view(np.uint16), other.view(np.uint16))


def test_unbiased_on_average_in_practice():
    """Sanity on the public path: 2^16 copies of 1 + 2^-10 (1/8 of an e4m3 ulp above 1)."""
    x = np.full(1 << 16, 1 + 2.0**-10, np.float32)
    mean = mpt.decode(mpt.round(x, "e4m3", "stochastic", seed=9), np.float64).mean()
    # ups ~ Binomial(2^16, 1/8): sd of the mean is 0.125 * sqrt(7/8 / 8 / 2^16) < 2^-13; 5 sd
    assert abs(mean - (1 + 2.0**-10)) < 5 * 2.0**-13


@pytest.mark.exhaustive
@pytest.mark.parametrize("x", [1 + 2.0**-12 + 2.0**-20, -(1 + 3 * 2.0**-9)])
def test_all_2_to_32_words_give_the_exact_mean(x):
    """All 2^32 words through mpt.round (bf16: 16 discarded bits <= 32): the sum is 2^32 x."""
    start, counts, chunk = time.perf_counter(), np.zeros(1 << 16, np.int64), 1 << 24
    xs = np.full(chunk, x, np.float32)
    for lo in range(0, 1 << 32, chunk):
        words = np.arange(lo, lo + chunk, dtype=np.uint32)
        got = mpt.round(xs, "bf16", "stochastic", random_bits=words)
        counts += np.bincount(got.view(np.uint16), minlength=1 << 16)   # codes seen, how often
    total = sum(Fraction(ref.decode_value(c, "bf16")) * int(counts[c])
                for c in np.flatnonzero(counts))
    print(f"\nbf16 SR of {x!r}: all 2^32 words in {time.perf_counter() - start:.1f} s")
    assert np.count_nonzero(counts) == 2 and total == Fraction(x) * 2**32
