"""L1: the IEEE models — what a CPU or a CUDA-core loop computes — and the exact dot product.

``ieee_fma``: ``acc = fma(a_k, b_k, acc)`` per k in increasing k, one RNE rounding to FP32 each
(a CUDA-core loop, a CPU, and mpt's FP32 matmul). ``ieee_mul_add``: product and sum rounded
separately. ``exact``: the exact dot product plus c, rounded once to nearest-even (the best any
hardware could do). Kernels: :mod:`mpt.kernels.gemm` (``fma_chain``, register-blocked) and
:mod:`mpt.kernels.mma`. Oracles: :mod:`mpt.reference.mma`. Evidence: IEEE 754 fixes every bit of
these (documented).
"""
from __future__ import annotations

import numpy as np

from mpt.engines.model import MMAConfig, MMAModel, register_model
from mpt.engines.nvidia import F8F6F4
from mpt.engines.operands import Operands, PackedOperands, output_params, register_kind, tiles
from mpt.kernels import gemm as _gemm
from mpt.kernels import mma as _mma

__all__ = ["MODELS", "ANY_FORMAT"]

#: Every input format the IEEE and exact models accept (decoded exactly to float32).
ANY_FORMAT = ("fp32", "tf32", "fp16", "bf16") + F8F6F4 + ("fp8_e4m3fnuz", "fp8_e5m2fnuz")


@register_kind("ieee_fma")
class FmaOperands(PackedOperands):
    """FP32 accumulator; the register-blocked FMA kernel (``fma_chain``). A is read in place,
    whole row tiles, where its layout allows it (``direct_rows``), and B as whole column panels
    of its rows where they are contiguous (``col_panels``); the rest (A's last partial row tile,
    B otherwise) is packed into zero-padded panels straight from its own layout (no contiguous
    copy first). A chain from +0 starts from zero registers on an unfilled accumulator. Many
    small products, which tiles would pad, run one output per chain (``fma_lanes``) on the
    operands as they are."""

    acc_dtype = np.float32

    @classmethod
    def check_config(cls, cfg):
        _check_per_k(cfg)

    def prepare(self):
        rows, cols = _gemm.ROWS, self.cols
        padded = min(tiles(self.m, rows) * tiles(self.n, cols),
                     tiles(self.n, rows) * tiles(self.m, cols)) * rows * cols
        if self.m * self.n * 4 < padded:        # lanes: plain (B, M, N) accumulator
            return
        self.rows = rows
        self.orient()
        direct = _gemm.direct_rows(self.a, self.rows)
        rest = self.a[:, direct * self.rows:]                      # rows read from panels
        panels = _gemm.pack_rows(rest, self.rows) if rest.shape[1] else \
            np.empty((rest.shape[0], 0, self.k, self.rows), np.float32)
        self.a = (self.a, panels, direct)
        self.b = _gemm.col_panels(self.b)

    def chain(self, acc, k0, k1, from_zero=False):
        if self.rows:
            _gemm.fma_chain(*self.a, self.b, acc, self.ia, self.ib, k0, k1, from_zero)
        else:
            _gemm.fma_lanes(self.a, self.b, acc, self.ia, self.ib, k0, k1)

    def chain_from(self, c, k0, k1):
        if not self.rows or c is not None or k1 <= k0:
            return super().chain_from(c, k0, k1)
        acc = np.empty(self.padded_shape, np.float32)   # all written by the chain from +0
        self.chain(acc, k0, k1, from_zero=True)
        return acc


def _check_per_k(cfg):
    if cfg.block != 1:
        raise ValueError(f"an IEEE model computes one product at a time: block must be 1; got "
                         f"{cfg.block}")


@register_kind("ieee_mul_add")
class MulAddOperands(Operands):
    acc_dtype = np.float32

    @classmethod
    def check_config(cls, cfg):
        _check_per_k(cfg)

    def chain(self, acc, k0, k1):
        _mma.mul_add_chain(self.a, self.b, acc, self.ia, self.ib, k0, k1)


@register_kind("exact")
class ExactOperands(Operands):
    """float64 accumulator holding values of the output format; one task per output row."""

    @classmethod
    def check_config(cls, cfg):
        if cfg.block is not None:
            raise ValueError(f"the exact model sums all of K at once: block must be None; got "
                             f"{cfg.block}")

    def prepare(self):
        precision, emin, largest, _ = output_params(self.cfg.output(self.out_format)[0])
        self.params = (precision, emin, largest)

    def chain(self, acc, k0, k1):
        _mma.exact_chain(self.a, self.b, acc, self.ia, self.ib, k0, k1, *self.params)


_DOCUMENTED = {"evidence": "documented"}

MODELS = tuple(register_model(m) for m in (
    MMAModel("ieee_fma", "ieee_fma", "sequential IEEE FP32 fused multiply-add in increasing k "
             "(a CPU or CUDA-core loop; mpt's FP32 matmul)", (
        MMAConfig(ANY_FORMAT, "fma.rn.f32 per k", 1, None, (("fp32", "rne_fp32", None),),
                  **_DOCUMENTED),)),
    MMAModel("ieee_mul_add", "ieee_mul_add", "sequential IEEE FP32 multiply then add, each rounded "
             "(RNE), in increasing k", (
        MMAConfig(ANY_FORMAT, "mul.rn.f32 + add.rn.f32 per k", 1, None,
                  (("fp32", "rne_fp32", None),), **_DOCUMENTED),)),
    MMAModel("exact", "exact", "the exact dot product plus c, rounded once to nearest-even "
             "(the best any hardware could do)", (
        MMAConfig(ANY_FORMAT, "exact sum, one rounding", None, None,
                  (("fp32", "rne_fp32", None), ("fp16", "rne_fp16", None)), **_DOCUMENTED),)),
))
