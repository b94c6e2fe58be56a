"""L1: FlashAttention-2 (Dao 2023) forward and backward, tile by tile, with the rounding points of
the real kernels and every GEMM through an MMA model.

Arrays: q (Z, Nq, d), k (Zkv, Nk, d), v (Zkv, Nk, dv) hold the values of one input format F
decoded exactly to the work dtype W (float32; float64 in fp64 mode); query batch z reads key/value
batch ``kv_of[z]`` (grouped-query attention and broadcast batches). τ is the softmax scale,
τ₂ = W(τ·log2 e); ``W(x)`` is one RNE rounding to W; exp, exp2 and log are evaluated in float64
by the platform libm from the exact W argument and rounded once to W (``mpt.kernels.ops``).

**Forward**, one task per (z, block of Br query rows); key blocks of Bc in increasing order::

    S  = Q_i·K_jᵀ                          MMA chain over d from +0 (FP32: raw scores)
    base e:  x_c = W(S_c·τ);  m' = max(m, x_c);  P_c = W(exp(W(x_c − m')));  α = W(exp(W(m − m')))
    base 2:  m' = max(m, S_c);  P_c = W(exp2(fma(S_c, τ₂, −W(m'·τ₂))));
             α = W(exp2(W(W(m − m')·τ₂)))
    l  = W(α·l), then l = W(l + P_c) for c in increasing key order (the un-dropped FP32 P)
    O  = W(α·O) (CUDA cores), then O = MMA(keep ∘ round_F(P), V_j) with C = O, chain over the keys
    end: inv = W(1/l);  O_out = W(O·W(inv·r)) with r = W(1/(1 − p)) (FA2 folds dropout's scale in)
         L = W(m + W(log l))  (base 2: W(W(m·τ) + W(log l)));  a row with l = 0 or NaN has
         L = +Inf and inv = 1, so a row without keys outputs 0.

**Backward**, one task per key/value batch zk (so that one task owns every dQ row it adds to: no
atomics, and a fixed order); its key blocks j in increasing order, and for each the query batches
z with kv_of[z] = zk and their query blocks i, both in increasing order::

    S  = Q_i·K_jᵀ;   P_c = W(exp(W(W(S_c·τ) − L)))
             (base 2: P_c = W(exp2(fma(S_c, τ₂, −W(L·W(log2 e))))))
    dV_j = MMA((keep ∘ round_F(P))ᵀ, dO_i) with C = dV_j         FP32 accumulator over (z, i)
    dP = dO_i·V_jᵀ (from +0);  with dropout dP_c = keep ? W(dP_c·r) : 0
    dS_c = round_F(W(W(P_c·W(dP_c − D)) ·τ)),  D = Σ_c W(dO_c·O_c) sequential (the stored O)
    dK_j = MMA(dSᵀ, Q_i) with C = dK_j;   dQ_i = MMA(dS, K_j) with C = dQ_i (FP32 over j)
    end of key block j: dK_j; dV_j = W(dV_j·r) with dropout. (The caller rounds dQ, dK, dV to F.)

Masking: with ``causal`` key j is masked for query i iff ``j > i + Nk − Nq`` (bottom-right
aligned); a masked entry has P = 0 and no part in the max or the sum; a key block masked for every
row of the query block is skipped, as FA2 skips it (it is never loaded, so its zero products never
touch the accumulators). Dropout: entry (z, i, j) is kept iff word ``(z·Nq + i)·Nk + j`` of the
Philox stream (seed, stream) is ≥ round(p·2^32) — the layout of ``mpt.functional.dropout_mask``
on (Z, Nq, Nk), so forward, backward and the naive backend draw the same mask.

**MMA engines** (each output element sees the same operations in the same order, whatever the
thread count): ``FMA_TILE`` (ieee_fma on float32: ``mpt.kernels.gemm.fma_tile`` on operands packed
per tile call), ``FMA`` (sequential fma in W: fp64 mode), ``MUL_ADD`` (ieee_mul_add) and ``BLOCK``
(the Tensor Core block model of ``mpt.kernels.mma``: K consumed in blocks of L from the start of
each tile GEMM; an accumulator row is copied to float64 for the block steps, exactly). NaN and
Inf propagate as the IEEE operations above do; a NaN score makes its row's max NaN. Oracle:
``mpt.reference.attention.flash_forward`` / ``flash_backward`` (numpy, the same order), and the
fp64 ``mpt.reference.attention.attention`` for accuracy.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types
from numba.core.extending import intrinsic

from mpt.kernels.block_gemm import BLOCK_COLS as _BC
from mpt.kernels.block_gemm import BLOCK_ROWS as _BR
from mpt.kernels.block_gemm import (E_MAX, SCRATCH_WORDS, chain_tiles, magnitude_range,
                                    product_range, tile_codes, tile_pack_fields, tile_params)
from mpt.kernels.gemm import COLS, ROWS, fma_tile, fma_tile_strided
from mpt.kernels.mma import (_as_bits, _from_bits, block_finish, block_scale, block_start,
                             threads_for)
from mpt.kernels.random import philox_block, split64

__all__ = ["FMA_TILE", "FMA", "MUL_ADD", "BLOCK", "engine_params", "rounding_params",
           "dropout_params", "flash_forward", "flash_backward"]

FMA_TILE, FMA, MUL_ADD, BLOCK = 0, 1, 2, 3
LOG2E = float.fromhex("0x1.71547652b82fep+0")  # log2(e) rounded to float64

# FP32-output roundings of the block models: name -> significant bits (RZ, emin -126)
_OUT_PRECISION = {"rz_fp32": 24, "rz_e8m13": 14}


# ---- parameters (Python) -------------------------------------------------------------------------

def engine_params(model: dict, fp64: bool, emin: int) -> tuple:
    """The engine tuple of the kernels for an MMA model given as ``mpt.reference.mma``'s dict
    (``{"kind": "ieee_fma"}``, ``{"kind": "ieee_mul_add"}`` or ``{"kind": "block", "block": L,
    "fraction_bits": F, "e_zero": e, "rounding": "rz_fp32" | "rz_e8m13"}``); ``emin`` is the input
    format's (nominal exponents of subnormal operands). fp64 mode always runs sequential fma64."""
    none = (0.0, 0.0, 0.0, False, 0.0)
    if fp64:
        return (FMA, 1, 0, 0.0) + none
    kind = model.get("kind")
    if kind == "ieee_fma":
        return (FMA_TILE, 1, 0, 0.0) + none
    if kind == "ieee_mul_add":
        return (MUL_ADD, 1, 0, 0.0) + none
    if kind == "block" and model.get("rounding") in _OUT_PRECISION:
        p = _OUT_PRECISION[model["rounding"]]
        out = (2.0**-126, 2.0 ** (1 - p), (2.0 - 2.0 ** (1 - p)) * 2.0**127, False)
        return (BLOCK, int(model["block"]), int(model["fraction_bits"]),
                2.0 ** model["e_zero"]) + out + (2.0**emin,)
    raise ValueError(f"flash attention runs the ieee_fma, ieee_mul_add and block (FP32 output) "
                     f"models; got {model!r}")


def rounding_params(fmt) -> tuple:
    """(mantissa bits, emin, largest finite) of the format P and dS are rounded to (RNE);
    mantissa bits -1 for fp32/fp64 (no rounding: they are already W values)."""
    if fmt.name in ("fp32", "fp64"):
        return (-1, 0, 0.0)
    return (fmt.mantissa_bits, fmt.emin, float(fmt.max))


def dropout_params(dropout, work) -> tuple:
    """(enabled, threshold, key lo, key hi, stream lo, stream hi, r) for ``dropout`` = None or
    (p, seed, stream); flat, as Numba's parallel loops take no nested tuples."""
    if dropout is None:
        return (False, np.uint64(0)) + split64(0) + split64(0) + (work(1.0),)
    p, seed, stream = dropout
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p must be in [0, 1); got {p}")
    return (True, np.uint64(round(p * 2.0**32))) + split64(seed) + split64(stream, "stream") + \
        (work(1.0 / (1.0 - p)),)


# ---- scalar helpers (njit) ----------------------------------------------------------------------

@intrinsic
def _fma(typingctx, a, b, c):
    """IEEE fused multiply-add (one rounding) of three floats of one type (llvm.fma)."""
    if not (a == b == c and isinstance(a, types.Float)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return a(a, a, a), codegen


@njit(inline="always")
def _round_format(x, rnd):
    """x (a W value) rounded to nearest-even on the grid of the format rnd = (mantissa bits, emin,
    max), as a float64; beyond max: ±Inf. Exact, in float64 bit arithmetic (no libm call): with
    2^e <= |x| < 2^(e+1) (x is a normal float64) the grid step is 2^g, g = max(e, emin) − mant,
    and adding then subtracting 1.5·2^(52+g) rounds |x| to it, ties to even (|x| < 2^(51+g)).
    Oracle: the ldexp/rint formulation, on random values of every format (tests)."""
    mant, emin, largest = rnd
    v = np.float64(x)
    if mant < 0 or v == 0 or not abs(v) < np.inf:
        return v
    e = ((_as_bits(v) >> 52) & 0x7FF) - 1023
    g = max(e, emin) - mant
    magic = _from_bits(((52 + g + 1023) << 52) | (1 << 51))
    r = math.copysign((v + magic) - magic, v)             # a result of 0 keeps x's sign, as rint
    return r if abs(r) <= largest else math.copysign(np.inf, r)


@njit(inline="always")
def _nominal(x, emin_pow2):
    """max(2^floor(log2|x|), 2^emin) for a finite non-zero float64 x; 0 for zeros, Inf, NaN."""
    if x == 0.0 or not abs(x) < np.inf:
        return 0.0
    return max(math.ldexp(1.0, math.frexp(x)[1] - 1), emin_pow2)


@njit
def _keep_row(keep, n, first, drop):
    """keep[c] = (word first + c of the Philox stream >= threshold) for c < n (all True without
    dropout). One Philox call per four words."""
    enabled, threshold = drop[0], drop[1]
    key, stream = (drop[2], drop[3]), (drop[4], drop[5])
    if not enabled:
        keep[:n] = True
        return
    c = 0
    while c < n:
        idx = first + c
        words = philox_block(key, stream, idx >> 2)
        for t in range(idx & 3, 4):
            if c < n:
                keep[c] = words[t] >= threshold
                c += 1


@njit(inline="always")
def _visible(i, j0, bc, nq, nk, causal):
    """How many keys j0, j0+1, ... of a block of bc are visible to query i (a prefix)."""
    if not causal:
        return bc
    return min(max(i + nk - nq - j0 + 1, 0), bc)


# ---- tile GEMMs ----------------------------------------------------------------------------------
# An operand is (x, z, r0, t): the rows r0, r0+1, ... of batch z of a 3-D C-contiguous array, read
# transposed when t. A(r, k) = x[z, r0 + r, k] (t: x[z, r0 + k, r]); B(k, j) = x[z, r0 + k, j]
# (t: x[z, r0 + j, k]). One array type for every operand, and flags and offsets passed as run-time
# values (Numba compiles a function once per *literal* argument), keep _mm to one specialisation
# per work dtype.
_NO, _YES, _ZERO = np.bool_(False), np.bool_(True), np.int64(0)


@njit(inline="always")
def _at(x, z, r0, transposed, r, k):
    return x[z, r0 + k, r] if transposed else x[z, r0 + r, k]


@njit
def _scratch(eng, m, kk, n):
    """Per-task buffers of the engine: packed A (ceil(m/ROWS), kk, ROWS) and B (ceil(n/COLS), kk,
    COLS) panels (FMA_TILE); decoded A values/nominals (m, kk), B (kk, n) and five (n,) float64
    rows (BLOCK, general path); the register-blocked block path's packed panels, anchor codes,
    parameters, tile scratch, flag, a copy of c, four (kk,) exponent ranges and the exponent
    fields of A's and B's panels (BLOCK). Unused buffers are empty."""
    fast, block = eng[0] == FMA_TILE, eng[0] == BLOCK
    ap = np.zeros(((m + ROWS - 1) // ROWS if fast else 0, kk, ROWS), np.float32)
    bp = np.zeros(((n + COLS - 1) // COLS if fast else 0, kk, COLS), np.float32)
    mb, kb, nb = (m, kk, n) if block else (0, 0, 0)
    mt, nt = (m + _BR - 1) // _BR if block else 0, (n + _BC - 1) // _BC if block else 0
    return (ap, bp, np.empty((mb, kb)), np.empty((mb, kb)), np.empty((kb, nb)),
            np.empty((kb, nb)), np.empty(nb), np.empty(nb), np.empty(nb), np.empty(nb),
            np.empty(nb),
            np.empty((mt, kb, _BR), np.float32), np.empty((mt, kb, _BR), np.uint32),
            np.empty((nt, kb, _BC), np.float32), np.empty((nt, kb, _BC), np.uint8),
            np.empty(8, np.int32), np.empty(SCRATCH_WORDS if block else 0, np.int32),
            np.zeros(1, np.int32), np.empty((mt * _BR, nt * _BC), np.float32),
            np.empty(kb, np.uint32), np.empty(kb, np.uint32), np.empty(kb, np.uint32),
            np.empty(kb, np.uint32), np.empty((mt, kb, _BR), np.uint8),
            np.empty((nt, kb, _BC), np.uint8))


@njit
def _mm(c, a, za, ra, a_t, b, zb, rb, b_t, m, n, kk, eng, sc):
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
                    c[r, j] = _fma(x, y, c[r, j]) if code == FMA else c[r, j] + x * y


@njit
def _mm_block(c, a, za, ra, a_t, b, zb, rb, b_t, m, n, kk, eng, sc):
    """The block model of ``mpt.kernels.mma`` (specs/tensor_cores.md §1) for every c[r, :n]:
    the register-blocked tile kernel (``mpt.kernels.block_gemm``) when the operands and c meet
    its conditions and it raises no flag, else :func:`_mm_block_general`."""
    a2 = a[za, ra:ra + kk, :m].T if a_t else a[za, ra:ra + m, :kk]          # (m, kk)
    b2 = b[zb, rb:rb + n, :kk].T if b_t else b[zb, rb:rb + kk, :n]          # (kk, n)
    if not _mm_block_fast(c, a2, b2, m, n, kk, eng, sc):
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
    va, ea, vb, eb, prm, scratch, flag, saved, lo_a, hi_a, lo_b, hi_b, fa, fb = sc[11:]
    L, F = eng[1], eng[2]
    fmin = np.uint32(max(_exponent_of(eng[8]) + 127, 1))
    for x in (lo_a, lo_b):
        x[:kk] = 0xFFFF
    for x in (hi_a, hi_b):
        x[:kk] = 0
    mt = tile_pack_fields(a2, fmin, va, fa, lo_a, hi_a)
    nt = tile_pack_fields(b2.T, fmin, vb, fb, lo_b, hi_b)
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
    finite, largest, smallest = magnitude_range(c[:m, :n])
    if not finite or largest + kk * 2.0 ** (highest + 2) >= 2.0 ** E_MAX or \
            smallest < 2.0 ** (F - 125):
        return False
    tile_codes(fa, mt, kk, np.int32(shift_a - 127), ea)
    tile_codes(fb, nt, kk, np.int32(shift_b + 127), eb)
    region = c[:mt * _BR, :nt * _BC]
    saved[:mt * _BR, :nt * _BC] = region
    flag[0] = 0
    chain_tiles(c, va[:mt], ea[:mt], vb[:nt], eb[:nt], kk, prm, variant, scratch, flag)
    if flag[0] == 0:
        return True
    region[:, :] = saved[:mt * _BR, :nt * _BC]
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
def _tile(rows, cols, dtype):
    """A zeroed accumulator tile padded to whole micro-tiles of every engine (ROWS x COLS and
    BLOCK_ROWS x BLOCK_COLS: 8 x 64)."""
    return np.zeros(((rows + _BR - 1) // _BR * _BR, (cols + _BC - 1) // _BC * _BC), dtype)


# ---- forward -------------------------------------------------------------------------------------

@njit
def _forward_row(s, p, acc, keep, r, bc, ncols, dv, m, l, tau, tau2, exp2, rnd):
    """One query row's online-softmax step for one key block (module docstring): updates m[r],
    l[r] and the rescaled acc[r, :dv]; writes keep ∘ round_F(P) into p[0, r, :bc]."""
    W = m.dtype.type
    mo = m[r]
    mx = mo
    for c in range(ncols):
        x = W(s[r, c]) if exp2 else W(W(s[r, c]) * tau)
        if x > mx or x != x:
            mx = x
    p[0, r, :bc] = 0.0
    if mx == -np.inf:               # no visible key yet: O and l stay 0
        return
    if exp2:
        mxs = W(mx * tau2)
        alpha = W(math.exp2(np.float64(W(W(mo - mx) * tau2))))
    else:
        alpha = W(math.exp(np.float64(W(mo - mx))))
    lr = W(alpha * l[r])
    for c in range(ncols):
        if exp2:
            pc = W(math.exp2(np.float64(_fma(W(s[r, c]), tau2, -mxs))))
        else:
            pc = W(math.exp(np.float64(W(W(W(s[r, c]) * tau) - mx))))
        lr = W(lr + pc)
        if keep[c]:
            p[0, r, c] = _round_format(pc, rnd)
    for c in range(dv):
        acc[r, c] = W(alpha * W(acc[r, c]))
    m[r] = mx
    l[r] = lr


@njit
def _forward_task(t, q, k, v, kv_of, o, lse, tau, tau2, causal, bq, bk, exp2, eng, rnd, drop):
    """Query block t % nqb of query batch t // nqb: the whole forward of its rows."""
    Z, nq, d = q.shape
    nk, dv = k.shape[1], v.shape[2]
    W = q.dtype.type
    nqb, nkb = (nq + bq - 1) // bq, (nk + bk - 1) // bk
    z, ib = t // nqb, t % nqb
    zk = kv_of[z]
    i0 = ib * bq
    br = min(bq, nq - i0)
    sc = _scratch(eng, bq, max(d, bk), max(bk, dv))
    s = _tile(bq, bk, q.dtype)                 # (Br, Bc) raw scores
    acc = _tile(bq, dv, q.dtype)               # (Br, dv) O accumulator
    p = np.zeros((1, bq, bk), q.dtype)         # keep ∘ round_F(P)
    keep = np.ones(bk, np.bool_)
    m = np.full(bq, -np.inf, q.dtype)
    l = np.zeros(bq, q.dtype)
    for jb in range(nkb):
        j0 = jb * bk
        bc = min(bk, nk - j0)
        if causal and j0 > i0 + br - 1 + nk - nq:
            break                                      # this and every later block is masked
        s[:] = 0.0
        _mm(s, q, z, i0, _NO, k, zk, j0, _YES, br, bc, d, eng, sc)
        for r in range(br):
            ncols = _visible(i0 + r, j0, bc, nq, nk, causal)
            _keep_row(keep, ncols, ((z * nq) + i0 + r) * nk + j0, drop)
            _forward_row(s, p, acc, keep, r, bc, ncols, dv, m, l, tau, tau2, exp2, rnd)
        _mm(acc, p, _ZERO, _ZERO, _NO, v, zk, j0, _NO, br, dv, bc, eng, sc)
    for r in range(br):
        lr = l[r]
        if lr == 0 or lr != lr:
            inv = W(1.0)
            lse[z, i0 + r] = W(np.inf)
        else:
            inv = W(1.0) / lr
            lg = W(math.log(np.float64(lr)))
            lse[z, i0 + r] = W(W(m[r] * tau) + lg) if exp2 else W(m[r] + lg)
        scale = W(inv * drop[6]) if drop[0] else inv
        for c in range(dv):
            o[z, i0 + r, c] = W(W(acc[r, c]) * scale)


@njit(cache=True, parallel=True)
def _forward(q, k, v, kv_of, o, lse, tau, tau2, causal, bq, bk, exp2, eng, rnd, drop):
    tasks = q.shape[0] * ((q.shape[1] + bq - 1) // bq)
    for t in prange(tasks):
        _forward_task(np.int64(t), q, k, v, kv_of, o, lse, tau, tau2, causal, bq, bk, exp2, eng,
                      rnd, drop)


# ---- backward ------------------------------------------------------------------------------------

@njit(cache=True, parallel=True)
def _rowdot(do, o):
    """D[z, i] = Σ_c W(dO·O) sequential in c, from W(0)."""
    Z, n, dv = o.shape
    out = np.zeros((Z, n), o.dtype)
    for t in prange(Z * n):
        z, i = t // n, t % n
        acc = o.dtype.type(0.0)
        for c in range(dv):
            acc += do[z, i, c] * o[z, i, c]
        out[z, i] = acc
    return out


@njit
def _backward_row(s, dp, p, ds, keep, r, bc, ncols, lse_r, d_r, tau, tau2, exp2, rnd, drop):
    """One query row of one (query block, key block) pair: P recomputed from L into p[0, r] as
    keep ∘ round_F(P), and round_F(dS) into ds[0, r] (module docstring)."""
    W = p.dtype.type
    l2 = W(lse_r * W(LOG2E))
    p[0, r, :bc] = 0.0
    ds[0, r, :bc] = 0.0
    for c in range(ncols):
        if exp2:
            pc = W(math.exp2(np.float64(_fma(W(s[r, c]), tau2, -l2))))
        else:
            pc = W(math.exp(np.float64(W(W(W(s[r, c]) * tau) - lse_r))))
        dpc = W(dp[r, c])
        if drop[0]:
            dpc = W(dpc * drop[6]) if keep[c] else W(0.0)
        if keep[c]:
            p[0, r, c] = _round_format(pc, rnd)
        ds[0, r, c] = _round_format(W(W(pc * W(dpc - d_r)) * tau), rnd)


@njit
def _backward_task(zk, q, k, v, do, lse, dsum, kv_order, kv_start, dq, dk, dvo, tau, tau2,
                   causal, bq, bk, exp2, eng, rnd, drop):
    """Key/value batch zk: dK, dV of its keys and dQ of the query batches that read it."""
    Z, nq, d = q.shape
    Zk, nk, dv = v.shape
    W = q.dtype.type
    nqb, nkb = (nq + bq - 1) // bq, (nk + bk - 1) // bk
    top = max(bq, bk)
    sc = _scratch(eng, top, max(d, dv, top), max(bk, d, dv))
    s = _tile(bq, bk, q.dtype)                 # (Br, Bc) scores
    dp = _tile(bq, bk, q.dtype)                # (Br, Bc) dO·Vᵀ
    dk_acc = _tile(bk, d, q.dtype)             # (Bc, d)
    dv_acc = _tile(bk, dv, q.dtype)            # (Bc, dv)
    dq_tile = _tile(bq, d, q.dtype)            # (Br, d)
    p = np.zeros((1, bq, bk), q.dtype)
    ds = np.zeros((1, bq, bk), q.dtype)
    keep = np.ones(bk, np.bool_)
    for jb in range(nkb):
        j0 = jb * bk
        bc = min(bk, nk - j0)
        dk_acc[:] = 0.0
        dv_acc[:] = 0.0
        for g in range(kv_start[zk], kv_start[zk + 1]):
            z = kv_order[g]
            for ib in range(nqb):
                i0 = ib * bq
                br = min(bq, nq - i0)
                if causal and j0 > i0 + br - 1 + nk - nq:
                    continue                           # the forward skipped this pair
                s[:] = 0.0
                _mm(s, q, z, i0, _NO, k, zk, j0, _YES, br, bc, d, eng, sc)
                dp[:] = 0.0
                _mm(dp, do, z, i0, _NO, v, zk, j0, _YES, br, bc, dv, eng, sc)
                for r in range(br):
                    i = i0 + r
                    ncols = _visible(i, j0, bc, nq, nk, causal)
                    _keep_row(keep, ncols, (z * nq + i) * nk + j0, drop)
                    _backward_row(s, dp, p, ds, keep, r, bc, ncols, lse[z, i], dsum[z, i], tau,
                                  tau2, exp2, rnd, drop)
                _mm(dv_acc, p, _ZERO, _ZERO, _YES, do, z, i0, _NO, bc, dv, br, eng, sc)
                _mm(dk_acc, ds, _ZERO, _ZERO, _YES, q, z, i0, _NO, bc, d, br, eng, sc)
                dq_tile[:br, :d] = dq[z, i0:i0 + br]
                _mm(dq_tile, ds, _ZERO, _ZERO, _NO, k, zk, j0, _NO, br, d, bc, eng, sc)
                dq[z, i0:i0 + br] = dq_tile[:br, :d]
        for r in range(bc):
            for c in range(d):
                dk[zk, j0 + r, c] = dk_acc[r, c]
            for c in range(dv):
                dvo[zk, j0 + r, c] = W(dv_acc[r, c] * drop[6]) if drop[0] else dv_acc[r, c]


@njit(cache=True, parallel=True)
def _backward(q, k, v, do, lse, dsum, kv_order, kv_start, dq, dk, dvo, tau, tau2, causal, bq, bk,
              exp2, eng, rnd, drop):
    for zk in prange(k.shape[0]):
        _backward_task(np.int64(zk), q, k, v, do, lse, dsum, kv_order, kv_start, dq, dk, dvo, tau,
                       tau2, causal, bq, bk, exp2, eng, rnd, drop)


# ---- drivers (Python) ----------------------------------------------------------------------------

def _check(q, k, v, kv_of, block_q, block_k):
    work = q.dtype
    if work not in (np.float32, np.float64) or k.dtype != work or v.dtype != work:
        raise TypeError(f"q, k, v must be float32 (or float64) arrays of one dtype; got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or q.shape[2] != k.shape[2] \
            or k.shape[:2] != v.shape[:2]:
        raise ValueError(f"need q (Z, Nq, d), k (Zkv, Nk, d), v (Zkv, Nk, dv); got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    if kv_of.shape != (q.shape[0],) or kv_of.size and not 0 <= kv_of.min() <= kv_of.max() < \
            k.shape[0]:
        raise ValueError(f"kv_of must map each of the {q.shape[0]} query batches to one of "
                         f"{k.shape[0]} key/value batches")
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ValueError(f"{name} must be a positive int; got {b!r}")


def flash_forward(q, k, v, kv_of, *, scale, causal, block_q, block_k, exp2, engine, rounding,
                  dropout=None):
    """FlashAttention-2 forward (module docstring). q (Z, Nq, d), k (Zkv, Nk, d), v (Zkv, Nk, dv)
    C-contiguous W arrays; kv_of (Z,) int64; ``engine`` from :func:`engine_params`, ``rounding``
    from :func:`rounding_params`, ``dropout`` None or (p, seed, stream). Returns (O, L): the
    normalised FP32 (W) output (Z, Nq, dv) before the cast to F, and the log-sum-exp (Z, Nq)."""
    _check(q, k, v, kv_of, block_q, block_k)
    W = q.dtype.type
    o = np.zeros((q.shape[0], q.shape[1], v.shape[2]), q.dtype)
    lse = np.zeros(q.shape[:2], q.dtype)
    with threads_for(q.shape[0] * q.shape[1] * k.shape[1] * (q.shape[2] + v.shape[2])):
        _forward(q, k, v, kv_of, o, lse, W(scale), W(scale * LOG2E),
                 bool(causal), int(block_q), int(block_k), bool(exp2), engine, rounding,
                 dropout_params(dropout, W))
    return o, lse


def flash_backward(q, k, v, o, do, lse, kv_of, *, scale, causal, block_q, block_k, exp2, engine,
                   rounding, dropout=None):
    """FlashAttention-2 backward (module docstring): o the stored output (its values in F, as W),
    do the output gradient (Z, Nq, dv), lse from :func:`flash_forward`; the other arguments as
    there. Returns (dQ, dK, dV) as W arrays of the FP32 accumulators (the caller rounds to F)."""
    _check(q, k, v, kv_of, block_q, block_k)
    W = q.dtype.type
    order = np.argsort(kv_of, kind="stable").astype(np.int64)          # query batches by kv batch
    start = np.searchsorted(kv_of[order], np.arange(k.shape[0] + 1)).astype(np.int64)
    dq = np.zeros(q.shape, q.dtype)
    dk = np.zeros(k.shape, q.dtype)
    dv = np.zeros(v.shape, q.dtype)
    with threads_for(q.shape[0] * q.shape[1] * k.shape[1] * (q.shape[2] + v.shape[2])):
        dsum = _rowdot(do, o)
        _backward(q, k, v, do, lse, dsum, order, start, dq, dk, dv, W(scale),
                  W(scale * LOG2E), bool(causal), int(block_q), int(block_k), bool(exp2), engine,
                  rounding, dropout_params(dropout, W))
    return dq, dk, dv
