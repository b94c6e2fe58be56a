"""L1: Blackwell's block-scaled MMA with FP4 groups (tcgen05 kind::mxf4 / mxf4nvf4, and
``mma.sync.block_scale`` m16n8k64 on RTX Blackwell), as a Numba kernel.

One instruction consumes 64 products of E2M1 values for each output element. The products of
each group of 16 consecutive k are summed exactly, multiplied by the two block-scale values of
the group (|sa|·|sb|: a UE4M3 scale's sign bit is ignored), and become one term whose nominal
exponent is e(sa) + e(sb) (a scale's exponent, a subnormal UE4M3 at −6), whatever the group's
sum. The four group terms and the accumulator c are then aligned with F fraction bits below
the largest of their exponents (c: nominal exponent, at least −126; the anchor never drops
below 2^e_zero), truncated toward zero, added exactly and rounded toward zero to FP32: the
block model of ``mpt.kernels.mma`` with group terms in place of products. The result is the c
of the next instruction (increasing k).

Why float64 is exact here: an E2M1 product is a multiple of 1/4 below 36, so a group sum is
below 2^10 with 2 fraction bits (exact in float32 as well); times two scales of at most 4
significant bits each it has at most 20 significant bits and lies within 2^±270. With anchor E
and q = 2^(E−F), a group term is below 2^10·4·2^(e(sa)+e(sb)) <= 2^(12+E), so trunc(term/q) is
an integer below 2^(12+F) = 2^47 (F = 35), c gives one below 2^(F+1), and the sum of four
groups and c stays below 2^50 < 2^53: exact in any order. Scaling by 1/q, a power of two
within float64's normal range, and ``trunc`` are exact. A NaN scale or a NaN c makes the sum
NaN; an infinite c gives that infinity (E2M1 and the scales have no Inf).

Oracle: ``mpt.reference.microscaling.block_scaled_dot_reference``; reference model: MMA-Sim
(``nv_fused_dot_add_with_block_scale``). Tests: ``tests/test_blockscaled.py``.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from mpt.kernels.mma import (TILE_I, block_finish, block_scale, block_start, output_tile,
                             pow2_floor, tile_counts)

__all__ = ["GROUP", "INSTRUCTION_K", "group_chain", "scaled_terms"]

GROUP = 16           # products summed exactly before scaling
INSTRUCTION_K = 64   # products per instruction (four groups)


@njit(cache=True, parallel=True)
def scaled_terms(x, emin_pow2, zero_nominal, s_value, s_nominal, block, scales_along_rows,
                 value, nominal):
    """Block-scaled operands as the block model's (value, nominal power of two) pairs.

    x: (B, R, C) float32 element values of a format whose smallest normal is emin_pow2.
    Scales (float64): s_value, s_nominal of shape (B, R, C/block) — one per block of ``block``
    along the last axis (A) — or, with ``scales_along_rows``, (B, R/block, C) (B). Outputs
    (B, R, C), float32 or float64: value = x·s_value and nominal = nominal(x)·s_nominal, with
    nominal(x) = max(2^floor(log2|x|), emin_pow2) for finite non-zero x, ``zero_nominal`` for
    zeros (0, or 2^-126 under MMA-Sim's zero rule) and 0 for Inf/NaN. Exact: a scale value is
    a power of two (E8M0) or NaN, and every product stays within float32's range where the
    caller asks for float32 (it checks).
    """
    nb, nr, nc = x.shape
    for t in prange(nb * nr):
        z, r = t // nr, t % nr
        for c in range(nc):
            si, sj = (r // block, c) if scales_along_rows else (r, c // block)
            v = np.float64(x[z, r, c])
            if v == 0.0:
                p = zero_nominal
            elif abs(v) < np.inf:
                p = max(pow2_floor(v), emin_pow2)
            else:
                p = 0.0
            value[z, r, c] = v * s_value[z, si, sj]
            nominal[z, r, c] = p * s_nominal[z, si, sj]


@njit(inline="always")
def _group_sum(a_row, b_mat, k0, j0, sums):
    """sums[w] = Σ_{k0<=k<k0+16} a_row[k]·b_mat[k, j0+w] (float32, exact: see module docstring)."""
    sums[:] = 0
    for k in range(k0, k0 + GROUP, 4):
        a0, a1, a2, a3 = a_row[k], a_row[k + 1], a_row[k + 2], a_row[k + 3]
        b0, b1, b2, b3 = b_mat[k, j0:], b_mat[k + 1, j0:], b_mat[k + 2, j0:], b_mat[k + 3, j0:]
        for w in range(sums.shape[0]):
            sums[w] += (a0 * b0[w] + a1 * b1[w]) + (a2 * b2[w] + a3 * b3[w])


@njit(inline="always")
def _instruction_row(d, a_row, b_mat, sva, spa, svb, spb, kb, j0, scratch, fraction_bits,
                     zero_pow2, out):
    """One instruction [kb, kb+64) for one output row segment d (W,) in place (c -> D).

    a_row: (K,) this row of A; b_mat: (K, N) all of B; sva, spa: (K/16,) this row's group
    scale values and nominal powers of two; svb, spb: (K/16, N) B's.
    """
    anchor, scale, c_term, total, sums = scratch
    w_n = d.shape[0]
    block_start(d, anchor, zero_pow2, out[0])
    g0 = kb // GROUP
    for g in range(g0, g0 + INSTRUCTION_K // GROUP):
        p, pb = spa[g], spb[g, j0:]
        for w in range(w_n):
            anchor[w] = max(anchor[w], p * pb[w])
    block_scale(d, anchor, scale, c_term, total, fraction_bits, np.inf)
    for g in range(g0, g0 + INSTRUCTION_K // GROUP):
        _group_sum(a_row, b_mat, g * GROUP, j0, sums)
        v, vb = sva[g], svb[g, j0:]
        for w in range(w_n):
            total[w] += np.trunc(np.float64(sums[w]) * v * vb[w] * scale[w])
    block_finish(d, anchor, c_term, total, fraction_bits, out)


@njit(cache=True, parallel=True)
def group_chain(a, b, sva, spa, svb, spb, acc, ia, ib, k0, k1, fraction_bits, zero_pow2, out):
    """Chain block-scaled FP4 instructions over k in [k0, k1) (multiples of 64), into acc.

    a: (Ba, M, K) float32 E2M1 values; b: (Bb, K, N) float32. sva, spa: (Ba, M, K/16) float64,
    each group's A-scale value |sa| (NaN for a NaN scale) and nominal power of two 2^e(sa) (0
    for a NaN scale; for a zero scale 0, or 2^-126 under MMA-Sim's zero rule); svb, spb:
    (Bb, K/16, N) likewise for B. acc: (B, M, N) float64, in: c (FP32 values), out: D. Batch z
    uses A[ia[z]] and B[ib[z]]. F = fraction_bits (35), 2^e_zero = zero_pow2, output ``out`` =
    (2^emin, 2^-(p-1), max finite, round to nearest?) as in ``mpt.kernels.mma.block_chain``.
    Tasks are (batch, 32×64 output tiles); each output element is computed by one thread in a
    fixed order, so the bits do not depend on threads.
    """
    nb, m, n = acc.shape
    nti, ntj = tile_counts(m, n)
    for t in prange(nb * nti * ntj):
        z, i0, j0, w_n = output_tile(t, nti, ntj, n)
        scratch = (np.empty(w_n), np.empty(w_n), np.empty(w_n), np.empty(w_n),
                   np.empty(w_n, np.float32))
        a_z, b_z = a[ia[z]], b[ib[z]]
        sva_z, spa_z, svb_z, spb_z = sva[ia[z]], spa[ia[z]], svb[ib[z]], spb[ib[z]]
        for kb in range(k0, k1, INSTRUCTION_K):
            for i in range(i0, min(i0 + TILE_I, m)):
                _instruction_row(acc[z, i, j0:j0 + w_n], a_z[i], b_z, sva_z[i], spa_z[i], svb_z,
                                 spb_z, kb, j0, scratch, fraction_bits, zero_pow2, out)
