"""L1: FlashAttention-2 (Dao 2023) forward and backward, tile by tile, with the rounding points of
the real kernels and every GEMM through an MMA model.

Arrays: q (Z, Nq, d), k (Zkv, Nk, d), v (Zkv, Nk, dv) hold the values of one input format F
decoded exactly to the work dtype W (float32; float64 in fp64 mode); query batch z reads key/value
batch ``kv_of[z]`` (grouped-query attention and broadcast batches). τ is the softmax scale,
τ₂ = W(τ·log2 e); ``W(x)`` is one RNE rounding to W; exp, exp2 and log are evaluated in float64
by the platform libm from the exact W argument and rounded once to W (``mpt.kernels.ops``;
P's exponentials run vectorized with those bits, ``mpt.kernels.exp_fast``). exp2 is spelled
``np.exp2``: Numba lowers it, as it lowers ``math.exp2`` from 0.61 on, to the same ``llvm.exp2``
intrinsic, and Numba 0.60 has no ``math.exp2``.

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
thread count): ``FMA_TILE`` (ieee_fma on float32), ``FMA`` (sequential fma in W: fp64 mode),
``MUL_ADD`` (ieee_mul_add) and ``BLOCK`` (the Tensor Core block model of ``mpt.kernels.mma``: K
consumed in blocks of L from the start of each tile GEMM), run by the tile GEMMs of
:mod:`mpt.kernels.flash_gemm`. NaN and Inf propagate as the IEEE operations above do; a NaN score
makes its row's max NaN. Oracle: ``mpt.reference.attention.flash_forward`` / ``flash_backward``
(numpy, the same order), and the fp64 ``mpt.reference.attention.attention`` for accuracy.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from mpt._checks import check_int
from mpt.kernels.exp_fast import exp_into
from mpt.kernels.flash_gemm import (BLOCK, FMA, FMA_TILE, MUL_ADD, NO, YES, ZERO, acc_tile, fma,
                                    tile_mm, tile_scratch)
from mpt.kernels.mma import _as_bits, _from_bits, threads_for
from mpt.kernels.random import philox_block, split64
from mpt.kernels.threads import run_tasks

__all__ = ["FMA_TILE", "FMA", "MUL_ADD", "BLOCK", "engine_params", "rounding_params",
           "dropout_params", "flash_forward", "flash_backward"]

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

@njit(inline="always")
def _round_format(x, rnd):
    """x (a W value) rounded to nearest-even on the grid of the format rnd = (mantissa bits, emin,
    max), as a float64; beyond max: ±Inf. Exact, in float64 bit arithmetic (no libm call): with
    2^e <= |x| < 2^(e+1) (x is a normal float64) the grid step is 2^g, g = max(e, emin) − mant,
    and adding then subtracting 1.5·2^(52+g) rounds |x| to it, ties to even (|x| < 2^(51+g)).
    Zeros, ±Inf and NaN (and every x when mant < 0) are returned as they are, by a final select:
    no branch, so that loops over rows vectorize. Oracle: the ldexp/rint formulation, on random
    values of every format (tests)."""
    mant, emin, largest = rnd
    v = np.float64(x)
    e = ((_as_bits(v) >> 52) & 0x7FF) - 1023
    g = max(e, emin) - mant
    magic = _from_bits(((52 + g + 1023) << 52) | (1 << 51))
    r = math.copysign((v + magic) - magic, v)             # a result of 0 keeps x's sign, as rint
    r = r if abs(r) <= largest else math.copysign(np.inf, r)
    return v if mant < 0 or v == 0 or not abs(v) < np.inf else r


@njit(inline="always")
def _round_row(out, x, keep, n, bc, rnd):
    """out[c] = keep[c] ? round_F(x[c]) : 0 for c < n, and 0 for n <= c < bc (fp32/fp64: x as
    it is, which :func:`_round_format` returns for them, without its bit arithmetic)."""
    if rnd[0] < 0:
        for c in range(n):
            out[c] = np.float64(x[c]) if keep[c] else 0.0
    else:
        for c in range(n):
            out[c] = _round_format(x[c], rnd) if keep[c] else 0.0
    out[n:bc] = 0.0


@njit
def _keep_row(keep, n, first, drop):
    """keep[c] = (word first + c of the Philox stream >= threshold) for c < n, with dropout (the
    callers' keep is all True without). One Philox call per four words."""
    threshold = drop[1]
    key, stream = (drop[2], drop[3]), (drop[4], drop[5])
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


# ---- forward -------------------------------------------------------------------------------------

@njit(inline="always")
def _forward_row(s, p, acc, keep, r, bc, ncols, dv, m, l, tau, tau2, exp2, rnd, buf, doubt):
    """One query row's online-softmax step for one key block (module docstring): updates m[r],
    l[r] and the rescaled acc[r, :dv]; writes keep ∘ round_F(P) into p[0, r, :bc]. buf: (2, >= bc)
    of W for the exponents' arguments and the FP32 P; doubt: (>= bc,) bool scratch."""
    W = m.dtype.type
    mo = m[r]
    mx = mo
    for c in range(ncols):
        x = W(s[r, c]) if exp2 else W(W(s[r, c]) * tau)
        if x > mx or x != x:
            mx = x
    if mx == -np.inf:               # no visible key yet: O and l stay 0
        p[0, r, :bc] = 0.0
        return
    arg, pc = buf[0, :ncols], buf[1, :ncols]
    if exp2:
        mxs = W(mx * tau2)
        alpha = W(np.exp2(np.float64(W(W(mo - mx) * tau2))))
        for c in range(ncols):
            arg[c] = fma(W(s[r, c]), tau2, -mxs)
    else:
        alpha = W(math.exp(np.float64(W(mo - mx))))
        for c in range(ncols):
            arg[c] = W(W(W(s[r, c]) * tau) - mx)
    exp_into(arg, pc, doubt, exp2)
    lr = W(alpha * l[r])
    for c in range(ncols):
        lr = W(lr + pc[c])
    _round_row(p[0, r], pc, keep, ncols, bc, rnd)
    for c in range(dv):
        acc[r, c] = W(alpha * W(acc[r, c]))
    m[r] = mx
    l[r] = lr


@njit(inline="always")
def _forward_task(t, q, k, v, kv_of, o, lse, tau, tau2, causal, bq, bk, exp2, eng, rnd, drop):
    """Query block t % nqb of query batch t // nqb: the whole forward of its rows. (Inlined into
    :func:`_forward`: a separate function is one more large LLVM module to optimize and emit.)"""
    Z, nq, d = q.shape
    nk, dv = k.shape[1], v.shape[2]
    W = q.dtype.type
    nqb, nkb = (nq + bq - 1) // bq, (nk + bk - 1) // bk
    z, ib = t // nqb, t % nqb
    zk = kv_of[z]
    i0 = ib * bq
    br = min(bq, nq - i0)
    sc = tile_scratch(eng, bq, max(d, bk), max(bk, dv))
    s = acc_tile(bq, bk, q.dtype)                 # (Br, Bc) raw scores
    acc = acc_tile(bq, dv, q.dtype)               # (Br, dv) O accumulator
    p = np.zeros((1, bq, bk), q.dtype)         # keep ∘ round_F(P)
    keep, doubt = np.ones(bk, np.bool_), np.empty(bk, np.bool_)
    buf = np.empty((2, bk), q.dtype)
    m = np.full(bq, -np.inf, q.dtype)
    l = np.zeros(bq, q.dtype)
    for jb in range(nkb):
        j0 = jb * bk
        bc = min(bk, nk - j0)
        if causal and j0 > i0 + br - 1 + nk - nq:
            break                                      # this and every later block is masked
        s[:] = 0.0
        tile_mm(s, q, z, i0, NO, k, zk, j0, YES, br, bc, d, eng, sc)
        for r in range(br):
            ncols = _visible(i0 + r, j0, bc, nq, nk, causal)
            if drop[0]:             # (without dropout keep stays all True)
                _keep_row(keep, ncols, ((z * nq) + i0 + r) * nk + j0, drop)
            _forward_row(s, p, acc, keep, r, bc, ncols, dv, m, l, tau, tau2, exp2, rnd, buf,
                         doubt)
        tile_mm(acc, p, ZERO, ZERO, NO, v, zk, j0, NO, br, dv, bc, eng, sc)
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


@njit(cache=True, nogil=True)
def _forward(first, step, ntasks, q, k, v, kv_of, o, lse, tau, tau2, causal, bq, bk, exp2, eng,
             rnd, drop):
    """Forward tasks first, first + step, ... below ntasks (``mpt.kernels.threads.run_tasks``)."""
    for t in range(first, ntasks, step):
        _forward_task(np.int64(t), q, k, v, kv_of, o, lse, tau, tau2, causal, bq, bk, exp2, eng,
                      rnd, drop)


# ---- backward ------------------------------------------------------------------------------------

@njit(cache=True)
def _rowdot(do, o):
    """D[z, i] = Σ_c W(dO·O) sequential in c, from W(0). On the calling thread: its work is at
    most 1/n of the backward's, and at GPT sizes (4096 rows of 32) waking a second thread cost
    more than it saved (0.2 ms a step on one thread, 1.4 ms on two, 2-core AMD EPYC)."""
    Z, n, dv = o.shape
    out = np.zeros((Z, n), o.dtype)
    for z in range(Z):
        for i in range(n):
            acc = o.dtype.type(0.0)
            for c in range(dv):
                acc += do[z, i, c] * o[z, i, c]
            out[z, i] = acc
    return out


@njit(inline="always")
def _backward_row(s, dp, p, ds, keep, r, bc, ncols, lse_r, d_r, tau, tau2, exp2, rnd, drop,
                  buf, every, doubt):
    """One query row of one (query block, key block) pair: P recomputed from L into p[0, r] as
    keep ∘ round_F(P), and round_F(dS) into ds[0, r] (module docstring); buf: (3, >= bc) of W
    for the exponents' arguments and the FP32 P and dS of the rounding passes; every: (>= bc,)
    True; doubt: (>= bc,) bool scratch."""
    W = p.dtype.type
    arg, pc, dsc = buf[2, :ncols], buf[0, :ncols], buf[1, :ncols]
    if exp2:
        l2 = W(lse_r * W(LOG2E))
        for c in range(ncols):
            arg[c] = fma(W(s[r, c]), tau2, -l2)
    else:
        for c in range(ncols):
            arg[c] = W(W(W(s[r, c]) * tau) - lse_r)
    exp_into(arg, pc, doubt, exp2)
    for c in range(ncols):
        dpc = W(dp[r, c])
        if drop[0]:
            dpc = W(dpc * drop[6]) if keep[c] else W(0.0)
        dsc[c] = W(W(pc[c] * W(dpc - d_r)) * tau)
    _round_row(p[0, r], pc, keep, ncols, bc, rnd)
    _round_row(ds[0, r], dsc, every, ncols, bc, rnd)


@njit(inline="always")
def _backward_task(zk, q, k, v, do, lse, dsum, kv_order, kv_start, dq, dk, dvo, tau, tau2,
                   causal, bq, bk, exp2, eng, rnd, drop):
    """Key/value batch zk: dK, dV of its keys and dQ of the query batches that read it (inlined,
    as :func:`_forward_task`)."""
    Z, nq, d = q.shape
    Zk, nk, dv = v.shape
    W = q.dtype.type
    nqb, nkb = (nq + bq - 1) // bq, (nk + bk - 1) // bk
    top = max(bq, bk)
    sc = tile_scratch(eng, top, max(d, dv, top), max(bk, d, dv))
    s = acc_tile(bq, bk, q.dtype)                 # (Br, Bc) scores
    dp = acc_tile(bq, bk, q.dtype)                # (Br, Bc) dO·Vᵀ
    dk_acc = acc_tile(bk, d, q.dtype)             # (Bc, d)
    dv_acc = acc_tile(bk, dv, q.dtype)            # (Bc, dv)
    dq_tile = acc_tile(bq, d, q.dtype)            # (Br, d)
    p = np.zeros((1, bq, bk), q.dtype)
    ds = np.zeros((1, bq, bk), q.dtype)
    keep, every, doubt = np.ones(bk, np.bool_), np.ones(bk, np.bool_), np.empty(bk, np.bool_)
    buf = np.empty((3, bk), q.dtype)
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
                tile_mm(s, q, z, i0, NO, k, zk, j0, YES, br, bc, d, eng, sc)
                dp[:] = 0.0
                tile_mm(dp, do, z, i0, NO, v, zk, j0, YES, br, bc, dv, eng, sc)
                for r in range(br):
                    i = i0 + r
                    ncols = _visible(i, j0, bc, nq, nk, causal)
                    if drop[0]:
                        _keep_row(keep, ncols, (z * nq + i) * nk + j0, drop)
                    _backward_row(s, dp, p, ds, keep, r, bc, ncols, lse[z, i], dsum[z, i], tau,
                                  tau2, exp2, rnd, drop, buf, every, doubt)
                tile_mm(dv_acc, p, ZERO, ZERO, YES, do, z, i0, NO, bc, dv, br, eng, sc)
                tile_mm(dk_acc, ds, ZERO, ZERO, YES, q, z, i0, NO, bc, d, br, eng, sc)
                dq_tile[:br, :d] = dq[z, i0:i0 + br]
                tile_mm(dq_tile, ds, ZERO, ZERO, NO, k, zk, j0, NO, br, d, bc, eng, sc)
                dq[z, i0:i0 + br] = dq_tile[:br, :d]
        for r in range(bc):
            for c in range(d):
                dk[zk, j0 + r, c] = dk_acc[r, c]
            for c in range(dv):
                dvo[zk, j0 + r, c] = W(dv_acc[r, c] * drop[6]) if drop[0] else dv_acc[r, c]


@njit(cache=True, nogil=True)
def _backward(first, step, ntasks, q, k, v, do, lse, dsum, kv_order, kv_start, dq, dk, dvo, tau,
              tau2, causal, bq, bk, exp2, eng, rnd, drop):
    """Backward tasks (key/value batches) first, first + step, ... below ntasks (as
    :func:`_forward`)."""
    for zk in range(first, ntasks, step):
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
        check_int(name, b, min=1)


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
        run_tasks(_forward, q.shape[0] * ((q.shape[1] + block_q - 1) // block_q), q, k, v, kv_of,
                  o, lse, W(scale), W(scale * LOG2E), bool(causal), int(block_q), int(block_k),
                  bool(exp2), engine, rounding, dropout_params(dropout, W))
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
        run_tasks(_backward, k.shape[0], q, k, v, do, lse, dsum, order, start, dq, dk, dv,
                  W(scale), W(scale * LOG2E), bool(causal), int(block_q), int(block_k), bool(exp2),
                  engine, rounding, dropout_params(dropout, W))
    return dq, dk, dv
