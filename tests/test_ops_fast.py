"""Vectorized evaluations that keep the bits of the scalar ones they replace.

* The float32 tanh ops (tanh, sigmoid, gelu_tanh, silu; gelu_tanh and silu backward) run a
  vectorized float64 tanh and recompute with libm wherever the two could round differently:
  the results equal the libm evaluation of the same float64 formula (the definition of these
  ops, ``mpt.kernels.ops``) on a large sample of every kind of float32 input.
* The flash-attention kernels round P and dS to the input format in float64 bit arithmetic:
  equal to the ldexp/rint formulation on every format they round to.
"""
import math

import numpy as np
import pytest
from numba import njit

from mpt.formats import get_format
from mpt.kernels import ops
from mpt.kernels.attention import _round_format
from mpt.kernels.tanh_ops import tanh as fast_tanh

TANH_OPS = {"tanh": 2, "sigmoid": 3, "gelu_tanh": 5, "silu": 6}


@njit
def _libm_forward(x, op):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = np.float32(ops._f64(op, np.float64(x[i])))
    return out


@njit
def _libm_backward(x, g, op):
    out = np.empty_like(x)
    for i in range(x.size):
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


@pytest.mark.parametrize("name", sorted(TANH_OPS))
def test_tanh_ops_keep_the_libm_bits(name):
    op = TANH_OPS[name]
    x = _sample(1)
    with np.errstate(all="ignore"):
        assert np.array_equal(ops.unary(x, op).view(np.uint32),
                              _libm_forward(x, op).view(np.uint32))
        if op in (5, 6):
            g = _sample(2)[:x.size]
            np.random.default_rng(3).shuffle(g)
            assert np.array_equal(ops.unary_backward(x, g, op).view(np.uint32),
                                  _libm_backward(x, g, op).view(np.uint32))


@njit
def _tanh_ulps(x):
    """max |_tanh(x) − libm tanh(x)| in ulps of the latter."""
    worst = 0.0
    for i in range(x.size):
        t = math.tanh(x[i])
        if t != 0.0:
            worst = max(worst, abs(fast_tanh(x[i]) - t) / np.spacing(abs(t)))
    return worst


def test_vectorized_tanh_is_within_4_ulp_of_libm():
    """The bound the fallback thresholds of mpt.kernels.tanh_ops rest on (with a wide margin)."""
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.standard_normal(1 << 20) * s for s in (1e-4, 0.1, 1, 5, 30)])
    assert _tanh_ulps(x) <= 4


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
