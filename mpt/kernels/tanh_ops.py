"""L1: the tanh ops of :mod:`mpt.kernels.ops` — tanh (2), sigmoid (3), gelu_tanh (5) and silu
(6), by their ``UNARY_OPS`` codes: each is a float64 formula around one tanh, evaluated with
libm's tanh and rounded once (:func:`libm_f64`, :func:`libm_df64`). The float32 kernels
(:func:`fast_forward` then :func:`fix_forward`, :func:`fast_backward` then :func:`fix_backward`,
run by ``ops.unary`` and ``ops.unary_backward`` in chunks of :data:`CHUNK`) give exactly those
bits at SIMD speed.

Exactness. Per element, :func:`forward` (f) and :func:`backward` (g·f') compute a float64 y
without libm and a bound ``reach`` with |y_libm − y| <= reach/2, y_libm the float64 value of the
definition. When fl32(y − reach) and fl32(y + reach) have the same bits and are not NaN, y_libm,
which lies between them (rounding is monotone), rounds to those bits too; otherwise libm
recomputes the element (about 2^-17 of N(0, 1) inputs; more where the definition's own last bits
decide, as in gelu_tanh below −4). The bounds, with u = 2^-53 (first order: the second-order
terms are below 2^-80):

* e = :func:`expm1_2a` (w) ≈ expm1(x), x = 2·min(|w|, 20). One fma into a shift constant rounds
  x/ln2 to an integer k (0 <= k <= 58), one fma gives r = fl(x − k·LN2): |r| <= 0.3466, within
  k·2^-55.2 + 0.35u of x − k·ln2 (|LN2 − ln2| < 2^-55.2; r = x for k = 0). The Taylor
  polynomial of degree 11 of expm1(r) is within ρ^11/12!·e^ρ/(1 − ρ/13) <= 2^-45.1 relatively
  (ρ = 0.3466); its fma Horner scheme adds < 2^-52. Then e = fma(2^k, p, 2^k − 1): scaling
  at most doubles p's relative error (k = 1: 2|p| <= 0.83 against e >= 0.41), r's error adds
  (k·2^-55.2 + 0.35u)·e^x/expm1(x) <= 2^-49.3 (e^x/expm1(x) <= 3.42 for k >= 1, <= 1.55 for
  k >= 2), the fma u: e is within 2^-43.9 of expm1(x) relatively (the tests find 2^-44.9).
* t = e/(e + 2), h = (1 + t)/2 = (e + 1)/(e + 2) for w >= 0 and 1/(e + 2) for w < 0, and
  h·m = (1 − t²)/4 = (e + 1)/(e + 2)² are each within 2^-43.9 + 5u relatively of their values at
  x (their relative sensitivity to e is <= 1), with no cancellation. Clamping |w| at 20 moves
  tanh by <= 2^-56.7 relatively, h and m by <= 2^-57.7 absolutely.
* libm's tanh is taken within 4 ulp: |t_L − tanh w| <= min(2^-51, 2^-50·|tanh w|) (glibc
  documents 2 ulp for double tanh). The definitions, with their few float64 roundings, are then
  within 2^-50·|y| (tanh), 2^-52 + 2^-52·|y| (sigmoid), 2^-52·|v| + 2^-51·|y| (gelu_tanh, silu)
  of their values with the exact tanh at the same float64 w; f' of gelu_tanh and silu,
  f' = h + z·h·m with z = 2v·du (gelu_tanh) or v (silu), within 2^-51 + 2^-50·|z| + u·|f'|,
  and the product with g adds u·|y|.
* Ours: y = t, h, or v·h within 2^-43.9 + 5u relatively (plus the clamp); f' = fma(z, h·m, h)
  within (h + |z|/4)·(2^-43.9 + 16u) + u·|f'| (h·m <= 1/4; gelu_tanh's z = v·fma(_Z2, v², _Z0)
  is within 10u of 2v·du, its constants rounded), and g·f' adds u·|y|.

``reach`` is at least twice the sum: E_REL = 2^-42 for the relative parts and 2^-50·|v|
(forward; 1 for sigmoid) for libm's; |g|·((h + |z|)·2^-41 + 2^-50) backward (|f'| <= h + |z|/4).
The factor 2 also covers the roundings of reach and of y ± reach (tests/test_ops_fast.py checks
|y_libm − y| <= reach/2 on samples of every kind of input, and the bits on every float32 input
with ``-m exhaustive``).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from mpt.kernels.exp_fast import (E_REL, INV_LN2, LN2, SHIFT, doubted, expm1_small, pow2_of,
                                  rounded)
from mpt.kernels.fma import fma64

__all__ = ["TANH_OPS", "CHUNK", "E_REL", "tanh_arg", "f64_of", "df64_of", "libm_f64", "libm_df64",
           "expm1_2a", "forward", "backward", "fast_forward", "fix_forward", "fast_backward",
           "fix_backward"]

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


_Z0, _Z2 = 2.0 * _SQRT_2_OVER_PI, 6.0 * _GELU_C * _SQRT_2_OVER_PI  # 2·du = _Z0 + _Z2·v²


@njit(inline="always", error_model="numpy")
def expm1_2a(w):
    """expm1(2·min(|w|, 20)) in float64 within 2^-43.9 relative (module docstring); NaN stays
    NaN. Vectorizable: 2|w| = k·ln2 + r, |r| <= 0.3466, and 2^k·(1 + p(r)) − 1 with p the
    degree-11 Taylor polynomial of expm1, by fused multiply-adds."""
    x = 2.0 * abs(w)
    x = 40.0 if x > 40.0 else x
    s = fma64(x, INV_LN2, SHIFT)           # SHIFT + k, k = x/ln2 rounded to an integer
    scale = pow2_of(s)
    return fma64(scale, expm1_small(fma64(s - SHIFT, -LN2, x)), scale - 1.0)


@njit(inline="always", error_model="numpy")
def forward(op, v):
    """(y, reach): f(v) of a tanh op by :func:`expm1_2a`, and a bound on its distance to
    :func:`libm_f64` (module docstring)."""
    w = tanh_arg(op, v)
    e = expm1_2a(w)
    if op == 2:
        y = math.copysign(e / (e + 2.0), w)
        return y, abs(y) * (2.0 * E_REL)
    h = (e + 1.0 if w >= 0.0 else 1.0) / (e + 2.0)   # (1 + tanh w)/2
    if op == 3:
        return h, h * E_REL + 2.0**-50
    y = v * h
    return y, abs(y) * E_REL + abs(v) * 2.0**-50


@njit(inline="always", error_model="numpy")
def backward(op, v, g):
    """(y, reach): g·f'(v) of gelu_tanh (5) or silu (6) by :func:`expm1_2a`, and a bound on its
    distance to g·:func:`libm_df64` (module docstring): f' = h + z·h·m with h = (1 + t)/2,
    h·m = (1 − t²)/4 = (e + 1)/(e + 2)², and z = 2v·du (gelu_tanh) or v (silu)."""
    w = tanh_arg(op, v)
    e = expm1_2a(w)
    rd = 1.0 / (e + 2.0)
    e1 = e + 1.0
    h = (e1 if w >= 0.0 else 1.0) * rd
    z = v * fma64(_Z2, v * v, _Z0) if op == 5 else v   # 2v·du within 10u (gelu_tanh)
    y = g * fma64(z, e1 * rd * rd, h)
    return y, abs(g) * fma64(h + abs(z), 2.0 * E_REL, 2.0**-50)


@njit(inline="always", error_model="numpy")
def fast_forward(x, out, doubt, op):
    """out = f(x) of a tanh op by :func:`forward` (op a constant where inlined: no branch in the
    loop, which vectorizes), doubt[i] = whether libm must decide out[i]; returns how many must.
    x, out, doubt: 1-D, one size (chunks: indices from 0 let LLVM see consecutive loads)."""
    unsure = 0
    for i in range(x.size):
        y, reach = forward(op, np.float64(x[i]))
        out[i], flag = rounded(y, reach)
        doubt[i] = flag
        unsure += flag
    return unsure


@njit(inline="always")
def fix_forward(x, out, doubt, op, n):
    """Recompute with libm the n values of out that :func:`fast_forward` doubts (a
    separate pass over their indices, taken rarely: a loop that tests doubt[i] before the call
    lets LLVM call the side-effect-free libm tanh for every element)."""
    for i in doubted(doubt, n):
        out[i] = np.float32(libm_f64(op, np.float64(x[i])))


@njit(inline="always", error_model="numpy")
def fast_backward(x, g, out, doubt, op):
    """out = g·f'(x) of gelu_tanh or silu by :func:`backward` (as :func:`fast_forward`)."""
    unsure = 0
    for i in range(x.size):
        y, reach = backward(op, np.float64(x[i]), np.float64(g[i]))
        out[i], flag = rounded(y, reach)
        doubt[i] = flag
        unsure += flag
    return unsure


@njit(inline="always")
def fix_backward(x, g, out, doubt, op, n):
    """Recompute with libm the n values of out that :func:`fast_backward` doubts."""
    for i in doubted(doubt, n):
        out[i] = np.float32(np.float64(g[i]) * libm_df64(op, np.float64(x[i])))
