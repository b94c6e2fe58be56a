"""L1: Google TPU matmuls — the MMA model ``tpu``: an assumed inner pass (the MXU), and XLA's
bf16 pass algorithms of an f32 dot around it.

**mma and gemm.** The MXU multiplies bf16 and accumulates in FP32; how it orders and rounds the
accumulation is undocumented, so one MXU pass is an assumed inner MMA model (``inner``).
``mpt.mma(a, b, c, model="tpu")`` takes bf16 operands and runs that pass — the instruction.
An f32 dot is no instruction: XLA compiles it into several bf16 passes and f32 adds, which is
software, so only ``mpt.gemm(a, b, c, model="tpu", algorithm=..., precision=...)`` takes fp32
operands (``mpt.mma`` refuses them). Its options: ``algorithm`` / ``precision``,
``decomposition``, ``inner``, ``conversion``, ``block_k`` (see :class:`TpuOperands`); gemm's
own ``split_k`` then splits K into separate f32 dots whose results are added in f32.

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

* pass algorithms — **reference model of XLA's source** (the fp32 configuration); whether the
  closed TPU compiler splits and orders the passes the same way is an **assumption**:
  ``decomposition`` ("xla" | "triton"), an :class:`~mpt.engines.model.Assumption` of the model
  (``MODEL.configure(decomposition="triton")``) and a per-call option.
* inner pass — **assumption** (the MXU's order and internal rounding are undocumented; the bf16
  configuration): ``inner``, the name of any mpt MMA model (the assumption lists the bf16
  models registered before the TPU's; the per-call option takes any model), run on the pieces
  through its operand class; default ``"ieee_fma"`` (sequential IEEE FP32 FMA in increasing k,
  from the pass's C).
* f32 -> bf16 conversion — **documented** (cloud.google.com/tpu/docs/bfloat16, "Format
  conversion details": round to nearest even, overflow to Inf, subnormals flushed to zero, NaN
  and Inf preserved): :func:`tpu_to_bf16`. Whether the flush applies to the f32 input (DAZ) or to
  the rounded result (which only differs for inputs in (2^-126 − 2^-134, 2^-126), rounding up to
  2^-126) is an **assumption**: ``conversion`` = "tpu" (flush the result, default),
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

import ml_dtypes
import numpy as np

from mpt import rounding as _rounding
from mpt.engines.model import (Assumption, MMAConfig, MMAModel, get_mma_model, mma_models,
                               register_model)
from mpt.engines.operands import Operands, operands_class, register_kind

__all__ = ["ALGORITHMS", "PRECISIONS", "DECOMPOSITIONS", "CONVERSIONS", "TRITON_BLOCK_K",
           "tpu_to_bf16", "TpuOperands", "MODEL"]

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
    or float32 read as tf32 (the inner model drops the low 13 bits) or fp32."""
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


# ---- the MMA model: the MXU pass, and an f32 dot's pass algorithm around it ----------------------

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


def _choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


_ALGORITHM_OPTIONS = ("algorithm", "precision", "decomposition", "conversion", "block_k")


@register_kind("xla_dot")
class TpuOperands(Operands):
    """The ``tpu`` model's operands.

    bf16 inputs (``mpt.mma`` or ``mpt.gemm``): one MXU pass — the inner model (assumption
    ``inner``) over the operands, FP32 accumulator from C. fp32 inputs (``mpt.gemm`` only: a
    software composition): the pieces of each operand as the algorithm splits them, and per
    piece pair the inner model's operands; :meth:`chain` sums or chains the passes as the
    decomposition says (module docstring). Options: ``inner`` (any MMA model name or
    :class:`MMAModel`), and for fp32 inputs ``algorithm`` / ``precision``, ``decomposition``,
    ``conversion``, ``block_k`` (defaults: BF16_BF16_F32 and the model's assumptions in effect).
    """

    acc_dtype = np.float32
    OPTIONS = ("inner",) + _ALGORITHM_OPTIONS

    @classmethod
    def check_config(cls, cfg):
        if [o[0] for o in cfg.outputs] != ["fp32"] or cfg.block != 1:
            raise ValueError(f"a TPU configuration has block 1 (the inner model's) and one fp32 "
                             f"output; got block {cfg.block}, outputs {cfg.outputs!r}")

    def prepare(self):
        opts, model = self.options, self.model
        self.inner = get_mma_model(opts.get("inner", model.choice("inner")))
        software = bool(self.cfg.param("software"))
        if not software:
            extra = sorted(set(opts) & set(_ALGORITHM_OPTIONS))
            if extra:
                raise TypeError(f"{', '.join(extra)}: options of an f32 dot's pass algorithm "
                                f"(fp32 inputs to mpt.gemm); {'/'.join(self.formats)} inputs run "
                                "one MXU pass")
            self.alg, self.decomposition = ALGORITHMS["BF16_BF16_F32"], "mxu"
            pieces = ([self.a.astype(ml_dtypes.bfloat16)], [self.b.astype(ml_dtypes.bfloat16)])
        else:
            self.alg = ALGORITHMS[_algorithm(opts.get("algorithm"), opts.get("precision"))]
            self.decomposition = _choice("decomposition", opts.get(
                "decomposition", model.choice("decomposition")), DECOMPOSITIONS)
            conversion = _choice("conversion", opts.get("conversion", model.choice("conversion")),
                                 CONVERSIONS)
            pieces = tuple(_pieces(x, self.alg, self.decomposition, conversion)
                           for x in (self.a, self.b))
        self._inner_ops(*pieces)
        self.block_k = self._block_k(opts.get("block_k"))

    def _inner_ops(self, pa, pb):
        """The inner model's operands of every piece pair a pass uses (batch made explicit)."""
        fmt = self.alg.piece
        pairs = set(self.alg.xla) | set(self.alg.triton) | {(0, 0)}
        kind = operands_class(self.inner.kind)
        self.passes = {}
        for i, j in pairs:
            x, y = pa[i][self.ia], pb[j][self.ib]                   # (B, M, K), (B, K, N)
            cfg = self.inner.config(fmt, fmt)
            self.passes[(i, j)] = kind(self.inner, cfg, x, y, (fmt, fmt), "fp32",
                                       (self.batch_size,))

    def _block_k(self, block_k):
        inner_unit = self.passes[(0, 0)].unit
        if self.decomposition != "triton":
            if block_k is not None:
                raise ValueError("block_k is the Triton lowering's K-tile; decomposition="
                                 f"{self.decomposition!r} runs every pass over the whole K")
            return inner_unit
        block_k = TRITON_BLOCK_K if block_k is None else block_k
        if isinstance(block_k, bool) or not isinstance(block_k, (int, np.integer)) or \
                block_k < 1 or block_k % inner_unit:
            raise ValueError(f"block_k must be a positive int, a multiple of the inner model's "
                             f"{inner_unit} products; got {block_k!r}")
        return int(block_k)

    @property
    def unit(self) -> int:
        return self.block_k

    def new_acc(self, c=None):
        """FP32 (B, M, N) holding c; without c, +0 — or -0 for the rewriter, whose dot has no C
        (the final ``+ c`` then adds nothing: ``d + (-0) = d``, signed zeros included)."""
        start = -0.0 if self.decomposition == "xla" else 0.0
        acc = np.full((self.batch_size, self.m, self.n), start, np.float32)
        if c is not None:
            acc[...] = c
        return acc

    def _pass(self, ij, k0, k1, c=None):
        """One inner pass over k in [k0, k1) from c (None: +0): (B, M, N) float32."""
        ops = self.passes[ij]
        return ops.values(ops.chain_from(c, k0, k1))

    def chain(self, acc, k0, k1):
        if self.decomposition == "mxu":                                  # one MXU pass from C
            acc[...] = self._pass((0, 0), k0, k1, acc)
            return
        if self.decomposition == "xla":
            acc[...] = _xla(self._pass, self.alg, k0, k1) + acc          # f32 add (RNE)
            return
        for t0 in range(k0, k1, self.block_k):
            t1 = min(t0 + self.block_k, k1)
            if not self.alg.triton:                                      # tt.dot(a, b, acc)
                acc[...] = self._pass((0, 0), t0, t1, acc)
                continue
            r = None                                                     # ZerosLike(acc)
            for ij in self.alg.triton:
                r = self._pass(ij, t0, t1, r)
            if self.alg.piece == "bf16":                                 # no NaN step in F32DotTC
                r = _zero_nonfinite(r)
            acc[...] = acc + self._pass((_H, _H), t0, t1, r)             # f32 add (RNE)


def _zero_nan(s):
    """The rewriter's ReplaceNaNWithZeros: select(inf >= |s|, s, +0): NaN -> +0, Inf kept."""
    return np.where(np.isnan(s), np.float32(0), s)


def _zero_nonfinite(s):
    """Triton's ZeroNaNs: select(inf > |s|, s, +0): NaN and ±Inf -> +0."""
    return np.where(np.isfinite(s), s, np.float32(0))


def _xla(run, alg, k0, k1):
    """The HLO rewriter on [k0, k1): passes from +0 summed in the source's order, NaN -> 0,
    + hi·hi (``run(pair, k0, k1)``: one pass)."""
    if not alg.xla:
        return run((0, 0), k0, k1)
    low = None
    for ij in alg.xla:
        d = run(ij, k0, k1)
        low = d if low is None else low + d                              # f32 add (RNE)
    return _zero_nan(low) + run((_H, _H), k0, k1)


def _inner_choices() -> tuple[str, ...]:
    """The MMA models registered so far that take bf16 inputs with an fp32 output: the named
    choices of the ``inner`` assumption (any model may be passed as the ``inner`` option)."""
    first = ("ieee_fma", "ieee_mul_add", "exact")
    others = [m.name for m in mma_models().values() if m.name not in first and
              any("bf16" in c.inputs and any(o[0] == "fp32" for o in c.outputs)
                  for c in m.configs)]
    return first + tuple(others)


#: The registered MMA model ``tpu`` (alias ``tpu-v5e``, ``mxu``).
MODEL = register_model(MMAModel(
    "tpu", "xla_dot", "Google TPU MXU: bf16 products accumulated in FP32 (the inner pass, "
    "assumed); an f32 dot (mpt.gemm) as XLA's bf16 pass algorithm (JAX DotAlgorithmPreset, "
    "precision=)", (
        MMAConfig(("bf16",), "one MXU pass: bf16 x bf16 products into an FP32 accumulator, as the "
                  "inner model computes them", 1, None, (("fp32", "rne_fp32", None),),
                  evidence="assumption"),
        MMAConfig(("fp32",), "f32 dot: XLA's pass algorithm (algorithm= / precision=; default "
                  "BF16_BF16_F32, one pass) over MXU passes - software, mpt.gemm", 1, None,
                  (("fp32", "rne_fp32", None),), evidence="reference model",
                  params=(("software", True),)),
    ), ("tpu-v5e", "mxu"), (
        Assumption("inner", _inner_choices(), "the accumulation of one MXU pass (undocumented): "
                   "the MMA model that runs it (sequential IEEE FP32 FMA by default)"),
        Assumption("decomposition", DECOMPOSITIONS, "how the closed TPU compiler splits and "
                   "orders an f32 dot's passes: XLA's HLO rewriter or its Triton lowering"),
        Assumption("conversion", CONVERSIONS, "the f32->bf16 converts of the split: subnormal "
                   "result flushed (tpu), subnormal input flushed (tpu_daz), or none (ieee)"),
    )))
