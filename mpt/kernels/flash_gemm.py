"""L1: the tile GEMMs of the flash-attention kernels (:mod:`mpt.kernels.attention`): one small
product C[:m, :n] += A·B through an MMA engine, the chain over k from C.

**Engines** (each output element sees the same operations in the same order, whatever the
thread count): ``FMA_TILE`` (ieee_fma on float32: ``mpt.kernels.gemm.fma_tile`` on B packed per
tile call and A read in place where its rows fill whole micro-tiles, else packed), ``FMA``
(sequential fma in W: fp64 mode), ``MUL_ADD`` (ieee_mul_add) and ``BLOCK`` (the Tensor Core block
model of ``mpt.kernels.mma``: K consumed in blocks of L from the start of each tile GEMM; the
register-blocked tile kernel of ``mpt.kernels.block_gemm`` where the operands and C meet its
conditions, else an accumulator row copied to float64 for the block steps, exactly). Oracle:
``mpt.reference.attention.flash_forward`` / ``flash_backward`` (tests/test_attention.py).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.core.extending import intrinsic

from mpt.kernels.block_gemm import BLOCK_COLS as _BC
from mpt.kernels.block_gemm import BLOCK_ROWS as _BR
from mpt.kernels.block_gemm import E_MAX, SCRATCH_WORDS, chain_tiles, tile_params
from mpt.kernels.block_pack import finite_range_2d, product_range, tile_codes, tile_pack
from mpt.kernels.gemm import COLS, ROWS, fma_tile, fma_tile_strided
from mpt.kernels.mma import block_finish, block_scale, block_start

__all__ = ["FMA_TILE", "FMA", "MUL_ADD", "BLOCK", "NO", "YES", "ZERO", "fma", "tile_scratch",
           "tile_mm", "acc_tile"]

FMA_TILE, FMA, MUL_ADD, BLOCK = 0, 1, 2, 3


@intrinsic
def fma(typingctx, a, b, c):
    """IEEE fused multiply-add (one rounding) of three floats of one type (llvm.fma)."""
    if not (a == b == c and isinstance(a, types.Float)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return a(a, a, a), codegen


@njit(inline="always")
def _nominal(x, emin_pow2):
    """max(2^floor(log2|x|), 2^emin) for a finite non-zero float64 x; 0 for zeros, Inf, NaN."""
    if x == 0.0 or not abs(x) < np.inf:
        return 0.0
    return max(math.ldexp(1.0, math.frexp(x)[1] - 1), emin_pow2)


# ---- tile GEMMs ---------------------------------------------------------------------------------
# An operand is (x, z, r0, t): the rows r0, r0+1, ... of batch z of a 3-D C-contiguous array, read
# transposed when t. A(r, k) = x[z, r0 + r, k] (t: x[z, r0 + k, r]); B(k, j) = x[z, r0 + k, j]
# (t: x[z, r0 + j, k]). One array type for every operand, and flags and offsets passed as run-time
# values (Numba compiles a function once per *literal* argument), keep tile_mm to one specialisation
# per work dtype.
NO, YES, ZERO = np.bool_(False), np.bool_(True), np.int64(0)


@njit(inline="always")
def _at(x, z, r0, transposed, r, k):
    return x[z, r0 + k, r] if transposed else x[z, r0 + r, k]


@njit
def tile_scratch(eng, m, kk, n):
    """Per-task buffers of the engine: packed A (ceil(m/ROWS), kk, ROWS) and B (ceil(n/COLS), kk,
    COLS) panels (FMA_TILE); decoded A values/nominals (m, kk), B (kk, n) and five (n,) float64
    rows (BLOCK, general path); the register-blocked block path's packed panels and anchor codes
    (for m, n or, transposed, n, m), parameters, tile scratch, flag, a copy of c, four (kk,)
    exponent ranges and a transposed accumulator (BLOCK). Unused buffers are empty."""
    fast, block = eng[0] == FMA_TILE, eng[0] == BLOCK
    ap = np.zeros(((m + ROWS - 1) // ROWS if fast else 0, kk, ROWS), np.float32)
    bp = np.zeros(((n + COLS - 1) // COLS if fast else 0, kk, COLS), np.float32)
    mb, kb, nb = (m, kk, n) if block else (0, 0, 0)
    top = max(m, n) if block else 0
    mt, nt = (top + _BR - 1) // _BR, (top + _BC - 1) // _BC
    return (ap, bp, np.empty((mb, kb)), np.empty((mb, kb)), np.empty((kb, nb)),
            np.empty((kb, nb)), np.empty(nb), np.empty(nb), np.empty(nb), np.empty(nb),
            np.empty(nb),
            np.empty((mt, kb, _BR), np.float32), np.empty((mt, kb, _BR), np.uint32),
            np.empty((nt, kb, _BC), np.float32), np.empty((nt, kb, _BC), np.uint8),
            np.empty(8, np.int32), np.empty(SCRATCH_WORDS if block else 0, np.int32),
            np.zeros(1, np.int32), np.empty((mt * _BR, nt * _BC), np.float32),
            np.empty(kb, np.uint32), np.empty(kb, np.uint32), np.empty(kb, np.uint32),
            np.empty(kb, np.uint32), np.empty((mt * _BR, nt * _BC), np.float32))


@njit
def tile_mm(c, a, za, ra, a_t, b, zb, rb, b_t, m, n, kk, eng, sc):
    """c[:m, :n] = MMA chain of A·B over k = 0..kk-1 onto c (its C); A (m, kk) and B (kk, n) as
    described above. c: C-contiguous, at least (ceil(m/ROWS)·ROWS, ceil(n/COLS)·COLS), of the
    work dtype W (float32; float64 in fp64 mode)."""
    code = eng[0]
    if code == FMA_TILE:
        ap, bp = sc[0], sc[1]
        a2 = a[za, ra:ra + kk, :m].T if a_t else a[za, ra:ra + m, :kk]          # (m, kk)
        b2 = b[zb, rb:rb + n, :kk].T if b_t else b[zb, rb:rb + kk, :n]          # (kk, n)
        direct = m % ROWS == 0          # A read in place (whole row tiles), else packed
        if not direct:
            for rt in range((m + ROWS - 1) // ROWS):
                for k in range(kk):
                    for t in range(ROWS):
                        r = rt * ROWS + t
                        ap[rt, k, t] = a2[r, k] if r < m else 0.0
        for ct in range((n + COLS - 1) // COLS):
            w_n = min(COLS, n - ct * COLS)
            for k in range(kk):
                for t in range(w_n):
                    bp[ct, k, t] = b2[k, ct * COLS + t]
                bp[ct, k, w_n:] = 0.0
        sar, sak = a2.strides[0] // a2.itemsize, a2.strides[1] // a2.itemsize
        for rt in range((m + ROWS - 1) // ROWS):
            for ct in range((n + COLS - 1) // COLS):
                c_addr = c[rt * ROWS:, ct * COLS:].ctypes.data
                if direct:
                    fma_tile_strided(c_addr, c.shape[1], a2[rt * ROWS:].ctypes.data, sar, sak,
                                     bp[ct].ctypes.data, kk)
                else:
                    fma_tile(c_addr, c.shape[1], ap[rt].ctypes.data, bp[ct].ctypes.data, kk)
    elif code == BLOCK:
        _mm_block(c, a, za, ra, a_t, b, zb, rb, b_t, m, n, kk, eng, sc)
    else:
        T = c.dtype.type
        for r in range(m):
            for k in range(kk):
                x = T(_at(a, za, ra, a_t, r, k))
                for j in range(n):
                    y = T(_at(b, zb, rb, not b_t, j, k))
                    c[r, j] = fma(x, y, c[r, j]) if code == FMA else c[r, j] + x * y


@njit(inline="always")
def _tiles(m, n):
    """The number of BLOCK_ROWS x BLOCK_COLS tiles of an (m, n) output."""
    return ((m + _BR - 1) // _BR) * ((n + _BC - 1) // _BC)


@njit
def _mm_block(c, a, za, ra, a_t, b, zb, rb, b_t, m, n, kk, eng, sc):
    """The block model of ``mpt.kernels.mma`` (docs/tensor_cores.md §1) for every c[r, :n]:
    the register-blocked tile kernel (``mpt.kernels.block_gemm``) when the operands and c meet
    its conditions and it raises no flag, else :func:`_mm_block_general`. Where it takes fewer
    tiles, the kernel computes the transposed product cᵀ = Bᵀ·Aᵀ (a narrow c, e.g. n = 32 of a
    64-column tile): the same bits, as the block model is a function of each output's c, row of
    A and column of B, and symmetric in the two factors (anchor ea + eb, exact products)."""
    a2 = a[za, ra:ra + kk, :m].T if a_t else a[za, ra:ra + m, :kk]          # (m, kk)
    b2 = b[zb, rb:rb + n, :kk].T if b_t else b[zb, rb:rb + kk, :n]          # (kk, n)
    if _tiles(n, m) < _tiles(m, n):
        ct = sc[23]                                     # cᵀ, padded with zeros
        ct[:(n + _BR - 1) // _BR * _BR, :(m + _BC - 1) // _BC * _BC] = 0.0
        ct[:n, :m] = c[:m, :n].T
        done = _mm_block_fast(ct, b2.T, a2.T, n, m, kk, eng, sc)
        if done:
            c[:m, :n] = ct[:n, :m].T
    else:
        done = _mm_block_fast(c, a2, b2, m, n, kk, eng, sc)
    if not done:
        _mm_block_general(c, a, za, ra, a_t, b, zb, rb, b_t, m, n, kk, eng, sc)


@njit
def _exponent_of(x):
    """e for x = 2^e (a float64 power of two)."""
    return math.frexp(x)[1] - 1


@njit
def _mm_block_fast(c, a2, b2, m, n, kk, eng, sc):
    """c[:m, :n] = the block chain of a2 (m, kk)·b2 (kk, n) onto c by the tile kernel; False
    (c unchanged) where its conditions fail or it raises the flag (``block_chain_packed``'s,
    checked here per call: operands finite and in the window, c finite, no c that could grow
    past 2^E_MAX and, without the tiny check, no non-zero |c| below 2^(F−125))."""
    va, ea, vb, eb, prm, scratch, flag, saved, lo_a, hi_a, lo_b, hi_b = sc[11:23]
    L, F = eng[1], eng[2]
    fmin = np.uint32(max(_exponent_of(eng[8]) + 127, 1))
    for x in (lo_a, lo_b):
        x[:kk] = 0xFFFF
    for x in (hi_a, hi_b):
        x[:kk] = 0
    mt = tile_pack(a2, fmin, va, lo_a, hi_a)
    nt = tile_pack(b2.T, fmin, vb, lo_b, hi_b)
    finite, lowest, highest, top_a, top_b = product_range(lo_a[:kk], hi_a[:kk], lo_b[:kk],
                                                         hi_b[:kk])
    if not finite:
        return False
    precision = 1 - _exponent_of(eng[5])
    variant, shift_a, shift_b = tile_params(L, F, _exponent_of(eng[3]), precision,
                                            _exponent_of(eng[4]), False, lowest, highest,
                                            top_a, top_b, prm)
    if variant < 0:
        return False
    finite, largest, smallest, zero = finite_range_2d(c, m, n)
    if not finite or largest + kk * 2.0 ** (highest + 2) >= 2.0 ** E_MAX or \
            smallest < 2.0 ** (F - 125):
        return False
    tile_codes(va, mt, kk, fmin, np.int32(shift_a - 127), ea)
    tile_codes(vb, nt, kk, fmin, np.int32(shift_b + 127), eb)
    if not zero:                                # (a zero c is restored by zeroing it)
        for r in range(m):
            saved[r, :n] = c[r, :n]
    flag[0] = 0
    chain_tiles(c, va[:mt], ea[:mt], vb[:nt], eb[:nt], kk, prm, variant, scratch, flag)
    if flag[0] == 0:
        return True
    for r in range(m):
        if zero:
            c[r, :n] = 0.0
        else:
            c[r, :n] = saved[r, :n]
    return False


@njit
def _mm_block_general(c, a, za, ra, a_t, b, zb, rb, b_t, m, n, kk, eng, sc):
    """The block model per output row, in float64 scalar code: blocks of L products from
    k = 0; per block the anchor E = max(2^e_zero, nominal(c), max nominal(a)·nominal(b)), the
    exact sum of the truncated terms and one rounding to the output (``block_start`` /
    ``block_scale`` / ``block_finish``), on a float64 copy of the row (exact: it holds FP32
    values)."""
    L, F, zero_pow2, out, emin_pow2 = eng[1], eng[2], eng[3], eng[4:8], eng[8]
    av, ap, bv, bp, anchor, scale, c_term, total, d = sc[2:11]
    for r in range(m):
        for k in range(kk):
            x = np.float64(_at(a, za, ra, a_t, r, k))
            av[r, k] = x
            ap[r, k] = _nominal(x, emin_pow2)
    for k in range(kk):
        for j in range(n):
            x = np.float64(_at(b, zb, rb, not b_t, j, k))
            bv[k, j] = x
            bp[k, j] = _nominal(x, emin_pow2)
    for r in range(m):
        for w in range(n):
            d[w] = c[r, w]
        for kb in range(0, kk, L):
            ke = min(kb + L, kk)
            block_start(d[:n], anchor, zero_pow2, out[0])
            for k in range(kb, ke):
                pa = ap[r, k]
                for w in range(n):
                    anchor[w] = max(anchor[w], pa * bp[k, w])
            block_scale(d[:n], anchor, scale, c_term, total, F, np.inf)
            for k in range(kb, ke):
                va = av[r, k]
                for w in range(n):
                    total[w] += np.trunc(va * bv[k, w] * scale[w])
            block_finish(d[:n], anchor, c_term, total, F, out)
        for w in range(n):
            c[r, w] = d[w]


@njit(inline="always")
def acc_tile(rows, cols, dtype):
    """A zeroed accumulator tile padded to whole micro-tiles of every engine (ROWS x COLS and
    BLOCK_ROWS x BLOCK_COLS: 8 x 64)."""
    return np.zeros(((rows + _BR - 1) // _BR * _BR, (cols + _BC - 1) // _BC * _BC), dtype)
