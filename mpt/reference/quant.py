"""Oracles for quantization (docs/techniques.md §3–4): affine fake quantization, its learnable
(LSQ) gradients, observers' qparams, codebook (NF4 / 8-bit dynamic) assignment, and gemmlowp's
fixed-point requantization.

One element at a time, every float32 operation computed exactly on rationals and rounded once
(:func:`mpt.reference.optim.round_f32`), C++'s conversions spelled out (an int64 added to a float is
converted to float32 first; ``fmax(NaN, q) = q``; x86's float→int64 conversion of NaN or an out of
range value gives INT64_MIN). Integer arithmetic is Python's exact ints, and the fixed-point
requantization is written from its mathematical definition (``floor(a·b/2^31 + 1/2)``, half away
from zero), not from gemmlowp's bit manipulations. Never imports ``mpt.kernels``. Slow: small
arrays only.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from mpt.reference.optim import add32, div32, f32, fma32, mul32, round_f32, sub32

__all__ = [
    "fake_quant_reference", "lsq_grad_reference", "qparams_reference",
    "nearest_level_reference", "blockwise_absmax_reference", "dynamic_map_reference",
    "srdhm_reference", "rounding_divide_by_pot_reference", "quantize_multiplier_reference",
    "requantize_reference",
]

_INT64_MIN = -(2**63)


def _rne_int(t: float) -> float:
    """``nearbyint`` of a float: nearest integer, ties to even; NaN/±Inf/±0 pass through, and a
    result 0 keeps the sign of ``t`` (rint(−0.3) = −0)."""
    if not math.isfinite(t) or t == 0:
        return t
    q = Fraction(t)
    k, rem = divmod(q, 1)                                  # q = k + rem, 0 <= rem < 1
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and k % 2 == 1):
        k += 1
    return float(k) if k != 0 else math.copysign(0.0, t)


def _x86_int64(v: float) -> int:
    """x86's conversion of a float to int64 (truncation; NaN or out of range gives INT64_MIN)."""
    if math.isnan(v) or not -(2.0**63) <= v < 2.0**63:
        return _INT64_MIN
    return int(v)


def _unclamped(x: float, inv: float, z: int) -> float:
    """``qf = fl32(fl32(z) + rne(fl32(x·inv)))``."""
    return add32(f32(float(z)), _rne_int(mul32(x, inv)))


def _fq_element(x: float, s: float, z: int, qmin: int, qmax: int, per_channel: bool):
    inv = div32(1.0, s)
    qf = _unclamped(x, inv, z)
    if per_channel:                                        # int64 first, then clamp, double product
        qi = _x86_int64(qf)
        q = min(max(qi, qmin), qmax)
        return round_f32(Fraction(float(Fraction(q - z) * Fraction(s)))), qmin <= qi <= qmax
    mask = f32(float(qmin)) <= qf <= f32(float(qmax))
    q = qmin if (math.isnan(qf) or qf < qmin) else (qmax if qf > qmax else int(qf))
    return mul32(f32(float(q - z)), s), mask


def fake_quant_reference(x, scale, zero_point, quant_min: int, quant_max: int, axis=None):
    """``(y, mask)`` of PyTorch's affine fake quantization of float32 ``x``: per tensor when
    ``axis`` is None (``scale`` one float32, ``zero_point`` one int), else per slice along
    ``axis`` (x86 per-channel semantics: int64 conversion before the clamp, float64 product)."""
    x = np.asarray(x, dtype=np.float32)
    if axis is None:
        scales = np.full(x.shape, np.float32(scale), np.float32)
        zps = np.full(x.shape, int(zero_point), np.int64)
    else:
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        scales = np.broadcast_to(np.asarray(scale, np.float32).reshape(shape), x.shape)
        zps = np.broadcast_to(np.asarray(zero_point, np.int64).reshape(shape), x.shape)
    y = np.empty(x.shape, np.float32)
    mask = np.empty(x.shape, bool)
    for idx in np.ndindex(x.shape):
        y[idx], mask[idx] = _fq_element(float(x[idx]), float(scales[idx]), int(zps[idx]),
                                        quant_min, quant_max, axis is not None)
    return y, mask


def lsq_grad_reference(x, dy, scale, zero_point_float, quant_min: int, quant_max: int,
                       grad_factor: float = 1.0, fma: bool = True):
    """``(dx, dscale_vec, dzero_point_vec, zb)`` of PyTorch's learnable per-tensor fake quant
    backward, element by element, with ``zb = trunc(clamp(fl32(z + 0.5)))`` its integer zero point;
    ``fma`` fuses ``zb + x·inv`` and ``(xq − zb)·s − x`` (GCC's contraction in PyTorch's x86-64
    AVX2/AVX-512 kernels) instead of rounding each product and sum.

    Sums of the vectors are the caller's (see :func:`mpt.kernels.quant.fake_quant_learnable_grad`).
    """
    s, g = float(np.float32(scale)), f32(float(grad_factor))
    zb = add32(float(np.float32(zero_point_float)), 0.5)
    zb = int(min(max(zb, f32(float(quant_min))), f32(float(quant_max))))
    inv = div32(1.0, s)
    x = np.asarray(x, np.float32)
    dy = np.asarray(dy, np.float32)
    out = [np.empty(x.shape, np.float32) for _ in range(3)]
    for idx in np.ndindex(x.shape):
        xi, d = float(x[idx]), float(dy[idx])
        zf = f32(float(zb))
        t = fma32(xi, inv, zf) if fma else add32(zf, mul32(xi, inv))
        xq = _x86_int64(_rne_int(t))
        if quant_min <= xq <= quant_max:
            q = f32(float(xq - zb))
            diff = fma32(q, s, -xi) if fma else sub32(mul32(q, s), xi)
            grads = (mul32(d, 1.0), mul32(mul32(mul32(d, diff), inv), g), 0.0)
        else:
            edge = quant_min if xq < quant_min else quant_max
            grads = (mul32(d, 0.0), mul32(mul32(d, f32(float(edge - zb))), g),
                     mul32(mul32(-d, s), g))
        for o, v in zip(out, grads):
            o[idx] = v
    return (*out, zb)


def qparams_reference(min_val: float, max_val: float, quant_min: int, quant_max: int,
                      symmetric: bool, unsigned_zero_point: int | None = None):
    """``(scale, zero_point)`` of PyTorch's ``_calculate_qparams`` for one (min, max) pair.

    Affine: ``s = max(fl32(fl32(max⁺ − min⁻) / (qmax − qmin)), 2^-23)``,
    ``z = clamp(qmin − rne(fl32(min⁻ / s)))``. Symmetric: ``s = max(fl32(max(−min⁻, max⁺) /
    ((qmax − qmin)/2)), 2^-23)`` and ``z = unsigned_zero_point`` (128 for quint8, the midpoint for
    a custom unsigned range) or 0. No observation (min = +inf, max = −inf) gives (1.0, 0).
    """
    if min_val == math.inf and max_val == -math.inf:
        return 1.0, 0
    lo, hi = min(float(min_val), 0.0), max(float(max_val), 0.0)
    eps = 2.0**-23
    if symmetric:
        amax = max(-lo, hi)
        s = max(div32(amax, f32((quant_max - quant_min) / 2)), eps)
        return s, (unsigned_zero_point or 0)
    s = max(div32(sub32(hi, lo), f32(float(quant_max - quant_min))), eps)
    z = quant_min - int(_rne_int(div32(lo, s)))
    return s, min(max(z, quant_min), quant_max)


# ---- codebooks -----------------------------------------------------------------------------------
def nearest_level_reference(x: float, levels) -> int:
    """Index of the level nearest to ``x`` (exact distances); a tie goes to the lower index."""
    q = Fraction(x)
    dist = [abs(q - Fraction(float(level))) for level in levels]
    return min(range(len(levels)), key=lambda k: (dist[k], k))


def blockwise_absmax_reference(x, blocksize: int, levels):
    """``(codes, absmax, dequantized)`` of absmax blockwise codebook quantization of flat float32
    ``x``: ``x_n = fl32(x · fl32(1/absmax))`` (0 for a zero block), nearest level,
    ``fl32(level · absmax)``."""
    x = [float(v) for v in np.asarray(x, np.float32).ravel()]
    codes, absmax, deq = [], [], []
    for start in range(0, len(x), blocksize):
        block = x[start:start + blocksize]
        a = max(abs(v) for v in block)
        inv = div32(1.0, a) if a > 0 else 0.0
        absmax.append(a)
        for v in block:
            k = nearest_level_reference(mul32(v, inv), levels)
            codes.append(k)
            deq.append(mul32(float(levels[k]), a))
    return (np.array(codes, np.uint8), np.array(absmax, np.float32), np.array(deq, np.float32))


def dynamic_map_reference() -> np.ndarray:
    """bitsandbytes' signed dynamic map from exact rationals: for i = 0..6 the midpoints of the
    2^i + 1 evenly spaced points from 1/10 to 1, times 10^(i−6), both signs, with 0 and 1; each
    rounded once to float32, sorted."""
    values = [Fraction(0), Fraction(1)]
    for i in range(7):
        n = 2**i
        bounds = [Fraction(1, 10) + Fraction(9, 10) * Fraction(j, n) for j in range(n + 1)]
        for a, b in zip(bounds, bounds[1:]):
            v = (a + b) / 2 * Fraction(10) ** (i - 6)
            values += [v, -v]
    return np.array(sorted(round_f32(v) for v in values), np.float32)


# ---- fixed-point requantization ------------------------------------------------------------------
def srdhm_reference(a: int, b: int) -> int:
    """``floor(a·b / 2^31 + 1/2)`` (round half up), saturated to int32 (only a = b = −2^31)."""
    return min(math.floor(Fraction(a * b, 2**31) + Fraction(1, 2)), 2**31 - 1)


def rounding_divide_by_pot_reference(x: int, exponent: int) -> int:
    """``x / 2^exponent`` rounded to nearest, ties away from zero."""
    return int(math.copysign(math.floor(Fraction(abs(x), 2**exponent) + Fraction(1, 2)), x))


def quantize_multiplier_reference(m: float) -> tuple[int, int]:
    """``(M0, shift)`` with ``M0 = round_half_away(m·2^(31−e)) ∈ [2^30, 2^31]`` for the exponent e
    with ``m·2^-e ∈ [1/2, 1)`` (renormalised when it rounds up to 2^31): ``m ≈ M0·2^(shift−31)``."""
    q = Fraction(m)
    e = 0
    while q >= 1:
        q, e = q / 2, e + 1
    while q < Fraction(1, 2):
        q, e = q * 2, e - 1
    m0 = math.floor(q * 2**31 + Fraction(1, 2))
    if m0 == 2**31:
        m0, e = 2**30, e + 1
    return m0, e


def requantize_reference(acc: int, m0: int, shift: int, zero_point: int, quant_min: int,
                         quant_max: int) -> int:
    """``clamp(zo + RDBPOT(SRDHM(sat32(acc·2^left), M0), right))`` from the definitions above."""
    left, right = max(shift, 0), max(-shift, 0)
    a = min(max(acc * 2**left, -(2**31)), 2**31 - 1)
    v = rounding_divide_by_pot_reference(srdhm_reference(a, m0), right) + zero_point
    return min(max(v, quant_min), quant_max)
