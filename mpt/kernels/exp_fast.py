"""L1: exp and exp2 of float32 arguments, rounded once to float32, at SIMD speed with the bits of
libm — and the machinery the vectorized tanh ops (:mod:`mpt.kernels.tanh_ops`) share with them.

The kernels define ``W(exp(x))`` and ``W(exp2(x))`` for a float32 x as libm's float64 ``exp`` /
``exp2`` of the exact x, rounded once (RNE) to float32 (``mpt.kernels.ops``,
``mpt.kernels.attention``). A libm call per element does not vectorize. :func:`exp_into`
computes a float64 y without libm and a bound ``reach`` with |y_libm − y| <= reach/2; when
fl32(y − reach) and fl32(y + reach) have the same bits and are not NaN, y_libm, which lies
between them (rounding is monotone), rounds to those bits too; otherwise libm recomputes the
element (about 2^-17 of them: a float32 rounding boundary within 2^-42 relatively of y).

Bounds, with u = 2^-53. The argument is clamped to [-151, 128] (exp2) or [-105, 89] (exp): below,
the exact result is under 2^-150 and rounds to +0 in float32, above it is at least 2^128 and
rounds to +Inf, so both roundings agree with libm's whatever the clamp gives (a NaN stays NaN and
goes to libm). Then x = k + r (exp2: k = x rounded to an integer, r = x − k exact, t = fl(r·ln2))
or x = k·ln2 + t (exp: one fma into a shift constant rounds x/ln2 to k, one fma gives
t = fl(x − k·LN2), within k·2^-55.2 + 0.35u of x − k·ln2; |k| <= 152); |t| <= 0.3466 either way,
with an error below 2^-47.9. :func:`expm1_small`, the degree-11 Taylor polynomial of expm1(t) by
fma Horner steps, is within 2^-45.1 relatively (ρ^12/12!·e^ρ/(1 − ρ/13), ρ = 0.3466, plus
< 2^-52 for the steps), so 1 + p within 2^-45.8 (|p|/(1 + p) <= 0.59), and y = fma(2^k, p, 2^k)
adds u: |y − e^x| <= 2^-45.3·y. libm's exp and exp2 are taken within 4 ulp (2^-50 relatively;
glibc documents < 1 ulp). ``reach`` = 2^-42·y is more than twice their sum, which also covers the
roundings of y ± reach (tests/test_ops_fast.py checks the bits against libm on samples of every
kind of input, and on every float32 with ``-m exhaustive``).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.core.extending import overload

from mpt.kernels.fma import fma64
from mpt.kernels.mma import _as_bits, _from_bits, f32_bits

__all__ = ["INV_LN2", "LN2", "SHIFT", "E_REL", "expm1_small", "pow2_of", "exp_near", "rounded",
           "doubted", "fast_exp", "fix_exp", "exp_into"]

INV_LN2 = float.fromhex("0x1.71547652b82fep+0")   # 1/ln 2
LN2 = float.fromhex("0x1.62e42fefa39efp-1")       # ln 2
SHIFT = float.fromhex("0x1.80000000003ffp+52")    # 1.5·2^52 + 1023: fl(y + SHIFT) − SHIFT is y
#                                                   rounded to an integer (|y| < 2^51)
# 1/n! for n = 2 .. 11 (Taylor series of expm1(r) = r + r²·(1/2 + r/6 + …))
_E2, _E3, _E4, _E5, _E6, _E7, _E8, _E9, _E10, _E11 = (
    1.0 / math.factorial(n) for n in range(2, 12))
E_REL = 2.0**-42   # relative reach of the vectorized exp (and of the tanh ops' f and f')


@njit(inline="always", error_model="numpy")
def expm1_small(r):
    """expm1(r) for |r| <= 0.3466 within 2^-45.1 relatively: its degree-11 Taylor polynomial,
    fma Horner steps (vectorizable)."""
    q = fma64(fma64(fma64(fma64(fma64(_E11, r, _E10), r, _E9), r, _E8), r, _E7), r, _E6)
    q = fma64(fma64(fma64(fma64(q, r, _E5), r, _E4), r, _E3), r, _E2)
    return fma64(r * r, q, r)


@njit(inline="always")
def pow2_of(s):
    """2^k for s = SHIFT + k (−1023 < k < 1024): the low bits of s are 1023 + k."""
    return _from_bits(_as_bits(s) << 52)


@njit(inline="always", error_model="numpy")
def exp_near(x, base2):
    """(y, reach): exp2(x) (``base2``) or exp(x) of a float64 x holding a float32 value, without
    libm, and a bound on its distance to libm's (module docstring)."""
    if base2:
        x = min(max(x, -151.0), 128.0)
        s = x + SHIFT
        t = (x - (s - SHIFT)) * LN2
    else:
        x = min(max(x, -105.0), 89.0)
        s = fma64(x, INV_LN2, SHIFT)
        t = fma64(s - SHIFT, -LN2, x)
    scale = pow2_of(s)
    y = fma64(scale, expm1_small(t), scale)
    return y, y * E_REL


@njit(inline="always")
def rounded(y, reach):
    """(fl32(y − reach), doubt): doubt when y ± reach may round to different float32 patterns (a
    zero's sign included) or y is a NaN (whose payload libm's path decides). Without doubt,
    fl32(y − reach) is fl32(y) (rounding is monotone): no third conversion."""
    lo = np.float32(y - reach)
    return lo, (f32_bits(lo) != f32_bits(np.float32(y + reach))) | (lo != lo)


@njit(inline="always")
def doubted(doubt, n):
    """The n indices i with doubt[i], in increasing order."""
    idx = np.empty(n, np.int64)
    j = 0
    for i in range(doubt.size):
        idx[j] = i
        j += doubt[i]
        if j == n:
            break
    return idx


@njit(inline="always", error_model="numpy")
def fast_exp(x, out, doubt, base2):
    """out = fl32(exp2(x)) (``base2``) or fl32(exp(x)) by :func:`exp_near`, doubt[i] = whether
    libm must decide out[i]; returns how many must. x, out (float32): 1-D, one size; doubt: 1-D,
    at least as long."""
    unsure = 0
    for i in range(x.size):
        y, reach = exp_near(np.float64(x[i]), base2)
        out[i], flag = rounded(y, reach)
        doubt[i] = flag
        unsure += flag
    return unsure


@njit(inline="always")
def _libm_exp(v, base2):
    """libm's exp2(v) (``base2``) or exp(v) of a float64 v."""
    return np.exp2(v) if base2 else math.exp(v)


@njit
def fix_exp(x, out, doubt, base2, n):
    """Recompute with libm the n values of out that :func:`fast_exp` doubts. A separate pass,
    and a function of its own (not inlined): a test of doubt[i] before the call would let LLVM
    call libm for every element, and the rarely taken code inlined next to the fast loop keeps
    that loop from vectorizing as well."""
    for i in doubted(doubt, n):
        out[i] = np.float32(_libm_exp(np.float64(x[i]), base2))


def exp_into(x, out, doubt, base2):
    """out[i] = W(exp2(x[i])) (``base2``) or W(exp(x[i])): libm's float64 value of the exact x,
    rounded once to the work dtype W of x and out (float32: :func:`fast_exp` then
    :func:`fix_exp`, the same bits; float64: libm). doubt: (>= x.size,) bool scratch. For njit
    code: the implementation is chosen by W when the caller compiles."""
    raise NotImplementedError("exp_into is called from njit code")


@overload(exp_into, inline="always")
def _exp_into(x, out, doubt, base2):
    if x.dtype == types.float32:
        def fast(x, out, doubt, base2):
            n = fast_exp(x, out, doubt, base2)
            if n:
                fix_exp(x, out, doubt, base2, n)
        return fast

    def libm(x, out, doubt, base2):
        for i in range(x.size):
            out[i] = _libm_exp(x[i], base2)
    return libm
