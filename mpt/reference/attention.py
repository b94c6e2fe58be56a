"""Oracles of FlashAttention (``mpt.kernels.attention``): the same tiles in the same order in plain
numpy, and the exact attention in float64.

:func:`flash_forward` / :func:`flash_backward` re-implement the kernels' algorithm (their module
docstring is the specification) one tile at a time, vectorised over the rows and columns of a
tile, without sharing code with the kernels:

* GEMMs follow the MMA model given as ``mpt.reference.mma``'s dict, re-derived here in numpy:
  ``ieee_fma`` by an exact float32 fma (the float64 product is exact; the float64 sum is made
  round-to-odd with TwoSum and then rounded to float32, which is the correctly rounded fma since
  53 >= 24 + 2 bits); ``ieee_mul_add`` by float32 numpy products and sums; the block model from
  its definition (nominal exponents by ``frexp``, the anchor, truncated terms summed exactly in
  float64, one RZ rounding to 24 or 14 bits) — checked against the exact-rational
  ``mpt.reference.mma.block_dot_reference`` in the tests.
* exp, exp2 and log are Python's ``math`` functions (the platform libm) in float64, rounded once
  to float32; P and dS are rounded to the input format by ``mpt.reference.rounding.round_array``.
* The dropout words are a numpy Philox4x32-10 (Salmon et al. 2011).

Float32 work dtype only (fp64 mode is checked by gradient checks and :func:`attention`). Slow:
meant for small and medium shapes in tests. Inputs are assumed finite.
"""
from __future__ import annotations

import math

import numpy as np

from mpt.formats import UNSIGNED, get_format
from mpt.reference.rounding import round_array

__all__ = ["fma32", "mma", "philox_words", "flash_forward", "flash_backward", "attention",
           "attention_backward"]

_F32, _F64 = np.float32, np.float64
_LOG2E = float.fromhex("0x1.71547652b82fep+0")
_OUT_PRECISION = {"rz_fp32": 24, "rz_e8m13": 14}


# ---- scalar arithmetic --------------------------------------------------------------------------

def fma32(a, b, c) -> np.ndarray:
    """Correctly rounded float32 fma(a, b, c) of broadcast float32 arrays (finite values)."""
    p = np.asarray(a, _F64) * np.asarray(b, _F64)            # exact: 24 x 24 bits
    c = np.asarray(c, _F64)
    s = p + c
    bv = s - p
    err = (p - (s - bv)) + (c - bv)                           # TwoSum: p + c = s + err exactly
    even = (s.view(np.int64) & 1) == 0
    toward = np.where(err > 0, np.inf, -np.inf)
    s = np.where((err != 0) & even, np.nextafter(s, toward), s)  # round to odd
    return s.astype(_F32)


def _libm(fn, x) -> np.ndarray:
    """fn (a ``math`` function) of every element of x in float64, rounded once to float32."""
    x = np.asarray(x, _F64)
    return np.frompyfunc(fn, 1, 1)(x).astype(_F64).astype(_F32).reshape(x.shape)


def _round_format(x, fmt) -> np.ndarray:
    """x (float32) rounded to nearest-even in ``fmt``, as float32 values (fp32: x itself)."""
    if fmt.name == "fp32":
        return np.asarray(x, _F32)
    codes = round_array(np.asarray(x, _F64), fmt)
    uint = UNSIGNED[np.dtype(fmt.dtype).itemsize]
    return codes.astype(uint).view(fmt.dtype).astype(_F32)


# ---- the MMA models -----------------------------------------------------------------------------

def _nominal(x, emin):
    """max(2^floor(log2|x|), 2^emin) for non-zero x, 0 for zeros (float64 arrays)."""
    e = np.frexp(x)[1] - 1
    return np.where(x == 0, 0.0, np.ldexp(1.0, np.maximum(e, emin)))


def _block(c, a, b, model, emin):
    """One block: c (m, n) FP32 values + a (m, L) · b (L, n), the truncated fused sum."""
    F = model["fraction_bits"]
    p = _OUT_PRECISION[model["rounding"]]
    a, b, c = (np.asarray(x, _F64) for x in (a, b, c))
    anchor = np.maximum(np.ldexp(1.0, model["e_zero"]), _nominal(c, -126))
    products = (_nominal(a, emin)[:, :, None] * _nominal(b, emin)[None, :, :]).max(axis=1,
                                                                                  initial=0.0)
    q = np.maximum(anchor, products) * 2.0**-F                               # (m, n)
    terms = np.trunc(a[:, :, None] * b[None, :, :] / q[:, None, :])          # (m, L, n)
    total = np.trunc(c / q) + terms.sum(axis=1)                              # exact integers
    v = total * q
    grid = np.ldexp(1.0, np.maximum(np.frexp(v)[1] - 1, -126) - (p - 1))
    r = np.trunc(v / grid) * grid                                            # RZ to p bits
    r = np.where(np.abs(r) >= 2.0**128, np.copysign(np.inf, r), r)
    return np.where(total == 0, 0.0, r).astype(_F32)


def mma(c, a, b, model: dict, emin: int = -126) -> np.ndarray:
    """The MMA chain c + a·b over k = 0..K-1 of float32 arrays c (m, n), a (m, K), b (K, n) under
    ``model`` (``{"kind": "ieee_fma"}``, ``{"kind": "ieee_mul_add"}`` or a block model dict);
    ``emin``: the input format's (nominal exponents of subnormal inputs)."""
    c = np.array(c, _F32)
    kind = model["kind"]
    if kind == "block":
        L = model["block"]
        for k0 in range(0, a.shape[1], L):
            c = _block(c, a[:, k0:k0 + L], b[k0:k0 + L], model, emin)
        return c
    for k in range(a.shape[1]):
        if kind == "ieee_fma":
            c = fma32(a[:, k:k + 1], b[k:k + 1], c)
        elif kind == "ieee_mul_add":
            c = c + a[:, k:k + 1] * b[k:k + 1]                   # float32 product, float32 sum
        else:
            raise ValueError(f"unknown model kind {kind!r}")
    return c


# ---- Philox4x32-10 ----------------------------------------------------------------------------

def philox_words(seed: int, stream: int, index) -> np.ndarray:
    """Word ``index`` (int array) of the Philox4x32-10 stream (seed, stream): word i is lane i % 4
    of the block with counter (i // 4 low, high, stream low, high) under key (seed low, high)."""
    index = np.asarray(index, np.int64)
    lo32 = np.uint64(0xFFFFFFFF)
    block = (index >> 2).astype(np.uint64)
    c = [block & lo32, block >> np.uint64(32), np.full_like(block, stream & 0xFFFFFFFF),
         np.full_like(block, stream >> 32)]
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & lo32, (p0 >> np.uint64(32)) ^ c[3] ^ k1,
             p0 & lo32]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & lo32, (k1 + np.uint64(0xBB67AE85)) & lo32
    return np.choose(index & 3, c)


def _keep(dropout, z, rows, cols, nq, nk):
    """(rows, cols) bool keep mask of batch z (all True without dropout)."""
    if dropout is None:
        return np.ones((len(rows), len(cols)), bool)
    p, seed, stream = dropout
    idx = (z * nq + rows[:, None]) * nk + cols[None, :]
    return philox_words(seed, stream, idx) >= np.uint64(round(p * 2.0**32))


# ---- the tiled algorithm ----------------------------------------------------------------------

class _Setup:
    def __init__(self, q, k, v, scale, causal, block_q, block_k, exp2, model, fmt, dropout):
        for x in (q, k, v):
            if x.dtype != _F32:
                raise TypeError("the flash oracle takes float32 values (fp64 mode: use attention)")
        self.nq, self.nk = q.shape[1], k.shape[1]
        self.tau, self.tau2 = _F32(scale), _F32(scale * _LOG2E)
        self.causal, self.bq, self.bk, self.exp2 = causal, block_q, block_k, exp2
        self.model, self.fmt, self.dropout = model, get_format(fmt), dropout
        self.emin = self.fmt.emin
        self.r = _F32(1.0 / (1.0 - dropout[0])) if dropout else _F32(1.0)

    def blocks(self, n, b):
        return [(s, min(s + b, n)) for s in range(0, n, b)]

    def skipped(self, i1, j0):
        """Whether the key block starting at j0 is masked for every row below i1."""
        return self.causal and j0 > i1 - 1 + self.nk - self.nq

    def visible(self, i0, i1, j0, j1):
        rows, cols = np.arange(i0, i1), np.arange(j0, j1)
        if not self.causal:
            return np.ones((i1 - i0, j1 - j0), bool)
        return cols[None, :] <= rows[:, None] + self.nk - self.nq

    def mm(self, c, a, b):
        return mma(c, a, b, self.model, self.emin)


def flash_forward(q, k, v, kv_of, *, scale, causal, block_q, block_k, exp2, model, fmt,
                  dropout=None):
    """The forward of ``mpt.kernels.attention.flash_forward`` for float32 q (Z, Nq, d), k
    (Zkv, Nk, d), v (Zkv, Nk, dv), kv_of (Z,); ``model`` a ``mpt.reference.mma`` dict, ``fmt`` the
    input format (P is rounded to it), ``dropout`` None or (p, seed, stream). Returns (O, L)."""
    st = _Setup(q, k, v, scale, causal, block_q, block_k, exp2, model, fmt, dropout)
    o = np.zeros((q.shape[0], st.nq, v.shape[2]), _F32)
    lse = np.zeros(q.shape[:2], _F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for z in range(q.shape[0]):
            zk = kv_of[z]
            for i0, i1 in st.blocks(st.nq, block_q):
                o[z, i0:i1], lse[z, i0:i1] = _forward_block(st, q[z, i0:i1], k[zk], v[zk], z, i0,
                                                            i1)
    return o, lse


def _forward_block(st, qi, kz, vz, z, i0, i1):
    br = i1 - i0
    m = np.full(br, -np.inf, _F32)
    l = np.zeros(br, _F32)
    acc = np.zeros((br, vz.shape[1]), _F32)
    for j0, j1 in st.blocks(st.nk, st.bk):
        if st.skipped(i1, j0):
            break
        s = st.mm(np.zeros((br, j1 - j0), _F32), qi, kz[j0:j1].T)          # raw scores
        vis = st.visible(i0, i1, j0, j1)
        x = s if st.exp2 else s * st.tau
        mx = np.maximum(m, np.where(vis, x, -np.inf).max(axis=1))          # NaN propagates
        live = mx != -np.inf
        if st.exp2:
            alpha = _libm(math.exp2, (m - mx) * st.tau2)
            p = _libm(math.exp2, fma32(s, st.tau2, -(mx * st.tau2)[:, None]))
        else:
            alpha = _libm(math.exp, m - mx)
            p = _libm(math.exp, s * st.tau - mx[:, None])
        p = np.where(vis & live[:, None], p, _F32(0))
        alpha = np.where(live, alpha, _F32(1))
        l = np.cumsum(np.concatenate([(alpha * l)[:, None], p], axis=1), axis=1,
                      dtype=_F32)[:, -1]                                    # sequential sum
        keep = _keep(st.dropout, z, np.arange(i0, i1), np.arange(j0, j1), st.nq, st.nk)
        pf = np.where(keep, _round_format(p, st.fmt), _F32(0))
        acc = st.mm(alpha[:, None] * acc, pf, vz[j0:j1])
        m = np.where(live, mx, m)
    empty = (l == 0) | np.isnan(l)
    inv = np.where(empty, _F32(1), _F32(1) / np.where(empty, _F32(1), l))
    lg = _libm(math.log, np.where(empty, 1.0, l))
    lse = np.where(empty, _F32(np.inf), (m * st.tau if st.exp2 else m) + lg)
    scale = inv * st.r if st.dropout else inv
    return acc * scale[:, None], lse


def flash_backward(q, k, v, o, do, lse, kv_of, *, scale, causal, block_q, block_k, exp2, model,
                   fmt, dropout=None):
    """The backward of ``mpt.kernels.attention.flash_backward``: o the stored output (values of
    fmt, as float32), do the output gradient, lse from the forward. Returns (dQ, dK, dV) as the
    float32 accumulators."""
    st = _Setup(q, k, v, scale, causal, block_q, block_k, exp2, model, fmt, dropout)
    dsum = np.cumsum(do * o, axis=-1, dtype=_F32)[..., -1]                   # D, sequential
    dq = np.zeros(q.shape, _F32)
    dk = np.zeros(k.shape, _F32)
    dv = np.zeros(v.shape, _F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for zk in range(k.shape[0]):
            group = [z for z in range(q.shape[0]) if kv_of[z] == zk]
            for j0, j1 in st.blocks(st.nk, block_k):
                dk_acc = np.zeros((j1 - j0, k.shape[2]), _F32)
                dv_acc = np.zeros((j1 - j0, v.shape[2]), _F32)
                for z in group:
                    for i0, i1 in st.blocks(st.nq, block_q):
                        if st.skipped(i1, j0):
                            continue
                        pf, ds = _backward_pair(st, q[z, i0:i1], k[zk, j0:j1], v[zk, j0:j1],
                                                do[z, i0:i1], lse[z, i0:i1], dsum[z, i0:i1], z,
                                                i0, i1, j0, j1)
                        dv_acc = st.mm(dv_acc, pf.T, do[z, i0:i1])
                        dk_acc = st.mm(dk_acc, ds.T, q[z, i0:i1])
                        dq[z, i0:i1] = st.mm(dq[z, i0:i1], ds, k[zk, j0:j1])
                dk[zk, j0:j1] = dk_acc
                dv[zk, j0:j1] = dv_acc * st.r if dropout else dv_acc
    return dq, dk, dv


def _backward_pair(st, qi, kj, vj, doi, lse, dsum, z, i0, i1, j0, j1):
    """(keep ∘ round_F(P), round_F(dS)) of one (query block, key block) pair."""
    s = st.mm(np.zeros((i1 - i0, j1 - j0), _F32), qi, kj.T)
    dp = st.mm(np.zeros((i1 - i0, j1 - j0), _F32), doi, vj.T)
    vis = st.visible(i0, i1, j0, j1)
    if st.exp2:
        p = _libm(math.exp2, fma32(s, st.tau2, -(lse * _F32(_LOG2E))[:, None]))
    else:
        p = _libm(math.exp, s * st.tau - lse[:, None])
    keep = _keep(st.dropout, z, np.arange(i0, i1), np.arange(j0, j1), st.nq, st.nk)
    if st.dropout:
        dp = np.where(keep, dp * st.r, _F32(0))
    pf = np.where(vis & keep, _round_format(p, st.fmt), _F32(0))
    ds = np.where(vis, _round_format(p * (dp - dsum[:, None]) * st.tau, st.fmt), _F32(0))
    return pf, ds


# ---- exact attention in float64 ---------------------------------------------------------------

def _scores(q, k, kv_of, scale, causal):
    q, k = np.asarray(q, _F64), np.asarray(k, _F64)[kv_of]
    s = np.einsum("zid,zjd->zij", q, k) * scale
    nq, nk = q.shape[1], k.shape[1]
    vis = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq if causal else \
        np.ones((nq, nk), bool)
    s = np.where(vis, s, -np.inf)
    empty = ~vis.any(axis=1)[None, :, None]
    e = np.exp(s - np.where(empty, 0.0, s.max(axis=-1, keepdims=True)))
    return np.where(empty, 0.0, e / np.where(empty, 1.0, e.sum(axis=-1, keepdims=True)))


def attention(q, k, v, kv_of, *, scale, causal=False):
    """softmax(q·kᵀ·scale, masked)·v in float64 (rows without keys give 0); q (Z, Nq, d),
    k (Zkv, Nk, d), v (Zkv, Nk, dv), kv_of (Z,)."""
    p = _scores(q, k, kv_of, scale, causal)
    return np.einsum("zij,zjd->zid", p, np.asarray(v, _F64)[kv_of])


def attention_backward(q, k, v, do, kv_of, *, scale, causal=False):
    """(dq, dk, dv) of :func:`attention` for the output gradient do, in float64 (textbook:
    dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P∘(dP − rowsum(dP∘P)), dQ = τ·dS·K, dK = τ·dSᵀ·Q; the key/value
    gradients of query batches that share a key/value batch are summed)."""
    p = _scores(q, k, kv_of, scale, causal)
    q64, k64, v64, do64 = (np.asarray(x, _F64) for x in (q, k, v, do))
    dp = np.einsum("zid,zjd->zij", do64, v64[kv_of])
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    dk, dv = np.zeros_like(k64), np.zeros_like(v64)
    np.add.at(dk, kv_of, np.einsum("zij,zid->zjd", ds, q64))
    np.add.at(dv, kv_of, np.einsum("zij,zid->zjd", p, do64))
    return np.einsum("zij,zjd->zid", ds, k64[kv_of]), dk, dv
