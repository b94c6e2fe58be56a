"""Oracles for the block-scaled formats and Blackwell's block-scaled MMA, in exact rationals.

Written from the rules (``mpt.microscaling``'s and ``mpt.engines.blockscaled``'s docstrings),
one block or one output element at a time, on Python floats and :class:`fractions.Fraction`:
float32 steps are :mod:`mpt.reference.optim`'s exact-rational ones, codes come from
:func:`mpt.reference.rounding.round_exact` and values from ``decode_value``. Scale exponents
are found with rational comparisons (ceil/floor of log2), not with bit manipulation as the
kernels do. Never imports ``mpt.kernels``. Slow: meant for small arrays in tests.
"""
from __future__ import annotations

import math
from fractions import Fraction

from mpt.formats import get_format
from mpt.reference.mma import round_fraction
from mpt.reference.optim import div32, mul32, round_f32
from mpt.reference.rounding import decode_value, nan_code, round_exact

__all__ = ["floor_log2", "e8m0_reference", "quantize_mx_reference", "nvfp4_global_scale_reference",
           "quantize_nvfp4_reference", "block_scaled_dot_reference"]

_FLT_MAX = float.fromhex("0x1.fffffep+127")
_E4M3 = "fp8_e4m3fn"


def floor_log2(v: Fraction) -> int:
    """E with 2^E <= v < 2^(E+1), for v > 0."""
    e = 0
    while Fraction(2) ** e > v:
        e -= 1
    while Fraction(2) ** (e + 1) <= v:
        e += 1
    return e


def _ceil_log2(v: Fraction) -> int:
    e = floor_log2(v)
    return e if Fraction(2) ** e == v else e + 1


def _element_info(fmt):
    fmt = get_format(fmt)
    if fmt.kind == "int":
        return fmt, 0, 127 * 2.0**-6
    return fmt, fmt.emax, fmt.max


def e8m0_reference(block, rule: str, fmt) -> int:
    """E8M0 code of one block (a list of float32 values as floats) under rule "ocp", "trainium"
    or "te" (NaN ignored in the amax; code of ceil(log2(fl32(amax · fl32(1/fmt_max)))))."""
    _, emax, fmax = _element_info(fmt)
    if rule == "te":
        amax = max([abs(v) for v in block if not math.isnan(v)], default=0.0)
        val = mul32(amax, round_f32(Fraction(1.0 / fmax)))     # TE's rcp: double, then float
        if math.isinf(val):
            return 0xFE
        if val == 0:
            return 0
        return min(max(_ceil_log2(Fraction(val)), -127), 127) + 127
    if not all(math.isfinite(v) for v in block):
        return 0xFF
    amax = max(abs(v) for v in block)
    if amax == 0:
        return 0
    e = floor_log2(Fraction(amax)) - emax + (1 if rule == "trainium" else 0)
    return min(max(e, -127), 127) + 127


def _word(mode, words, i):
    return None if mode == "nearest_even" else int(words[i])


def _element_code(y, fmt, mode, word, nan_to):
    """Code of the scaled value y (float or Fraction) in the element format (module rules)."""
    stochastic = mode != "nearest_even"
    rmode = "stochastic" if stochastic else "nearest_even"
    rbits = 8 if mode == "stochastic_8bit" else 32
    if isinstance(y, float) and math.isnan(y):
        if fmt.kind == "int":
            return 0
        if nan_to is not None:
            return nan_to
        return nan_code(fmt, math.copysign(1.0, y) < 0)
    if fmt.kind == "int":
        v = y * 64 if isinstance(y, Fraction) else y
        code = round_exact(v, fmt, rmode, word=word if stochastic else None, rbits=rbits)
        return max(code, -127)
    return round_exact(y, fmt, rmode, saturate=True, word=word if stochastic else None,
                       rbits=rbits)


def _blocks_2d(rows, cols, block):
    """Index lists of the blocks of a rows × cols matrix, blocks along the last axis."""
    br, bc = block
    for r0 in range(0, rows, br):
        for c0 in range(0, cols, bc):
            yield [(r, c) for r in range(r0, min(r0 + br, rows))
                   for c in range(c0, min(c0 + bc, cols))], (r0 // br, c0 // bc)


def quantize_mx_reference(x, fmt, *, block, rule, mode="nearest_even", words=None):
    """MX quantization of a matrix x (rows × cols nested lists of float32 values as floats) with
    blocks along the last axis (block (1, n) or (16, 16)). words: nested lists of uint32 ints
    (stochastic modes). Returns (element codes: nested lists of ints — uint bit patterns, or
    int8 values —, scale codes: nested lists of ints)."""
    fmt, _, fmax = _element_info(fmt)
    rows, cols = len(x), len(x[0])
    codes = [[0] * cols for _ in range(rows)]
    scales = [[0] * -(-cols // block[1]) for _ in range(-(-rows // block[0]))]
    nan_to = None
    if rule == "te" and fmt.kind == "float":
        nan_to = 0x7F if fmt.bits == 8 else round_exact(fmax, fmt)
    for cells, (i, j) in _blocks_2d(rows, cols, block):
        code = e8m0_reference([x[r][c] for r, c in cells], rule, fmt)
        scales[i][j] = code
        if code == 0xFF:
            shift = None if rule == "te" else 0                # TE: NaN elements; OCP: unscaled
        else:
            shift = code - 127
        for r, c in cells:
            v = x[r][c]
            if shift is None or not math.isfinite(v) or v == 0:    # a float keeps -0's sign
                y = math.nan if shift is None else v
            else:
                y = Fraction(v) / Fraction(2) ** shift
            w = None if words is None else int(words[r][c])
            codes[r][c] = _element_code(y, fmt, mode, w, nan_to)
    return codes, scales


def nvfp4_global_scale_reference(amax: float) -> float:
    """S_enc = min(fl32(2688 / amax), FLT_MAX), or 1 when amax = 0 or S_enc = 0."""
    if amax == 0:
        return 1.0
    s = div32(2688.0, amax)
    s = min(s, _FLT_MAX)
    return 1.0 if s == 0 else s


def _nvfp4_scale_value(block_amax, s_enc, rule):
    sixth = round_f32(Fraction(1, 6))
    if rule == "te":
        return mul32(block_amax, mul32(s_enc, sixth))
    if rule == "te_v2.8":
        return min(mul32(div32(block_amax, 6.0), s_enc), _FLT_MAX)
    return mul32(mul32(block_amax, sixth), s_enc)


def quantize_nvfp4_reference(x, *, block, rule="te", mode="nearest_even", words=None,
                             global_amax=None):
    """NVFP4 quantization of a matrix (nested lists of float32 values), blocks along the last
    axis ((1, 16) or (16, 16)). Returns (e2m1 codes, UE4M3 scale codes, S_dec, amax)."""
    flat = [v for row in x for v in row if not math.isnan(v)]
    amax = max([abs(v) for v in flat], default=0.0) if global_amax is None else global_amax
    s_enc = nvfp4_global_scale_reference(amax)
    s_dec = round_f32(Fraction(1.0 / s_enc))                   # double division, then float
    rows, cols = len(x), len(x[0])
    codes = [[0] * cols for _ in range(rows)]
    scales = [[0] * -(-cols // block[1]) for _ in range(-(-rows // block[0]))]
    for cells, (i, j) in _blocks_2d(rows, cols, block):
        vals = [x[r][c] for r, c in cells]
        block_amax = max([abs(v) for v in vals if not math.isnan(v)], default=0.0)
        s_code = round_exact(_nvfp4_scale_value(block_amax, s_enc, rule), _E4M3, saturate=True)
        scales[i][j] = s_code
        inv = min(div32(1.0, mul32(decode_value(s_code, _E4M3), s_dec)), _FLT_MAX)
        for r, c in cells:
            w = None if words is None else int(words[r][c])
            y = mul32(x[r][c], inv)
            codes[r][c] = _element_code(y, get_format("fp4_e2m1fn"), mode, w, nan_to=0x07)
    return codes, scales, s_dec, amax


# ---- block-scaled MMA ---------------------------------------------------------------------------
_KINDS = {"mxf8f6f4": (32, 25), "mxf4": (64, 35), "mxf4nvf4": (64, 35)}
_E_ZERO = -133      # mpt's zero-term exponent of the Blackwell FP32-output block model


def _nominal(x: float, emin: int) -> int:
    return max(floor_log2(abs(Fraction(x))), emin)


def _zero_exp(rule):
    return _E_ZERO if rule == "mpt" else -126


def _specials(values):
    """NaN / ±Inf of an instruction from its products/terms (floats, NaN and Inf included)."""
    if any(math.isnan(v) for v in values):
        return math.nan
    infs = {math.copysign(1.0, v) for v in values if math.isinf(v)}
    if len(infs) == 2:
        return math.nan
    return infs.pop() * math.inf if infs else None


def _instruction(terms, c, fraction_bits, zero_rule):
    """Align terms (value Fraction, exponent) and c with F fraction bits, truncate, add, RZ."""
    e_c = _zero_exp(zero_rule) if c == 0 else _nominal(c, -126)
    anchor = max([e for _, e in terms] + [e_c])
    q = Fraction(2) ** (anchor - fraction_bits)
    total = sum((math.trunc(t / q) for t, _ in terms), 0) + math.trunc(Fraction(c) / q)
    if total == 0:
        return 0.0
    d = round_fraction(total * q, "rz_fp32")
    return 0.0 if d == 0 and zero_rule == "mma_sim" else d


def block_scaled_dot_reference(a, b, sa, sb, c, *, kind, block, a_format, b_format,
                               scale_format, zero_rule="mpt"):
    """One output of a chain of block-scaled MMA instructions in increasing k.

    a, b: K element values (floats); sa, sb: K/block scale values (floats, as decoded: a UE4M3
    scale may carry a sign, which is ignored; NaN for NaN codes); c: the FP32 accumulator.
    kind "mxf8f6f4" (32 per instruction, F = 25): each product a·b·|sa|·|sb| is a term with
    exponent e(a)+e(b)+e(sa)+e(sb) (nominal exponents, a subnormal at its format's emin).
    kind "mxf4"/"mxf4nvf4" (64 per instruction, F = 35): each group of 16 products is summed
    exactly and times |sa|·|sb| is a term with exponent e(sa)+e(sb). A zero term — a zero
    product, a zero c, or a group with a zero scale — takes e_zero = −133 (zero_rule "mpt"); with
    zero_rule "mma_sim" a zero value has exponent −126 instead and a zero result is +0. A last
    instruction that K does not fill gets zero elements and scale code 0x00 (TMA's zero fill).
    """
    kk, fraction_bits = _KINDS[kind]
    pad = -len(a) % kk
    if pad:
        zero_code = decode_value(0, scale_format)               # E8M0: 2^-127; UE4M3: 0
        a, b = list(a) + [0.0] * pad, list(b) + [0.0] * pad
        sa, sb = (list(s) + [zero_code] * (pad // block) for s in (sa, sb))
    ea_min, eb_min = get_format(a_format).emin, get_format(b_format).emin
    s_emin = get_format(scale_format).emin
    z = -126

    def e_of(x, emin):
        return z if x == 0 else _nominal(x, emin)

    for k0 in range(0, len(a), kk):
        scales = [(abs(sa[k // block]), abs(sb[k // block])) for k in range(k0, k0 + kk)]
        special = _specials([c] + [x * y for x, y in zip(a[k0:k0 + kk], b[k0:k0 + kk])]
                            + [s for pair in scales for s in pair])
        if special is not None:
            c = special
            continue
        terms = []
        if kind == "mxf8f6f4":
            for k in range(k0, k0 + kk):
                x, y, (u, v) = a[k], b[k], scales[k - k0]
                value = Fraction(x) * Fraction(y) * Fraction(u) * Fraction(v)
                if zero_rule == "mpt" and value == 0:
                    terms.append((value, _E_ZERO))
                else:
                    terms.append((value, e_of(x, ea_min) + e_of(y, eb_min) + e_of(u, s_emin)
                                  + e_of(v, s_emin)))
        else:
            for g0 in range(k0, k0 + kk, 16):
                u, v = scales[g0 - k0]
                s = sum((Fraction(a[k]) * Fraction(b[k]) for k in range(g0, g0 + 16)), Fraction(0))
                value = s * Fraction(u) * Fraction(v)
                if zero_rule == "mpt" and (u == 0 or v == 0):
                    terms.append((value, _E_ZERO))
                else:
                    terms.append((value, e_of(u, s_emin) + e_of(v, s_emin)))
        c = _instruction(terms, c, fraction_bits, zero_rule)
    return c
