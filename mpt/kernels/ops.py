"""L1: Numba kernels behind ``mpt.functional``: fixed-order reductions, row-wise softmax /
log-softmax / norms / cross-entropy, float64-evaluated transcendentals, embedding backward, and a
float64 matmul for fp64 mode.

Every kernel takes float32 arrays (the exact "opmath" values of fp32/fp16/bf16/fp8 tensors) or
float64 arrays (fp64 mode) and computes in that dtype ("work dtype"); arithmetic is plain IEEE
(no ``fastmath``, so LLVM neither reassociates nor contracts ``a*b + c`` into an FMA).

Orders (they decide the bits, and none depends on the thread count: threads split independent
outputs, never one sum):

* **Reductions** are sequential in increasing index: ``acc = 0; acc = acc + x[i]`` rounded to the
  work dtype at every step. Oracle: ``np.cumsum(x, dtype=work)[-1]`` (numpy's accumulate is
  sequential) and the float64 oracles of ``mpt.reference.ops``.
* **Transcendentals** (exp, log, tanh, erf, …) are evaluated in float64 with Numba's ``math``
  functions (the platform libm, < 1 ulp of float64) and rounded once (RNE) to the work dtype: for
  float32 results this is deterministic unless a float64 error straddles a float32 rounding
  boundary (probability about 2^-29 per value), and never uses float32 SIMD approximations. The
  float32 kernels of the tanh ops (tanh, sigmoid, gelu_tanh, silu) give the same bits faster: a
  vectorized float64 evaluation with a proven error bound, and libm's wherever the two could
  round differently (:mod:`mpt.kernels.tanh_ops`); so do the float32 exponentials of the
  cross-entropy kernels (:mod:`mpt.kernels.exp_fast`).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, prange

from mpt.kernels import readonly
from mpt.kernels.exp_fast import exp_into
from mpt.kernels.fma import fma64_chain
from mpt.kernels.tanh_ops import CHUNK as _CHUNK_T
from mpt.kernels.tanh_ops import TANH_OPS as _TANH_OPS
from mpt.kernels.tanh_ops import (fast_backward, fast_forward, fix_backward, fix_forward, libm_df64,
                                  libm_f64)
from mpt.kernels.threads import one_thread

__all__ = [
    "sum_anb", "softmax_rows", "softmax_backward_rows", "log_softmax_backward_rows",
    "layer_norm_rows", "layer_norm_backward_rows", "rms_norm_rows", "rms_norm_backward_rows",
    "cross_entropy_rows", "cross_entropy_backward_rows", "unary", "unary_backward",
    "pow_elementwise", "embedding_backward", "matmul_f64", "UNARY_OPS",
]

_CHUNK = 256  # columns per parallel task in sum_anb
_ROW_BLOCK = 16  # rows per parallel task of the row kernels with scratch rows
SERIAL_BELOW = 1 << 17  # elements: smaller problems run on the calling thread alone
# sum_anb is memory-bound: on 2 cores (AMD EPYC), 2 threads were slower than 1 from 1024 x 128
# to 1024 x 2048 and 4096 x 512 elements (26-408 us), so it runs on one thread up to 2^22
_SUM_SERIAL_BELOW = 1 << 22


def sized(kernel=None, *, below=SERIAL_BELOW):
    """Run a ``parallel=True`` kernel on the calling thread alone when its first argument has
    fewer than ``below`` elements: waking and joining worker threads costs more than such work
    (and much more on a loaded machine). Bits never depend on the thread count. ``@sized`` or
    ``@sized(below=n)``."""
    if kernel is None:
        return functools.partial(sized, below=below)

    @functools.wraps(kernel)
    def run(*args):
        with one_thread(args[0].size < below):
            return kernel(*args)
    return run

# ---- reductions ----------------------------------------------------------------------------------


@sized(below=_SUM_SERIAL_BELOW)
@njit(parallel=True, cache=True)
def sum_anb(x):
    """``out[a, b] = Σ_n x[a, n, b]``, sequential in increasing ``n``, in ``x``'s dtype.

    x: (A, N, B) C-contiguous float32/float64. Parallel over (a, block of 256 b) from
    ``_SUM_SERIAL_BELOW`` elements: every output element is summed by one thread in the same
    order, whatever the thread count.
    """
    A, N, B = x.shape
    out = np.zeros((A, B), x.dtype)
    nb = (B + _CHUNK - 1) // _CHUNK
    for t in prange(A * nb):
        a = t // nb
        b0 = (t % nb) * _CHUNK
        width = min(B, b0 + _CHUNK) - b0
        acc = np.zeros(_CHUNK, x.dtype)      # a local row of sums: the loop vectorizes
        for n in range(N):
            row = x[a, n, b0:b0 + width]
            for b in range(width):
                acc[b] += row[b]
        out[a, b0:b0 + width] = acc[:width]
    return out


@njit(inline="always")
def _row_max(row):
    """The largest element of a row (a NaN sticks); −inf for an empty row, the max of nothing
    (starting from −inf gives the same result as starting from ``row[0]`` otherwise)."""
    m = row.dtype.type(-np.inf)
    for v in row:
        if v > m or v != v:  # a NaN sticks (NaN > m and NaN <= m are both false)
            m = v
    return m


@njit(inline="always")
def _exp_row(row, m, ls, arg, out, doubt):
    """out[j] = W(exp((row[j] − m) − ls)) (W: the row's dtype; every step rounded to W; libm's
    float64 exp, vectorized with the same bits: ``mpt.kernels.exp_fast``); arg, doubt: scratch
    rows."""
    for j in range(row.size):
        arg[j] = (row[j] - m) - ls
    exp_into(arg, out, doubt, False)


# ---- softmax and log-softmax ---------------------------------------------------------------------


@sized
@njit(parallel=True, cache=True)
def softmax_rows(x, log):
    """Row softmax (``log=False``) or log-softmax (``log=True``) of x (R, N), float32/float64.

    Per row: ``m = max(x)``; ``d_j = x_j − m`` (work dtype); ``e_j = exp(d_j)`` (float64 exp,
    rounded); ``s = Σ e_j`` sequential; softmax ``y_j = e_j / s``; log-softmax
    ``y_j = d_j − log(s)`` with ``log(s)`` evaluated in float64 and rounded (PyTorch's
    ``x − max − logsum`` epilogue). Returns (y, m, logsum) — m and logsum per row.
    """
    R, N = x.shape
    y = np.empty_like(x)
    ms = np.empty(R, x.dtype)
    lse = np.empty(R, x.dtype)
    for r in prange(R):
        m = _row_max(x[r])
        s = x.dtype.type(0)
        for j in range(N):
            e = x.dtype.type(math.exp(np.float64(x[r, j] - m)))
            y[r, j] = e
            s += e
        ls = x.dtype.type(math.log(np.float64(s)))
        for j in range(N):
            y[r, j] = (x[r, j] - m) - ls if log else y[r, j] / s
        ms[r] = m
        lse[r] = ls
    return y, ms, lse


@sized
@njit(parallel=True, cache=True)
def softmax_backward_rows(y, g):
    """Softmax backward per row: ``s = Σ_j g_j·y_j`` (products rounded, sequential sum),
    ``gx_j = y_j · (g_j − s)``. y, g: (R, N) of one work dtype."""
    R, N = y.shape
    gx = np.empty_like(y)
    for r in prange(R):
        s = y.dtype.type(0)
        for j in range(N):
            s += g[r, j] * y[r, j]
        for j in range(N):
            gx[r, j] = y[r, j] * (g[r, j] - s)
    return gx


@sized
@njit(parallel=True, cache=True)
def log_softmax_backward_rows(y, g):
    """Log-softmax backward per row: ``s = Σ_j g_j`` sequential, ``gx_j = g_j − exp(y_j)·s``
    (exp in float64, rounded). y (the log-softmax output), g: (R, N)."""
    R, N = y.shape
    gx = np.empty_like(y)
    for r in prange(R):
        s = y.dtype.type(0)
        for j in range(N):
            s += g[r, j]
        for j in range(N):
            gx[r, j] = g[r, j] - y.dtype.type(math.exp(np.float64(y[r, j]))) * s
    return gx


# ---- layer norm and RMS norm ---------------------------------------------------------------------


@njit(inline="always")
def _inv_sqrt64(v):
    """``1/sqrt(v)`` evaluated in float64 (the caller rounds it once to its work dtype)."""
    return 1.0 / math.sqrt(np.float64(v))


@sized
@njit(parallel=True, cache=True)
def layer_norm_rows(x, w, b, inv_n, eps):
    """Layer norm of x (R, N) over its rows, two-pass, sequential sums in the work dtype:
    ``mean = (Σ x)·inv_n``; ``var = (Σ (x − mean)²)·inv_n`` (biased); ``rstd = 1/sqrt(var + eps)``
    (``var + eps`` rounded, then 1/sqrt in float64 rounded once);
    ``y = ((x − mean)·rstd)·w + b`` (each op rounded). w, b: (N,) (pass ones/zeros for none);
    inv_n, eps: scalars of the work dtype. Returns (y, mean, rstd)."""
    R, N = x.shape
    y = np.empty_like(x)
    means = np.empty(R, x.dtype)
    rstds = np.empty(R, x.dtype)
    for r in prange(R):
        s = x.dtype.type(0)
        for j in range(N):
            s += x[r, j]
        mean = s * inv_n
        q = x.dtype.type(0)
        for j in range(N):
            d = x[r, j] - mean
            q += d * d
        rstd = x.dtype.type(_inv_sqrt64(q * inv_n + eps))
        for j in range(N):
            y[r, j] = ((x[r, j] - mean) * rstd) * w[j] + b[j]
        means[r] = mean
        rstds[r] = rstd
    return y, means, rstds


@sized
@njit(parallel=True, cache=True)
def layer_norm_backward_rows(x, w, g, mean, rstd, inv_n):
    """Layer-norm input gradient and the per-element products for dw.

    ``xhat = (x − mean)·rstd``, ``gh = g·w``; ``m1 = (Σ gh)·inv_n``, ``m2 = (Σ gh·xhat)·inv_n``
    (sequential); ``dx = rstd·((gh − m1) − xhat·m2)``. Returns (dx, g·xhat) — the caller sums
    ``g·xhat`` and ``g`` over rows (``sum_anb``) for dw and db."""
    R, N = x.shape
    dx = np.empty_like(x)
    gxh = np.empty_like(x)
    for r in prange(R):
        s1 = x.dtype.type(0)
        s2 = x.dtype.type(0)
        for j in range(N):
            xh = (x[r, j] - mean[r]) * rstd[r]
            gh = g[r, j] * w[j]
            s1 += gh
            s2 += gh * xh
            gxh[r, j] = g[r, j] * xh
        m1 = s1 * inv_n
        m2 = s2 * inv_n
        for j in range(N):
            xh = (x[r, j] - mean[r]) * rstd[r]
            dx[r, j] = rstd[r] * ((g[r, j] * w[j] - m1) - xh * m2)
    return dx, gxh


@sized
@njit(parallel=True, cache=True)
def rms_norm_rows(x, w, inv_n, eps):
    """RMS norm of x (R, N): ``ms = (Σ x²)·inv_n`` sequential; ``rstd = 1/sqrt(ms + eps)``
    (float64, rounded once); ``y = (x·rstd)·w``. Returns (y, rstd)."""
    R, N = x.shape
    y = np.empty_like(x)
    rstds = np.empty(R, x.dtype)
    for r in prange(R):
        q = x.dtype.type(0)
        for j in range(N):
            q += x[r, j] * x[r, j]
        rstd = x.dtype.type(_inv_sqrt64(q * inv_n + eps))
        for j in range(N):
            y[r, j] = (x[r, j] * rstd) * w[j]
        rstds[r] = rstd
    return y, rstds


@sized
@njit(parallel=True, cache=True)
def rms_norm_backward_rows(x, w, g, rstd, inv_n):
    """RMS-norm backward: ``xhat = x·rstd``, ``gh = g·w``, ``m2 = (Σ gh·xhat)·inv_n``,
    ``dx = rstd·(gh − xhat·m2)``. Returns (dx, g·xhat) (the caller sums the latter for dw)."""
    R, N = x.shape
    dx = np.empty_like(x)
    gxh = np.empty_like(x)
    for r in prange(R):
        s2 = x.dtype.type(0)
        for j in range(N):
            xh = x[r, j] * rstd[r]
            s2 += (g[r, j] * w[j]) * xh
            gxh[r, j] = g[r, j] * xh
        m2 = s2 * inv_n
        for j in range(N):
            dx[r, j] = rstd[r] * (g[r, j] * w[j] - (x[r, j] * rstd[r]) * m2)
    return dx, gxh


# ---- cross-entropy -------------------------------------------------------------------------------


@sized
@njit(parallel=True, cache=True)
def cross_entropy_rows(x, target, ignore_index):
    """Per row of logits x (R, C): ``logp_t = (x_t − m) − logsum`` exactly as ``softmax_rows``'s
    log-softmax computes it; returns (logp_t, m, logsum); rows whose target is ``ignore_index``
    get logp_t = 0. Raises IndexError for a target outside [0, C). Tasks of ``_ROW_BLOCK`` rows
    (their exponentials vectorized: :func:`_exp_row`)."""
    R, C = x.shape
    logpt = np.zeros(R, x.dtype)
    ms = np.empty(R, x.dtype)
    lse = np.empty(R, x.dtype)
    bad = np.zeros(R, np.bool_)
    for b in prange((R + _ROW_BLOCK - 1) // _ROW_BLOCK):
        arg, e, doubt = np.empty(C, x.dtype), np.empty(C, x.dtype), np.empty(C, np.bool_)
        for r in range(b * _ROW_BLOCK, min(R, (b + 1) * _ROW_BLOCK)):
            m = _row_max(x[r])
            _exp_row(x[r], m, x.dtype.type(0), arg, e, doubt)
            s = x.dtype.type(0)
            for j in range(C):
                s += e[j]
            ls = x.dtype.type(math.log(np.float64(s)))
            ms[r] = m
            lse[r] = ls
            t = target[r]
            if t == ignore_index:
                continue
            if t < 0 or t >= C:
                bad[r] = True
                continue
            logpt[r] = (x[r, t] - m) - ls
    if bad.any():
        raise IndexError("cross_entropy: a target is outside [0, C)")
    return logpt, ms, lse


@sized
@njit(parallel=True, cache=True)
def cross_entropy_backward_rows(x, target, m, lse, gl):
    """d loss / d x for rows whose log-softmax gradient is ``gl_r`` at the target and 0 elsewhere
    (ignored rows: gl_r = 0): the log-softmax backward of that one-hot gradient,
    ``gx_j = [j = t]·gl_r − exp(logp_j)·gl_r`` with ``logp_j = (x_j − m) − logsum`` — the same bits
    as ``log_softmax_backward_rows`` on the composed graph (a sequential sum of zeros and one value
    is that value)."""
    R, C = x.shape
    gx = np.empty_like(x)
    zero = x.dtype.type(0)
    for b in prange((R + _ROW_BLOCK - 1) // _ROW_BLOCK):
        arg, doubt = np.empty(C, x.dtype), np.empty(C, np.bool_)
        for r in range(b * _ROW_BLOCK, min(R, (b + 1) * _ROW_BLOCK)):
            _exp_row(x[r], m[r], lse[r], arg, gx[r], doubt)
            t = target[r]
            for j in range(C):
                gj = gl[r] if j == t else zero
                gx[r, j] = gj - gx[r, j] * gl[r]
    return gx


# ---- elementwise functions evaluated in float64 --------------------------------------------------

#: Codes of :func:`unary` / :func:`unary_backward`.
UNARY_OPS = {"exp": 0, "log": 1, "tanh": 2, "sigmoid": 3, "gelu": 4, "gelu_tanh": 5, "silu": 6}

_SQRT_HALF = 0.7071067811865476           # 1/sqrt(2) rounded to float64
_INV_SQRT_2PI = 0.3989422804014327        # 1/sqrt(2*pi)


@njit(inline="always")
def _f64(op, v):
    """f(v) in float64 for the ``UNARY_OPS`` code ``op``."""
    if op == 0:
        return math.exp(v)
    if op == 1:
        return math.log(v) if v > 0.0 else (-math.inf if v == 0.0 else math.nan)
    if op == 4:
        return 0.5 * v * (1.0 + math.erf(v * _SQRT_HALF))
    return libm_f64(op, v)


@njit(inline="always")
def _df64(op, v):
    """f'(v) in float64 for gelu (4), gelu_tanh (5), silu (6)."""
    if op == 4:
        return 0.5 * (1.0 + math.erf(v * _SQRT_HALF)) + v * _INV_SQRT_2PI * math.exp(-0.5 * v * v)
    return libm_df64(op, v)


@sized
@njit(parallel=True, cache=True, error_model="numpy")
def unary(x, op):
    """``out = f(x)`` for the ``UNARY_OPS`` code ``op``: f evaluated in float64 from the exact
    input, rounded once (RNE) to x's dtype. x: 1-D float32/float64. Float32 tanh ops run
    vectorized with the same bits (:mod:`mpt.kernels.tanh_ops`)."""
    out = np.empty_like(x)
    if x.itemsize != 4 or op not in _TANH_OPS:
        for i in prange(x.size):
            out[i] = x.dtype.type(_f64(op, np.float64(x[i])))
        return out
    for t in prange((x.size + _CHUNK_T - 1) // _CHUNK_T):
        lo, hi = t * _CHUNK_T, min(x.size, (t + 1) * _CHUNK_T)
        xs, outs, doubts = x[lo:hi], out[lo:hi], np.empty(hi - lo, np.bool_)
        if op == 2:
            n = fast_forward(xs, outs, doubts, 2)
        elif op == 3:
            n = fast_forward(xs, outs, doubts, 3)
        elif op == 5:
            n = fast_forward(xs, outs, doubts, 5)
        else:
            n = fast_forward(xs, outs, doubts, 6)
        if n:
            fix_forward(xs, outs, doubts, op, n)
    return out


@sized
@njit(parallel=True, cache=True, error_model="numpy")
def unary_backward(x, g, op):
    """``gx = g·f'(x)``: f' evaluated in float64, the product in float64, rounded once to the
    work dtype. x, g: 1-D of one dtype; op: gelu (4), gelu_tanh (5), silu (6). Float32
    gelu_tanh and silu run vectorized with the same bits (:mod:`mpt.kernels.tanh_ops`)."""
    out = np.empty_like(x)
    if x.itemsize != 4 or op not in _TANH_OPS:
        for i in prange(x.size):
            out[i] = x.dtype.type(np.float64(g[i]) * _df64(op, np.float64(x[i])))
        return out
    for t in prange((x.size + _CHUNK_T - 1) // _CHUNK_T):
        lo, hi = t * _CHUNK_T, min(x.size, (t + 1) * _CHUNK_T)
        xs, gs, outs = x[lo:hi], g[lo:hi], out[lo:hi]
        doubts = np.empty(hi - lo, np.bool_)
        if op == 5:
            n = fast_backward(xs, gs, outs, doubts, 5)
        else:
            n = fast_backward(xs, gs, outs, doubts, 6)
        if n:
            fix_backward(xs, gs, outs, doubts, op, n)
    return out


@sized
@njit(parallel=True, cache=True)
def pow_elementwise(a, b, g, mode):
    """``a**b`` and its partial derivatives, evaluated in float64 and rounded once to a's dtype.

    mode 0: ``out = a**b``; mode 1: ``g·b·a**(b−1)`` (d/da); mode 2: ``g·a**b·log(a)`` (d/db).
    a, b, g: 1-D of one dtype (g unused in mode 0)."""
    out = np.empty_like(a)
    for i in prange(a.size):
        x = np.float64(a[i])
        y = np.float64(b[i])
        if mode == 0:
            v = math.pow(x, y) if not (x < 0.0 and y != math.floor(y)) else math.nan
        elif mode == 1:
            v = np.float64(g[i]) * y * math.pow(x, y - 1.0) if y != 0.0 else 0.0
        else:
            v = np.float64(g[i]) * math.pow(x, y) * math.log(x) if x > 0.0 else (
                0.0 if x == 0.0 and y >= 0.0 else math.nan)
        out[i] = a.dtype.type(v)
    return out


# ---- embedding -----------------------------------------------------------------------------------


@sized
@njit(parallel=True, cache=True)
def embedding_backward(idx, g, num_rows, padding_idx):
    """``out[idx[i]] += g[i]`` for i = 0, 1, … in order (sequential per output element), rows equal
    to ``padding_idx`` skipped. idx (n,) int64, g (n, D) work dtype; out (num_rows, D).
    Parallel over blocks of 64 columns."""
    n, D = g.shape
    out = np.zeros((num_rows, D), g.dtype)
    nb = (D + 63) // 64
    for t in prange(nb):
        d0 = t * 64
        d1 = min(D, d0 + 64)
        for i in range(n):
            row = idx[i]
            if row == padding_idx:
                continue
            for d in range(d0, d1):
                out[row, d] += g[i, d]
    return out


# ---- fp64 matmul ---------------------------------------------------------------------------------


def matmul_f64(a, b):
    """Batched float64 ``a @ b``: a (T, M, K), b (T, K, N) → (T, M, N); each element a sequential
    chain of IEEE float64 fused multiply-adds in increasing k from +0 (what an FP64 GEMM on CUDA
    cores or FP64 Tensor Cores computes): ``mpt.kernels.fma.fma64_chain``, parallel over rows."""
    t, m, _ = a.shape
    out = np.zeros((t, m, b.shape[2]))
    index = readonly(np.arange(t))
    with one_thread(a.size < SERIAL_BELOW):
        fma64_chain(readonly(np.ascontiguousarray(a, np.float64)),
                    readonly(np.ascontiguousarray(b, np.float64)), out, index, index, 0, a.shape[2])
    return out
