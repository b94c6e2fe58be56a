"""L1: NVIDIA Tensor Cores — the block-FMA model and its presets per GPU generation.

The model (docs/tensor_cores.md): K is consumed in blocks of L products in increasing k; each
product is exact and not renormalised; every term (c included) is truncated to F fraction bits
below the largest exponent of the block (a zero term counts with the exponent e_zero); the exact
sum is rounded once per block — RZ-FP32, RZ-E8M13 (Ada/Hopper FP8) or RNE-FP16 — and is the next
block's c. Kernels: :mod:`mpt.kernels.mma` (any inputs) and the register-blocked fast path of
:mod:`mpt.kernels.gemm`. Oracle: :mod:`mpt.reference.mma`; hardware: the vendored V100/A100/H100
samples (tests/test_mma_hardware.py).

Evidence: the FP16/BF16/TF32 configurations of Volta, Ampere and Hopper reproduce every row of
the real-GPU samples (hardware-verified); Turing, Ada, Blackwell and every FP8 configuration
follow the bit-accurate models of MMA-Sim (Xie et al., arXiv:2511.10909) and of Khattak and
Mikaitis (arXiv:2512.07004), which their authors checked on those GPUs (reference model).
"""
from __future__ import annotations

import numpy as np

from mpt._checks import check_int
from mpt.engines.model import MMAConfig, MMAModel, register_model
from mpt.engines.operands import PackedOperands, emin_pow2, output_params, register_kind
from mpt.formats import get_format
from mpt.kernels import gemm as _gemm
from mpt.kernels import mma as _mma

__all__ = ["PRESETS", "BlockOperands", "FP8", "F8F6F4"]

FP8 = ("fp8_e4m3fn", "fp8_e5m2")
F8F6F4 = FP8 + ("fp6_e3m2fn", "fp6_e2m3fn", "fp4_e2m1fn")

_MAGNITUDE_LIMIT = 60
#: output format -> the roundings a block of that output may end with
_BLOCK_ROUNDINGS = {"fp32": ("rz_fp32", "rz_e8m13"), "fp16": ("rne_fp16",)}   # the fast path's product range [2^-60, 2^60] (mpt.kernels.mma.block_chain)


@register_kind("block")
class BlockOperands(PackedOperands):
    """The block model: operands decoded into (value, nominal power of two) pairs; the
    register-blocked kernel when the operands meet its conditions (finite, non-zero products in
    [2^-60, 2^60], block·2^(F+2) <= 2^31), else the general kernel."""

    @classmethod
    def check_config(cls, cfg):
        """``block`` in [1, 32] and ``fraction_bits`` in [0, 25] (where the kernels' float64
        arithmetic is exact, mpt.kernels.mma), outputs fp32/fp16 with a block rounding and an
        ``e_zero`` in [-300, emin of the output) (a zero term must weigh less than any non-zero
        accumulator)."""
        check_int("block", cfg.block, min=1, max=32)
        check_int("fraction_bits", cfg.fraction_bits, min=0, max=25)
        for name, rounding, e_zero in cfg.outputs:
            if rounding not in _BLOCK_ROUNDINGS.get(name, ()):
                raise ValueError(f"each output of a block model must be ('fp32', 'rz_fp32' | "
                                 f"'rz_e8m13', e_zero) or ('fp16', 'rne_fp16', e_zero); got "
                                 f"{(name, rounding, e_zero)!r}")
            check_int(f"e_zero of output {name}", e_zero, min=-300,
                      max=get_format(name).emin - 1)

    def prepare(self):
        cfg = self.cfg
        rounding, e_zero = cfg.output(self.out_format)
        precision, emin, largest, nearest = output_params(rounding)
        out = (2.0 ** emin, 2.0 ** (1 - precision), largest, nearest)
        self.params = (cfg.block, cfg.fraction_bits, 2.0 ** e_zero, out)
        if cfg.block << (cfg.fraction_bits + 2) <= 1 << 31 and \
                _products_in(self.a, self.b, _MAGNITUDE_LIMIT):
            self.rows = _gemm.BLOCK_ROWS
        self.a, self.b = self._decode(self.a, self.formats[0]), self._decode(self.b, self.formats[1])
        if self.rows:
            self.pack()

    def _decode(self, x32, fmt):
        """(values, nominal powers of two): float32 for the packed path, else float64."""
        dtype = np.float32 if self.rows else np.float64
        value, nominal = np.empty(x32.shape, dtype), np.empty(x32.shape, dtype)
        _mma.decode_terms(x32.ravel(), emin_pow2(fmt), value.ravel(), nominal.ravel())
        return value, nominal

    def new_acc(self, c=None):
        if not self.rows:
            return super().new_acc(c)
        if c is None:
            rows, cols = self._shape
            return np.zeros((self.batch_size, -(-rows // self.rows), -(-cols // _gemm.COLS),
                             self.rows * _gemm.COLS))
        return _gemm.pack_tiles(self._padded(c), self.rows)

    def chain(self, acc, k0, k1):
        if self.rows:
            _gemm.block_chain_packed(*self.a, *self.b, acc, self.ia, self.ib, k0, k1, *self.params)
        else:
            _mma.block_chain(*self.a, *self.b, acc, self.ia, self.ib, k0, k1, *self.params)

    def values(self, acc):
        if self.rows:
            rows, cols = self._shape
            acc = _gemm.unpack_tiles(acc, self.rows, rows, cols)
        return super().values(acc)


def _products_in(a, b, e):
    """Whether a and b are finite and every non-zero |a_ik·b_kj| lies in [2^-e, 2^e]."""
    finite_a, lo_a, hi_a = _mma.magnitude_range(a)
    finite_b, lo_b, hi_b = _mma.magnitude_range(b)
    if not (finite_a and finite_b):
        return False
    if hi_a == 0 or hi_b == 0:
        return True   # every product is zero
    return lo_a * lo_b >= 2.0 ** -e and hi_a * hi_b <= 2.0 ** e


def _outs(fp32_rounding, fp32_e_zero, fp16_e_zero=None):
    fp32 = (("fp32", fp32_rounding, fp32_e_zero),)
    return fp32 if fp16_e_zero is None else fp32 + (("fp16", "rne_fp16", fp16_e_zero),)


def _half(instruction, block, fraction_bits, outputs, formats=("fp16", "bf16"), **kw):
    """The same parameters for FP16 and for BF16 inputs (which the hardware does not mix)."""
    return tuple(MMAConfig((f,), instruction, block, fraction_bits, outputs, **kw)
                 for f in formats)


_VERIFIED = {"evidence": "hardware-verified"}

# e_zero of the FP32 output is measured for Ampere/Ada (-132) and Hopper/Blackwell (-133). Volta
# and Turing take FP16 inputs only, whose products have nominal exponents >= -28, and a non-zero
# FP32 c has one >= -126, so any e_zero below -28 gives the same bits: -132 is used there.
PRESETS = tuple(register_model(m) for m in (
    MMAModel("volta", "block", "NVIDIA V100 Tensor Cores (sm_70)", _half(
        "mma.sync m8n8k4 (wmma 16x16x16 = four k4 steps)", 4, 23, _outs("rz_fp32", -132, -19),
        formats=("fp16",), **_VERIFIED), ("v100",)),
    MMAModel("turing", "block", "NVIDIA T4 Tensor Cores (sm_75)", _half(
        "mma.sync m16n8k8", 8, 24, _outs("rz_fp32", -132, -20), formats=("fp16",)), ("t4",)),
    MMAModel("ampere", "block", "NVIDIA A100/A30/A2 Tensor Cores (sm_80, sm_86)", _half(
        "mma.sync m16n8k8; m16n8k16 = 2 blocks of 8", 8, 24, _outs("rz_fp32", -132, -20),
        **_VERIFIED) + (
        MMAConfig(("tf32",), "mma.sync m16n8k4; m16n8k8 = 2 blocks of 4", 4, 24,
                  _outs("rz_fp32", -132), **_VERIFIED),
    ), ("a100", "a30", "a2")),
    MMAModel("ada", "block", "NVIDIA L40S / RTX 4090 Tensor Cores (sm_89)", _half(
        "mma.sync m16n8k8; m16n8k16 = 2 blocks of 8", 8, 24, _outs("rz_fp32", -132, -20)) + (
        MMAConfig(("tf32",), "mma.sync m16n8k4; m16n8k8 = 2 blocks of 4", 4, 24,
                  _outs("rz_fp32", -132)),
        MMAConfig(FP8, "mma.sync m16n8k16 fp8; m16n8k32 = 2 blocks of 16", 16, 13,
                  _outs("rz_e8m13", -132, -20)),
    ), ("l40s", "rtx4090")),
    MMAModel("hopper", "block", "NVIDIA H100/H200/H800 Tensor Cores (sm_90)", _half(
        "wgmma / mma.sync k16 (one block of 16)", 16, 25, _outs("rz_fp32", -133, -21),
        **_VERIFIED) + (
        MMAConfig(("tf32",), "wgmma / mma.sync k8 (one block of 8)", 8, 25, _outs("rz_fp32", -133),
                  **_VERIFIED),
        MMAConfig(FP8, "wgmma k32 (one block of 32)", 32, 13, _outs("rz_e8m13", -133)),
    ), ("h100", "h200", "h800")),
    MMAModel("blackwell", "block", "NVIDIA B200 Tensor Cores (sm_100)", _half(
        "tcgen05.mma kind::f16 (k16)", 16, 25, _outs("rz_fp32", -133, -21)) + (
        MMAConfig(("tf32",), "tcgen05.mma kind::tf32 (k8)", 8, 25, _outs("rz_fp32", -133)),
        MMAConfig(F8F6F4, "tcgen05.mma kind::f8f6f4 (k32)", 32, 25, _outs("rz_fp32", -133)),
    ), ("b200",)),
))
