"""Oracles for the MMA models and the GEMM around them (docs/tensor_cores.md), in exact rationals.

Everything here follows the spec's words literally, one output element at a time, on Python
floats (every value of a format up to fp32 is a float64) and :class:`fractions.Fraction`:
decoding and encoding work on bit patterns with the :class:`~mpt.formats.Format` fields (no
ml_dtypes, no numpy arithmetic), products and sums are exact, and each rounding is written out.
IEEE FP32 steps (``fma``, ``+``, ``×``) are :mod:`mpt.reference.optim`'s exact-rational ones.
Never imports ``mpt.kernels``. Slow: meant for small matrices in tests.

A model is described by a plain dict, so that this module does not depend on the presets:
``{"kind": "block", "block": L, "fraction_bits": F, "e_zero": e, "rounding": r}`` with
r in {"rz_fp32", "rz_e8m13", "rne_fp16"}, or ``{"kind": "exact", "rounding": "rne_fp32" |
"rne_fp16"}``, ``{"kind": "ieee_fma"}``, ``{"kind": "ieee_mul_add"}``.
"""
from __future__ import annotations

import math
from fractions import Fraction

from mpt.formats import get_format
from mpt.reference.optim import add32, fma32, mul32

__all__ = [
    "decode_bits", "encode_bits", "round_fraction", "block_dot_reference", "exact_dot_reference",
    "ieee_fma_reference", "ieee_mul_add_reference", "dot_reference", "mma_reference",
    "gemm_reference", "special_result",
]

# output rounding name -> (significant bits, emin, largest finite, nearest?, format of the bits)
_ROUNDINGS = {
    "rz_fp32": (24, -126, (2 - 2**-23) * 2.0**127, False, "fp32"),
    "rz_e8m13": (14, -126, (2 - 2**-13) * 2.0**127, False, "fp32"),
    "rne_fp32": (24, -126, (2 - 2**-23) * 2.0**127, True, "fp32"),
    "rne_fp16": (11, -14, 65504.0, True, "fp16"),
    "rne_bf16": (8, -126, (2 - 2**-7) * 2.0**127, True, "bf16"),
}


def decode_bits(bits: int, fmt) -> float:
    """The value of one bit pattern of a floating-point format (tf32: an fp32 pattern, low 13 bits
    dropped), from the Format fields alone."""
    fmt = get_format(fmt)
    if fmt.name == "tf32":
        return decode_bits(bits & 0xFFFFE000, "fp32")
    m, e = fmt.mantissa_bits, fmt.exponent_bits
    sign = -1.0 if (bits >> (m + e)) & 1 else 1.0
    field = (bits >> m) & ((1 << e) - 1)
    frac = bits & ((1 << m) - 1)
    top = (1 << e) - 1
    if fmt.nan == "ieee" and field == top:
        return sign * math.inf if frac == 0 else math.nan
    if fmt.nan == "fn" and field == top and frac == (1 << m) - 1:
        return math.nan
    if fmt.nan == "fnuz" and sign < 0 and field == 0 and frac == 0:
        return math.nan
    if field == 0:
        return sign * math.ldexp(frac, fmt.emin - m)
    return sign * math.ldexp((1 << m) + frac, field - fmt.bias - m)


def encode_bits(x: float, fmt) -> int:
    """The bit pattern of x (exactly representable, ±Inf or NaN) in fp32/fp16/bf16.

    NaN is the canonical NaN of the Tensor Core models: sign 0, every other bit 1
    (0x7FFFFFFF, 0x7FFF).
    """
    fmt = get_format(fmt)
    m, e = fmt.mantissa_bits, fmt.exponent_bits
    sign = 1 << (m + e)
    if math.isnan(x):
        return sign - 1
    s = sign if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if math.isinf(a):
        return s | (((1 << e) - 1) << m)
    if a == 0:
        return s
    exp = max(math.frexp(a)[1] - 1, fmt.emin)
    q = Fraction(a) / Fraction(2) ** (exp - m)
    assert q.denominator == 1, f"{x!r} is not a {fmt.name} value"
    n = q.numerator
    field = exp + fmt.bias if n >> m else 0
    return s | (field << m) | (n & ((1 << m) - 1))


def _floor_log2(q: Fraction) -> int:
    e = q.numerator.bit_length() - q.denominator.bit_length()
    return e if Fraction(2) ** e <= q else e - 1


def round_fraction(q: Fraction, rounding: str) -> float:
    """Round an exact non-zero rational to one of the output formats (RZ or RNE, subnormals on
    the format's grid, overflow past the largest finite value to ±Inf; a result of zero keeps
    the sign of q)."""
    precision, emin, largest, nearest, _ = _ROUNDINGS[rounding]
    a = abs(q)
    grid = Fraction(2) ** (max(_floor_log2(a), emin) - precision + 1)
    n, rem = divmod(a, grid)
    if nearest and (rem > grid / 2 or (rem == grid / 2 and n % 2 == 1)):
        n += 1
    r = n * grid
    value = math.inf if r > Fraction(largest) else float(r)
    return math.copysign(value, q)


def _nominal(x: float, emin: int) -> int:
    """The spec's nominal exponent max(floor(log2|x|), emin) of a finite non-zero value."""
    return max(math.frexp(x)[1] - 1, emin)


def special_result(pairs, c):
    """NaN / ±Inf result of a block or dot product of ``pairs`` (x, y) plus ``c`` if any, else
    None: NaN on a NaN input, Inf·0 or Inf of both signs; else the Inf's sign."""
    infs = set()
    for x, y in list(pairs) + [(c, 1.0)]:
        if math.isnan(x) or math.isnan(y):
            return math.nan
        if math.isinf(x) or math.isinf(y):
            if x == 0 or y == 0:
                return math.nan
            infs.add(math.copysign(1.0, x) * math.copysign(1.0, y))
    if len(infs) == 2:
        return math.nan
    return infs.pop() * math.inf if infs else None


def _block(a, b, c, a_emin, b_emin, fraction_bits, e_zero, rounding):
    """One block of the truncated fused dot-product-add, literally as specs §1 steps 2-9."""
    special = special_result(zip(a, b), c)
    if special is not None:
        return special
    terms = [(Fraction(x) * Fraction(y), _nominal(x, a_emin) + _nominal(y, b_emin))
             for x, y in zip(a, b) if x != 0 and y != 0]    # exact, unnormalised products
    if c != 0:
        terms.append((Fraction(c), _nominal(c, _ROUNDINGS[rounding][1])))
    has_zero = len(terms) < len(a) + 1                        # a zero product or a zero c
    anchor = max([e for _, e in terms] + ([e_zero] if has_zero else []))
    quantum = Fraction(2) ** (anchor - fraction_bits)         # smallest bit kept: 2^(E-F)
    total = sum((math.trunc(t / quantum) for t, _ in terms), 0) * quantum  # toward zero, exact sum
    return 0.0 if total == 0 else round_fraction(total, rounding)


def block_dot_reference(a, b, c, *, a_format, b_format, block, fraction_bits, e_zero, rounding):
    """The block model for one output: blocks of ``block`` products in increasing k, each result
    rounded to the output and fed back as the next block's c. a, b: sequences of floats (values of
    their formats), c: a value of the output format."""
    a_emin, b_emin = get_format(a_format).emin, get_format(b_format).emin
    for k0 in range(0, len(a), block):
        c = _block(a[k0:k0 + block], b[k0:k0 + block], c, a_emin, b_emin,
                   fraction_bits, e_zero, rounding)
    return c


def exact_dot_reference(a, b, c, *, rounding):
    """c + Σ a_k·b_k computed exactly and rounded once (RNE); specials as the block model,
    an exact zero is +0."""
    special = special_result(zip(a, b), c)
    if special is not None:
        return special
    total = Fraction(c) + sum((Fraction(x) * Fraction(y) for x, y in zip(a, b)), Fraction(0))
    return 0.0 if total == 0 else round_fraction(total, rounding)


def ieee_fma_reference(a, b, c):
    """acc = c; acc = fma(a_k, b_k, acc) for increasing k (IEEE binary32, RNE)."""
    for x, y in zip(a, b):
        c = fma32(x, y, c)
    return c


def ieee_mul_add_reference(a, b, c):
    """acc = c; acc = acc + a_k·b_k with the product and the sum each rounded (binary32, RNE)."""
    for x, y in zip(a, b):
        c = add32(c, mul32(x, y))
    return c


def dot_reference(a, b, c, model: dict, a_format="fp32", b_format="fp32"):
    """One output of the MMA model ``model`` (see the module docstring) on float values."""
    kind = model["kind"]
    if kind == "block":
        return block_dot_reference(a, b, c, a_format=a_format, b_format=b_format,
                                   block=model["block"], fraction_bits=model["fraction_bits"],
                                   e_zero=model["e_zero"], rounding=model["rounding"])
    if kind == "exact":
        return exact_dot_reference(a, b, c, rounding=model["rounding"])
    if kind == "ieee_fma":
        return ieee_fma_reference(a, b, c)
    if kind == "ieee_mul_add":
        return ieee_mul_add_reference(a, b, c)
    raise ValueError(f"unknown model kind {kind!r}")


def _out_format(model):
    return _ROUNDINGS[model.get("rounding", "rne_fp32")][4]


def mma_reference(a_bits, b_bits, c_bits, model: dict, a_format, b_format):
    """D = A·B + C on bit patterns: a_bits (M, K), b_bits (K, N), c_bits (M, N) nested lists of
    ints (c in the model's output format: fp16 for "rne_fp16", else fp32). Returns (M, N) ints."""
    out = _out_format(model)
    a = [[decode_bits(x, a_format) for x in row] for row in a_bits]
    b = [[decode_bits(x, b_format) for x in row] for row in b_bits]
    return [[encode_bits(dot_reference(a[i], [row[j] for row in b], decode_bits(c_bits[i][j], out),
                                       model, a_format, b_format), out)
             for j in range(len(c_bits[0]))] for i in range(len(c_bits))]


def gemm_reference(a, b, c, model: dict, *, a_format="fp32", b_format="fp32", split_k=1,
                   unit=1, promote_every=None, scale_a=None, scale_b=None, out_format="fp32"):
    """The GEMM of ``mpt.gemm`` for one element at a time, on float values.

    a: (M, K), b: (K, N) nested lists of floats; c: (M, N) list or None. ``unit`` is the model's
    block (split-K chunks are multiples of it, or of promote_every when given). Scales: None, a
    float (per tensor), or nested lists (M, K/G) and (K/G, N/G) with G = promote_every (per block).
    Returns (M, N) floats (values of out_format; NaN for NaN).
    """
    m, k, n = len(a), len(b), len(c[0]) if c is not None else len(b[0])
    if k == 0:
        promote_every = None                                  # no products, nothing to promote
    unit = promote_every or unit
    per_chunk = -(-k // split_k)                              # ceil(K / split_k) ...
    step = max(unit, -(-per_chunk // unit) * unit)            # ... rounded up to a multiple of unit
    chunks = [(k0, min(k0 + step, k)) for k0 in range(0, k, step)] or [(0, 0)]
    blockwise = isinstance(scale_a, list) or isinstance(scale_b, list)
    per_tensor = (scale_a is not None or scale_b is not None) and not blockwise

    def scale_of(s, i, g, j_block, is_a):
        if s is None:
            return 1.0
        if not isinstance(s, list):
            return s
        return s[i][g] if is_a else s[g][j_block]

    def element(i, j):
        row, col = a[i], [b[kk][j] for kk in range(k)]
        cij = None if c is None else c[i][j]

        def chain(init, k0, k1):
            return dot_reference(row[k0:k1], col[k0:k1], init, model, a_format, b_format)
        d = None
        for s, (k0, k1) in enumerate(chunks):
            own_c = s == 0 and cij is not None and not per_tensor
            if promote_every is None:
                acc = chain(cij if own_c else 0.0, k0, k1)
            else:
                acc = cij if own_c else -0.0                        # the FP32 promotion register
                for g0 in range(k0, k1, promote_every):
                    part = chain(0.0, g0, min(g0 + promote_every, k1))
                    g = g0 // promote_every
                    scale = 1.0
                    if blockwise:
                        scale = mul32(scale_of(scale_a, i, g, 0, True),
                                      scale_of(scale_b, i, g, j // promote_every, False))
                    acc = fma32(scale, part, acc)
            d = acc if d is None else add32(d, acc)
        if per_tensor:
            alpha = mul32(1.0 if scale_a is None else scale_a, 1.0 if scale_b is None else scale_b)
            d = fma32(alpha, d, -0.0 if cij is None else cij)
        if out_format in ("fp16", "bf16") and math.isfinite(d) and d != 0:
            d = round_fraction(Fraction(d), "rne_" + out_format)
        return d

    return [[element(i, j) for j in range(n)] for i in range(m)]
