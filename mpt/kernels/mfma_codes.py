"""L1: the operands of the register-blocked CDNA3/CDNA4 kernel (:mod:`mpt.kernels.mfma_packed`):
whether they may take it (:func:`packed_ok`), their nominal exponents (:func:`exponents`) and
their uint8 anchor codes (:func:`pack_codes`), laid out as the kernel's ROWS x COLS tiles read
them. Why the codes hold every anchor: :mod:`mpt.kernels.mfma_packed`'s module docstring.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from mpt.kernels import gemm as _gemm

__all__ = ["ROWS", "packed_ok", "exponents", "pack_codes"]

ROWS = 4                      # tile rows: 4 x 32 outputs keep the scales and S (16 vectors)
                              # in the 32 AVX-512 registers; measured faster than 2 or 6
_ZERO_EXP = -126              # a zero's nominal exponent, and the anchor codes' floor


def packed_ok(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether decoded operands (float32) may take :func:`fused_chain_packed`: all finite, and
    every non-zero |a_ik·b_kj| within [2^-60, 2^60]."""
    (hi_a, lo_a), (hi_b, lo_b) = (_magnitudes(np.ascontiguousarray(x).reshape(-1)
                                              .view(np.uint32)) for x in (a, b))
    if max(hi_a, hi_b) >= 0x7F800000:                  # an Inf or a NaN
        return False
    if hi_a == 0 or hi_b == 0:                         # every product is zero
        return True
    lo_a, lo_b, hi_a, hi_b = (np.float64(np.uint32(x).view(np.float32))
                              for x in (lo_a, lo_b, hi_a, hi_b))
    return lo_a * lo_b >= 2.0**-60 and hi_a * hi_b <= 2.0**60


@njit(cache=True)
def _magnitudes(bits):
    """(largest, smallest non-zero) magnitude pattern of float32 patterns (sign dropped; the
    patterns of magnitudes order as their values); the smallest is 0 when all are ±0. Integer
    min/max only, so the loop vectorizes."""
    hi, low = np.uint32(0), np.uint32(0xFFFFFFFF)
    for i in range(bits.size):
        m = bits[i] & np.uint32(0x7FFFFFFF)
        hi = max(hi, m)
        low = min(low, np.uint32(m - np.uint32(1)))   # ±0 wraps to the largest
    return hi, np.uint32(low + np.uint32(1))


@njit(cache=True, parallel=True)
def exponents(bits, emin, out):
    """out = the nominal exponent of each float32 pattern of bits ((n,) uint32 -> (n,) int32):
    max(floor(log2|x|), emin) for x != 0 (emin >= -126: a float32 subnormal gets emin), and
    -126 for a zero (``mpt.kernels.mfma._nominal``)."""
    for i in prange(bits.size):
        field = np.int32((bits[i] >> np.uint32(23)) & np.uint32(0xFF))
        zero = (bits[i] & np.uint32(0x7FFFFFFF)) == 0
        out[i] = _ZERO_EXP if zero else max(field - np.int32(127), emin)


def pack_codes(ea: np.ndarray, eb: np.ndarray):
    """The anchor codes of A and B from their nominal exponents :func:`exponents`: A's
    (Ba, Mt, K, ROWS) uint32 (each code in all four bytes), B's (Bb, Nt, K, 64) uint8 (the
    interleaved panel ``mfma_packed._emit_codes`` reads); ea (Ba, M, K), eb (Bb, N, K), any strides.
    The codes hold every anchor when max ea + max eb <= 129 (module docstring), which
    :func:`packed_ok` operands meet: a largest nominal exponent that comes from a normal value
    is at most log2 of it, so two such sum to at most log2 of the largest product, 60; one that
    comes from a subnormal or a zero (emin, −126) sums with the other operand's to at most
    emin + the largest exponent of its format, <= 1 for every format here. ValueError
    otherwise."""
    top_a, top_b = int(ea.max()), int(eb.max())
    if top_a + top_b > 255 + _ZERO_EXP:
        raise ValueError(f"anchor codes need max ea + max eb <= {255 + _ZERO_EXP}; got "
                         f"{top_a} + {top_b} (operands outside packed_ok's range)")
    shift = 255 - top_a
    nb, m, k = ea.shape
    ca = np.empty((nb, -(-m // ROWS), k, ROWS), np.uint32)
    cb = np.full((eb.shape[0], -(-eb.shape[1] // _gemm.COLS), k, 2 * _gemm.COLS), 255, np.uint8)
    _codes_a(ea, shift, ca)
    _codes_b(eb, shift + _ZERO_EXP, _gemm.along_k(eb), cb)
    return ca, cb


@njit(cache=True, parallel=True)
def _codes_a(ea, shift, out):
    """out[z, t, k, w] = u·0x01010101, u = clip(ea[z, t·ROWS + w, k] + shift, 0, 255) (0 past
    M), written in memory order, row tiles in parallel."""
    nr, nt = ea.shape[1], out.shape[1]
    for zt in prange(out.shape[0] * nt):
        z, t = zt // nt, zt % nt
        for k in range(out.shape[2]):
            for w in range(ROWS):
                r = t * ROWS + w
                u = min(max(ea[z, r, k] + shift, 0), 255) if r < nr else 0
                out[z, t, k, w] = np.uint32(u * 0x01010101)


@njit(cache=True, parallel=True)
def _codes_b(eb, shift, along_k, out):
    """out[z, t, k, L] = v = clip(shift − eb[z, t·COLS + j, k], 0, 255) for both bytes L of
    column j: L = 8·(j // 4) + j % 4 and L + 4 (255 past N: the difference is then 0); eb
    read in memory order, its outer axis in parallel."""
    cols, nc, nk = _gemm.COLS, eb.shape[1], eb.shape[2]
    outer, inner = (nc, nk) if along_k else (nk, nc)
    for zi in prange(eb.shape[0] * outer):
        z, i = zi // outer, zi % outer
        for j in range(inner):
            c, k = (i, j) if along_k else (j, i)
            lane = 8 * (c % cols // 4) + c % 4
            v = np.uint8(min(max(shift - eb[z, c, k], 0), 255))
            out[z, c // cols, k, lane] = v
            out[z, c // cols, k, lane + 4] = v
