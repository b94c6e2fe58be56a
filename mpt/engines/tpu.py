"""Google TPU matmuls: XLA's bf16 pass algorithms around an assumed inner pass (the MXU).

A TPU multiplies bf16 and accumulates in IEEE FP32 (documented). An f32 dot is computed with one
or several bf16 passes chosen by JAX's ``DotAlgorithmPreset`` (``precision=``): DEFAULT is 1
pass, HIGH 3 and HIGHEST 6 on a TPU (JAX's ``jax.lax.Precision`` docs). The TPU compiler is
closed, so the pass algorithms here are XLA's open-source ones, read from openxla/xla:

* ``decomposition="xla"`` — the HLO rewriter, ``xla/backends/gpu/transforms/
  dot_algorithm_rewriter.cc`` (``RewriteF32ToBF16``, ``RewriteF32ToBF16X3``/``X6``/``X9``,
  ``RewriteF32ToTF32X3``; it was ``xla/service/gpu/transforms/`` before, with X3 and X6 only).
  Splits by truncation: ``hi = x`` with its low 16 bits zeroed (``Truncate``, mask 0xFFFF0000),
  ``r = x − hi`` in f32; X3 ``lo = bf16(r)``; X6/X9 ``mid = trunc(r)``, ``lo = bf16(r − mid)``
  (``Split2xToBF16``, ``Split3xToBF16``). Every pass is a separate full-K dot with an f32
  result; the passes are summed with f32 adds, then ``ReplaceNaNWithZeros`` (``select(inf >=
  |s|, s, 0)``: NaN -> +0, **Inf kept**), then ``+ dot(hi, hi)``.
* ``decomposition="triton"`` — XLA's Triton GEMM lowering, ``xla/backends/gpu/codegen/triton/
  transforms/stablehlo_lower_to_triton.cc`` (``EmitBF16x3Matmul``/``x6``/``x9``, ``SplitF32``,
  ``ZeroNaNs``, ``EmitRegularDot``). Every piece is RNE (``p_i = bf16(x_i)``, ``x_{i+1} = x_i −
  p_i``); K is walked in tiles of ``block_k``; per tile the passes are chained through ONE
  accumulator that starts at +0 (each dot's C is the previous dot's D), then ``ZeroNaNs``
  (``select(inf > |s|, s, 0)``: NaN **and ±Inf** -> +0), then the hi·hi dot, and the tile result
  is added to the outer accumulator with one f32 add. Single-pass algorithms chain the outer
  accumulator through the dot itself (``tt.dot(a, b, acc)``). The default ``block_k`` is 32:
  ``kDefaultGemmTiling = {32, 32, 32, 1, 1, 4}`` ("default tiling when autotuning is disabled",
  ``xla/service/gpu/autotuning/gemm_fusion_autotuner.cc``); autotuned configs use 16..512.

Pass lists, as (lhs piece, rhs piece) in the order the source sums or chains them (h = hi,
m = mid, l = lo):

=================  ==========================================  ===================================
algorithm          xla (summed, then NaN->0, then + hh)         triton (chained, then ZeroNaNs, hh)
=================  ==========================================  ===================================
BF16_BF16_F32      one dot of bf16(a), bf16(b)                  one dot per tile into the acc
BF16_BF16_F32_X3   lh, hl                                       lh, hl
BF16_BF16_F32_X6   mm, hl, lh, hm, mh                           mm, lh, hl, mh, hm
BF16_BF16_F32_X9   ll, lm, ml, mm, hl, lh, hm, mh               ll, ml, lm, mm, lh, hl, mh, hm
TF32_TF32_F32      one dot of tf32 operands                     one dot per tile into the acc
TF32_TF32_F32_X3   lh, hl (hi = trunc13(x), lo = x − hi)        Triton's F32DotTC: big = RNA_tf32,
                                                                small·big, big·small, big·big from
                                                                +0, no NaN step, + acc
F32_F32_F32        one f32 dot                                  one dot per tile into the acc
=================  ==========================================  ===================================

The TF32 rows are GPU algorithms (a TPU has no TF32): a tf32 dot reads the top 19 bits of each
f32 operand (``in_format="tf32"``: low 13 bits dropped), and the Triton TF32x3 split rounds
with PTX's ``cvt.rna.tf32.f32`` (``lib/Dialect/TritonGPU/Transforms/F32DotTC.cpp`` in
triton-lang/triton). ``conversion`` does not apply to them.

Evidence and parameters (every assumed rule is a parameter):

* pass algorithms — **reference model of XLA's source**; whether the closed TPU compiler splits
  and orders the passes the same way is an **assumption**: parameter ``decomposition``
  ("xla" | "triton").
* inner pass — **assumption** (the MXU's order and internal rounding are undocumented):
  parameter ``inner``, the name of any mpt MMA model, run by :func:`mpt.gemm` on the pieces;
  default ``"ieee_fma"`` (sequential IEEE FP32 FMA in increasing k, from the pass's C).
* f32 -> bf16 conversion — **documented** (cloud.google.com/tpu/docs/bfloat16, "Format
  conversion details": round to nearest even, overflow to Inf, subnormals flushed to zero, NaN
  and Inf preserved): :func:`tpu_to_bf16`. Whether the flush applies to the f32 input (DAZ) or to
  the rounded result (which only differs for inputs in (2^-126 − 2^-134, 2^-126), rounding up to
  2^-126) is an **assumption**: parameter ``conversion`` = "tpu" (flush the result, default),
  "tpu_daz" (flush the input), or "ieee" (no flush: XLA's convert on GPU/CPU). It applies to
  every f32 -> bf16 convert of the algorithm: the operand casts of BF16_BF16_F32, every
  ``RoundToBF16`` of the rewriter (hi and mid are exact there, but flush when subnormal; lo
  rounds), every ``TruncFOp`` of the Triton split.
* f32 elementwise steps (subtract, add, select) are IEEE binary32 (RNE, subnormals kept), as
  XLA's HLO defines them. A TPU vector unit's f32 subnormal handling is not documented and is
  not modelled.

Results are float32 with the canonical NaN (0x7FFFFFFF). Oracle: ``mpt.reference.tpu`` (the
algorithms spelled out on exact rationals, inner pass fixed to a sequential exact FMA). JAX on a
CPU ignores these algorithms, so it is no oracle.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpt import rounding as _rounding
from mpt.formats import get_format
from mpt.mma import _canonical_nan, _ieee_values, gemm

__all__ = ["ALGORITHMS", "PRECISIONS", "DECOMPOSITIONS", "CONVERSIONS", "TRITON_BLOCK_K",
           "tpu_to_bf16", "tpu_gemm"]

#: f32 -> bf16 conversion rules (see the module docstring).
CONVERSIONS = ("tpu", "tpu_daz", "ieee")
#: The two named pass decompositions of XLA's source.
DECOMPOSITIONS = ("xla", "triton")
#: XLA's default Triton GEMM K-tile (kDefaultGemmTiling, used when autotuning is disabled).
TRITON_BLOCK_K = 32
#: JAX's Precision levels on a TPU -> the algorithm with that many bf16 passes (1, 3, 6).
PRECISIONS = {"default": "BF16_BF16_F32", "high": "BF16_BF16_F32_X3",
              "highest": "BF16_BF16_F32_X6"}

_SMALLEST_NORMAL = np.float32(2.0**-126)


@dataclass(frozen=True)
class _Algorithm:
    """One DotAlgorithmPreset: ``piece`` is the pieces' format ("bf16", "tf32" or "fp32"),
    ``parts`` how many pieces each operand is split into; ``xla`` and ``triton`` the passes
    before the NaN step as (lhs piece, rhs piece) indices (0 = hi, 1 = mid or lo, 2 = lo) in the
    source's order (empty for a single pass)."""

    piece: str
    parts: int
    xla: tuple[tuple[int, int], ...] = ()
    triton: tuple[tuple[int, int], ...] = ()


_H, _M, _L3, _L2 = 0, 1, 2, 1   # piece indices: hi, mid (3 parts), lo of 3 parts, lo of 2 parts
#: Every algorithm by its JAX DotAlgorithmPreset name.
ALGORITHMS = {
    "BF16_BF16_F32": _Algorithm("bf16", 1),
    "BF16_BF16_F32_X3": _Algorithm("bf16", 2, xla=((_L2, _H), (_H, _L2)),
                                   triton=((_L2, _H), (_H, _L2))),
    "BF16_BF16_F32_X6": _Algorithm(
        "bf16", 3, xla=((_M, _M), (_H, _L3), (_L3, _H), (_H, _M), (_M, _H)),
        triton=((_M, _M), (_L3, _H), (_H, _L3), (_M, _H), (_H, _M))),
    "BF16_BF16_F32_X9": _Algorithm(
        "bf16", 3,
        xla=((_L3, _L3), (_L3, _M), (_M, _L3), (_M, _M), (_H, _L3), (_L3, _H), (_H, _M), (_M, _H)),
        triton=((_L3, _L3), (_M, _L3), (_L3, _M), (_M, _M), (_L3, _H), (_H, _L3), (_M, _H),
                (_H, _M))),
    "TF32_TF32_F32": _Algorithm("tf32", 1),
    "TF32_TF32_F32_X3": _Algorithm("tf32", 2, xla=((_L2, _H), (_H, _L2)),
                                   triton=((_L2, _H), (_H, _L2))),
    "F32_F32_F32": _Algorithm("fp32", 1),
}


# ---- conversions and splits ---------------------------------------------------------------------

def tpu_to_bf16(x, *, flush="result"):
    """f32 -> bf16 as a TPU converts: round to nearest even, overflow to ±Inf, NaN and Inf kept,
    subnormals flushed to zero (sign kept). Documented: cloud.google.com/tpu/docs/bfloat16.

    ``flush`` (assumption, the docs do not say which side): "result" rounds first and flushes a
    subnormal result (``mpt.round(x, "bf16", subnormals=False)``); "input" flushes subnormal
    inputs first (DAZ), so inputs just below 2^-126 give 0 instead of rounding up to 2^-126.
    x: float32 array or scalar. Returns bfloat16.
    """
    if flush not in ("result", "input"):
        raise ValueError(f"flush must be 'result' or 'input'; got {flush!r}")
    x = np.asarray(x, dtype=np.float32)
    if flush == "input":
        x = np.where(np.abs(x) < _SMALLEST_NORMAL, np.copysign(np.float32(0), x), x)
    return _rounding.round(x, "bf16", subnormals=False)


def _to_bf16(x, conversion):
    """One f32 -> bf16 convert of the algorithm under the ``conversion`` rule."""
    if conversion == "ieee":
        return _rounding.round(x, "bf16")
    return tpu_to_bf16(x, flush="input" if conversion == "tpu_daz" else "result")


def _truncate(x, mask):
    """XLA's ``Truncate``: the f32 bit pattern ANDed with ``mask`` (low bits zeroed)."""
    return (np.ascontiguousarray(x, np.float32).view(np.uint32) & np.uint32(mask)).view(np.float32)


def _pieces(x, alg, decomposition, conversion):
    """The pieces (hi, [mid,] lo) of an f32 operand, as arrays the inner pass takes: bfloat16,
    or float32 read as tf32/fp32 (see ``_dot``)."""
    if alg.piece == "fp32" or (alg.piece == "tf32" and alg.parts == 1):
        return [x]                       # F32; TF32: the tf32 dot drops the low 13 bits itself
    if alg.piece == "tf32":              # X3: the low piece stays f32, truncated by its tf32 dot
        big = _truncate(x, 0xFFFFE000) if decomposition == "xla" \
            else _rounding.round(x, "tf32", "nearest_away")        # cvt.rna.tf32.f32
        return [big, x - big]
    if alg.parts == 1:
        return [_to_bf16(x, conversion)]
    if decomposition == "triton":        # SplitF32: every piece RNE, the rest in f32
        pieces, rest = [], x
        for i in range(alg.parts):
            p = _to_bf16(rest, conversion)
            pieces.append(p)
            if i < alg.parts - 1:
                rest = rest - p.astype(np.float32)
        return pieces
    hi = _truncate(x, 0xFFFF0000)        # Split2xToBF16 / Split3xToBF16
    rest = x - hi
    parts = [hi]
    if alg.parts == 3:
        mid = _truncate(rest, 0xFFFF0000)
        parts.append(mid)
        rest = rest - mid
    parts.append(rest)
    return [_to_bf16(p, conversion) for p in parts]


# ---- the passes ---------------------------------------------------------------------------------

def _dot(x, y, c, inner, piece):
    """One inner pass D = X·Y + C by :func:`mpt.gemm` with the model ``inner`` (C None: +0)."""
    in_format = None if piece == "bf16" else piece
    return gemm(x, y, c, model=inner, in_format=in_format)


def _zero_nan(s):
    """The rewriter's ReplaceNaNWithZeros: select(inf >= |s|, s, +0): NaN -> +0, Inf kept."""
    return np.where(np.isnan(s), np.float32(0), s)


def _zero_nonfinite(s):
    """Triton's ZeroNaNs: select(inf > |s|, s, +0): NaN and ±Inf -> +0."""
    return np.where(np.isfinite(s), s, np.float32(0))


def _xla(pa, pb, alg, inner):
    """The HLO rewriter: full-K passes summed in the source's order, NaN -> 0, + hi·hi."""
    if not alg.xla:
        return _dot(pa[0], pb[0], None, inner, alg.piece)
    low = None
    for i, j in alg.xla:
        d = _dot(pa[i], pb[j], None, inner, alg.piece)
        low = d if low is None else low + d                        # f32 add (RNE)
    return _zero_nan(low) + _dot(pa[_H], pb[_H], None, inner, alg.piece)


def _tile(pa, pb, k0, k1):
    return [p[..., k0:k1] for p in pa], [p[..., k0:k1, :] for p in pb]


def _triton(pa, pb, alg, inner, c, block_k, k):
    """XLA's Triton GEMM: per K-tile, the passes chained through one accumulator, then added to
    the outer accumulator (which starts at c or +0)."""
    acc = c
    for k0 in range(0, max(k, 1), block_k):
        ta, tb = _tile(pa, pb, k0, min(k0 + block_k, k))
        if not alg.triton:                                          # tt.dot(a, b, acc)
            acc = _dot(ta[0], tb[0], acc, inner, alg.piece)
            continue
        r = None                                                    # ZerosLike(acc)
        for i, j in alg.triton:
            r = _dot(ta[i], tb[j], r, inner, alg.piece)
        if alg.piece == "bf16":                                     # no NaN step in F32DotTC
            r = _zero_nonfinite(r)
        r = _dot(ta[_H], tb[_H], r, inner, alg.piece)
        acc = (np.float32(0) if acc is None else acc) + r           # f32 add (RNE), from +0
    return acc


# ---- the public function ------------------------------------------------------------------------

def _algorithm(algorithm, precision):
    """The algorithm name from ``algorithm`` or ``precision`` (at most one of them)."""
    if precision is not None:
        if algorithm is not None:
            raise ValueError("give algorithm or precision, not both: precision "
                             f"{precision!r} names algorithm {PRECISIONS.get(precision)}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}; "
                             f"got {precision!r}")
        return PRECISIONS[precision]
    algorithm = "BF16_BF16_F32" if algorithm is None else algorithm
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}")
    return algorithm


def _operand(x, arg):
    """An f32 operand: float32 as is; bfloat16 or a narrower float format decoded exactly."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return x
    try:
        fmt = get_format(x.dtype)
    except (TypeError, ValueError):
        fmt = None
    if fmt is None or fmt.kind != "float" or fmt.name == "fp64":
        raise TypeError(f"{arg} must be float32 (or a narrower float format such as bfloat16, "
                        f"decoded exactly); got dtype {x.dtype}")
    return _rounding.decode(x)


@_ieee_values
def tpu_gemm(a, b, c=None, *, algorithm=None, precision=None, decomposition="xla",
             inner="ieee_fma", conversion="tpu", block_k=None):
    """D = A·B (+ C) of f32 operands as a TPU runs an f32 dot with a DotAlgorithmPreset.

    a: (..., M, K), b: (..., K, N) float32 (bfloat16 and narrower formats are decoded exactly),
    batch dimensions broadcast; c: (..., M, N) float32 or None. ``algorithm``: a JAX
    ``DotAlgorithmPreset`` name (:data:`ALGORITHMS`; default "BF16_BF16_F32"), or ``precision``
    = "default" / "high" / "highest" (1, 3, 6 bf16 passes: :data:`PRECISIONS`), not both.
    ``decomposition``: "xla" (HLO rewriter) or "triton" (XLA's Triton lowering, K-tiles of
    ``block_k``, default :data:`TRITON_BLOCK_K`). ``inner``: the MMA model of each pass
    (assumption; default "ieee_fma"). ``conversion``: the f32 -> bf16 rule ("tpu", "tpu_daz",
    "ieee"). The module docstring gives every step and its source.

    c: with "xla" it is added after the dot with one f32 add (an HLO add); with "triton" it is
    the outer accumulator's initial value. Returns float32 (..., M, N), canonical NaN.
    Oracle: ``mpt.reference.tpu.tpu_gemm_reference``.
    """
    name = _algorithm(algorithm, precision)
    alg = ALGORITHMS[name]
    if decomposition not in DECOMPOSITIONS:
        raise ValueError(f"decomposition must be 'xla' or 'triton'; got {decomposition!r}")
    if conversion not in CONVERSIONS:
        raise ValueError(f"conversion must be one of {', '.join(map(repr, CONVERSIONS))}; "
                         f"got {conversion!r}")
    if decomposition == "xla" and block_k is not None:
        raise ValueError("block_k is the Triton lowering's K-tile; decomposition='xla' runs "
                         "every pass over the whole K")
    block_k = TRITON_BLOCK_K if block_k is None else block_k
    if not isinstance(block_k, (int, np.integer)) or isinstance(block_k, bool) or block_k < 1:
        raise ValueError(f"block_k must be a positive int; got {block_k!r}")
    a, b = _operand(a, "a"), _operand(b, "b")
    for arg, x in (("a", a), ("b", b)):
        if x.ndim < 2:
            raise ValueError(f"{arg} must have shape (..., M, K) / (..., K, N); got {x.shape}")
    if c is not None:
        c = np.asarray(c)
        if c.dtype != np.float32:
            raise TypeError(f"c must be float32; got {c.dtype}")
    pa = _pieces(a, alg, decomposition, conversion)
    pb = _pieces(b, alg, decomposition, conversion)
    if decomposition == "xla":
        d = _xla(pa, pb, alg, inner)
        if c is not None:
            d = d + c                                               # f32 add (RNE)
    else:
        d = _triton(pa, pb, alg, inner, c, block_k, a.shape[-1])
    return _canonical_nan(np.ascontiguousarray(d, dtype=np.float32))
