"""Oracle of the Intel Gaudi 2 / Gaudi 3 matrix engine (MME), in exact rationals.

The rules below are those of Habana's published bit-level MME reference model
(github HabanaAI/Intel_Gaudi3_Software, ``mme/mme_reference/chip_fma/{gaudi2,gaudi3}_fma.cpp`` and
the ``coral-sim`` FMA trees they call), restated in words and re-derived here one output element
at a time on Python floats and :class:`fractions.Fraction`; no code of that model is used. Never
imports ``mpt.kernels``. Slow: meant for small matrices in tests.

**The K walk.** For one output, K is cut into trees of ``W`` products starting at k = 0; the last
tree is padded with zero products. The accumulator starts at +0 (or C); each tree's FP32 result
is the next tree's C.

**Gaudi 2** (W = 16 fp8, 8 bf16/fp16, 4 tf32, 2 fp32; F = 24 for fp8, else 46):

1. Inputs: fp8 is widened to fp16 (round to nearest even: exact for the descriptor's biases);
   fp32 becomes tf32 by round to nearest even for tf32; bf16, tf32 and fp32 subnormals are
   flushed to zero, and so is a subnormal C (fp16 and fp8 subnormals survive).
2. Terms: bf16/fp16/tf32 products a·b, exact, at the exponent floor(log2|a·b|) (normalised);
   fp8 products at max(e_a, -14) + max(e_b, -14) (fp16's emin clamps: not normalised); fp32
   products as four partial products of a 12 + 12-bit split of each significand, each at
   e_a + e_b.
3. E = the largest term exponent (zero terms excluded); every term is truncated toward zero to
   a multiple of q = 2^(E - F), and the truncated terms are summed exactly: S.
4. The result is S + C (C exact, not truncated), rounded once to FP32 with round to nearest
   even (gradual underflow), then subnormal results are flushed to zero; overflow gives ±Inf.
   After the last tree, every output goes through an RNE ``+ 0`` (the reference's H3-2134 fix),
   so a zero is +0: this oracle returns +0 for every zero, tree by tree (a zero C adds nothing).

**Gaudi 3** (W = 8 fp8/bf16, 2 fp16/tf32, 1 fp32; F = 24; one "9-term step"):

1. Inputs are exact (fp8 with its bias and Inf/NaN mode, fp16, bf16, fp32 subnormals kept);
   fp32 becomes tf32 by round to nearest even.
2. Terms: bf16/fp8 products a·b at e_a + e_b, with e = max(floor(log2|x|), -126) (a bf16 or
   fp32 subnormal keeps emin -126; fp8 and fp16 values are all FP32 normals); fp16 and tf32
   products as four partial products of a 3 + 8-bit split of each 11-bit significand; fp32
   products as eight partial products of a byte split (low byte × low byte dropped); C is one
   more term at e_c.
3. E = max(largest term exponent, -132) (zero terms excluded); every term, C included, is
   truncated toward zero to a multiple of q = 2^(E - 24), and the terms are summed exactly.
4. The sum is rounded toward zero to FP32 (subnormals on their grid; a magnitude >= 2^128 gives
   ±Inf, even under round toward zero); a zero is +0.

Specials on both chips: a NaN operand, Inf·0 (0 after the flush of step 1), or +Inf with -Inf
(C included) give NaN; otherwise an Inf term gives that Inf. NaN is returned as ``math.nan``.
"""
from __future__ import annotations

import math
from fractions import Fraction

from mpt.formats import get_format
from mpt.reference.mma import decode_bits, encode_bits, round_fraction, special_result
from mpt.reference.rounding import decode_value, round_exact

__all__ = ["TREE_WIDTH", "family", "operand", "tree_reference", "mme_dot_reference",
           "mme_reference"]

#: Products per tree (the reference's ``c_fma_tree_addr_width``) per chip and operand family.
TREE_WIDTH = {
    "gaudi2": {"fp8": 16, "fp16": 8, "bf16": 8, "tf32": 4, "fp32": 2},
    "gaudi3": {"fp8": 8, "fp16": 2, "bf16": 8, "tf32": 2, "fp32": 1},
}
# Significand bit fields [hi, lo] of each piece (bit 23 is the hidden bit of an FP32 view), and
# the (a piece, b piece) pairs that are multiplied: the partial products of the reference.
_SPLITS = {
    ("gaudi2", "fp32"): (((23, 12), (11, 0)), ((0, 0), (0, 1), (1, 0), (1, 1))),
    ("gaudi3", "fp16"): (((23, 21), (20, 13)), ((0, 0), (0, 1), (1, 0), (1, 1))),
    ("gaudi3", "tf32"): (((23, 21), (20, 13)), ((0, 0), (0, 1), (1, 0), (1, 1))),
    ("gaudi3", "fp32"): (((23, 16), (15, 8), (7, 0)),
                         ((2, 1), (2, 0), (1, 2), (1, 1), (1, 0), (0, 2), (0, 1), (0, 0))),
}
_WHOLE = (((23, 0),), ((0, 0),))
_FP32_MIN_NORMAL = 2.0**-126


def family(fmt) -> str:
    """The MME operand family of a format: "fp32", "tf32", "bf16", "fp16" or "fp8"."""
    fmt = get_format(fmt)
    if fmt.name in ("fp32", "tf32", "bf16", "fp16"):
        return fmt.name
    if fmt.kind == "float" and fmt.bits == 8 and (fmt.exponent_bits, fmt.mantissa_bits) in (
            (4, 3), (5, 2)):
        return "fp8"
    raise ValueError(f"format {fmt.name} is not an MME operand format")


def _exponent(x: float) -> int:
    """floor(log2|x|) of a finite non-zero float."""
    return math.frexp(x)[1] - 1


def operand(x: float, chip: str, fmt) -> float:
    """The value the MME multiplies for input value ``x`` of ``fmt`` (step 1 of the chip)."""
    fam = family(fmt)
    if math.isnan(x) or math.isinf(x):
        return x
    if chip == "gaudi2" and fam == "fp8":
        x = decode_value(round_exact(x, "fp16"), "fp16")
    if fam == "tf32":
        x = decode_value(round_exact(x, "tf32"), "tf32")
    if chip == "gaudi2" and fam in ("bf16", "tf32", "fp32") and abs(x) < _FP32_MIN_NORMAL:
        x = math.copysign(0.0, x)
    return x


def _nominal(x: float, chip: str, fam: str) -> int:
    """The exponent a finite non-zero operand enters its products with."""
    if chip == "gaudi2" and fam == "fp8":
        return max(_exponent(x), -14)
    return max(_exponent(x), -126)


def _pieces(x: float, e: int, fields) -> list[Fraction]:
    """x = Σ pieces: the significand of x on the grid 2^(e - 23), cut into bit fields."""
    sig = Fraction(x) / Fraction(2) ** (e - 23)
    assert sig.denominator == 1 and abs(sig) < 2**24, (x, e)
    n = abs(sig.numerator)
    sign = -1 if x < 0 else 1
    return [sign * ((n >> lo) & ((1 << (hi - lo + 1)) - 1)) * Fraction(2) ** (lo + e - 23)
            for hi, lo in fields]


def _terms(a, b, chip, fam):
    """(exact term, exponent) of every partial product of one tree's non-zero products."""
    fields, pairs = _SPLITS.get((chip, fam), _WHOLE)
    terms = []
    for x, y in zip(a, b):
        if x == 0 or y == 0:
            continue
        if chip == "gaudi2" and fam in ("bf16", "fp16", "tf32"):   # normalised products
            p = Fraction(x) * Fraction(y)
            terms.append((p, _exponent(float(p))))
            continue
        ex, ey = _nominal(x, chip, fam), _nominal(y, chip, fam)
        px, py = _pieces(x, ex, fields), _pieces(y, ey, fields)
        terms += [(px[i] * py[j], ex + ey) for i, j in pairs]
    return terms


def _truncated_sum(terms, anchor, fraction_bits) -> Fraction:
    q = Fraction(2) ** (anchor - fraction_bits)
    return sum((math.trunc(t / q) for t, _ in terms), 0) * q


def _formats(fmt):
    """(format of a, format of b, their family) from one format or a pair."""
    fa, fb = (fmt, fmt) if not isinstance(fmt, (tuple, list)) else fmt
    fa, fb = get_format(fa), get_format(fb)
    if family(fa) != family(fb):
        raise ValueError(f"operand formats {fa.name} and {fb.name} are not of one family")
    return fa, fb, family(fa)


def tree_reference(a, b, c: float, *, chip: str, fmt, fraction_bits: int | None = None) -> float:
    """One tree of the chip: a, b sequences of at most W operand values (padded with zeros),
    c an FP32 value. ``fmt``: the operands' format, or a pair (format of a, format of b).
    ``fraction_bits``: Gaudi 2's F when not the chip's (46, fp8: 24) — a fault-injected unit.
    Returns the FP32 result as a Python float."""
    fa, fb, fam = _formats(fmt)
    a = [operand(x, chip, fa) for x in a]
    b = [operand(y, chip, fb) for y in b]
    if chip == "gaudi2" and math.isfinite(c) and abs(c) < _FP32_MIN_NORMAL:
        c = 0.0                                                  # flushed (sign immaterial)
    special = special_result(zip(a, b), c)
    if special is not None:
        return special
    terms = _terms(a, b, chip, fam)
    if chip == "gaudi2":
        total = Fraction(c)
        if terms:
            f = fraction_bits if fraction_bits is not None else 24 if fam == "fp8" else 46
            total += _truncated_sum(terms, max(e for _, e in terms), f)
        r = 0.0 if total == 0 else round_fraction(total, "rne_fp32")
        return 0.0 if abs(r) < _FP32_MIN_NORMAL else r             # flush, and +0 for zero
    if c != 0:
        terms.append((Fraction(c), max(_exponent(c), -126)))
    anchor = max([e for _, e in terms] + [-132])
    total = _truncated_sum(terms, anchor, 24)
    return 0.0 if total == 0 else round_fraction(total, "rz_fp32") + 0.0   # +0 for zero


def mme_dot_reference(a, b, c=0.0, *, chip: str, fmt, fraction_bits: int | None = None) -> float:
    """One output: c + Σ a_k·b_k walked tree by tree from k = 0 (module docstring).

    a, b: sequences of K values of ``fmt`` (one format or a pair); c: an FP32 value (default
    +0); ``fraction_bits``: as :func:`tree_reference`. With K = 0 the result is c (Gaudi 2: plus
    the final +0, so -0 becomes +0).
    """
    width = TREE_WIDTH[chip][_formats(fmt)[2]]
    if len(a) == 0 and chip == "gaudi2":
        return c + 0.0                                            # the final RNE "+ 0"
    for k0 in range(0, len(a), width):
        c = tree_reference(a[k0:k0 + width], b[k0:k0 + width], c, chip=chip, fmt=fmt,
                           fraction_bits=fraction_bits)
    return c


def mme_reference(a_bits, b_bits, c_bits, *, chip: str, fmt, n=None):
    """D = A·B + C on bit patterns: a_bits (M, K), b_bits (K, N) nested lists of codes of
    ``fmt`` or of the pair (format of a, format of b) (fp32 patterns for fp32/tf32), c_bits
    (M, N) FP32 patterns or None (+0); ``n``: N, needed only when K = 0 and c_bits is None.
    Returns (M, N) FP32 patterns, NaN as 0x7FFFFFFF."""
    fa, fb, fam = _formats(fmt)

    def decode(v, f):
        return decode_bits(v, "fp32") if fam in ("fp32", "tf32") else decode_value(v, f)
    a = [[decode(v, fa) for v in row] for row in a_bits]
    b = [[decode(v, fb) for v in row] for row in b_bits]
    m = len(a)
    n = len(b[0]) if b else len(c_bits[0]) if c_bits is not None else n
    out = []
    for i in range(m):
        row = []
        for j in range(n):
            c = 0.0 if c_bits is None else decode_bits(c_bits[i][j], "fp32")
            d = mme_dot_reference(a[i], [r[j] for r in b], c, chip=chip, fmt=fmt)
            row.append(encode_bits(d, "fp32"))
        out.append(row)
    return out
