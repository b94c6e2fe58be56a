"""L1: the tanh ops of :mod:`mpt.kernels.ops` — tanh (2), sigmoid (3), gelu_tanh (5) and silu
(6), by their ``UNARY_OPS`` codes: each is a float64 formula around one tanh, evaluated with
libm's tanh and rounded once (:func:`libm_f64`, :func:`libm_df64`). The float32 kernels
(:func:`fast_forward`, :func:`fix_forward`, :func:`fast_backward`, run by ``ops.unary`` and
``ops.unary_backward`` in chunks of :data:`CHUNK`) give exactly those bits at SIMD speed.

The float64 formula runs with :func:`tanh` below, which is vectorizable, and every value whose
float64 result lies so close to a float32 rounding boundary that the two tanh could round
differently is recomputed with libm. :func:`tanh` is within 4 ulp of libm's tanh on every
tested input (tests/test_ops_fast.py; both are within ~2.5 ulp of the exact tanh), so
|t − tanh_libm| <= 2^-50 (|t| <= 1) and relatively 2^-49; the bounds ``_reach`` / ``_dreach``
take 2^-48 / 2^-46 to cover that and the few float64 roundings after it, with room to spare. A
result r is kept when r ± its bound round to the same float32.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from mpt.kernels.mma import _from_bits, f32_bits

__all__ = ["TANH_OPS", "CHUNK", "tanh_arg", "f64_of", "df64_of", "libm_f64", "libm_df64",
           "tanh", "fast_forward", "fix_forward", "fast_backward"]

_SQRT_2_OVER_PI = 0.7978845608028654      # sqrt(2/pi)
_GELU_C = 0.044715                        # tanh-approximation coefficient (Hendrycks & Gimpel)
TANH_OPS = (2, 3, 5, 6)                   # tanh, sigmoid, gelu_tanh, silu: one tanh each
CHUNK = 4096                              # elements per parallel task of the float32 kernels


@njit(inline="always")
def tanh_arg(op, v):
    """The argument w of the one tanh in f (and f') of a tanh op."""
    if op == 2:
        return v
    if op == 5:
        return _SQRT_2_OVER_PI * (v + _GELU_C * v * v * v)
    return 0.5 * v


@njit(inline="always")
def f64_of(op, v, t):
    """f(v) of a tanh op given t = tanh(tanh_arg(op, v)): the float64 operations of
    :func:`libm_f64`."""
    if op == 2:
        return t
    if op == 3:
        return 0.5 * t + 0.5
    if op == 5:
        return 0.5 * v * (1.0 + t)
    return v * (0.5 * t + 0.5)


@njit(inline="always")
def df64_of(op, v, t):
    """f'(v) of gelu_tanh (5) or silu (6) given t: the float64 operations of
    :func:`libm_df64`."""
    if op == 5:
        du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * v * v)
        return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du
    s = 0.5 * t + 0.5
    return s * (1.0 + v * (1.0 - s))


@njit(inline="always")
def libm_f64(op, v):
    """f(v) of a tanh op in float64, with libm's tanh (the definition of these ops)."""
    return f64_of(op, v, math.tanh(tanh_arg(op, v)))


@njit(inline="always")
def libm_df64(op, v):
    """f'(v) of gelu_tanh (5) or silu (6) in float64, with libm's tanh."""
    return df64_of(op, v, math.tanh(tanh_arg(op, v)))


_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")   # ln 2, high part (k·ln2_hi exact for k < 2^11)
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")  # ln 2 − ln2_hi
_INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
# 1/n! for n = 2 .. 14 (Taylor series of exp(r) − 1 − r; |r| <= ln2/2: remainder < 2^-61 |r|)
_E2, _E3, _E4, _E5, _E6, _E7, _E8, _E9, _E10, _E11, _E12, _E13, _E14 = (
    1.0 / math.factorial(n) for n in range(2, 15))


@njit(inline="always", error_model="numpy")
def _expm1_pos(x):
    """exp(x) − 1 for 0 <= x <= 40, vectorizable: x = k·ln2 + r, |r| <= ln2/2, and
    2^k·(1 + p(r)) − 1 = (2^k − 1) + 2^k·p(r) with p the Taylor polynomial of degree 14."""
    k = np.floor(x * _INV_LN2 + 0.5)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = ((((((((((((_E14 * r + _E13) * r + _E12) * r + _E11) * r + _E10) * r + _E9) * r + _E8)
              * r + _E7) * r + _E6) * r + _E5) * r + _E4) * r + _E3) * r + _E2)
    p = r + r * r * p
    scale = _from_bits((np.int64(k) + 1023) << 52)
    return (scale - 1.0) + scale * p


@njit(inline="always", error_model="numpy")
def tanh(u):
    """tanh(u) in float64, vectorizable: e/(e + 2) with e = expm1(2|u|) (no cancellation); u for
    |u| < 2^-26, ±1 past |u| = 20 (where tanh rounds to ±1); NaN gives a finite value (callers
    recompute NaN results with libm)."""
    a = abs(u)
    e = _expm1_pos(2.0 * (a if a < 20.0 else 20.0))
    t = e / (e + 2.0)
    t = a if a < 2.0**-26 else t
    return math.copysign(t, u)


@njit(inline="always")
def _reach(op, v, y):
    """How far f(v) of a tanh op may move with a tanh off by 2^-50 (module docstring)."""
    if op == 2:
        return abs(y) * 2.0**-46
    if op == 3:
        return 2.0**-46
    return (abs(v) + abs(y)) * 2.0**-46


@njit(inline="always")
def _dreach(op, v, d):
    """How far f'(v) of gelu_tanh (5) or silu (6) may move with a tanh off by 2^-50."""
    if op == 5:
        du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * v * v)
        return (1.0 + abs(v * du)) * 2.0**-46 + abs(d) * 2.0**-50
    return (1.0 + 2.0 * abs(v)) * 2.0**-46 + abs(d) * 2.0**-50


@njit(inline="always")
def _unsure(v, y, reach):
    """Whether y ± reach may round to different float32 patterns (a zero's sign included), or
    the input v is a NaN (whose payload libm's path decides)."""
    return (f32_bits(np.float32(y - reach)) != f32_bits(np.float32(y + reach))) | (v != v)


@njit(inline="always", error_model="numpy")
def fast_forward(x, out, lo, hi, op):
    """out[lo:hi] = f(x) of a tanh op with :func:`tanh` (op a constant where inlined: no branch
    in the loop, which vectorizes); returns how many need libm."""
    unsure = 0
    for i in range(lo, hi):
        v = np.float64(x[i])
        y = f64_of(op, v, tanh(tanh_arg(op, v)))
        out[i] = np.float32(y)
        unsure += _unsure(v, y, _reach(op, v, y))
    return unsure


@njit(inline="always", error_model="numpy")
def fix_forward(x, out, lo, hi, op):
    """Recompute with libm the values of out[lo:hi] that :func:`fast_forward` is unsure of (a
    separate pass, taken rarely: under ``if unsure`` in the fast loop, LLVM would call the side-
    effect-free libm for every element)."""
    for i in range(lo, hi):
        v = np.float64(x[i])
        y = f64_of(op, v, tanh(tanh_arg(op, v)))
        if _unsure(v, y, _reach(op, v, y)):
            out[i] = np.float32(libm_f64(op, v))


@njit(inline="always", error_model="numpy")
def fast_backward(x, g, out, lo, hi, op, fix):
    """out[lo:hi] = g·f'(x) of gelu_tanh or silu with :func:`tanh` (as :func:`fast_forward`); with
    ``fix``, recompute with libm the values it is unsure of (as :func:`fix_forward`)."""
    unsure = 0
    for i in range(lo, hi):
        v, gi = np.float64(x[i]), np.float64(g[i])
        d = df64_of(op, v, tanh(tanh_arg(op, v)))
        y = gi * d
        doubt = _unsure(v, y, abs(gi) * _dreach(op, v, d) + abs(y) * 2.0**-50)
        if fix:
            if doubt:
                out[i] = np.float32(gi * libm_df64(op, v))
        else:
            out[i] = np.float32(y)
            unsure += doubt
    return unsure
