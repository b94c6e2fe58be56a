"""Oracles for optimizer steps, loss-scale updates and FP8 scaling (docs/amp.md §1, §3, §4).

Every float32 operation here is computed EXACTLY on rationals (:class:`fractions.Fraction`) and
rounded once to float32 (round to nearest, ties to even) by :func:`round_f32`, with IEEE 754's
rules for signed zeros, infinities and NaN. Values travel as Python floats (every float32 is a
float64). Nothing here uses numpy float32 arithmetic or ``mpt.kernels``, so it checks both the
vectorised numpy path and the fused Numba kernels independently. Slow: use small arrays.

The optimizer oracles spell out PyTorch's single-tensor operation order op by op, one element at a
time, with the arithmetic profile of docs/amp.md §3: ``fma=True`` fuses ``lerp``, ``add(alpha)``
and ``addcmul`` into one rounding each, ``fma=False`` rounds every product and sum.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = [
    "round_f32", "f32", "add32", "sub32", "mul32", "div32", "sqrt32", "fma32",
    "sgd_reference", "adam_reference",
    "grad_scaler_reference", "delayed_scaling_reference", "mx_scale_exponent_reference",
]

_FLT_MAX = float.fromhex("0x1.fffffep+127")


def round_f32(q: Fraction) -> float:
    """The float32 nearest to the exact rational ``q`` (ties to even), as a Python float.

    Overflow gives ±inf (IEEE: values at or beyond max + ½ulp); a zero result is +0 (callers fix
    the sign of exact zeros by IEEE's rules).
    """
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^e <= a < 2^(e+2)
    if a < Fraction(2) ** e:
        e -= 1
    elif a >= Fraction(2) ** (e + 1):
        e += 1                                                  # now 2^e <= a < 2^(e+1)
    quantum = Fraction(2) ** max(e - 23, -149)                  # float32 spacing at a
    k, rem = divmod(a, quantum)                                 # a = k·quantum + rem
    if rem > quantum / 2 or (rem == quantum / 2 and k % 2 == 1):
        k += 1
    value = k * quantum
    if value >= Fraction(2) ** 128:
        return sign * math.inf
    return sign * float(value)


def f32(x: float) -> float:
    """Round a Python float (float64) to float32 once (a hyper-parameter entering float32 math)."""
    if not math.isfinite(x) or x == 0:
        return x
    return round_f32(Fraction(x))


def _zero_sign_sum(x: float, y: float) -> float:
    """IEEE sign of an exact zero sum in round-to-nearest: −0 only if both addends are −0."""
    return -0.0 if (math.copysign(1, x) < 0 and math.copysign(1, y) < 0) else 0.0


def add32(x: float, y: float) -> float:
    if not (math.isfinite(x) and math.isfinite(y)):
        return x + y                     # inf/NaN arithmetic is the same in float64
    exact = Fraction(x) + Fraction(y)
    return round_f32(exact) if exact != 0 else _zero_sign_sum(x, y)


def sub32(x: float, y: float) -> float:
    return add32(x, -y)


def mul32(x: float, y: float) -> float:
    if not (math.isfinite(x) and math.isfinite(y)):
        return x * y
    exact = Fraction(x) * Fraction(y)
    return round_f32(exact) if exact != 0 else math.copysign(0.0, x) * math.copysign(1.0, y)


def div32(x: float, y: float) -> float:
    if math.isnan(x) or math.isnan(y) or (x == 0 and y == 0) or (math.isinf(x) and math.isinf(y)):
        return math.nan
    sign = math.copysign(1.0, x) * math.copysign(1.0, y)
    if y == 0 or math.isinf(x):
        return sign * math.inf
    if math.isinf(y) or x == 0:
        return sign * 0.0
    return round_f32(Fraction(x) / Fraction(y))


def sqrt32(x: float) -> float:
    """Correctly rounded float32 square root, exact integer arithmetic.

    For a float32 x > 0, N = x·2^220 is an integer (x is a multiple of 2^-149) with at least 71
    bits, so r = isqrt(N) >= 2^35. If r² < N the root lies strictly inside (r, r+1)·2^-110, an
    interval holding no float32 rounding boundary (boundaries are at least 2^10 integers apart at
    that scale), so rounding (r + ½)·2^-110 gives the same float32.
    """
    if math.isnan(x) or x < 0:
        return math.nan
    if x == 0 or math.isinf(x):
        return x
    n = Fraction(x) * 2**220
    assert n.denominator == 1
    r = math.isqrt(n.numerator)
    root = Fraction(r) if r * r == n.numerator else Fraction(2 * r + 1, 2)
    return round_f32(root / 2**110)


def fma32(a: float, b: float, c: float) -> float:
    """float32 ``a·b + c`` rounded once (IEEE 754 fusedMultiplyAdd)."""
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        return a * b + c                 # the inf/NaN class is the same in float64
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact != 0:
        return round_f32(exact)
    product_sign = math.copysign(1.0, a) * math.copysign(1.0, b)
    if (a == 0 or b == 0) and c == 0:
        return _zero_sign_sum(math.copysign(0.0, product_sign), c)
    return 0.0


# ---- PyTorch's primitive tensor ops, one element, per arithmetic profile ----------------------

def _add_alpha(a, b, alpha, fma):
    """``a.add(b, alpha=alpha)``: fma(f32(alpha), b, a) or a + f32(alpha)·b."""
    s = f32(alpha)
    return fma32(s, b, a) if fma else add32(a, mul32(s, b))


def _lerp(a, b, weight, fma):
    """``a.lerp(b, weight)`` with PyTorch's two formulas split at |w| = 0.5 (float32 weight)."""
    w = f32(weight)
    diff = sub32(b, a)
    if abs(w) < 0.5:                                  # a + w·(b − a)
        return fma32(w, diff, a) if fma else add32(a, mul32(w, diff))
    coeff = sub32(w, 1.0)                             # b − (1 − w)·(b − a); w − 1 is exact here
    return fma32(coeff, diff, b) if fma else add32(b, mul32(coeff, diff))


def _addcmul(a, t1, t2, value, fma):
    """``a.addcmul(t1, t2, value=value)``: fma(f32(value)·t1, t2, a) or a + (f32(value)·t1)·t2."""
    scaled = mul32(f32(value), t1)
    return fma32(scaled, t2, a) if fma else add32(a, mul32(scaled, t2))


def _addcdiv(a, t1, t2, value):
    """``a.addcdiv(t1, t2, value=value)`` = a + (f32(value)·t1)/t2, separate roundings."""
    return add32(a, div32(mul32(f32(value), t1), t2))


# ---- optimizers ---------------------------------------------------------------------------------

def _floats(*arrays):
    return [np.asarray(x, dtype=np.float32).astype(np.float64).ravel().tolist() for x in arrays]


def _array(values, shape):
    return np.array(values, dtype=np.float64).astype(np.float32).reshape(shape)


def sgd_reference(p, g, buf, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                  nesterov=False, fma=True):
    """One ``torch.optim.SGD`` step (single-tensor path) on float32 arrays.

    ``buf`` is the momentum buffer or None (first step: ``buf = g`` after weight decay, no
    dampening). Returns ``(p_new, buf_new)``; ``buf_new`` is None when ``momentum == 0``.
    """
    shape = np.shape(p)
    (ps, gs) = _floats(p, g)
    bufs = _floats(buf)[0] if buf is not None else None
    new_p, new_buf = [], []
    for i, (pi, gi) in enumerate(zip(ps, gs)):
        if weight_decay != 0:
            gi = _add_alpha(gi, pi, weight_decay, fma)
        if momentum != 0:
            if bufs is None:
                b = gi
            else:
                b = _add_alpha(mul32(bufs[i], f32(momentum)), gi, 1 - dampening, fma)
            new_buf.append(b)
            gi = _add_alpha(gi, b, momentum, fma) if nesterov else b
        new_p.append(_add_alpha(pi, gi, -lr, fma))
    return _array(new_p, shape), (_array(new_buf, shape) if momentum != 0 else None)


def adam_reference(p, g, m, v, step, *, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                   decoupled=False, fma=True):
    """One Adam (``decoupled=False``) or AdamW (``decoupled=True``) step, PyTorch's order.

    ``step`` is the step number AFTER its increment (1 on the first step). Hyper-parameter
    arithmetic (bias corrections, step size, 1 − lr·wd) is float64 as in PyTorch; every tensor op
    rounds to float32. Returns ``(p_new, m_new, v_new)``.
    """
    b1, b2 = betas
    shape = np.shape(p)
    ps, gs, ms, vs = _floats(p, g, m, v)
    bc1 = 1 - b1 ** float(step)
    bc2 = 1 - b2 ** float(step)
    step_size = lr / bc1
    bc2_sqrt = bc2 ** 0.5
    out_p, out_m, out_v = [], [], []
    for pi, gi, mi, vi in zip(ps, gs, ms, vs):
        if weight_decay != 0:
            if decoupled:
                pi = mul32(pi, f32(1 - lr * weight_decay))
            else:
                gi = _add_alpha(gi, pi, weight_decay, fma)
        mi = _lerp(mi, gi, 1 - b1, fma)
        vi = _addcmul(mul32(vi, f32(b2)), gi, gi, 1 - b2, fma)
        denom = add32(div32(sqrt32(vi), f32(bc2_sqrt)), f32(eps))
        pi = _addcdiv(pi, mi, denom, -step_size)
        out_p.append(pi), out_m.append(mi), out_v.append(vi)
    return _array(out_p, shape), _array(out_m, shape), _array(out_v, shape)


# ---- loss scaling and FP8 scaling ---------------------------------------------------------------

def grad_scaler_reference(found_infs, *, init_scale=2.0**16, growth_factor=2.0,
                          backoff_factor=0.5, growth_interval=2000):
    """(scale, growth_tracker) after each ``update()`` of PyTorch's GradScaler, for a sequence of
    found_inf flags. Products are float64 (Python float) then rounded once to float32."""
    scale, tracker, out = f32(init_scale), 0, []
    for found in found_infs:
        if found:
            scale, tracker = f32(scale * backoff_factor), 0
        else:
            tracker += 1
            if tracker == growth_interval:
                grown = f32(scale * growth_factor)
                if math.isfinite(grown):
                    scale = grown
                tracker = 0
        out.append((scale, tracker))
    return out


def delayed_scaling_reference(amaxes, *, fp8_max, margin=0, history_len=1024, algo="max"):
    """Scales of Transformer Engine's DelayedScaling after each step for a sequence of per-step
    amax values (each the float32 max|x| seen by the step's quantize calls; scale starts at 1).

    Each step: history[0] = max(history[0], amax); then amax = max(history) or history[0];
    roll the history by −1 and clear slot 0; scale = f32(f32(fp8_max / amax) / 2^margin) when
    amax is finite and > 0 (inf becomes FLT_MAX), else unchanged.
    """
    history, scale, out = [0.0] * history_len, 1.0, []
    for a in amaxes:
        history[0] = a if (math.isnan(a) or a > history[0]) else history[0]
        if algo == "max":
            amax = math.nan if any(math.isnan(h) for h in history) else max(history)
        else:
            amax = history[0]
        history = history[1:] + history[:1]
        history[0] = 0.0
        if math.isfinite(amax) and amax > 0:
            scale = div32(div32(f32(fp8_max), amax), f32(2.0 ** margin))
            if math.isinf(scale):
                scale = _FLT_MAX
        out.append(scale)
    return out


def mx_scale_exponent_reference(block, emax_elem):
    """OCP MX v1.0 shared exponent of one block: floor(log2 max|x|) − emax_elem, clamped to the
    E8M0 range [−127, 127]; None (NaN scale) if the block holds a non-finite value; −127 for an
    all-zero block."""
    values = [float(x) for x in np.asarray(block, dtype=np.float64).ravel()]
    if not all(math.isfinite(x) for x in values):
        return None
    amax = Fraction(max(abs(x) for x in values))
    if amax == 0:
        return -127
    e = 0
    while Fraction(2) ** (e + 1) <= amax:
        e += 1
    while Fraction(2) ** e > amax:
        e -= 1
    return max(-127, min(127, e - emax_elem))
