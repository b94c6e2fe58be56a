"""Vectorized evaluations that keep the bits of the scalar ones they replace.

* The float32 tanh ops (tanh, sigmoid, gelu_tanh, silu; gelu_tanh and silu backward) run a
  vectorized float64 evaluation and recompute with libm wherever the two could round
  differently: the results equal the libm evaluation of the same float64 formula (the
  definition of these ops, ``mpt.kernels.ops``) on samples of every kind of float32 input,
  hypothesis-drawn bit patterns and a dense sweep (every float32 with ``-m exhaustive``); the
  error bounds the recomputation rests on hold with their margin of 2.
* exp and exp2 of float32 arguments (``mpt.kernels.exp_fast``: the flash-attention and
  cross-entropy kernels) keep libm's bits the same way, on the same kinds of inputs, and their
  bound holds with its margin of 2.
* The flash-attention kernels round P and dS to the input format in float64 bit arithmetic:
  equal to the ldexp/rint formulation on every format they round to.
"""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import njit, prange

from mpt.formats import get_format
from mpt.kernels import exp_fast, ops, tanh_ops
from mpt.kernels.attention import _round_format

TANH_OPS = {"tanh": 2, "sigmoid": 3, "gelu_tanh": 5, "silu": 6}


@njit(parallel=True)
def _libm_forward(x, op):
    out = np.empty_like(x)
    for i in prange(x.size):
        out[i] = np.float32(ops._f64(op, np.float64(x[i])))
    return out


@njit(parallel=True)
def _libm_backward(x, g, op):
    out = np.empty_like(x)
    for i in prange(x.size):
        out[i] = np.float32(np.float64(g[i]) * ops._df64(op, np.float64(x[i])))
    return out


def _sample(seed, n=1 << 18):
    """Normal values at scales from 1e-6 to 100, random float32 patterns (subnormals, huge
    values, Inf, NaN), and the special values."""
    rng = np.random.default_rng(seed)
    normal = [(rng.standard_normal(n) * s).astype(np.float32) for s in (1e-6, 0.01, 1, 3, 10, 100)]
    patterns = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    specials = np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 3e38, -3e38], np.float32)
    return np.concatenate(normal + [patterns, specials])


def _assert_libm_bits(x, g):
    """Every tanh op forward on x, and gelu_tanh and silu backward on (x, g), bit for bit."""
    with np.errstate(all="ignore"):
        for name, op in TANH_OPS.items():
            assert np.array_equal(ops.unary(x, op).view(np.uint32),
                                  _libm_forward(x, op).view(np.uint32)), name
            if op in (5, 6):
                assert np.array_equal(ops.unary_backward(x, g, op).view(np.uint32),
                                      _libm_backward(x, g, op).view(np.uint32)), name


def test_tanh_ops_keep_the_libm_bits():
    x = _sample(1)
    g = _sample(2)[:x.size]
    np.random.default_rng(3).shuffle(g)
    _assert_libm_bits(x, g)


_WORDS = st.lists(st.integers(0, (1 << 32) - 1), min_size=1, max_size=300)


@given(_WORDS, _WORDS)
def test_tanh_ops_keep_the_libm_bits_on_any_float32_patterns(xw, gw):
    x = np.array(xw, np.uint32).view(np.float32)
    g = np.resize(np.array(gw, np.uint32), x.size).view(np.float32)
    _assert_libm_bits(x, g)


def _sweep(first, stride, count):
    """``count`` float32 bit patterns ``first, first + stride, …`` (modulo 2^32), and g: the same
    patterns in another order (all classes: zeros, subnormals, normals, Inf, NaN)."""
    words = (first + stride * np.arange(count, dtype=np.uint64)) & 0xFFFFFFFF
    x = words.astype(np.uint32).view(np.float32)
    g = ((words * 2654435761) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return x, g


def test_tanh_ops_keep_the_libm_bits_on_a_sweep():
    """Every 1021st float32 pattern (4.2M inputs, every binade of both signs)."""
    _assert_libm_bits(*_sweep(7, 1021, ((1 << 32) + 1020) // 1021))


@pytest.mark.exhaustive
@pytest.mark.parametrize("part", range(16))
def test_tanh_ops_keep_the_libm_bits_on_every_float32(part):
    """Every float32 input (a sixteenth per case), g a permutation of the same patterns."""
    step = 1 << 24
    for first in range(part << 28, (part + 1) << 28, step):
        _assert_libm_bits(*_sweep(first, 1, step))


@njit
def _expm1_rel_err(w):
    """max |expm1_2a(w) − expm1(2|w|)| / expm1(2|w|) over w with 2|w| <= 40 (libm's expm1)."""
    worst = 0.0
    for i in range(w.size):
        want = math.expm1(2.0 * abs(w[i]))
        if want != 0.0:
            worst = max(worst, abs(tanh_ops.expm1_2a(w[i]) - want) / want)
    return worst


def test_expm1_2a_is_within_its_bound():
    """The module docstring's 2^-43.9 (libm's expm1: within 1 ulp, 2^-52)."""
    rng = np.random.default_rng(4)
    w = np.concatenate([rng.uniform(0, 20, 1 << 20), -rng.uniform(0, 0.2, 1 << 18),
                        rng.standard_normal(1 << 18) * 1e-6, np.linspace(0, 20, 1 << 18),
                        [5e-324, 1e-300, 2.0**-30, 0.17328679513998632, 20.0]])
    assert _expm1_rel_err(w) <= 2.0**-43.9 + 2.0**-52
    assert tanh_ops.expm1_2a(25.0) == tanh_ops.expm1_2a(-20.0) == tanh_ops.expm1_2a(20.0)
    assert math.isnan(tanh_ops.expm1_2a(math.nan))


@njit
def _worst_reach_ratio(x, g, op, backward):
    """max |libm result − vectorized y| / reach over x (finite y and reach only)."""
    worst = 0.0
    for i in range(x.size):
        v, gi = np.float64(x[i]), np.float64(g[i])
        if backward:
            y, reach = tanh_ops.backward(op, v, gi)
            want = gi * tanh_ops.libm_df64(op, v)
        else:
            y, reach = tanh_ops.forward(op, v)
            want = tanh_ops.libm_f64(op, v)
        if abs(y) < np.inf and reach < np.inf and abs(want) < np.inf:
            worst = max(worst, abs(want - y) / reach if reach > 0 else (
                0.0 if want == y else np.inf))
    return worst


@pytest.mark.parametrize("name", sorted(TANH_OPS))
def test_reach_bounds_the_libm_distance_with_a_margin(name):
    """The docstring's bounds hold with their margin of 2 on normal values at many scales and
    random float32 patterns."""
    op = TANH_OPS[name]
    x, g = _sample(5), _sample(6)
    with np.errstate(all="ignore"):
        assert _worst_reach_ratio(x, np.ones_like(x), op, False) <= 0.5
        if op in (5, 6):
            assert _worst_reach_ratio(x, g[:x.size], op, True) <= 0.5


@njit
def _doubted(x, g, op):
    out, doubt = np.empty_like(x), np.empty(x.size, np.bool_)
    if op == 5:
        return tanh_ops.fast_forward(x, out, doubt, 5), tanh_ops.fast_backward(x, g, out, doubt, 5)
    return tanh_ops.fast_forward(x, out, doubt, 6), tanh_ops.fast_backward(x, g, out, doubt, 6)


def test_libm_decides_few_values_of_normal_inputs():
    """The speed contract: on N(0, 1) inputs the vectorized path decides all but ~2^-12."""
    rng = np.random.default_rng(7)
    x, g = (rng.standard_normal(1 << 20).astype(np.float32) for _ in range(2))
    for op in (5, 6):
        assert max(_doubted(x, g, op)) < x.size >> 10


@njit(parallel=True)
def _libm_exp(x, base2):
    """W(libm exp2(x)) or W(libm exp(x)) per element: the definition."""
    out = np.empty_like(x)
    for i in prange(x.size):
        v = np.float64(x[i])
        out[i] = np.float32(np.exp2(v) if base2 else math.exp(v))
    return out


@njit
def _fast_exp(x, base2):
    out, doubt = np.empty_like(x), np.empty(x.size, np.bool_)
    exp_fast.exp_into(x, out, doubt, base2)
    return out


def _assert_exp_bits(x):
    for base2 in (True, False):
        assert np.array_equal(_fast_exp(x, base2).view(np.uint32),
                              _libm_exp(x, base2).view(np.uint32)), base2


def test_exp_keeps_the_libm_bits():
    """Normal values at many scales, the range ends (the clamps: ±151 / 128, -105 / 89, where
    results turn 0 or Inf), random patterns and the specials."""
    edges = np.array([-151, -150.5, -150, -149.5, -149, -126, -105, -104, -103.5, 88.5, 88.75,
                      89, 127.5, 128, 129], np.float32)
    near = np.concatenate([np.nextafter(edges, np.float32(np.inf)),
                           np.nextafter(edges, np.float32(-np.inf))])
    _assert_exp_bits(np.concatenate([_sample(8), edges, near,
                                     np.random.default_rng(9).uniform(-160, 130, 1 << 20)
                                     .astype(np.float32)]))


@given(_WORDS)
def test_exp_keeps_the_libm_bits_on_any_float32_patterns(xw):
    _assert_exp_bits(np.array(xw, np.uint32).view(np.float32))


def test_exp_keeps_the_libm_bits_on_a_sweep():
    _assert_exp_bits(_sweep(7, 1021, ((1 << 32) + 1020) // 1021)[0])


@pytest.mark.exhaustive
@pytest.mark.parametrize("part", range(16))
def test_exp_keeps_the_libm_bits_on_every_float32(part):
    step = 1 << 24
    for first in range(part << 28, (part + 1) << 28, step):
        _assert_exp_bits(_sweep(first, 1, step)[0])


@njit
def _worst_exp_reach_ratio(x, base2):
    """max |libm result − exp_near's y| / reach over x (finite results only)."""
    worst = 0.0
    for i in range(x.size):
        v = np.float64(x[i])
        y, reach = exp_fast.exp_near(v, base2)
        want = np.exp2(v) if base2 else math.exp(v)
        if 0.0 < want < np.inf:
            worst = max(worst, abs(want - y) / reach)
    return worst


def test_exp_reach_bounds_the_libm_distance_with_a_margin():
    """The module docstring's bound holds with its margin of 2 inside the clamps, where y is
    libm's value's approximation (outside, both round to the same 0 or Inf)."""
    rng = np.random.default_rng(10)
    x2 = rng.uniform(-151, 128, 1 << 20).astype(np.float32)
    xe = rng.uniform(-105, 89, 1 << 20).astype(np.float32)
    assert _worst_exp_reach_ratio(x2, True) <= 0.5
    assert _worst_exp_reach_ratio(xe, False) <= 0.5


@njit
def _exp_doubts(x, base2):
    out, doubt = np.empty_like(x), np.empty(x.size, np.bool_)
    return exp_fast.fast_exp(x, out, doubt, base2)


def test_libm_decides_few_exponentials():
    """The speed contract: on the arguments softmax sees (x − max, N(0, 3) logits) the
    vectorized path decides all but ~2^-17."""
    x = -np.abs(np.random.default_rng(11).standard_normal(1 << 20) * 3).astype(np.float32)
    for base2 in (True, False):
        assert _exp_doubts(x, base2) < x.size >> 12


@njit
def _round_format_all(x, rnd):
    out = np.empty(x.size)
    for i in range(x.size):
        out[i] = _round_format(x[i], rnd)
    return out


@njit
def _ldexp_rint(x, rnd):
    """The formulation _round_format replaced: frexp, ldexp and rint in float64."""
    mant, emin, largest = rnd
    out = np.empty(x.size)
    for i in range(x.size):
        v = np.float64(x[i])
        if mant < 0 or v == 0 or not abs(v) < np.inf:
            out[i] = v
            continue
        g = max(math.frexp(v)[1] - 1, emin) - mant
        r = math.ldexp(np.rint(math.ldexp(v, -g)), g)
        out[i] = r if abs(r) <= largest else math.copysign(np.inf, r)
    return out


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3fn", "fp8_e5m2"])
def test_attention_rounding_equals_ldexp_rint(fmt):
    f = get_format(fmt)
    rnd = (f.mantissa_bits, f.emin, float(f.max))
    x = _sample(5)
    got, want = _round_format_all(x, rnd), _ldexp_rint(x, rnd)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint64), want[~nan].view(np.uint64))
