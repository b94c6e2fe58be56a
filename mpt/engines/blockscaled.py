"""L1: block-scaled MMA — the arithmetic kind ``"block_scaled"``: Blackwell's ``tcgen05.mma``
kind::mxf8f6f4 / mxf4 / mxf4nvf4 and RTX Blackwell's ``mma.sync ... block_scale``, bit for bit
(reference model: MMA-Sim, arXiv:2511.10909). Its configurations are instruction variants of the
``blackwell`` and ``rtx_blackwell`` presets (:mod:`mpt.engines.nvidia`):

    mpt.mma(a, b, c, model="blackwell", variant="mxf4nvf4", scale_a=sa, scale_b=sb)

computes D = (A ⊙ scale_a)·(B ⊙ scale_b) + C with the block scales applied *inside* the
instruction, chaining instructions in increasing k (each FP32 result is the next C).

**Scales.** ``scale_a``: a's batch dimensions + (M, K/block), ``scale_b``: b's + (K/block, N) —
one code per ``block`` consecutive k of a row of A / a column of B. The scale format is the
dtype: ``float8_e8m0fnu`` is UE8M0 (a power of two 2^(code−127), 0xFF NaN), ``float8_e4m3fn``
holds UE4M3 (its sign bit is ignored, as the hardware ignores it); the block size is K divided
by the scales' last axis (``scale_a.shape[-1]``). Each variant lists the (format, block) pairs
it takes (``MMAConfig.param("scales")``). K must be a multiple of the block; a last instruction
that K does not fill is computed as if the missing k were zero elements with scale code 0x00
(what TMA's zero fill of out-of-bounds elements and scale factors gives).

- **kind "mxf8f6f4"** (K = 32 per instruction, UE8M0 per 32): the Blackwell f8f6f4 block
  model on scale-folded operands — one block of 32 exact products, each with nominal exponent
  e(a) + e(b) + e(sa) + e(sb), truncated to F = 25 fraction bits below the largest exponent of
  the products and C, added exactly, rounded toward zero to FP32. Elements e4m3/e5m2/e2m1
  (reference model) and e3m2/e2m3 (the same rule with their own minimum exponent: assumption —
  MMA-Sim leaves them TODO).
- **kinds "mxf4" and "mxf4nvf4"** (K = 64; E2M1): each group of 16 products is summed exactly,
  times |sa|·|sb|, with exponent e(sa) + e(sb); the four group terms and C are aligned with
  F = 35 and rounded toward zero (:mod:`mpt.kernels.blockscaled`).
- **Specials**: a NaN scale, a NaN C or a NaN element gives the canonical NaN 0x7FFFFFFF; an Inf
  element (e5m2) gives that Inf (Inf·0 and +Inf with −Inf: NaN); an infinite C gives that Inf
  (assumption: MMA-Sim has no rule for it).
- **Zero rule** (the model's :data:`ZERO_RULE` assumption, ``MMAModel.configure(zero_rule=)``):
  ``"mpt"`` (default) — a zero product, a group with a zero scale and a zero C take the exponent
  e_zero = −133 of Blackwell's FP32-output block model, and a non-zero sum that rounds to zero
  keeps its sign; ``"mma_sim"`` (MMA-Sim's rule) — every zero value (element, scale, C) has
  exponent −126, so a zero product has −126 + the partner's and the scales' exponents, and a
  zero result is +0. The two differ in 16 of 97,920 random outputs (tests/test_blockscaled.py).

Oracle: ``mpt.reference.microscaling.block_scaled_dot_reference``; MMA-Sim itself was run on
random and directed cases outside the repository (tests/test_blockscaled.py).
"""
from __future__ import annotations

import numpy as np

from mpt import rounding as _rounding
from mpt._checks import check_int
from mpt.engines.block import BlockOperands, packable
from mpt.engines.model import Assumption, MMAConfig
from mpt.engines.operands import batched, emin_pow2, output_params, register_kind
from mpt.formats import get_format
from mpt.kernels import blockscaled as _bs
from mpt.kernels import mma as _mma

__all__ = ["BlockScaledOperands", "ZERO_RULE", "SCALE_FORMATS", "KINDS", "scaled_config",
           "scale_format_of"]

#: The block-scaled MMA's rule for zero values (module docstring): an assumption of the models.
ZERO_RULE = Assumption(
    "zero_rule", ("mpt", "mma_sim"),
    "block-scaled kinds: 'mpt' gives a zero product, a zero-scale group and a zero C the "
    "exponent e_zero = -133 of the FP32-output block model and keeps the sign of a sum that "
    "rounds to zero; 'mma_sim' gives every zero value the exponent -126 and returns +0")

#: Scale formats by the hardware's name: the mpt format that stores their codes.
SCALE_FORMATS = {"ue8m0": "e8m0", "ue4m3": "fp8_e4m3fn"}

#: kind -> (products per instruction, fraction bits F, terms: single products or groups of 16)
KINDS = {"mxf8f6f4": (32, 25, "product"), "mxf4": (64, 35, "group16"),
         "mxf4nvf4": (64, 35, "group16")}

_E_ZERO = -133           # mpt's zero-term exponent of the Blackwell FP32-output block model
_MMA_SIM_ZERO = 2.0**-126


def scaled_config(kind, inputs, instruction, scales, evidence="reference model") -> MMAConfig:
    """The :class:`MMAConfig` of a block-scaled instruction: variant ``kind`` ("mxf8f6f4",
    "mxf4" or "mxf4nvf4"), element formats ``inputs`` (mixable), the (scale format, block)
    pairs it takes; FP32 output rounded toward zero."""
    k, fraction_bits, terms = KINDS[kind]
    return MMAConfig(inputs, instruction, k, fraction_bits, (("fp32", "rz_fp32", _E_ZERO),),
                     evidence, kind, (("terms", terms), ("scales", tuple(scales))),
                     kind="block_scaled")


def scale_format_of(dtype) -> str | None:
    """"ue8m0" for float8_e8m0fnu codes, "ue4m3" for float8_e4m3fn codes, else None."""
    for name, fmt in SCALE_FORMATS.items():
        if np.dtype(dtype) == get_format(fmt).dtype:
            return name
    return None


@register_kind("block_scaled")
class BlockScaledOperands(BlockOperands):
    """Block-scaled operands (module docstring). Product terms (kind::mxf8f6f4) fold the scales
    into the block model's (value, nominal) pairs and run :class:`BlockOperands`' kernels (the
    chunked register-blocked one when the folded operands meet its conditions, under the "mpt"
    zero rule; else the general kernel); group terms (mxf4, mxf4nvf4) run
    ``mpt.kernels.blockscaled.group_chain``."""

    SCALES = True

    @classmethod
    def check_config(cls, cfg):
        """Terms "product" (block in [1, 32], F <= 25: the block model's kernels) or "group16"
        (block 64, F <= 35: four group terms below 2^(12+F) and c add exactly in float64);
        scales (format, block) with a block that divides the instruction's K; an FP32 RZ
        output."""
        terms = cfg.param("terms")
        if terms == "product":
            check_int("block", cfg.block, min=1, max=32)
            check_int("fraction_bits", cfg.fraction_bits, min=0, max=25)
        elif terms == "group16":
            check_int("block", cfg.block, min=_bs.INSTRUCTION_K, max=_bs.INSTRUCTION_K)
            check_int("fraction_bits", cfg.fraction_bits, min=0, max=35)
        else:
            raise ValueError(f"a block-scaled configuration's terms must be 'product' or "
                             f"'group16'; got {terms!r}")
        scales = cfg.param("scales", ())
        if not scales or any(f not in SCALE_FORMATS or b not in (16, 32) or cfg.block % b
                             for f, b in scales):
            raise ValueError(f"scales must be (format, block) pairs with a format in "
                             f"{tuple(SCALE_FORMATS)} and a block 16 or 32 dividing "
                             f"{cfg.block}; got {scales!r}")
        if cfg.outputs != (("fp32", "rz_fp32", cfg.outputs[0][2]),):
            raise ValueError(f"a block-scaled configuration has one output, ('fp32', 'rz_fp32', "
                             f"e_zero); got {cfg.outputs!r}")

    def __init__(self, model, cfg, a, b, formats, out_format, batch, scales=None, options=None):
        self.shapes = (np.shape(a), np.shape(b))
        super().__init__(model, cfg, a, b, formats, out_format, batch, scales, options)

    @property
    def zero_rule(self) -> str:
        return self.model.choice("zero_rule") if any(
            a.name == "zero_rule" for a in self.model.assumptions) else ZERO_RULE.default

    def prepare(self):
        cfg = self.cfg
        sfmt, block, scale_a, scale_b = self._check_scales()
        mma_sim = self.zero_rule == "mma_sim"
        precision, emin, largest, nearest = output_params("rz_fp32")
        zero_pow2 = _MMA_SIM_ZERO if mma_sim else 2.0 ** cfg.output("fp32")[1]
        self.params = (cfg.block, cfg.fraction_bits, zero_pow2,
                       (2.0 ** emin, 2.0 ** (1 - precision), largest, nearest))
        sa = batched(scale_a, self.batch)[0]                              # (Ba, M, K/block)
        sb = batched(scale_b, self.batch)[0]                              # (Bb, K/block, N)
        if cfg.param("terms") == "product":
            self._fold(sfmt, block, sa, sb, mma_sim)
        else:
            self._groups(sfmt, block, sa, sb, mma_sim)

    def _check_scales(self):
        """(scale format, block, scale_a, scale_b) after checking them against the variant."""
        name, cfg = self.model.name, self.cfg
        if self.scales is None or any(s is None for s in self.scales):
            raise ValueError(f"model {name!r} variant {cfg.variant!r} is block-scaled: it needs "
                             f"both scale_a and scale_b")
        scale_a, scale_b = (np.asarray(s) for s in self.scales)
        valid = ", ".join(f"{f}/{b}" for f, b in cfg.param("scales"))
        formats = {scale_format_of(s.dtype) for s in (scale_a, scale_b)}
        if None in formats or len(formats) != 1:
            raise TypeError(f"scale_a and scale_b must both hold UE8M0 (float8_e8m0fnu) or both "
                            f"UE4M3 (float8_e4m3fn) codes; got {scale_a.dtype} and "
                            f"{scale_b.dtype}")
        sfmt = formats.pop()
        groups = scale_a.shape[-1] if scale_a.ndim >= 2 else 0
        block = self.k // groups if groups and self.k % groups == 0 else None
        if (sfmt, block) not in cfg.param("scales"):
            raise ValueError(f"model {name!r} variant {cfg.variant!r} takes scales "
                             f"(format/block) {valid}; got {sfmt} codes with scale_a of shape "
                             f"{scale_a.shape} for K = {self.k}")
        (a_shape, b_shape), kb = self.shapes, self.k // block
        for arg, s, want in (("scale_a", scale_a, a_shape[:-2] + (self.m, kb)),
                             ("scale_b", scale_b, b_shape[:-2] + (kb, self.n))):
            if s.shape != want:
                raise ValueError(f"{arg} must have shape {want} (its operand's batch dimensions, "
                                 f"one code per {block} k); got {s.shape}")
        return sfmt, block, scale_a, scale_b

    def _scale_terms(self, s, sfmt, mma_sim, repeat, axis):
        """(|values|, nominal powers of two) float64 of scale codes, each repeated ``repeat``
        times along ``axis``; a NaN code: value NaN, nominal 0; a zero (UE4M3): nominal 0, or
        2^-126 under MMA-Sim's rule."""
        values = np.abs(_rounding.decode(s, np.float32))
        v, p = np.empty(values.shape), np.empty(values.shape)
        _mma.decode_terms(values.ravel(), emin_pow2(SCALE_FORMATS[sfmt]), v.ravel(), p.ravel())
        if mma_sim:
            p[v == 0] = _MMA_SIM_ZERO
        if repeat > 1:
            v, p = np.repeat(v, repeat, axis=axis), np.repeat(p, repeat, axis=axis)
        return v, p

    def _fold(self, sfmt, block, sa, sb, mma_sim):
        """kind::mxf8f6f4: (value, nominal) pairs with the scales folded in (exact: E8M0 scales
        are powers of two), packed for the register kernel when its conditions hold (finite,
        within float32, non-zero products in [2^-60, 2^60], the "mpt" zero rule)."""
        zero_nominal = _MMA_SIM_ZERO if mma_sim else 0.0
        terms = []
        for x, s, fmt, along_rows in ((self.a, sa, self.formats[0], False),
                                      (self.b, sb, self.formats[1], True)):
            sv, sp = self._scale_terms(s, sfmt, mma_sim, 1, -1)
            value, nominal = np.empty(x.shape), np.empty(x.shape)
            _bs.scaled_terms(x, emin_pow2(fmt), zero_nominal, sv, sp, block, along_rows, value,
                             nominal)
            terms.append((value, nominal))
        (va, pa), (vb, pb) = terms
        if not mma_sim and packable(va, vb):
            self.chunks(*(tuple(x.astype(np.float32) for x in t) for t in terms))
        else:
            self.terms, self.index = (va, pa, vb, pb), (self.ia, self.ib)

    def _groups(self, sfmt, block, sa, sb, mma_sim):
        """mxf4 / mxf4nvf4: float32 E2M1 values and per-group scale terms, K padded with zeros
        (scale terms 0) to whole instructions."""
        per = block // _bs.GROUP
        sav, sap = self._scale_terms(sa, sfmt, mma_sim, per, -1)          # (Ba, M, K/16)
        sbv, sbp = self._scale_terms(sb, sfmt, mma_sim, per, -2)          # (Bb, K/16, N)
        pad = -self.k % self.cfg.block
        if pad:
            self.a = np.pad(self.a, ((0, 0), (0, 0), (0, pad)))
            self.b = np.pad(self.b, ((0, 0), (0, pad), (0, 0)))
            g = pad // _bs.GROUP
            sav, sap = (np.pad(x, ((0, 0), (0, 0), (0, g))) for x in (sav, sap))
            sbv, sbp = (np.pad(x, ((0, 0), (0, g), (0, 0))) for x in (sbv, sbp))
        self.group_scales = (sav, sap, sbv, sbp)

    def chain(self, acc, k0, k1):
        if self.cfg.param("terms") == "product":
            super().chain(acc, k0, k1)
            return
        k1 = k1 + (-k1 % self.cfg.block if k1 == self.k else 0)        # the padded tail
        _bs.group_chain(self.a, self.b, *self.group_scales, acc, self.ia, self.ib, k0, k1,
                        self.cfg.fraction_bits, *self.params[2:])

    def values(self, acc):
        d = super().values(acc)
        if self.zero_rule == "mma_sim":
            d[d == 0] = 0.0                                               # MMA-Sim: +0
        return d

