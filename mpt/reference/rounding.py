"""L1' oracle: exact decoding and rounding for every format and mode, from the definitions.

Two independent implementations of one specification, neither sharing code with
``mpt.kernels.rounding``:

* :func:`decode_value`, :func:`round_exact` -- one value at a time in exact rational arithmetic
  (``fractions.Fraction``): find the two format neighbours of |x| on the grid of its binade and
  pick one. Slow; used on hypothesis samples and special values.
* :func:`round_array` -- the same rules vectorised in float64, exact for float64 inputs: scaling by
  powers of two, ``floor`` and the subtraction ``|x| - lo`` are all exact. Used on exhaustive
  domains (every fp16/bf16 input), and checked against :func:`round_exact` in the tests.

The specification (every format of ``mpt.formats``; ``q`` is the grid step of the binade of |x|,
``2^(max(E, emin) - M)``, and ``lo <= |x| < lo + q`` are the magnitude neighbours with the
exponent range unbounded above):

* nearest_even / nearest_away: the nearer neighbour; a tie goes to the one whose multiple of q is
  even / to the larger. toward_zero: lo. up / down: toward +Inf / -Inf.
  stochastic with word ``w`` (uint32) and precision ``r``: the larger one iff
  ``floor((|x| - lo) / q * 2^r) + (w >> (32 - r)) >= 2^r``.
* A result above max overflows: to Inf (formats without Inf: their NaN for e4m3fn, fnuz, e8m0,
  ±max for fp6/fp4) in the nearest and stochastic modes, for up with x > 0 and down with x < 0;
  to ±max otherwise or with ``saturate``. Inf input: that same Inf code, or ±max with saturate.
* ``subnormals=False``: a nonzero result below min normal becomes zero of x's sign.
* Zero keeps its sign where the format has -0 (not fnuz). e8m0 has no zero and no sign: x <= 0
  (-0 included) or NaN give NaN, results below 2^-127 give 2^-127.
* NaN gives the canonical NaN: IEEE formats S.1…1.10…0, e4m3fn S.1111.111, fnuz 1000 0000,
  e8m0 0xFF; fp6/fp4 have no NaN: the zero with the opposite sign (what ml_dtypes does).
* Integer formats: the rounding above with q = 1, then clamped to [lowest, max]; NaN is an error.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from mpt.formats import Format, get_format

__all__ = ["decode_value", "round_exact", "round_array", "nan_code", "inf_like"]

_MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic")


def _fields(fmt: Format):
    """(sign position or None, exponent field max, fraction mask) of a float format."""
    return (fmt.bits - 1 if fmt.signed else None, (1 << fmt.exponent_bits) - 1,
            (1 << fmt.mantissa_bits) - 1)


def decode_value(code: int, fmt) -> float:
    """The exact value of ``code`` in ``fmt`` as a Python float (every value of every format is a
    float64 number); signed zeros, ±inf and nan as floats. Integers: the two's complement value."""
    fmt = get_format(fmt)
    code = int(code)
    if fmt.kind == "int":
        return float(code - (1 << fmt.bits) if fmt.signed and code >> (fmt.bits - 1) else code)
    sign_pos, e_max, f_mask = _fields(fmt)
    sign = -1.0 if sign_pos is not None and code >> sign_pos & 1 else 1.0
    mag = code & ((1 << sign_pos) - 1) if sign_pos is not None else code
    e, f = mag >> fmt.mantissa_bits, mag & f_mask
    is_nan = {"ieee": e == e_max and f != 0, "fn": e == e_max and f == f_mask,
              "fnuz": code == 1 << (fmt.bits - 1), "e8m0": code == 0xFF}.get(fmt.nan, False)
    if is_nan:
        return math.copysign(math.nan, sign)
    if fmt.nan == "ieee" and e == e_max:
        return math.copysign(math.inf, sign)
    if fmt.nan == "e8m0":
        return float(Fraction(2) ** (e - fmt.bias))
    if e == 0:  # zero or subnormal: no hidden bit, exponent of the smallest normal binade
        value = f * Fraction(2) ** (fmt.emin - fmt.mantissa_bits)
    else:
        value = ((1 << fmt.mantissa_bits) + f) * Fraction(2) ** (e - fmt.bias - fmt.mantissa_bits)
    return math.copysign(float(value), sign)


def nan_code(fmt, negative: bool) -> int:
    """The code a NaN input (of sign ``negative``) rounds to."""
    fmt = get_format(fmt)
    sign_pos, e_max, f_mask = _fields(fmt)
    sign = (1 << sign_pos) if negative and sign_pos is not None else 0
    if fmt.nan == "ieee":
        return sign | e_max << fmt.mantissa_bits | (1 << fmt.mantissa_bits - 1)
    if fmt.nan == "fn":
        return sign | e_max << fmt.mantissa_bits | f_mask
    if fmt.nan == "fnuz":
        return 1 << sign_pos
    if fmt.nan == "e8m0":
        return 0xFF
    return 0 if negative else 1 << sign_pos  # "none": ml_dtypes' zero of the opposite sign


def inf_like(mode: str, negative: bool) -> bool:
    """Whether IEEE 754 sends an overflow in ``mode`` to infinity (else to ±max)."""
    return mode in ("nearest_even", "nearest_away", "stochastic") \
        or (mode == "up" and not negative) or (mode == "down" and negative)


def _encode(value: Fraction, negative: bool, fmt: Format) -> int:
    """Code of ``value`` (0 or a magnitude of the format, <= max) with the given sign."""
    sign_pos = fmt.bits - 1 if fmt.signed else None
    sign = (1 << sign_pos) if negative and sign_pos is not None else 0
    if value == 0:
        return sign if fmt.negative_zero else 0
    e = _exponent(value)
    if fmt.nan == "e8m0":
        return e + fmt.bias
    m = fmt.mantissa_bits
    if e < fmt.emin:
        return sign | int(value / Fraction(2) ** (fmt.emin - m))
    return sign | (e + fmt.bias) << m | int((value / Fraction(2) ** e - 1) * 2**m)


def _exponent(v: Fraction) -> int:
    """E with 2^E <= v < 2^(E+1), for v > 0."""
    e = v.numerator.bit_length() - v.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > v else e


def _overflow_code(fmt: Format, negative: bool) -> int:
    """Code of an Inf-like overflow (Inf, or what a format without Inf gives)."""
    sign = (1 << fmt.bits - 1) if negative and fmt.signed else 0
    if fmt.nan == "ieee":
        return sign | ((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits
    if fmt.nan == "none":
        return sign | _encode(Fraction(fmt.max), False, fmt)
    return nan_code(fmt, negative)


def _choose(v: Fraction, q: Fraction, negative: bool, mode: str, word, rbits: int) -> Fraction:
    """The neighbour of v > 0 on the grid of step q picked by ``mode``."""
    lo = (v // q) * q
    hi = lo + q
    if lo == v:
        return v
    if mode == "nearest_even":
        if v - lo != hi - v:
            return lo if v - lo < hi - v else hi
        return lo if (lo / q) % 2 == 0 else hi
    if mode == "nearest_away":
        return lo if v - lo < hi - v else hi
    if mode == "toward_zero":
        return lo
    if mode in ("up", "down"):
        return hi if (mode == "up") != negative else lo
    p = math.floor((v - lo) / q * 2**rbits)
    return hi if p + (int(word) >> (32 - rbits)) >= 2**rbits else lo


def round_exact(x, fmt, mode="nearest_even", *, saturate=False, subnormals=True, word=None,
                rbits=32) -> int:
    """The code of ``x`` (a float or Fraction) rounded to ``fmt``; integers: the int value.

    ``word``: the uint32 random word of stochastic rounding, of which the top ``rbits`` are used.
    """
    fmt = get_format(fmt)
    if mode not in _MODES:
        raise ValueError(f"unknown mode {mode!r}")
    if (mode == "stochastic") != (word is not None):
        raise ValueError("word is needed by, and only by, mode='stochastic'")
    if isinstance(x, Fraction):
        negative, special = x < 0, None
    else:
        x = float(x)
        negative, special = math.copysign(1.0, x) < 0, (x if not math.isfinite(x) else None)
    if special is not None and math.isnan(special):
        if fmt.kind == "int":
            raise ValueError(f"NaN has no {fmt.name} value")
        return nan_code(fmt, negative)
    if fmt.kind == "float" and fmt.nan == "e8m0" and (negative or x == 0):
        return 0xFF
    max_code = _encode(Fraction(fmt.max), negative, fmt) if fmt.kind == "float" else None
    if special is not None:  # ±Inf
        if fmt.kind == "int":
            return int(fmt.lowest if negative else fmt.max)
        return max_code if saturate else _overflow_code(fmt, negative)
    v = abs(Fraction(x))
    if fmt.kind == "int":
        r = _choose(v, Fraction(1), negative, mode, word, rbits) if v else v
        return int(min(max(-r if negative else r, fmt.lowest), fmt.max))
    r = v
    if v:
        q = Fraction(2) ** (max(_exponent(v), fmt.emin) - fmt.mantissa_bits)
        r = _choose(v, q, negative, mode, word, rbits)
    if r > Fraction(fmt.max):
        return _overflow_code(fmt, negative) if inf_like(mode, negative) and not saturate \
            else max_code
    if fmt.nan == "e8m0":
        r = max(r, Fraction(fmt.min_normal))
    if not subnormals and r < Fraction(fmt.min_normal):
        r = Fraction(0)
    return _encode(r, negative, fmt)


# ---- the same rules vectorised in float64 (exact for float64 inputs) ---------------------------

def round_array(x, fmt, mode="nearest_even", *, saturate=False, subnormals=True, words=None,
                rbits=32) -> np.ndarray:
    """:func:`round_exact` of every element of ``x`` (float64 values), as an int64 array.

    Float formats only, without NaN or Inf inputs (checked by the special-value tests instead).
    """
    fmt = get_format(fmt)
    x = np.asarray(x, np.float64)
    if fmt.kind != "float" or not np.isfinite(x).all():
        raise ValueError("round_array takes finite inputs and a float format")
    neg = np.signbit(x)
    a = np.abs(x)
    e = np.frexp(a)[1].astype(np.int64) - 1                         # 2^e <= a < 2^(e+1)
    step = np.maximum(e, fmt.emin) - fmt.mantissa_bits              # q = 2^step
    k = np.floor(np.ldexp(a, -step))                                # lo = k q (exact)
    frac = np.ldexp(a, -step) - k                                   # (a - lo) / q in [0, 1), exact
    up = {
        "nearest_even": (frac > 0.5) | ((frac == 0.5) & (np.fmod(k, 2) == 1)),
        "nearest_away": frac >= 0.5,
        "toward_zero": np.zeros_like(neg),
        "up": (frac > 0) & ~neg,
        "down": (frac > 0) & neg,
    }.get(mode)
    if mode == "stochastic":
        r_words = np.asarray(words, np.uint64) >> np.uint64(32 - rbits)
        up = np.floor(np.ldexp(frac, rbits)) + r_words.astype(np.float64) >= 2.0**rbits
    with np.errstate(over="ignore"):  # 2^1024 and beyond: inf, still above max
        r = np.ldexp(k + up, step)                                  # the rounded magnitude
    codes = _encode_array(np.minimum(r, fmt.max), neg, fmt)
    over = r > fmt.max
    inf_mask = np.array([inf_like(mode, bool(n)) for n in (False, True)])[neg.astype(int)]
    ovf = np.where(neg, _overflow_code(fmt, True), _overflow_code(fmt, False))
    codes = np.where(over & inf_mask & (not saturate), ovf, codes)
    if fmt.nan == "e8m0":
        codes = np.where(neg | (a == 0), 0xFF, np.maximum(codes, 0))
    if not subnormals and fmt.subnormals:
        tiny = (r < fmt.min_normal) & ~over
        zero = np.where(neg & fmt.negative_zero, 1 << (fmt.bits - 1), 0)
        codes = np.where(tiny, zero, codes)
    return codes


def _encode_array(r, neg, fmt):
    """Codes of magnitudes r (0 or values of fmt) with signs neg (vectorised :func:`_encode`)."""
    m = fmt.mantissa_bits
    e = np.frexp(r)[1].astype(np.int64) - 1
    if fmt.nan == "e8m0":  # below 2^-127 (r == 0 included): the smallest value
        return np.where(r < fmt.min_normal, 0, e + fmt.bias)
    normal = e >= fmt.emin
    fraction = np.where(normal, np.ldexp(r, -e) - 1.0, np.ldexp(r, m - fmt.emin))
    mag = np.where(normal, (e + fmt.bias) << m, 0) + np.ldexp(fraction, np.where(normal, m, 0))
    mag = np.where(r == 0, 0.0, mag)
    sign = np.where(neg & ((r != 0) | fmt.negative_zero), 1 << (fmt.bits - 1), 0)
    return sign | mag.astype(np.int64)
