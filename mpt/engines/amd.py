"""L1: AMD Matrix Cores (MFMA) — CDNA1 to CDNA4 as MMA models, one configuration per instruction.

The arithmetic (``mpt.reference.mfma`` states every rule and is the oracle; kernels:
:mod:`mpt.kernels.mfma`), per group of products p_i = a_i·b_i onto the accumulator c:

``fma``        f32 and f64 instructions (every CDNA): c = fma(a, b, c) per k, IEEE RNE to FP32
               (FP64), in increasing k — a CPU loop's bits, but for NaN payloads.
``pairwise``   CDNA1/CDNA2 f16, bf16 (groups of 4; 2 for CDNA1's original bf16 instructions):
               each product rounded to FP32, a pairwise tree of FP32 adds (p0+p1)+(p2+p3), then
               c + tree. CDNA2 flushes FP16/BF16 subnormal inputs, every node and C (at each
               instruction's start) below 2^-126 to zero.
``fused``      CDNA3 f16, bf16 (groups of 8), xf32 (groups of 4, inputs truncated to TF32): exact
               products truncated to 24 bits below the group's largest exponent, summed, re-aligned
               with c to their common exponent rounding toward −∞ (31 and 24 bits), one RNE
               rounding to FP32.
``fused_fp8``  CDNA3 FNUZ fp8/bf8 (mixable, groups of 16): the fused rule on the even-k and odd-k
               halves separately, each rounded toward −∞ to 24 bits, and c dropped when more than
               25 binades below.
Special values: IEEE propagation with no canonical NaN (a NaN input comes out quiet with its
payload); a finite product of magnitude >= 2^128 makes a fused group ±Inf.

Evidence. CDNA1-3 (``reference model``): MMA-Sim (P. Xie et al., "MMA-Sim: Bit-Accurate
Reference Model of Tensor Cores and Matrix Cores", arXiv:2511.10909; github microsoft/MMA-Sim,
MIT), which its authors checked bit for bit on MI100, MI250 and MI300; mpt reimplements its rules
and agrees with 4,632 of 4,960 outputs of its code bit for bit, the rest being NaNs with several
possible sources (tests/test_mfma.py). CDNA4 (``assumption``): nothing is published; every
configuration follows its CDNA3 counterpart, the assumed rule ``accumulation`` (below).

Assumptions (:class:`~mpt.engines.model.Assumption`, chosen with ``MMAModel.configure``):

* ``several_nans`` (every AMD model): which NaN a result carries when several operands of one
  group are NaN — "first" (default) or "last" in the order c, a_0, b_0, a_1, b_1, …; IEEE 754
  leaves it open and MMA-Sim's choice follows its host's summation order.
* ``accumulation`` (cdna4): "cdna3" (default) — every instruction computes as its CDNA3
  counterpart (OCP fp8 and f8f6f4 by the FP8 rule in groups of 16, the E8M0 block scales of the
  ``v_mfma_scale`` instructions added to the product exponents); "cdna3_fp8_single_group" — the
  same, except that fp8/f8f6f4 groups of 16 are summed as one (no even/odd halves, C kept).

Instruction variants (``MMAConfig.variant``, ``mpt.mma(..., variant=...)``): the first
instruction mnemonic of each row; instructions that differ only in M×N or in the number of
blocks (``_2b``, ``_4b``, ``_16b``) compute each output element alike and share a row. The
*default* variant for a pair of input formats is the one Triton's AMD backend, the compiler
behind ``torch.compile`` on ROCm, picks for a GEMM tile of at least 32×32: a 32×32 instruction
(``AccelerateAMDMatmul.cpp``: 32×32 when min(M, N) >= 32), the one with the largest K
(``MfmaGroup.cpp``) — e.g. CDNA3 fp16: ``v_mfma_f32_32x32x8_f16``; CDNA2 bf16: the ``_1k``
instruction ``v_mfma_f32_32x32x8bf16_1k`` (CDNA1 has only the original bf16 instructions, groups
of 2); with E8M0 scales, CDNA4's ``v_mfma_scale_f32_32x32x64_f8f6f4``. hipBLASLt picks its
kernels per problem size: name the variant to match one. The variant decides K per instruction
(hence the zero padding of K and, on CDNA2, where C is flushed) and the group size.

Formats: ``tf32`` is mpt's name for CDNA3's xf32 (FP32 operands, low 13 bits dropped): the
arithmetic reads the same TF32 values as NVIDIA's, so one name serves both
(``mpt.mma(a32, b32, model="cdna3", in_format="tf32")``). FNUZ fp8 (``fp8_e4m3fnuz``,
``fp8_e5m2fnuz``) is MI300's fp8/bf8; OCP fp8/fp6/fp4 are CDNA4's.
"""
from __future__ import annotations

import numpy as np

from mpt._checks import check_int
from mpt.engines.model import Assumption, MMAConfig, MMAModel, register_model
from mpt.engines.nvidia import F8F6F4, FP8
from mpt.engines.operands import PackedOperands, register_kind, tiles
from mpt.formats import get_format
from mpt.kernels import mfma as _mfma
from mpt.kernels import mfma_packed as _packed

__all__ = ["MODELS", "MFMAOperands", "RULES", "FNUZ_FP8", "SEVERAL_NANS", "CDNA4_ACCUMULATION"]

RULES = ("fma", "pairwise", "fused", "fused_fp8")
FNUZ_FP8 = ("fp8_e4m3fnuz", "fp8_e5m2fnuz")
_REFERENCE, _ASSUMPTION = "reference model", "assumption"

SEVERAL_NANS = Assumption(
    "several_nans", ("first", "last"),
    "which NaN a result carries when several operands of one group are NaN: the first or the "
    "last in the order c, a_0, b_0, a_1, b_1, ... (a block scale after its element); IEEE 754 "
    "leaves it open")
CDNA4_ACCUMULATION = Assumption(
    "accumulation", ("cdna3", "cdna3_fp8_single_group"),
    "CDNA4's accumulation, unpublished: each instruction as its CDNA3 counterpart (fp8/f8f6f4: "
    "CDNA3's FP8 rule in groups of 16, E8M0 block scales added to the product exponents), or "
    "the same with the fp8/f8f6f4 groups summed as one (no even/odd halves, C kept)")


def _v(instructions, k, rule, group, inputs, *, output="fp32", flush=False, scaled=False,
       evidence=_REFERENCE):
    """One instruction variant: ``instructions`` (space-separated mnemonics; the first names the
    variant), K per instruction, the rule and group of ``mpt.reference.mfma``, the input formats
    (mixable), the output, CDNA2's flush, E8M0 block scales per 32 k (``scaled``)."""
    names = tuple(instructions.split())
    params = (("rule", rule), ("group", group), ("flush", flush)) + \
        ((("scale_block", _mfma.MX_BLOCK),) if scaled else ())
    return MMAConfig(tuple(inputs), ", ".join(names), k, None,
                     ((output, f"rne_{output}", None),), evidence, names[0], params)


def _cdna12(flush):
    """The f32, f16 and original bf16 instructions of CDNA1 (CDNA2 keeps them, and flushes
    FP16/BF16 subnormals)."""
    f16 = ("fp16",)
    bf16 = ("bf16",)
    return (
        _v("v_mfma_f32_32x32x2f32", 2, "fma", 1, ("fp32",)),
        _v("v_mfma_f32_16x16x4f32", 4, "fma", 1, ("fp32",)),
        _v("v_mfma_f32_32x32x1f32 v_mfma_f32_16x16x1f32 v_mfma_f32_4x4x1f32", 1, "fma", 1,
           ("fp32",)),
        _v("v_mfma_f32_32x32x8f16", 8, "pairwise", 4, f16, flush=flush),
        _v("v_mfma_f32_16x16x16f16", 16, "pairwise", 4, f16, flush=flush),
        _v("v_mfma_f32_32x32x4f16 v_mfma_f32_16x16x4f16 v_mfma_f32_4x4x4f16", 4, "pairwise", 4,
           f16, flush=flush),
        _v("v_mfma_f32_32x32x4bf16", 4, "pairwise", 2, bf16, flush=flush),
        _v("v_mfma_f32_16x16x8bf16", 8, "pairwise", 2, bf16, flush=flush),
        _v("v_mfma_f32_32x32x2bf16 v_mfma_f32_16x16x2bf16 v_mfma_f32_4x4x2bf16", 2, "pairwise",
           2, bf16, flush=flush),
    )


_CDNA2_BF16_1K = (
    _v("v_mfma_f32_32x32x8bf16_1k", 8, "pairwise", 4, ("bf16",), flush=True),
    _v("v_mfma_f32_16x16x16bf16_1k", 16, "pairwise", 4, ("bf16",), flush=True),
    _v("v_mfma_f32_32x32x4bf16_1k v_mfma_f32_16x16x4bf16_1k v_mfma_f32_4x4x4bf16_1k", 4,
       "pairwise", 4, ("bf16",), flush=True),
)


def _f64(evidence=_REFERENCE, names="v_mfma_f64_16x16x4f64 v_mfma_f64_4x4x4f64"):
    return _v(names, 4, "fma", 1, ("fp64",), output="fp64", evidence=evidence)


def _half_cdna3(fmt, evidence):
    """CDNA3's f16 or bf16 instructions (``fmt`` "f16"/"bf16" in the mnemonics)."""
    name = "fp16" if fmt == "f16" else "bf16"
    return (
        _v(f"v_mfma_f32_32x32x8_{fmt}", 8, "fused", 8, (name,), evidence=evidence),
        _v(f"v_mfma_f32_16x16x16_{fmt}", 16, "fused", 8, (name,), evidence=evidence),
        _v(f"v_mfma_f32_32x32x4_2b_{fmt} v_mfma_f32_16x16x4_4b_{fmt} v_mfma_f32_4x4x4_16b_{fmt}",
           4, "fused", 4, (name,), evidence=evidence),
    )


def _fp8_cdna3(inputs, evidence):
    """The fp8/bf8 instructions (FNUZ on CDNA3, OCP on CDNA4), every pairing one row."""
    pairs = "fp8_fp8 fp8_bf8 bf8_fp8 bf8_bf8".split()
    return (
        _v(" ".join(f"v_mfma_f32_32x32x16_{p}" for p in pairs), 16, "fused_fp8", 16, inputs,
           evidence=evidence),
        _v(" ".join(f"v_mfma_f32_16x16x32_{p}" for p in pairs), 32, "fused_fp8", 16, inputs,
           evidence=evidence),
    )


def _f32_cdna3(evidence):
    return (
        _v("v_mfma_f32_32x32x2_f32", 2, "fma", 1, ("fp32",), evidence=evidence),
        _v("v_mfma_f32_16x16x4_f32", 4, "fma", 1, ("fp32",), evidence=evidence),
        _v("v_mfma_f32_32x32x1_2b_f32 v_mfma_f32_16x16x1_4b_f32 v_mfma_f32_4x4x1_16b_f32", 1,
           "fma", 1, ("fp32",), evidence=evidence),
    )


_CDNA3 = _half_cdna3("f16", _REFERENCE) + _half_cdna3("bf16", _REFERENCE) + (
    _v("v_mfma_f32_32x32x4_xf32", 4, "fused", 4, ("tf32",)),
    _v("v_mfma_f32_16x16x8_xf32", 8, "fused", 4, ("tf32",)),
) + _fp8_cdna3(FNUZ_FP8, _REFERENCE) + _f32_cdna3(_REFERENCE) + (
    _f64(names="v_mfma_f64_16x16x4_f64 v_mfma_f64_4x4x4_4b_f64"),)


def _cdna4():
    """CDNA4 (gfx950): CDNA3's instructions but xf32, the double-K f16/bf16 ones, OCP fp8 and
    f8f6f4 with and without E8M0 block scales; all assumed (module docstring)."""
    a = _ASSUMPTION
    wide = tuple(row for fmt, name in (("f16", "fp16"), ("bf16", "bf16")) for row in (
        _v(f"v_mfma_f32_32x32x16_{fmt}", 16, "fused", 8, (name,), evidence=a),
        _v(f"v_mfma_f32_16x16x32_{fmt}", 32, "fused", 8, (name,), evidence=a)))
    f8f6f4 = (
        _v("v_mfma_f32_32x32x64_f8f6f4", 64, "fused_fp8", 16, F8F6F4, evidence=a),
        _v("v_mfma_f32_16x16x128_f8f6f4", 128, "fused_fp8", 16, F8F6F4, evidence=a),
        _v("v_mfma_scale_f32_32x32x64_f8f6f4", 64, "fused_fp8", 16, F8F6F4, scaled=True,
           evidence=a),
        _v("v_mfma_scale_f32_16x16x128_f8f6f4", 128, "fused_fp8", 16, F8F6F4, scaled=True,
           evidence=a),
    )
    return (wide[:2] + _half_cdna3("f16", a) + wide[2:] + _half_cdna3("bf16", a)
            + _fp8_cdna3(FP8, a) + f8f6f4 + _f32_cdna3(a)
            + (_f64(a, "v_mfma_f64_16x16x4_f64 v_mfma_f64_4x4x4_4b_f64"),))


@register_kind("mfma")
class MFMAOperands(PackedOperands):
    """A and B decoded for one MFMA instruction variant (the rules in the module docstring).

    Operands are decoded by ``mpt.kernels.mfma.decode`` (NaNs in the quiet form they come out
    as; CDNA2's flush of FP16/BF16 subnormals) and K is zero-padded to a multiple of the
    instruction's K (the padding computes like any zeros; padded block scales are 2^0). Block
    scales ``scale_a`` (..., M, ceil(K/32)) and ``scale_b`` (..., ceil(K/32), N) — E8M0 patterns
    as uint8 or ``ml_dtypes.float8_e8m0fnu``, batch dimensions as a's and b's — go with the
    ``v_mfma_scale`` variants. The fused rules without scales take the register-blocked kernel
    when every product is finite and within [2^-60, 2^60] (``packed_tops``); every other case takes
    the general kernels, one output element at a time.
    """

    canonical_nan = False
    SCALES = True
    acc_dtype = np.float32        # the packed kernel's accumulator (the fused rules output FP32)

    @classmethod
    def check_config(cls, cfg):
        """``rule`` one of :data:`RULES` with a ``group`` that divides K (pairwise: 2 or 4; FP8
        rule: even; FMA: 1); fused rules on inputs of at most 11 significant bits (the kernels'
        exact float64 arithmetic); an FP32 output, or FP64 for fp64 inputs on the FMA rule;
        ``scale_block`` 32 on fused rules only."""
        rule, group = cfg.param("rule"), cfg.param("group")
        if rule not in RULES:
            raise ValueError(f"rule of an MFMA model must be one of {RULES}; got {rule!r}")
        k = check_int("block", cfg.block, min=1)
        group = check_int("group", group, min=1)
        if k % group or (rule == "pairwise" and group not in (2, 4)) or \
                (rule == "fused_fp8" and group % 2) or (rule == "fma" and group != 1):
            raise ValueError(f"variant {cfg.variant}: K={k} and group={group} do not fit rule "
                             f"{rule!r} (K a multiple of the group; pairwise groups of 2 or 4; "
                             "FP8 groups even; FMA groups of 1)")
        if rule.startswith("fused") and any(get_format(f).mantissa_bits > 10 for f in cfg.inputs
                                            if f != "tf32"):
            raise ValueError(f"the fused rules take inputs of at most 11 significant bits; got "
                             f"{cfg.inputs}")
        fp64 = (("fp64", "rne_fp64", None),)
        if cfg.outputs not in ((("fp32", "rne_fp32", None),), fp64) or \
                ((cfg.outputs == fp64) != (cfg.inputs == ("fp64",))) or \
                (cfg.outputs == fp64 and rule != "fma"):
            raise ValueError(f"an MFMA variant outputs ('fp32', 'rne_fp32', None), or "
                             f"('fp64', 'rne_fp64', None) for fp64 inputs on the FMA rule; got "
                             f"{cfg.outputs!r} for {cfg.inputs}")
        scale = cfg.param("scale_block")
        if scale is not None and (scale != _mfma.MX_BLOCK or not rule.startswith("fused")
                                  or k % scale):
            raise ValueError(f"scale_block must be {_mfma.MX_BLOCK}, on a fused rule whose K it "
                             f"divides; got {scale!r} with rule {rule!r}, K={k}")

    def decode(self, x, fmt):
        """Float32 values (:func:`mpt.kernels.mfma.decode`); float16 and bfloat16 operands of
        the fused rules stay as stored until :meth:`prepare`: the packed kernel's packers widen
        them as they read (exact; the rules neither flush them nor see NaN payloads there)."""
        if self._stored(x, fmt):
            return x
        return _mfma.decode(x, fmt, flush=bool(self.cfg.param("flush")))

    def _stored(self, x, fmt):
        """Whether operand x of format fmt stays as stored (:meth:`decode`)."""
        cfg = self.cfg
        return cfg.param("rule").startswith("fused") and not cfg.param("flush") and \
            fmt in ("fp16", "bf16") and x.dtype == get_format(fmt).dtype

    def prepare(self):
        cfg = self.cfg
        self.rule, self.group = cfg.param("rule"), cfg.param("group")
        if self.rule == "fused_fp8" and \
                _choice(self.model, "accumulation", "cdna3") == "cdna3_fp8_single_group":
            self.rule = "fused"
        self.last = _choice(self.model, "several_nans", "first") == "last"
        self.padded = tiles(self.k, cfg.block) * cfg.block
        fp64 = self.out_format == "fp64"
        self.out_dtype = np.float64 if fp64 else np.float32
        self.default_nan = _mfma.DEFAULT_NAN64 if fp64 else _mfma.DEFAULT_NAN32
        emins = [get_format("fp32" if f == "tf32" else f).emin for f in self.formats]
        self.emins = tuple(2.0**e for e in emins)
        a = _pad(self.a, 2, self.padded, 0.0)                         # (Ba, M, Kp)
        b = _pad(self.b, 1, self.padded, 0.0)                         # (Bb, Kp, N)
        self.sa, self.sb = self._block_scales()
        tops = _packed.packed_tops(a, b, *emins) if self.rule.startswith("fused") and \
            self.sa.shape[2] == 0 else None
        if tops is not None:
            if self.rule == "fused_fp8":   # each group's even k first, then its odd k
                order = np.arange(self.padded).reshape(-1, self.group // 2, 2)
                order = order.transpose(0, 2, 1).ravel()
                a, b = np.ascontiguousarray(a[:, :, order]), np.ascontiguousarray(b[:, order, :])
            self.a, self.b, self.rows = a, b, _packed.ROWS
            self.pack()                            # A's and B's roles fix their codes
            if self.swap:
                tops, emins = tops[::-1], emins[::-1]
            codes = _packed.pack_codes(self.a, self.b, tops, emins)
            self.a, self.b = (self.a, codes[0]), (self.b, codes[1])
        else:
            self.a, self.b = (_mfma.decode(x, f) if self._stored(x, f) else x
                              for x, f in zip((a, b), self.formats))

    def _block_scales(self):
        """(sa (Ba, M, Kp/32), sb (Bb, Kp/32, N)) float64 powers of two (NaN for 0xFF), padded
        with 2^0; empty along the block axis for an unscaled variant."""
        ba, bb = self.a.shape[0], self.b.shape[0]
        if self.cfg.param("scale_block") is None:
            if self.scales is not None:
                raise ValueError(f"variant {self.cfg.variant} of model {self.model.name!r} takes "
                                 f"no block scales (scale_a/scale_b)")
            return np.empty((ba, self.m, 0)), np.empty((bb, 0, self.n))
        blocks = self.padded // _mfma.MX_BLOCK
        if self.scales is None:                                         # unit scales
            return np.ones((ba, self.m, blocks)), np.ones((bb, blocks, self.n))
        (a_shape, b_shape), kb = self.shapes, tiles(self.k, _mfma.MX_BLOCK)
        out = []
        for arg, s, shape, axis in (("scale_a", self.scales[0], a_shape[:-1] + (kb,), 2),
                                    ("scale_b", self.scales[1], b_shape[:-2] + (kb, self.n), 1)):
            dtype = getattr(s, "dtype", None)
            if dtype is None or not (dtype == np.uint8 or dtype == get_format("e8m0").dtype):
                raise TypeError(f"{arg} must be E8M0 block scales (uint8 patterns or "
                                f"float8_e8m0fnu); got {type(s).__name__} {dtype or ''}".rstrip())
            if s.shape != shape:
                raise ValueError(f"{arg} must have shape {shape} (one E8M0 scale per "
                                 f"{_mfma.MX_BLOCK} k); got {s.shape}")
            s = _mfma.decode_scales(s).reshape((-1,) + shape[-2:])
            out.append(_pad(s, axis, blocks, 1.0))
        return tuple(out)

    def new_acc(self, c=None):
        if c is not None:
            c = _mfma.decode(c, self.out_format)           # a NaN C quieted, its payload kept
        if self.rows:
            return self._padded(c)
        acc = np.zeros((self.batch_size, self.m, self.n), self.out_dtype)
        if c is not None:
            acc[...] = c
        return acc

    def chain(self, acc, k0, k1):
        """The instructions over [k0, k1) (k0 a multiple of the instruction's K; k1 rounded up
        to one: the zero padding)."""
        k_inst = self.cfg.block
        k1 = min(tiles(k1, k_inst) * k_inst, self.padded)
        if self.rows:
            _packed.fused_chain_packed(*self.a, *self.b, acc, self.ia, self.ib, k0, k1, self.group,
                                     self.rule == "fused_fp8")
        elif self.rule == "fma":
            _mfma.fma_chain(self.a, self.b, acc, self.ia, self.ib, k0, k1, self.default_nan,
                            self.last)
        elif self.rule == "pairwise":
            _mfma.pairwise_chain(self.a, self.b, acc, self.ia, self.ib, k0, k1, self.group,
                                 k_inst, bool(self.cfg.param("flush")), self.default_nan,
                                 self.last)
        else:
            _mfma.fused_chain(self.a, self.b, acc, self.ia, self.ib, k0, k1, self.group,
                              self.rule == "fused_fp8", *self.emins, self.sa, self.sb,
                              self.default_nan, self.last)


def _choice(model, name, default):
    """The choice of assumption ``name`` in effect for ``model``, or ``default`` for a model
    without it (a user-built MMAModel of this kind)."""
    return model.choice(name) if any(a.name == name for a in model.assumptions) else default


def _pad(x, axis, size, value):
    """x padded with ``value`` along ``axis`` to ``size``."""
    if x.shape[axis] == size:
        return x
    width = [(0, 0)] * x.ndim
    width[axis] = (0, size - x.shape[axis])
    return np.pad(x, width, constant_values=value)


# The models, registered once their operand class is (mpt.engines.model checks the kind).
MODELS = tuple(register_model(m) for m in (
    MMAModel("cdna1", "mfma", "AMD Instinct MI100 Matrix Cores (CDNA1, gfx908)",
             _cdna12(flush=False), ("mi100",), (SEVERAL_NANS,)),
    MMAModel("cdna2", "mfma", "AMD Instinct MI200 series Matrix Cores (CDNA2, gfx90a): CDNA1's "
             "arithmetic with FP16/BF16 subnormals flushed, the bf16 _1k and f64 instructions",
             _CDNA2_BF16_1K + _cdna12(flush=True) + (_f64(),),
             ("mi200", "mi210", "mi250", "mi250x"), (SEVERAL_NANS,)),
    MMAModel("cdna3", "mfma", "AMD Instinct MI300 series Matrix Cores (CDNA3, gfx942)", _CDNA3,
             ("mi300", "mi300a", "mi300x", "mi325x"), (SEVERAL_NANS,)),
    MMAModel("cdna4", "mfma", "AMD Instinct MI350 series Matrix Cores (CDNA4, gfx950): OCP fp8 "
             "and MX f8f6f4 with E8M0 block scales; accumulation assumed (CDNA3's rules)",
             _cdna4(), ("mi350", "mi350x", "mi355x"), (SEVERAL_NANS, CDNA4_ACCUMULATION)),
))
