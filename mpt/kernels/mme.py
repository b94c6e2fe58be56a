"""L1: the Intel Gaudi 2 / Gaudi 3 matrix engine (MME) as Numba kernels.

One output element of D = A·B + C walks K in trees of ``width`` products from k = 0; each tree's
FP32 result is the next tree's C (the rules, and their source, are in :mod:`mpt.reference.mme`).
Per tree, with the operands' pieces x = Σ_p x_p (one piece, or the bit fields of the partial
products) and the pairs (p, r) of pieces that are multiplied:

    E     = max(nominal term exponents)          (Gaudi 3: with C's and 2^-132)   a power of two
    q     = E·2^-F
    total = Σ_k Σ_(p,r) trunc(a_kp·b_kr / q)      (Gaudi 3: + trunc(c / q))        an integer
    gaudi2_chain:  D = flush(RNE_fp32(total·q + c))
    gaudi3_chain:  D = RZ_fp32(total·q), ±Inf from 2^128 on

Why float64 is exact here: a piece has at most 24 significant bits, so a piece product has at
most 48 and is exact; pieces, products, 1/q and scaled terms all lie between 2^-600 and 2^300
(fp32 operands: products within [2^-298, 2^256], 1/q within [2^-232, 2^298]), far inside
float64's normal range, so scaling by the power of two 1/q is exact; a truncated term is an
integer below 2^48 (F = 46, significand products below 4) or 2^26 (F = 24); a tree sums at most
16 terms below 2^26 (Gaudi 2 fp8), 8 products below 2^48 (Gaudi 2 bf16/fp16/tf32, or 2 fp32
products of 4 partial products each) or 9 terms below 2^26 (Gaudi 3), so every partial sum is an
integer below 2^53, exact in any order, and ``total·q`` is exact too. Gaudi 2's one rounding of
the exact ``total·q + c``: TwoSum gives the float64 sum and its exact error, round-to-odd to 53
bits keeps the sticky information, and the float32 conversion (RNE) of a round-to-odd value with
at least two extra bits is the correctly rounded result (also for float32 subnormals). Gaudi 3's
RZ rounding is :func:`mpt.kernels.mma._round_out`.

Specials come from float64 arithmetic on the whole operand values: a NaN operand or Inf·0 gives
a NaN product, an Inf operand an Inf product, and +Inf + (-Inf) a NaN; they enter ``special``
(never the anchor), and a non-zero or NaN ``special`` is the tree's result. Kernels return NaN
with whatever payload; the front end writes the canonical NaN.

Oracle: ``mpt.reference.mme`` (exact rationals). Each output element is computed by one thread
in a fixed order (one task per output row), so the bits never depend on the thread count.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from mpt.kernels.mma import _as_bits, _from_bits, _round_out, pow2_floor, recip_pow2

__all__ = ["gaudi2_chain", "gaudi3_chain"]

_FLT_MIN = 2.0**-126
_FLT_MAX = float.fromhex("0x1.fffffep127")
_ANCHOR_FLOOR = 2.0**-132   # Gaudi 3: the accumulator's lowest integer bit sits at exponent -132


@njit(inline="always")
def _rne_flush(s, c):
    """flush(RNE_fp32(s + c)) for float64 s, c whose exact sum is far inside float64's range:
    TwoSum, round to odd, round to nearest even in float32; subnormal results and zeros are +0."""
    hi = s + c
    bb = hi - s
    err = (s - (hi - bb)) + (c - bb)                 # hi + err == s + c exactly
    if err != 0.0:
        bits = _as_bits(hi)
        if (err > 0.0) != (hi > 0.0):                # exact value is nearer zero: truncate
            bits -= 1
        hi = _from_bits(bits | 1)                    # round to odd: the sticky bit
    r = np.float64(np.float32(hi))                   # one RNE rounding, overflow to ±Inf
    return r if abs(r) >= _FLT_MIN else 0.0


@njit(inline="always")
def _tree_start(a_w, a_n, b_w, b_n, kb, ke, anchor, special, normalised):
    """Anchor (max of nominal product exponents, as powers of two) and special terms of one tree
    for one output row: a_w, a_n (K,) this row of A's values and nominal powers of two; b_w, b_n
    (K, N) all of B; anchor, special (N,) in/out."""
    n = anchor.shape[0]
    for k in range(kb, ke):
        av, an = a_w[k], a_n[k]
        bw, bn = b_w[k], b_n[k]
        for j in range(n):
            p = av * bw[j]
            finite = abs(p) < np.inf
            if not finite:
                special[j] += p                      # NaN, or ±Inf (opposite Infs give NaN)
            e = an * bn[j]
            if normalised:
                e = pow2_floor(p) if finite else 0.0
            anchor[j] = max(anchor[j], e)


@njit(inline="always")
def _tree_sum(va, vb, zi_a, zb, i, kb, ke, pair_a, pair_b, scale, total):
    """total[j] += Σ_k Σ_pairs trunc(a_kp·b_kr·scale[j]) for one output row (pieces va
    (P, Ba, M, K) and vb (P, Bb, K, N); zi_a, zb: the batch indices of A and B)."""
    n = total.shape[0]
    for k in range(kb, ke):
        for t in range(pair_a.size):
            ap = va[pair_a[t], zi_a, i, k]
            if ap == 0.0:
                continue
            bp = vb[pair_b[t], zb, k]
            for j in range(n):
                total[j] += np.trunc(ap * bp[j] * scale[j])


@njit(cache=True, parallel=True)
def gaudi2_chain(va, wa, na, vb, wb, nb, acc, ia, ib, k0, k1, width, pair_a, pair_b,
                 fraction_bits, normalised):
    """Gaudi 2 trees of ``width`` products over k in [k0, k1), in increasing k, into acc.

    va: (P, Ba, M, K) float64 pieces of A's operand values (0 for zeros and specials); wa: (Ba,
    M, K) float64 operand values (after the chip's input conversion: fp8 widened to fp16, tf32
    rounded, bf16/tf32/fp32 subnormals flushed); na: (Ba, M, K) float64 nominal powers of two
    (0 for zeros and specials). vb, wb, nb: likewise (P, Bb, K, N), (Bb, K, N). acc: (B, M, N)
    float32, in: C, out: D. Batch z uses A[ia[z]] and B[ib[z]]. pair_a, pair_b: (pairs,) int64
    piece indices of the partial products. ``fraction_bits`` F (46, fp8: 24); ``normalised``:
    terms take the exponent of the product itself (bf16, fp16, tf32) rather than the sum of the
    nominal exponents (fp8, fp32). k0 must be a multiple of ``width``.
    """
    nb_, m, n = acc.shape
    two_f = 2.0 ** fraction_bits
    for t in prange(nb_ * m):
        z, i = t // m, t % m
        za, zb = ia[z], ib[z]
        anchor, special, scale, total = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
        row = acc[z, i]
        for kb in range(k0, k1, width):
            ke = min(kb + width, k1)
            anchor[:] = 0.0
            special[:] = 0.0
            total[:] = 0.0
            _tree_start(wa[za, i], na[za, i], wb[zb], nb[zb], kb, ke, anchor, special, normalised)
            for j in range(n):
                scale[j] = recip_pow2(anchor[j]) * two_f if anchor[j] > 0.0 else 0.0
            _tree_sum(va, vb, za, zb, i, kb, ke, pair_a, pair_b, scale, total)
            for j in range(n):
                c = np.float64(row[j])
                c = c if not abs(c) < _FLT_MIN else 0.0                  # flush a subnormal C
                sp = special[j] + (c if not abs(c) < np.inf else 0.0)
                if sp != 0.0 or sp != sp:
                    row[j] = sp
                else:
                    s = total[j] * (anchor[j] / two_f) if anchor[j] > 0.0 else 0.0
                    row[j] = _rne_flush(s, c)


@njit(cache=True, parallel=True)
def gaudi3_chain(va, wa, na, vb, wb, nb, acc, ia, ib, k0, k1, width, pair_a, pair_b):
    """Gaudi 3 trees (the 9-term step: products plus C, F = 24, RZ) over k in [k0, k1).

    Arguments as :func:`gaudi2_chain` (operands exact: subnormals kept, tf32 rounded; nominal
    powers of two 2^max(floor(log2|x|), -126)); C joins every tree as one more truncated term.
    """
    nb_, m, n = acc.shape
    two_f = 2.0**24
    for t in prange(nb_ * m):
        z, i = t // m, t % m
        za, zb = ia[z], ib[z]
        anchor, special, scale, total = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
        row = acc[z, i]
        for kb in range(k0, k1, width):
            ke = min(kb + width, k1)
            for j in range(n):
                c = np.float64(row[j])
                finite = abs(c) < np.inf
                anchor[j] = max(max(pow2_floor(c), _FLT_MIN) if finite and c != 0.0 else 0.0,
                                _ANCHOR_FLOOR)
                special[j] = 0.0 if finite else c
            _tree_start(wa[za, i], na[za, i], wb[zb], nb[zb], kb, ke, anchor, special, False)
            for j in range(n):
                scale[j] = recip_pow2(anchor[j]) * two_f
                c = np.float64(row[j])
                total[j] = np.trunc(c * scale[j]) if abs(c) < np.inf else 0.0
            _tree_sum(va, vb, za, zb, i, kb, ke, pair_a, pair_b, scale, total)
            for j in range(n):
                sp = special[j]
                if sp != 0.0 or sp != sp:
                    row[j] = sp
                else:
                    d = _round_out(total[j], anchor[j] / two_f, _FLT_MIN, 2.0**-23, _FLT_MAX,
                                   False)
                    row[j] = d + 0.0                                 # a zero is +0
