"""Oracle of AMD Matrix Core (MFMA) arithmetic, CDNA1 to CDNA4, in exact rationals.

One output element of ``D = A·B + C`` at a time, bit patterns in and out, every rounding written
out on :class:`fractions.Fraction` (IEEE FP32 steps are :mod:`mpt.reference.optim`'s exact ones,
final roundings :func:`mpt.reference.rounding.round_exact`). Never imports ``mpt.kernels``.
Slow: meant for small matrices in tests.

Source of the rules: the reference model of P. Xie et al., "MMA-Sim: Bit-Accurate Reference
Model of Tensor Cores and Matrix Cores", arXiv:2511.10909 (code: github microsoft/MMA-Sim, MIT,
``mmasim/simulator/amd.py``, ``arithmetic.py``, ``isa/amd.py``; read, not copied), which its
authors checked bit for bit on MI100, MI250 and MI300 hardware. Where the paper's summary is
ambiguous its code decides; each such point is marked "(MMA-Sim's code)" below. CDNA4 is an
assumption (marked so).

An instruction variant is a plain dict (so that this module does not depend on the models in
``mpt.engines.amd``)::

    {"rule": "fma" | "pairwise" | "fused" | "fused_fp8", "k": K per instruction,
     "group": products per group, "flush": CDNA2's subnormal flush (bool), "out": "fp32"|"fp64",
     "nan": "first" | "last" (which of several NaNs, below; default "first")}

**Chaining and padding.** A dot product of length K runs ceil(K / k) instructions in increasing
k; the D of one is the C of the next. K that is not a multiple of k is zero-padded (+0 elements;
MX scales of whole padded blocks are 2^0) and the padding runs through the arithmetic like any
other zeros (it can turn a −0 accumulator into +0). Inside an instruction, groups of ``group``
products run in increasing k.

**Exponents** (fused rules). A finite x = s·2^e with e = max(floor(log2|x|), emin of its format)
(a subnormal keeps emin, |s| < 1), except that a zero has e = −126 whatever its format (so a
zero product has e = −126 + e(partner); MMA-Sim's code). C is an FP32 value (emin −126).

Rules, per group of products p_i = a_i·b_i with accumulator c (FP32 unless said otherwise):

``fma`` (f32 and f64 instructions, every CDNA; group 1): c = fma(a, b, c), one IEEE RNE rounding
    to FP32 (FP64 for f64), for each k in increasing order.

``pairwise`` (CDNA1/CDNA2 f16, bf16, bf16_1k; group 4, or 2 for the pre-_1k bf16 instructions):
    each product is rounded to FP32 as fma(a, b, +0) (so an exact −0 product becomes +0, and a
    non-zero product that underflows keeps its sign; MMA-Sim's code); the group is summed by a
    pairwise tree of FP32 RNE adds, left half first: (p0+p1)+(p2+p3) (a group of n splits into
    its first n//2 and the rest); then c = c + group, RNE.
    CDNA2 (``flush``): at the start of each instruction C becomes +0 if |C| < 2^-126 (−0
    included); inputs with |x| < 2^emin of their format become +0 (−0 included); every tree
    node (products included) and every accumulator value with |x| < 2^-126 becomes a zero of
    its sign (MMA-Sim's code).

``fused`` (CDNA3 f16, bf16: group min(8, k); xf32: group 4, inputs truncated to TF32, i.e. the
    low 13 bits of the FP32 pattern dropped):
    1. E = max_i (e(a_i) + e(b_i)) over the group's products (zero products included; C is not).
    2. Each exact, unnormalised product is truncated toward zero to 24 fraction bits below 2^E;
       S = the exact integer sum (in units of 2^(E-24)).
    3. M = max(E, e(c)). The product sum is re-aligned to 2^M rounding toward −∞ with 31
       fraction bits: s = floor(S·2^(E-M+7)) (units of 2^(M-31)); C likewise with 24:
       t = floor(c·2^(24-M)) (units of 2^(M-24)).
    4. D = RNE_FP32((s + 2^7·t)·2^(M-31)) (subnormals on the FP32 grid; from FLT_MAX + ½ulp
       up: Inf).
       An exact zero sum is +0; a non-zero sum that rounds to zero keeps its sign.
    D is the next group's c.

``fused_fp8`` (CDNA3 FNUZ fp8/bf8, mixable; CDNA4 OCP fp8 and f8f6f4, assumption; group 16):
    as ``fused``, but step 2 runs twice, on the even-k and on the odd-k products of the group
    (positions 0, 2, … and 1, 3, … within the group), each truncated at 24 bits against its own
    maximum (E0, S0), (E1, S1); then E = max(E0, E1) and each half is rounded toward −∞ to 24
    fraction bits below 2^E: S = floor(S0·2^(E0-E)) + floor(S1·2^(E1-E)). Step 3 as before, except
    that C is dropped (t = 0) when e(c) < M − 25.
    CDNA4 block scales (``v_mfma_scale_f32_*_f8f6f4``, assumption "cdna3"): A and B carry one
    E8M0 scale per 32 consecutive k (scale_a (M, K/32), scale_b (K/32, N)); the two scale
    exponents are added to every product's exponent, i.e. p_i = a_i·b_i·2^(sa+sb) with exponent
    e(a_i)+e(b_i)+sa+sb, and everything else is the rule above.

**Special values** (every rule): IEEE propagation. The result is NaN when the model's IEEE
arithmetic gives NaN (a NaN operand, Inf·0, Inf − Inf, also after an FP32 overflow in the
pairwise tree); else ±Inf when it gives ±Inf. For the fused rules: NaN if any operand (a, b,
scale, c) is NaN, a product is Inf·0 or Infs of both signs meet among the products and c; else
±Inf if one is infinite; else (MMA-Sim's code) a finite product with |p| ≥ 2^128 makes the group
±Inf, or NaN if both signs occur.
Which NaN, bit for bit (no canonical NaN; from MMA-Sim's outputs on its x86 host):
    * an input NaN comes out quieted and widened: fp32/xf32 ``bits | 0x00400000``; fp16, bf16,
      e5m2, e4m3fn: sign, all-ones exponent, the fraction at the top of the FP32 fraction, the
      quiet bit set (fp16 0x7C01 → 0x7FC02000, e4m3fn NaN → 0x7FF00000 / 0xFFF00000); FNUZ's NaN
      0x80 → 0x7FC00001 (what MMA-Sim's conversion gives); an E8M0 NaN scale → 0x7FC00000
      (assumption); fp64 ``bits | 0x0008000000000000``.
    * a NaN made by the arithmetic (Inf·0, Inf − Inf): the x86 default NaN 0xFFC00000
      (FP64 0xFFF8000000000000); the 2^128 rule's NaN: 0x7FC00000 (MMA-Sim's code).
    * several NaNs (assumption ``several_nans``): IEEE leaves the choice open and MMA-Sim's
      choice is an artifact of its host (the lane order of torch's vectorised sum, the
      compiler's operand order), so it is a parameter: the first ("first", the default) or the
      last ("last") NaN among the group's operands in the order c, a_0, b_0, a_1, b_1, … (a
      product's element before its scale); only if no operand is NaN, the made NaN. With
      "first" a NaN accumulator keeps its payload through the rest of the chain.
"""
from __future__ import annotations

import math
from fractions import Fraction

from mpt.formats import get_format
from mpt.reference.optim import add32, fma32
from mpt.reference.rounding import decode_value, round_exact

__all__ = ["RULES", "exponent", "input_nan_bits", "mfma_dot_reference", "mfma_reference"]

RULES = ("fma", "pairwise", "fused", "fused_fp8")
DEFAULT_NAN = {"fp32": 0xFFC00000, "fp64": 0xFFF8000000000000}
_BIG_NAN = 0x7FC00000          # NaN of the 2^128 rule (both signs)
_SCALE_NAN = 0x7FC00000        # NaN of an E8M0 NaN scale (assumption)
_ZERO_EXPONENT = -126
_MX_BLOCK = 32


def _value(bits: int, fmt: str) -> float:
    """The value of a pattern (xf32/tf32: an FP32 pattern with its low 13 bits dropped)."""
    if fmt == "tf32":
        return decode_value(bits & 0xFFFFE000, "fp32")
    return decode_value(bits, fmt)


def input_nan_bits(bits: int, fmt: str, out: str = "fp32") -> int:
    """The quiet NaN of the output format that a NaN input pattern comes out as (see module doc)."""
    f = get_format(fmt)
    if out == "fp64":
        return bits | 0x0008000000000000
    if fmt in ("fp32", "tf32"):
        return (bits & (0xFFFFE000 if fmt == "tf32" else 0xFFFFFFFF)) | 0x00400000
    if f.nan == "fnuz":
        return 0x7FC00001
    sign = (bits >> (f.bits - 1)) & 1
    fraction = bits & ((1 << f.mantissa_bits) - 1)
    return sign << 31 | 0x7FC00000 | fraction << (23 - f.mantissa_bits)


def exponent(x: float, fmt: str) -> int:
    """e of a finite x: max(floor(log2|x|), emin of fmt); −126 for a zero (any format)."""
    if x == 0:
        return _ZERO_EXPONENT
    emin = get_format("fp32" if fmt == "tf32" else fmt).emin
    return max(math.frexp(x)[1] - 1, emin)


class _Operand:
    """One element (or the accumulator): its pattern, format, value and, for MX, scale exponent."""

    def __init__(self, bits, fmt, scale_bits=None, flush=False):
        self.bits, self.fmt = bits, fmt
        self.value = _value(bits, fmt)
        if flush and abs(self.value) < get_format(fmt).min_normal:   # CDNA2: also −0 -> +0
            self.bits, self.value = 0, 0.0
        self.scale_bits = scale_bits
        self.scale = 0 if scale_bits is None else (
            None if scale_bits == 0xFF else scale_bits - get_format("e8m0").bias)

    def nan_bits(self, out):
        """The NaN this operand contributes (None if it is not NaN)."""
        if math.isnan(self.value):
            return input_nan_bits(self.bits, self.fmt, out)
        if self.scale_bits is not None and self.scale is None:
            return _SCALE_NAN
        return None


def _first_nan(c, pairs, out, last=False):
    """The first (``last``: the last) NaN among c, a_0, b_0, a_1, b_1, …, or the default (made)
    NaN."""
    order = [c] + [y for pair in pairs for y in pair]
    for x in (reversed(order) if last else order):
        nan = x.nan_bits(out)
        if nan is not None:
            return nan
    return DEFAULT_NAN[out]


def _encode(x: float, out: str) -> int:
    return round_exact(x, out)   # exact values of the format (or ±Inf) encode as themselves


# ---- the rules, one group each: (c bits, operand pairs) -> D bits ------------------------------

def _fma_group(c, pairs, out, flush, last):
    (a, b), = pairs
    acc = c.value
    if out == "fp32":
        acc = fma32(a.value, b.value, acc)
    else:
        acc = _fma64(a.value, b.value, acc)
    return _first_nan(c, pairs, out, last) if math.isnan(acc) else _encode(acc, out)


def _fma64(a, b, c):
    """float64 fma(a, b, c), one RNE rounding, IEEE signed zeros."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a * b + c                      # an Inf or NaN product: IEEE's class
    if not math.isfinite(c):
        return c                              # a finite product (maybe > DBL_MAX) plus Inf/NaN
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact != 0:
        return decode_value(round_exact(exact, "fp64"), "fp64")
    product_negative = (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0)
    both_negative = product_negative and math.copysign(1, c) < 0 and (a == 0 or b == 0)
    return -0.0 if both_negative else 0.0


def _flush(x, flush):
    """CDNA2's flush of a tree node or accumulator: |x| < 2^-126 -> a zero of x's sign."""
    return math.copysign(0.0, x) if flush and abs(x) < 2.0**-126 else x


def _tree(values, flush):
    if len(values) == 1:
        return values[0]
    half = len(values) // 2
    return _flush(add32(_tree(values[:half], flush), _tree(values[half:], flush)), flush)


def _pairwise_group(c, pairs, out, flush, last):
    leaves = [_flush(fma32(a.value, b.value, 0.0), flush) for a, b in pairs]
    acc = _flush(add32(c.value, _tree(leaves, flush)), flush)
    return _first_nan(c, pairs, out, last) if math.isnan(acc) else _encode(acc, "fp32")


def _fused_group(c, pairs, out, flush, last, halves):
    special = _fused_specials(c, pairs, last)
    if special is not None:
        return special
    terms = [(Fraction(a.value) * Fraction(b.value) * Fraction(2) ** (a.scale + b.scale),
              exponent(a.value, a.fmt) + exponent(b.value, b.fmt) + a.scale + b.scale)
             for a, b in pairs]
    if halves:
        (s0, e0), (s1, e1) = _truncated_sum(terms[0::2]), _truncated_sum(terms[1::2])
        e = max(e0, e1)
        s = math.floor(s0 * Fraction(2) ** (e0 - e)) + math.floor(s1 * Fraction(2) ** (e1 - e))
    else:
        s, e = _truncated_sum(terms)
    ec = exponent(c.value, "fp32")
    m = max(e, ec)
    s31 = math.floor(s * Fraction(2) ** (e - m + 7))                  # units of 2^(m-31)
    t24 = math.floor(Fraction(c.value) * Fraction(2) ** (24 - m))     # units of 2^(m-24)
    if halves and ec < m - 25:
        t24 = 0                                                       # C dropped
    total = (s31 + 2**7 * t24) * Fraction(2) ** (m - 31)
    return 0 if total == 0 else round_exact(total, "fp32")


def _truncated_sum(terms):
    """(S, E): E the largest exponent, S = Σ trunc(p·2^(24-E)), an integer."""
    e = max(t[1] for t in terms)
    quantum = Fraction(2) ** (e - 24)
    return sum(math.trunc(p / quantum) for p, _ in terms), e


def _fused_specials(c, pairs, last):
    """D bits when a NaN, an Inf or a product >= 2^128 decides the group; None otherwise."""
    infs, nan = set(), False
    for x in [c] + [y for pair in pairs for y in pair]:
        nan = nan or x.nan_bits("fp32") is not None
    if math.isinf(c.value):
        infs.add(math.copysign(1, c.value))
    big = set()
    for a, b in pairs:
        if math.isinf(a.value) or math.isinf(b.value):
            if a.value == 0 or b.value == 0:
                nan = True
            infs.add(math.copysign(1, a.value) * math.copysign(1, b.value))
    if nan or len(infs) == 2:
        return _first_nan(c, pairs, "fp32", last)
    if infs:
        return _encode(infs.pop() * math.inf, "fp32")
    for a, b in pairs:
        p = Fraction(a.value) * Fraction(b.value) * Fraction(2) ** (a.scale + b.scale)
        if abs(p) >= 2**128:
            big.add(1 if p > 0 else -1)
    if len(big) == 2:
        return _BIG_NAN
    return _encode(big.pop() * math.inf, "fp32") if big else None


_GROUP_RULES = {
    "fma": _fma_group,
    "pairwise": _pairwise_group,
    "fused": lambda *args: _fused_group(*args, halves=False),
    "fused_fp8": lambda *args: _fused_group(*args, halves=True),
}


def mfma_dot_reference(a_bits, b_bits, c_bits, variant: dict, a_format, b_format,
                       scale_a=None, scale_b=None) -> int:
    """One output of a chain of MFMA instructions: bits of D for the rows a, b (length K) and c.

    a_bits, b_bits: K patterns of their formats ("tf32" for xf32: FP32 patterns); c_bits: one
    pattern of the output format ("fp32", or "fp64" for f64 instructions). scale_a, scale_b:
    None, or ceil(K/32) E8M0 patterns (CDNA4 block scales). ``variant``: see the module doc.
    """
    rule, k_inst, group = variant["rule"], variant["k"], variant["group"]
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}; got {rule!r}")
    out, flush = variant.get("out", "fp32"), variant.get("flush", False)
    if variant.get("nan", "first") not in ("first", "last"):
        raise ValueError(f"nan must be 'first' or 'last'; got {variant['nan']!r}")
    last = variant.get("nan") == "last"
    n = len(a_bits)
    padded = -(-n // k_inst) * k_inst
    a_bits, b_bits = list(a_bits) + [0] * (padded - n), list(b_bits) + [0] * (padded - n)
    blocks = -(-padded // _MX_BLOCK)
    if scale_a is not None:
        scale_a = list(scale_a) + [0x7F] * (blocks - len(scale_a))
        scale_b = list(scale_b) + [0x7F] * (blocks - len(scale_b))
    d = c_bits
    for k0 in range(0, padded, k_inst):
        if flush and abs(_value(d, out)) < 2.0**-126:
            d = 0                                              # CDNA2: C flushed to +0
        for g0 in range(k0, k0 + k_inst, group):
            pairs = [(_Operand(a_bits[k], a_format, None if scale_a is None else scale_a[k // 32],
                               flush),
                      _Operand(b_bits[k], b_format, None if scale_b is None else scale_b[k // 32],
                               flush)) for k in range(g0, g0 + group)]
            d = _GROUP_RULES[rule](_Operand(d, out), pairs, out, flush, last)
    return d


def mfma_reference(a_bits, b_bits, c_bits, variant: dict, a_format, b_format,
                   scale_a=None, scale_b=None):
    """D = A·B + C on bit patterns: a_bits (M, K), b_bits (K, N), c_bits (M, N) nested lists of
    ints; scale_a (M, ceil(K/32)) and scale_b (ceil(K/32), N) E8M0 patterns or None. Returns
    (M, N) ints of the output format."""
    m, n = len(c_bits), len(c_bits[0])
    return [[mfma_dot_reference(a_bits[i], [row[j] for row in b_bits], c_bits[i][j], variant,
                                a_format, b_format,
                                None if scale_a is None else scale_a[i],
                                None if scale_b is None else [row[j] for row in scale_b])
             for j in range(n)] for i in range(m)]
