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
  vectorized float64 tanh, and libm's wherever the two could round differently (see
  :func:`unary`).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, prange

from mpt.kernels.fma import fma64
from mpt.kernels.mma import _from_bits, f32_bits
from mpt.kernels.threads import one_thread

__all__ = [
    "sum_anb", "softmax_rows", "softmax_backward_rows", "log_softmax_backward_rows",
    "layer_norm_rows", "layer_norm_backward_rows", "rms_norm_rows", "rms_norm_backward_rows",
    "cross_entropy_rows", "cross_entropy_backward_rows", "unary", "unary_backward",
    "pow_elementwise", "embedding_backward", "matmul_f64", "UNARY_OPS",
]

_CHUNK = 256  # columns per parallel task in sum_anb
SERIAL_BELOW = 1 << 17  # elements: smaller problems run on the calling thread alone


def sized(kernel):
    """Run a ``parallel=True`` kernel on the calling thread alone when its first argument has
    fewer than ``SERIAL_BELOW`` elements: waking and joining worker threads costs more than such
    work (and much more on a loaded machine). Bits never depend on the thread count."""
    @functools.wraps(kernel)
    def run(*args):
        with one_thread(args[0].size < SERIAL_BELOW):
            return kernel(*args)
    run.kernel = kernel
    return run

# ---- reductions ----------------------------------------------------------------------------------


@sized
@njit(parallel=True, cache=True)
def sum_anb(x):
    """``out[a, b] = Σ_n x[a, n, b]``, sequential in increasing ``n``, in ``x``'s dtype.

    x: (A, N, B) C-contiguous float32/float64. Parallel over (a, block of 256 b): every output
    element is summed by one thread in the same order, whatever the thread count.
    """
    A, N, B = x.shape
    out = np.zeros((A, B), x.dtype)
    nb = (B + _CHUNK - 1) // _CHUNK
    for t in prange(A * nb):
        a = t // nb
        b0 = (t % nb) * _CHUNK
        b1 = min(B, b0 + _CHUNK)
        for n in range(N):
            for b in range(b0, b1):
                out[a, b] += x[a, n, b]
    return out


@njit(inline="always")
def _row_max(row):
    m = row[0]
    for v in row:
        if v > m or v != v:  # a NaN sticks (NaN > m and NaN <= m are both false)
            m = v
    return m


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
    get logp_t = 0. Raises IndexError for a target outside [0, C)."""
    R, C = x.shape
    logpt = np.zeros(R, x.dtype)
    ms = np.empty(R, x.dtype)
    lse = np.empty(R, x.dtype)
    bad = np.zeros(R, np.bool_)
    for r in prange(R):
        m = _row_max(x[r])
        s = x.dtype.type(0)
        for j in range(C):
            s += x.dtype.type(math.exp(np.float64(x[r, j] - m)))
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
    for r in prange(R):
        t = target[r]
        for j in range(C):
            lp = (x[r, j] - m[r]) - lse[r]
            gj = gl[r] if j == t else zero
            gx[r, j] = gj - x.dtype.type(math.exp(np.float64(lp))) * gl[r]
    return gx


# ---- elementwise functions evaluated in float64 --------------------------------------------------

#: Codes of :func:`unary` / :func:`unary_backward`.
UNARY_OPS = {"exp": 0, "log": 1, "tanh": 2, "sigmoid": 3, "gelu": 4, "gelu_tanh": 5, "silu": 6}

_SQRT_HALF = 0.7071067811865476           # 1/sqrt(2) rounded to float64
_INV_SQRT_2PI = 0.3989422804014327        # 1/sqrt(2*pi)
_SQRT_2_OVER_PI = 0.7978845608028654      # sqrt(2/pi)
_GELU_C = 0.044715                        # tanh-approximation coefficient (Hendrycks & Gimpel)


_TANH_OPS = (2, 3, 5, 6)   # tanh, sigmoid, gelu_tanh, silu: one tanh each


@njit(inline="always")
def _tanh_arg(op, v):
    """The argument w of the one tanh in f (and f') of a tanh op."""
    if op == 2:
        return v
    if op == 5:
        return _SQRT_2_OVER_PI * (v + _GELU_C * v * v * v)
    return 0.5 * v


@njit(inline="always")
def _f64_of(op, v, t):
    """f(v) of a tanh op given t = tanh(_tanh_arg(op, v)): the float64 operations of _f64."""
    if op == 2:
        return t
    if op == 3:
        return 0.5 * t + 0.5
    if op == 5:
        return 0.5 * v * (1.0 + t)
    return v * (0.5 * t + 0.5)


@njit(inline="always")
def _df64_of(op, v, t):
    """f'(v) of gelu_tanh (5) or silu (6) given t: the float64 operations of _df64."""
    if op == 5:
        du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * v * v)
        return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du
    s = 0.5 * t + 0.5
    return s * (1.0 + v * (1.0 - s))


@njit(inline="always")
def _f64(op, v):
    """f(v) in float64 for the ``UNARY_OPS`` code ``op``."""
    if op == 0:
        return math.exp(v)
    if op == 1:
        return math.log(v) if v > 0.0 else (-math.inf if v == 0.0 else math.nan)
    if op == 4:
        return 0.5 * v * (1.0 + math.erf(v * _SQRT_HALF))
    return _f64_of(op, v, math.tanh(_tanh_arg(op, v)))


@njit(inline="always")
def _df64(op, v):
    """f'(v) in float64 for gelu (4), gelu_tanh (5), silu (6)."""
    if op == 4:
        return 0.5 * (1.0 + math.erf(v * _SQRT_HALF)) + v * _INV_SQRT_2PI * math.exp(-0.5 * v * v)
    return _df64_of(op, v, math.tanh(_tanh_arg(op, v)))


# ---- tanh ops of float32, vectorized -------------------------------------------------------------
# The float32 kernels of the tanh ops give exactly the bits above (libm's tanh in float64, the
# float64 formula, one rounding) at SIMD speed: the formula runs with _tanh below, which is
# vectorizable, and every value whose float64 result lies so close to a float32 rounding
# boundary that the two tanh could round differently is recomputed with libm. _tanh is within
# 4 ulp of libm's tanh on every tested input (tests/test_functional.py; both are within ~2.5 ulp
# of the exact tanh), so |t − tanh_libm| <= 2^-50 (|t| <= 1) and relatively 2^-49; the bounds
# _reach / _dreach take 2^-48 / 2^-46 to cover that and the few float64 roundings after it, with
# room to spare. A result r is kept when r ± its bound round to the same float32.

_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")   # ln 2, high part (k·ln2_hi exact for k < 2^11)
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")  # ln 2 − ln2_hi
_INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
# 1/n! for n = 2 .. 14 (Taylor series of exp(r) − 1 − r; |r| <= ln2/2: remainder < 2^-61 |r|)
_E2, _E3, _E4, _E5, _E6, _E7, _E8, _E9, _E10, _E11, _E12, _E13, _E14 = (
    1.0 / math.factorial(n) for n in range(2, 15))


@njit(inline="always", error_model="numpy")
def _expm1_pos(x):
    """exp(x) − 1 for 0 <= x <= 40, vectorizable: x = k·ln2 + r, |r| <= ln2/2, and
    2^k·(1 + p(r)) − 1 = (2^k − 1) + 2^k·p(r) with p the Taylor polynomial of degree 14."""
    k = np.floor(x * _INV_LN2 + 0.5)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = ((((((((((((_E14 * r + _E13) * r + _E12) * r + _E11) * r + _E10) * r + _E9) * r + _E8)
              * r + _E7) * r + _E6) * r + _E5) * r + _E4) * r + _E3) * r + _E2)
    p = r + r * r * p
    scale = _from_bits((np.int64(k) + 1023) << 52)
    return (scale - 1.0) + scale * p


@njit(inline="always", error_model="numpy")
def _tanh(u):
    """tanh(u) in float64, vectorizable: e/(e + 2) with e = expm1(2|u|) (no cancellation); u for
    |u| < 2^-26, ±1 past |u| = 20 (where tanh rounds to ±1); NaN gives a finite value (callers
    recompute NaN results with libm)."""
    a = abs(u)
    e = _expm1_pos(2.0 * (a if a < 20.0 else 20.0))
    t = e / (e + 2.0)
    t = a if a < 2.0**-26 else t
    return math.copysign(t, u)


@njit(inline="always")
def _reach(op, v, y):
    """How far f(v) of a tanh op may move with a tanh off by 2^-50 (see above)."""
    if op == 2:
        return abs(y) * 2.0**-46
    if op == 3:
        return 2.0**-46
    return (abs(v) + abs(y)) * 2.0**-46


@njit(inline="always")
def _dreach(op, v, d):
    """How far f'(v) of gelu_tanh (5) or silu (6) may move with a tanh off by 2^-50."""
    if op == 5:
        du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * v * v)
        return (1.0 + abs(v * du)) * 2.0**-46 + abs(d) * 2.0**-50
    return (1.0 + 2.0 * abs(v)) * 2.0**-46 + abs(d) * 2.0**-50


@njit(inline="always")
def _unsure(v, y, reach):
    """Whether y ± reach may round to different float32 patterns (a zero's sign included), or
    the input v is a NaN (whose payload libm's path decides)."""
    return (f32_bits(np.float32(y - reach)) != f32_bits(np.float32(y + reach))) | (v != v)


_CHUNK_T = 4096


@njit(inline="always", error_model="numpy")
def _fast_forward(x, out, lo, hi, op):
    """out[lo:hi] = f(x) of a tanh op with _tanh (op a constant where inlined: no branch in the
    loop, which vectorizes); returns how many need libm."""
    unsure = 0
    for i in range(lo, hi):
        v = np.float64(x[i])
        y = _f64_of(op, v, _tanh(_tanh_arg(op, v)))
        out[i] = np.float32(y)
        unsure += _unsure(v, y, _reach(op, v, y))
    return unsure


@njit(inline="always", error_model="numpy")
def _fix_forward(x, out, lo, hi, op):
    """Recompute with libm the values of out[lo:hi] that :func:`_fast_forward` is unsure of (a
    separate pass, taken rarely: under ``if unsure`` in the fast loop, LLVM would call the side-
    effect-free libm for every element)."""
    for i in range(lo, hi):
        v = np.float64(x[i])
        y = _f64_of(op, v, _tanh(_tanh_arg(op, v)))
        if _unsure(v, y, _reach(op, v, y)):
            out[i] = np.float32(_f64(op, v))


@njit(inline="always", error_model="numpy")
def _fast_backward(x, g, out, lo, hi, op, fix):
    """out[lo:hi] = g·f'(x) of gelu_tanh or silu with _tanh (as :func:`_fast_forward`); with
    ``fix``, recompute with libm the values it is unsure of (as :func:`_fix_forward`)."""
    unsure = 0
    for i in range(lo, hi):
        v, gi = np.float64(x[i]), np.float64(g[i])
        d = _df64_of(op, v, _tanh(_tanh_arg(op, v)))
        y = gi * d
        doubt = _unsure(v, y, abs(gi) * _dreach(op, v, d) + abs(y) * 2.0**-50)
        if fix:
            if doubt:
                out[i] = np.float32(gi * _df64(op, v))
        else:
            out[i] = np.float32(y)
            unsure += doubt
    return unsure


@sized
@njit(parallel=True, cache=True, error_model="numpy")
def unary(x, op):
    """``out = f(x)`` for the ``UNARY_OPS`` code ``op``: f evaluated in float64 from the exact
    input, rounded once (RNE) to x's dtype. x: 1-D float32/float64. Float32 tanh ops run
    vectorized with the same bits (see above)."""
    out = np.empty_like(x)
    if x.itemsize != 4 or op not in _TANH_OPS:
        for i in prange(x.size):
            out[i] = x.dtype.type(_f64(op, np.float64(x[i])))
        return out
    for t in prange((x.size + _CHUNK_T - 1) // _CHUNK_T):
        lo, hi = t * _CHUNK_T, min(x.size, (t + 1) * _CHUNK_T)
        if op == 2:
            if _fast_forward(x, out, lo, hi, 2):
                _fix_forward(x, out, lo, hi, 2)
        elif op == 3:
            if _fast_forward(x, out, lo, hi, 3):
                _fix_forward(x, out, lo, hi, 3)
        elif op == 5:
            if _fast_forward(x, out, lo, hi, 5):
                _fix_forward(x, out, lo, hi, 5)
        elif _fast_forward(x, out, lo, hi, 6):
            _fix_forward(x, out, lo, hi, 6)
    return out


@sized
@njit(parallel=True, cache=True, error_model="numpy")
def unary_backward(x, g, op):
    """``gx = g·f'(x)``: f' evaluated in float64, the product in float64, rounded once to the
    work dtype. x, g: 1-D of one dtype; op: gelu (4), gelu_tanh (5), silu (6). Float32
    gelu_tanh and silu run vectorized with the same bits (see above)."""
    out = np.empty_like(x)
    if x.itemsize != 4 or op not in _TANH_OPS:
        for i in prange(x.size):
            out[i] = x.dtype.type(np.float64(g[i]) * _df64(op, np.float64(x[i])))
        return out
    for t in prange((x.size + _CHUNK_T - 1) // _CHUNK_T):
        lo, hi = t * _CHUNK_T, min(x.size, (t + 1) * _CHUNK_T)
        if op == 5:
            if _fast_backward(x, g, out, lo, hi, 5, False):
                _fast_backward(x, g, out, lo, hi, 5, True)
        elif _fast_backward(x, g, out, lo, hi, 6, False):
            _fast_backward(x, g, out, lo, hi, 6, True)
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


@sized
@njit(parallel=True, cache=True)
def matmul_f64(a, b):
    """Batched float64 ``a @ b``: a (T, M, K), b (T, K, N) → (T, M, N); each element a sequential
    chain of IEEE float64 fused multiply-adds in increasing k from +0 (what an FP64 GEMM on CUDA
    cores or FP64 Tensor Cores computes). Parallel over (t, m) rows."""
    T, M, K = a.shape
    N = b.shape[2]
    out = np.zeros((T, M, N))
    for tm in prange(T * M):
        t = tm // M
        m = tm % M
        for k in range(K):
            aik = a[t, m, k]
            for n in range(N):
                out[t, m, n] = fma64(aik, b[t, k, n], out[t, m, n])
    return out
