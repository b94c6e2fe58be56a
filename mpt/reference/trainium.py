"""Oracle of Trainium's matmul engine (``mpt.engines.trainium.trainium_matmul``): K in passes
of at most 128 products, each pass an FP32 result added into an FP32 PSUM accumulator.

One output element at a time on Python floats (values of formats up to fp32 are float64
numbers), every FP32 step rounded once by :mod:`mpt.reference.optim` (exact rationals, IEEE
specials). Within a pass (the labelled assumption ``pass_order``):

* "sequential_fma": t = +0; t = fma32(a_k, b_k, t) for increasing k;
* "sequential_mul_add": t = +0; t = add32(t, mul32(a_k, b_k)) for increasing k;
* "exact": t = the exact sum of the pass's products rounded once to FP32 (RNE), with the
  specials of an exact dot product (NaN for NaN, Inf·0 or +Inf + −Inf; ±Inf otherwise).

PSUM: the first pass's t when c is None, else c + t; every later pass: PSUM + t (add32).
"""
from __future__ import annotations

from mpt.reference.mma import exact_dot_reference
from mpt.reference.optim import add32, fma32, mul32

__all__ = ["pass_reference", "trainium_matmul_reference"]


def pass_reference(a, b, pass_order):
    """One pass (at most 128 products) from +0, as FP32."""
    t = 0.0
    if pass_order == "exact":
        return exact_dot_reference(a, b, 0.0, rounding="rne_fp32")
    for x, y in zip(a, b):
        t = fma32(x, y, t) if pass_order == "sequential_fma" else add32(t, mul32(x, y))
    return t


def trainium_matmul_reference(a, b, c=None, *, pass_order="sequential_fma", tile_k=128):
    """D = A·B (+ C): a (M, K), b (K, N) nested lists of floats, c (M, N) or None."""
    m, k, n = len(a), len(b), len(b[0])
    out = []
    for i in range(m):
        row = []
        for j in range(n):
            col = [b[kk][j] for kk in range(k)]
            psum = None if c is None else c[i][j]
            for k0 in range(0, max(k, 1), tile_k):
                t = pass_reference(a[i][k0:k0 + tile_k], col[k0:k0 + tile_k], pass_order)
                psum = t if psum is None else add32(psum, t)
            row.append(psum)
        out.append(row)
    return out
