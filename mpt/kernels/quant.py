"""L1: quantization kernels — fake quantization (fixed and learnable), codebook (NF4, 8-bit dynamic)
quantization, and gemmlowp's integer-only requantization.

**Affine fake quantization** (PyTorch's CPU kernels, ``FakeQuantAffine``; docs/techniques.md §3).
Per element, with ``s`` the float32 scale and ``z`` the integer zero point::

    inv  = fl32(1 / s)                 # float32 division: the reciprocal is rounded once
    t    = fl32(x · inv)               # multiply by the reciprocal, never divide
    qf   = fl32(fl32(z) + rne(t))      # round half to even, then add z IN FLOAT32 (C++ promotion)
    mask = fl32(qmin) <= qf <= fl32(qmax)            # straight-through mask on the UNclamped qf
    q    = fmin(fmax(qf, qmin), qmax)  # in float64; fmax(NaN, qmin) = qmin, so NaN maps to qmin
    y    = fl32(fl32(q − z) · s)       (int64 · float → a float32 product)

Per channel PyTorch's kernel differs in two places, both reproduced: it converts ``qf`` to int64
*before* clamping and masking (undefined in C++ for NaN, ±Inf and ``|qf| >= 2^63``; x86's
``cvttss2si`` returns INT64_MIN, so there +Inf and NaN map to qmin with mask 0), and it forms
``(q − z)·s`` in float64 then rounds once to float32 (equal to the per-tensor product whenever
``|q − z| <= 2^24``, i.e. for every 8- and 16-bit range).

**Learnable (LSQ) fake quantization** (``_fake_quantize_learnable_per_tensor_affine_backward``):
the backward rebuilds its own codes with the zero point ``zb = trunc(clamp(fl32(zf + 0.5)))``
(the forward uses ``rne(zf)``) and ``xq = rne(zb + x·inv)`` — the zero point added *before*
rounding — converted to int64 as x86 does (NaN and out-of-range give INT64_MIN). Then, with ``g``
the float32 grad factor and every operation a float32 one, left to right::

    in range:  dx = dy·1, dscale = ((dy·(xfq − x))·inv)·g, dzp = 0,   xfq = (xq − zb)·s
    below:     dx = dy·0, dscale = (dy·fl32(qmin − zb))·g,  dzp = ((−dy)·s)·g
    above:     dx = dy·0, dscale = (dy·fl32(qmax − zb))·g,  dzp = ((−dy)·s)·g

Two of these expressions are ``a·b + c`` in C++, and PyTorch's x86-64 wheels compile this kernel
in their AVX2/AVX-512 variants with GCC's default ``-ffp-contract=fast``, which fuses them:
``fma=True`` (the default, measured bit-exact against torch 2.13 on x86-64) computes
``xq = rne(fma(x, inv, zb))`` and ``xfq − x = fma(fl32(xq − zb), s, −x)`` with one rounding each;
``fma=False`` rounds every product and sum as the source reads (a build without contraction).

The per-element vectors are exact; their sums (PyTorch: a float32 ``Tensor.sum`` whose order
depends on the SIMD width) are here a sequential float64 sum in C order, rounded once to float32.

**Codebook quantization** (NF4, the 8-bit dynamic map): ``code(x) = #{k : x > m_k}`` for sorted
float64 decision points ``m_k`` (exact midpoints of adjacent float32 levels: nearest level, an
exact tie to the lower level). Blockwise: ``absmax`` per block, ``x_n = fl32(x · fl32(1/absmax))``
(a block of zeros has absmax 0 and ``x_n = 0``), dequantized ``fl32(level · absmax)``.

**Integer requantization** (Jacob et al. 2018; gemmlowp): int64 accumulation of int32-range
products, wrapped to int32; ``SaturatingRoundingDoublingHighMul(a, M0)`` and
``RoundingDivideByPOT(·, n)`` (round half away from zero), plus the output zero point, clamped.

Oracles: ``mpt.reference.quant`` (exact rationals), tests/test_quant.py, test_nf4.py,
test_requant.py. Every kernel is elementwise or per block/row, so results do not depend on the
thread count.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from mpt._checks import check_int, check_real
from mpt.kernels.fma import fma32

__all__ = [
    "fake_quant_per_tensor", "fake_quant_per_channel", "fake_quant_learnable_grad",
    "codebook_encode", "blockwise_absmax_encode", "blockwise_decode",
    "forward_zero_point", "backward_zero_point",
    "srdhm", "rounding_divide_by_pot", "quantize_multiplier", "requantize", "int_matmul",
]

_INT64_MIN = np.iinfo(np.int64).min
_TWO63 = 2.0**63


# ---- affine fake quantization --------------------------------------------------------------------
@njit(inline="always")
def _fq_unclamped(x, inv, zf):
    """``qf = fl32(fl32(z) + rne(fl32(x · inv)))`` of one float32 ``x`` (rint of a float32 is
    exact)."""
    return np.float32(zf + np.float32(np.rint(np.float64(np.float32(x * inv)))))


@njit(inline="always")
def _to_int64_x86(r):
    """C++ ``static_cast<int64_t>`` of a float64 as x86 does it (cvttsd2si): NaN or out of range
    gives INT64_MIN."""
    if not (-_TWO63 <= r < _TWO63):
        return _INT64_MIN
    return np.int64(r)


@njit(cache=True, parallel=True)
def _fq_per_tensor(x, scale, zero_point, qmin, qmax, y, mask, codes):  # all (n,)
    s = np.float32(scale)
    inv = np.float32(np.float32(1.0) / s)
    zf = np.float32(zero_point)
    qmin_f, qmax_f = np.float32(qmin), np.float32(qmax)
    for i in prange(x.size):
        qf = _fq_unclamped(x[i], inv, zf)
        mask[i] = qmin_f <= qf and qf <= qmax_f
        q = np.float64(qf)
        q = q if q >= qmin else np.float64(qmin)       # fmax(NaN, qmin) = qmin
        q = q if q <= qmax else np.float64(qmax)
        codes[i] = np.int64(q)
        y[i] = np.float32(np.int64(q) - zero_point) * s


@njit(cache=True, parallel=True)
def _fq_per_channel(x, scale, zero_point, qmin, qmax, y, mask, codes):  # all (outer, C, inner)
    outer, channels, inner = x.shape
    for oc in prange(outer * channels):
        o, c = oc // channels, oc % channels
        s = scale[c]
        inv = np.float32(np.float32(1.0) / s)
        z = zero_point[c]
        for k in range(inner):
            qi = _to_int64_x86(np.float64(_fq_unclamped(x[o, c, k], inv, np.float32(z))))
            mask[o, c, k] = qmin <= qi and qi <= qmax
            q = min(max(qi, qmin), qmax)
            codes[o, c, k] = q
            y[o, c, k] = np.float32(np.float64(q - z) * np.float64(s))


def _as_f32(name, x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"{name} must be a float32 array; got {x.dtype}")
    return np.ascontiguousarray(x)


def _check_range(qmin, qmax, zero_point):
    for name, v in (("quant_min", qmin), ("quant_max", qmax)):
        check_int(name, v, min=-(2**31), max=2**31 - 1)                    # fits in int32
    if qmin > qmax:
        raise ValueError(f"quant_min must be <= quant_max; got {qmin} > {qmax}")
    z = np.asarray(zero_point)
    if z.size and (z.min() < qmin or z.max() > qmax):
        raise ValueError(f"zero_point must lie in [quant_min, quant_max] = [{qmin}, {qmax}]; "
                         f"got {zero_point}")


def _check_scale(scale) -> np.ndarray:
    s = np.asarray(scale)
    if s.dtype != np.float32:
        raise TypeError(f"scale must be float32 (round it first); got {s.dtype}")
    if not (np.isfinite(s) & (s > 0)).all():
        raise ValueError(f"scale must be finite and > 0; got {scale}")
    return s


def fake_quant_per_tensor(x, scale, zero_point: int, quant_min: int, quant_max: int):
    """``(y, mask, codes)``: PyTorch's ``fake_quantize_per_tensor_affine_cachemask`` on float32
    ``x``, plus the clamped integer codes ``q`` (int32) that an integer deployment stores.

    Precision contract: float32 in, float32 out; the arithmetic of the module docstring (float32
    reciprocal and product, RNE, zero point added in float32, clamp, float32 dequantization).
    ``mask`` (bool, shape of ``x``) is the straight-through gradient mask. Oracle:
    ``mpt.reference.fake_quant_reference``.
    """
    x = _as_f32("x", x)
    s = _check_scale(scale)
    if s.size != 1:
        raise ValueError(f"scale must be a scalar; got shape {s.shape}")
    _check_range(quant_min, quant_max, zero_point)
    y, mask, codes = (np.empty(x.size, np.float32), np.empty(x.size, np.bool_),
                      np.empty(x.size, np.int32))
    _fq_per_tensor(x.ravel(), np.float32(s.reshape(())), np.int64(zero_point), np.int64(quant_min),
                   np.int64(quant_max), y, mask, codes)
    return y.reshape(x.shape), mask.reshape(x.shape), codes.reshape(x.shape)


def _channel_view(x: np.ndarray, axis: int) -> np.ndarray:
    """``x`` as (outer, C, inner) with ``axis`` in the middle (a view of a C-contiguous array)."""
    axis = check_int("axis", axis, min=-x.ndim, max=x.ndim - 1) % x.ndim
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
    return x.reshape(outer, x.shape[axis], inner)


def fake_quant_per_channel(x, scale, zero_point, axis: int, quant_min: int, quant_max: int):
    """``(y, mask, codes)``: PyTorch's ``fake_quantize_per_channel_affine`` (int zero points) on
    float32 ``x``; ``scale`` (float32) and ``zero_point`` (ints) have one entry per slice along
    ``axis``.

    Same contract as :func:`fake_quant_per_tensor` per slice, with the two per-channel details of
    the module docstring (x86 int64 conversion before the clamp; float64 dequantizing product).
    """
    x = _as_f32("x", x)
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension for per-channel quantization")
    x3 = _channel_view(x, axis)
    s = _check_scale(scale).ravel()
    z = np.asarray(zero_point).ravel()
    if s.size != x3.shape[1] or z.size != x3.shape[1]:
        raise ValueError(f"scale and zero_point need {x3.shape[1]} entries (size of axis {axis}); "
                         f"got {s.size} and {z.size}")
    if not np.issubdtype(z.dtype, np.integer):
        raise TypeError(f"zero_point must be integers; got {z.dtype}")
    _check_range(quant_min, quant_max, z)
    y, mask, codes = (np.empty(x3.shape, t) for t in (np.float32, np.bool_, np.int32))
    _fq_per_channel(x3, np.ascontiguousarray(s), z.astype(np.int64), np.int64(quant_min),
                    np.int64(quant_max), y, mask, codes)
    return y.reshape(x.shape), mask.reshape(x.shape), codes.reshape(x.shape)


# ---- learnable (LSQ) fake quantization: the backward ---------------------------------------------
@njit(cache=True, parallel=True)
def _lsq_grad(x, dy, scale, zero_point, qmin, qmax, grad_factor, fma, dx, dscale, dzp):  # (n,)
    s = np.float32(scale)
    inv = np.float32(np.float32(1.0) / s)
    g = np.float32(grad_factor)
    zf = np.float32(zero_point)
    small = np.float32(qmin - zero_point)
    big = np.float32(qmax - zero_point)
    for i in prange(x.size):
        t = fma32(x[i], inv, zf) if fma else np.float32(zf + np.float32(x[i] * inv))
        xq = _to_int64_x86(np.rint(np.float64(t)))
        d = dy[i]
        if xq < qmin or xq > qmax:
            dx[i] = d * np.float32(0.0)
            dscale[i] = np.float32(d * (small if xq < qmin else big)) * g
            dzp[i] = np.float32(np.float32(-d) * s) * g
        else:
            dx[i] = d * np.float32(1.0)
            q = np.float32(xq - zero_point)
            diff = fma32(q, s, -x[i]) if fma else np.float32(np.float32(q * s) - x[i])
            dscale[i] = np.float32(np.float32(d * diff) * inv) * g
            dzp[i] = np.float32(0.0)


@njit(cache=True)
def _sum_f64(v):
    acc = 0.0
    for i in range(v.size):
        acc += np.float64(v[i])
    return np.float32(acc)


def fake_quant_learnable_grad(x, dy, scale, zero_point_float, quant_min: int, quant_max: int,
                              grad_factor: float = 1.0, fma: bool = True):
    """``(dx, dscale, dzero_point, dscale_vec, dzero_point_vec)`` of PyTorch's
    ``_fake_quantize_learnable_per_tensor_affine_backward`` (module docstring).

    ``x``, ``dy`` float32 arrays of one shape; ``scale`` a float32 scalar; ``zero_point_float`` the
    float32 learnable zero point (rounded here as PyTorch's backward does:
    ``trunc(clamp(z + 0.5))``); ``grad_factor`` is rounded to float32; ``fma`` selects the
    contracted (x86-64 wheel) or the unfused arithmetic. ``dscale``/``dzero_point`` are the float32
    sums of the per-element vectors (sequential float64 sum, one rounding). Oracle:
    ``mpt.reference.lsq_grad_reference``.
    """
    x, dy = _as_f32("x", x), _as_f32("dy", dy)
    if x.shape != dy.shape:
        raise ValueError(f"x and dy must have one shape; got {x.shape} and {dy.shape}")
    s = np.float32(_check_scale(scale).reshape(()))
    zb = backward_zero_point(zero_point_float, quant_min, quant_max)
    if not quant_min <= 0 <= quant_max:
        raise ValueError(f"the range [quant_min, quant_max] must include 0; got [{quant_min}, "
                         f"{quant_max}]")
    out = [np.empty(x.size, np.float32) for _ in range(3)]
    _lsq_grad(x.ravel(), dy.ravel(), s, np.int64(zb), np.int64(quant_min), np.int64(quant_max),
              np.float32(grad_factor), bool(fma), *out)
    dx, dscale_vec, dzp_vec = (v.reshape(x.shape) for v in out)
    return dx, _sum_f64(out[1]), _sum_f64(out[2]), dscale_vec, dzp_vec


def _zero_point_f32(zero_point_float, quant_min, quant_max) -> np.float32:
    _check_range(quant_min, quant_max, ())
    z = np.asarray(zero_point_float)
    if z.dtype != np.float32 or z.size != 1 or not np.isfinite(z).all():
        raise ValueError(f"zero_point must be one finite float32; got {zero_point_float!r}")
    return np.float32(z.reshape(()))


def _clamp_trunc(z, quant_min, quant_max) -> int:
    z = min(max(z, np.float32(quant_min)), np.float32(quant_max))  # float32 clamp, as std::min/max
    return int(z)                                                  # static_cast truncates


def forward_zero_point(zero_point_float, quant_min: int, quant_max: int) -> int:
    """The integer zero point PyTorch's learnable forward uses: ``trunc(clamp(rne(z)))``."""
    z = _zero_point_f32(zero_point_float, quant_min, quant_max)
    return _clamp_trunc(np.float32(np.rint(z)), quant_min, quant_max)


def backward_zero_point(zero_point_float, quant_min: int, quant_max: int) -> int:
    """The integer zero point PyTorch's learnable backward uses: ``trunc(clamp(fl32(z + 0.5)))``
    (not the forward's — e.g. z = 2.5 is 2 forward and 3 backward)."""
    z = _zero_point_f32(zero_point_float, quant_min, quant_max)
    return _clamp_trunc(np.float32(z + np.float32(0.5)), quant_min, quant_max)


# ---- codebook quantization -----------------------------------------------------------------------
@njit(cache=True, parallel=True)
def _encode(x, decision, codes):  # x: (n,) float32; decision: (L-1,) float64 ascending
    for i in prange(x.size):
        codes[i] = np.searchsorted(decision, np.float64(x[i]), side="left")  # #{k : m_k < x}


def _decision(decision) -> np.ndarray:
    """Decision points as a contiguous float64 vector of at most 255 (codes fit in a uint8)."""
    d = np.ascontiguousarray(decision, dtype=np.float64)
    if d.ndim != 1 or d.size > 255:
        raise ValueError(f"decision must be a 1-D array of at most 255 points (uint8 codes); got "
                         f"shape {d.shape}")
    return d


def codebook_encode(x, decision) -> np.ndarray:
    """uint8 codes ``#{k : x > decision[k]}`` of float32 ``x`` (nearest level when ``decision``
    holds the exact midpoints of sorted levels; an exact tie goes to the lower level)."""
    x = _as_f32("x", x)
    codes = np.empty(x.size, np.uint8)
    _encode(x.ravel(), _decision(decision), codes)
    return codes.reshape(x.shape)


@njit(cache=True, parallel=True)
def _absmax_encode(x, blocksize, decision, codes, absmax):  # x, codes: (n,); absmax: (nblocks,)
    for b in prange(absmax.size):
        lo, hi = b * blocksize, min((b + 1) * blocksize, x.size)
        a = np.float32(0.0)
        for i in range(lo, hi):
            a = max(a, abs(x[i]))
        absmax[b] = a
        inv = np.float32(np.float32(1.0) / a) if a > 0 else np.float32(0.0)
        for i in range(lo, hi):
            codes[i] = np.searchsorted(decision, np.float64(np.float32(x[i] * inv)), side="left")


def blockwise_absmax_encode(x, blocksize: int, decision):
    """``(codes uint8 (n,), absmax float32 (ceil(n/blocksize),))`` of a flat float32 ``x``: per
    block ``absmax = max|x|``, ``codes = codebook_encode(fl32(x · fl32(1/absmax)))`` (0 for a zero
    block). The last block may be partial."""
    x = _as_f32("x", x).ravel()
    blocksize = check_int("blocksize", blocksize, min=1)
    if not np.isfinite(x).all():
        raise ValueError("x must be finite for absmax quantization")
    codes = np.empty(x.size, np.uint8)
    absmax = np.empty(-(-x.size // blocksize), np.float32)
    _absmax_encode(x, np.int64(blocksize), _decision(decision), codes, absmax)
    return codes, absmax


@njit(cache=True, parallel=True)
def _decode(codes, levels, absmax, blocksize, y):  # codes, y: (n,)
    for i in prange(codes.size):
        y[i] = levels[codes[i]] * absmax[i // blocksize]


def blockwise_decode(codes, levels, absmax, blocksize: int) -> np.ndarray:
    """float32 ``fl32(levels[code] · absmax[block])`` for flat uint8 ``codes``.

    Checked first, so that the kernel never reads outside an array: every code indexes
    ``levels`` and ``absmax`` holds one value per block of ``blocksize`` (at least
    ``ceil(n/blocksize)``)."""
    codes = np.ascontiguousarray(codes, dtype=np.uint8).ravel()
    levels, absmax = _as_f32("levels", levels).ravel(), _as_f32("absmax", absmax).ravel()
    blocksize = check_int("blocksize", blocksize, min=1)
    if codes.size and codes.max() >= levels.size:
        raise ValueError(f"codes must index the {levels.size} levels; got code {codes.max()}")
    if absmax.size < -(-codes.size // blocksize):
        raise ValueError(f"absmax must hold one value per block of {blocksize} of the "
                         f"{codes.size} codes ({-(-codes.size // blocksize)}); got {absmax.size}")
    y = np.empty(codes.size, np.float32)
    _decode(codes, levels, absmax, np.int64(blocksize), y)
    return y


# ---- integer-only requantization (gemmlowp) ------------------------------------------------------
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


@njit(inline="always")
def srdhm(a, b):
    """gemmlowp ``SaturatingRoundingDoublingHighMul``: ``round(a·b / 2^31)`` for int32 ``a, b``,
    the nudge ``2^30`` (or ``1 − 2^30`` for a negative product) then truncating division; only
    ``a = b = −2^31`` saturates (to ``2^31 − 1``)."""
    if a == _I32_MIN and b == _I32_MIN:
        return np.int64(_I32_MAX)
    ab = np.int64(a) * np.int64(b)
    nudge = np.int64(1 << 30) if ab >= 0 else np.int64(1 - (1 << 30))
    num = ab + nudge
    q = num // np.int64(1 << 31)                   # floor division ...
    if q < 0 and q * np.int64(1 << 31) != num:     # ... turned into C's truncation toward zero
        q += 1
    return q


@njit(inline="always")
def rounding_divide_by_pot(x, exponent):
    """gemmlowp ``RoundingDivideByPOT``: ``x / 2^exponent`` rounded half away from zero."""
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def quantize_multiplier(m: float) -> tuple[int, int]:
    """``(M0, shift)`` with ``m ≈ M0·2^(shift−31)``, ``M0 ∈ [2^30, 2^31)`` an int32 (TFLite's
    ``QuantizeMultiplier``): ``m = f·2^shift`` with ``f ∈ [1/2, 1)`` (``frexp``, exact), ``M0 =
    round_half_away(f·2^31)`` (exact in float64), renormalised when it rounds up to 2^31. Relative
    error ``|M0·2^(shift−31) − m| <= 2^-32·2^shift <= 2^-31·m``."""
    m = check_real("multiplier", m, gt=0)
    f, shift = math.frexp(m)
    m0 = math.floor(f * 2.0**31 + 0.5)
    if m0 == 2**31:
        m0, shift = 2**30, shift + 1
    return m0, shift


@njit(cache=True, parallel=True)
def _requant(acc, m0, left, right, zo, qmin, qmax, out):  # acc, out: (outer, C, inner)
    outer, channels, inner = acc.shape
    for oc in prange(outer * channels):
        o, c = oc // channels, oc % channels
        for k in range(inner):
            a = np.int64(acc[o, c, k]) << left[c]
            a = min(max(a, _I32_MIN), _I32_MAX)        # saturate the left-shifted input to int32
            v = rounding_divide_by_pot(srdhm(a, m0[c]), right[c]) + zo
            out[o, c, k] = min(max(v, qmin), qmax)


def requantize(acc, multiplier, shift, zero_point: int, quant_min: int, quant_max: int,
               axis: int = -1) -> np.ndarray:
    """int64 codes ``clamp(zo + RDBPOT(SRDHM(acc·2^left, M0), right))`` of an int32 accumulator.

    ``multiplier`` (M0 in [2^30, 2^31)) and ``shift`` (the exponent: M = M0·2^(shift−31), a left
    shift when positive, a right shift when negative, as TFLite's ``MultiplyByQuantizedMultiplier``)
    hold one entry per slice along ``axis`` (or one in all). The left-shifted accumulator saturates
    to int32. Oracle: ``mpt.reference.requantize_reference``.
    """
    acc = np.asarray(acc)
    if acc.dtype != np.int32:
        raise TypeError(f"acc must be int32; got {acc.dtype}")
    if acc.ndim == 0:
        acc = acc.reshape(1)
    a3 = _channel_view(np.ascontiguousarray(acc), axis)
    m0 = np.broadcast_to(np.asarray(multiplier, np.int64).ravel(), a3.shape[1]).copy()
    sh = np.broadcast_to(np.asarray(shift, np.int64).ravel(), a3.shape[1])
    if ((m0 < 2**30) | (m0 >= 2**31)).any():
        raise ValueError(f"multiplier must lie in [2^30, 2^31); got {multiplier}")
    if ((sh > 31) | (sh < -62)).any():
        raise ValueError(f"shift must lie in [-62, 31]; got {shift}")
    out = np.empty(a3.shape, np.int64)
    _requant(a3, m0, np.maximum(sh, 0), np.maximum(-sh, 0), np.int64(zero_point),
             np.int64(quant_min), np.int64(quant_max), out)
    return out.reshape(acc.shape)


@njit(cache=True, parallel=True)
def _int_matmul(a, za, b, zb, out):  # a: (M, K) int; b: (N, K) int; zb: (N,); out: (M, N) int32
    m, k = a.shape
    n = b.shape[0]
    for ij in prange(m * n):
        i, j = ij // n, ij % n
        acc = np.int64(0)
        for p in range(k):
            acc += (np.int64(a[i, p]) - za) * (np.int64(b[j, p]) - zb[j])
        out[i, j] = np.int32(((acc + (1 << 31)) & 0xFFFFFFFF) - (1 << 31))  # wrap like int32


def int_matmul(a, a_zero_point: int, b, b_zero_point) -> np.ndarray:
    """int32 ``Σ_k (a[i,k] − za)(b[j,k] − zb[j])`` of int8/uint8 ``a`` (M, K) and ``b`` (N, K),
    accumulated exactly and wrapped modulo 2^32 like an int32 accumulator (no wrap can happen while
    ``K · 255 · 255 < 2^31``, i.e. K <= 33025). ``b_zero_point`` is one int or one per row of b."""
    a, b = np.asarray(a), np.asarray(b)
    for name, v in (("a", a), ("b", b)):
        if v.dtype not in (np.int8, np.uint8) or v.ndim != 2:
            raise TypeError(f"{name} must be a 2-D int8 or uint8 array; got {v.dtype} {v.shape}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a (M, K) and b (N, K) must share K; got {a.shape} and {b.shape}")
    zb = np.broadcast_to(np.asarray(b_zero_point, np.int64).ravel(), b.shape[0]).copy()
    out = np.empty((a.shape[0], b.shape[0]), np.int32)
    _int_matmul(np.ascontiguousarray(a), np.int64(a_zero_point), np.ascontiguousarray(b), zb, out)
    return out
