"""Oracle of XLA's f32-dot pass algorithms (the TPU model of ``mpt.engines.tpu``), element by
element, on Python floats and exact rationals.

Written from XLA's source text, not from the implementation: every split, every pass and every
sum is spelled out in the source's order below. Values travel as Python floats (every f32 is a
float64); each f32 operation is rounded once by :mod:`mpt.reference.optim` (exact rationals,
IEEE specials), each conversion by :mod:`mpt.reference.rounding` (from the format's
definition), and bit masks work on the IEEE pattern from :mod:`struct`. The inner pass of every
dot is fixed: acc = c; acc = fma32(x_k, y_k, acc) for increasing k. Slow; small matrices only.

Algorithms, by JAX DotAlgorithmPreset name, for decomposition "xla" (XLA's HLO rewriter) and
"triton" (XLA's Triton lowering, K-tiles of ``block_k``); conversion rules "tpu" (RNE, then a
subnormal result flushed to zero), "tpu_daz" (subnormal input flushed first), "ieee" (RNE only).
"""
from __future__ import annotations

import math
import struct

from mpt.reference.mma import ieee_fma_reference
from mpt.reference.optim import add32, sub32
from mpt.reference.rounding import decode_value, round_exact

__all__ = ["truncate_bits", "bf16_convert", "tf32_round_away", "tpu_gemm_reference"]


def truncate_bits(x, mask: int) -> float:
    """XLA's Truncate: the f32 whose bit pattern is x's ANDed with mask. x: an f32 value, or an
    int (the pattern itself: an input, whose NaN payload matters — 0x7F800001 truncates to Inf).
    Computed values are floats: their NaNs are quiet, and stay NaN."""
    bits = x if isinstance(x, int) else struct.unpack("<I", struct.pack("<f", x))[0]
    return struct.unpack("<f", struct.pack("<I", bits & mask))[0]


def _value(bits: int) -> float:
    return decode_value(bits, "fp32")


def bf16_convert(x: float, rule: str) -> float:
    """x (an f32 value) converted to bf16 under ``rule`` ("tpu", "tpu_daz" or "ieee")."""
    if rule == "tpu_daz" and x != 0 and abs(x) < 2.0**-126:
        x = math.copysign(0.0, x)
    return decode_value(round_exact(x, "bf16", subnormals=rule == "ieee"), "bf16")


def tf32_round_away(x: float) -> float:
    """PTX cvt.rna.tf32.f32: x rounded to tf32, ties away from zero."""
    return decode_value(round_exact(x, "tf32", "nearest_away"), "tf32")


def _tf32_operand(x) -> float:
    """What a tf32 dot reads of an f32 operand (a value, or an input's bit pattern): its top
    19 bits."""
    return truncate_bits(x, 0xFFFFE000)


def _dot(x, y, c):
    """One inner pass: the exact sequential FMA chain from c."""
    return ieee_fma_reference(x, y, c)


# ---- splits: one operand element at a time -------------------------------------------------------

def _split_xla_bf16(bits, parts, rule):
    """Split2xToBF16 / Split3xToBF16: truncations and f32 subtractions, then RoundToBF16 each."""
    hi = truncate_bits(bits, 0xFFFF0000)
    rest = sub32(_value(bits), hi)
    if parts == 2:
        return [bf16_convert(hi, rule), bf16_convert(rest, rule)]
    mid = truncate_bits(rest, 0xFFFF0000)
    low = sub32(rest, mid)
    return [bf16_convert(hi, rule), bf16_convert(mid, rule), bf16_convert(low, rule)]


def _split_triton_bf16(bits, parts, rule):
    """SplitF32: piece = bf16(rest) (RNE), rest = rest - piece, ``parts`` times."""
    x, pieces = _value(bits), []
    for i in range(parts):
        p = bf16_convert(x, rule)
        pieces.append(p)
        if i < parts - 1:
            x = sub32(x, p)
    return pieces


def _split_tf32(bits, decomposition):
    """TF32 X3: hi (xla: truncated to tf32; triton: cvt.rna) and lo = x - hi, read as tf32."""
    x = _value(bits)
    hi = truncate_bits(bits, 0xFFFFE000) if decomposition == "xla" else tf32_round_away(x)
    return [hi, _tf32_operand(sub32(x, hi))]


# ---- the algorithms on one output element --------------------------------------------------------

def _xla_element(A, B, name):
    """A[p], B[p]: the pieces of row a_i and column b_j (lists over k); the rewriter's sum."""
    h, m, l2, l3 = 0, 1, 1, 2

    def d(i, j):
        return _dot(A[i], B[j], 0.0)

    if name in ("BF16_BF16_F32_X3", "TF32_TF32_F32_X3"):   # RewriteF32ToBF16X3 / TF32X3
        low = add32(d(l2, h), d(h, l2))
    elif name == "BF16_BF16_F32_X6":                         # RewriteF32ToBF16X6
        low = add32(add32(add32(add32(d(m, m), d(h, l3)), d(l3, h)), d(h, m)), d(m, h))
    elif name == "BF16_BF16_F32_X9":                         # RewriteF32ToBF16X9
        low = d(l3, l3)
        for i, j in ((l3, m), (m, l3), (m, m), (h, l3), (l3, h), (h, m), (m, h)):
            low = add32(low, d(i, j))
    else:                                                    # one dot
        return d(0, 0)
    low = 0.0 if math.isnan(low) else low                    # ReplaceNaNWithZeros (kGe)
    return add32(low, d(h, h))


def _triton_element(A, B, name, c, block_k):
    """XLA's Triton GEMM on one element: K-tiles, each a chain of dots, into the accumulator."""
    h, m, l2, l3 = 0, 1, 1, 2
    k = len(A[0])
    acc = 0.0 if c is None else c
    for k0 in range(0, max(k, 1), block_k):
        def d(i, j, init):
            return _dot(A[i][k0:k0 + block_k], B[j][k0:k0 + block_k], init)

        if name in ("BF16_BF16_F32", "TF32_TF32_F32", "F32_F32_F32"):   # EmitRegularDot
            acc = d(0, 0, acc)
            continue
        if name == "BF16_BF16_F32_X3":                       # EmitBF16x3Matmul
            chain = [(l2, h), (h, l2)]
        elif name == "BF16_BF16_F32_X6":                     # EmitBF16x6Matmul
            chain = [(m, m), (l3, h), (h, l3), (m, h), (h, m)]
        elif name == "BF16_BF16_F32_X9":                     # EmitBF16x9Matmul
            chain = [(l3, l3), (m, l3), (l3, m), (m, m), (l3, h), (h, l3), (m, h), (h, m)]
        else:                                                # TF32x3 (Triton's F32DotTC)
            chain = [(l2, h), (h, l2)]
        r = 0.0
        for i, j in chain:
            r = d(i, j, r)
        if name != "TF32_TF32_F32_X3":
            r = r if math.isfinite(r) else 0.0               # ZeroNaNs (OGT): NaN and Inf
        r = d(h, h, r)
        acc = add32(acc, r)
    return acc


_PIECES = {"BF16_BF16_F32": ("bf16", 1), "BF16_BF16_F32_X3": ("bf16", 2),
           "BF16_BF16_F32_X6": ("bf16", 3), "BF16_BF16_F32_X9": ("bf16", 3),
           "TF32_TF32_F32": ("tf32", 1), "TF32_TF32_F32_X3": ("tf32", 2),
           "F32_F32_F32": ("fp32", 1)}


def _split(bits, name, decomposition, rule):
    """The pieces of one operand element given by its f32 bit pattern."""
    kind, parts = _PIECES[name]
    if kind == "fp32":
        return [_value(bits)]
    if kind == "tf32":
        return [_tf32_operand(bits)] if parts == 1 else _split_tf32(bits, decomposition)
    if parts == 1:
        return [bf16_convert(_value(bits), rule)]
    split = _split_xla_bf16 if decomposition == "xla" else _split_triton_bf16
    return split(bits, parts, rule)


def tpu_gemm_reference(a, b, c=None, *, algorithm, decomposition, conversion="tpu",
                       block_k=32):
    """D = A·B (+ C) by the named algorithm and decomposition, one element at a time.

    a: (M, K), b: (K, N) nested lists of f32 BIT PATTERNS (ints: an input NaN's payload decides
    what XLA's truncation makes of it); c: (M, N) nested lists of f32 values or None (xla: one
    f32 add after the dot; triton: the accumulator's start). Returns (M, N) floats (NaN for NaN).
    """
    m, k, n = len(a), len(b), len(b[0]) if b else 0
    sa = [[_split(x, algorithm, decomposition, conversion) for x in row] for row in a]
    sb = [[_split(x, algorithm, decomposition, conversion) for x in row] for row in b]
    parts = len(sa[0][0]) if m and k else _PIECES[algorithm][1]
    out = []
    for i in range(m):
        A = [[sa[i][kk][p] for kk in range(k)] for p in range(parts)]
        row = []
        for j in range(n):
            B = [[sb[kk][j][p] for kk in range(k)] for p in range(parts)]
            cij = None if c is None else c[i][j]
            if decomposition == "xla":
                d = _xla_element(A, B, algorithm)
                d = d if cij is None else add32(d, cij)
            else:
                d = _triton_element(A, B, algorithm, cij, block_k)
            row.append(d)
        out.append(row)
    return out
