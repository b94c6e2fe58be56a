"""L1: NVIDIA Tensor Cores — the block-FMA model's presets per GPU generation.

The model (docs/tensor_cores.md): K is consumed in blocks of L products in increasing k; each
product is exact and not renormalised; every term (c included) is truncated to F fraction bits
below the largest exponent of the block (a zero term counts with the exponent e_zero); the exact
sum is rounded once per block — RZ-FP32, RZ-E8M13 (Ada/Hopper FP8) or RNE-FP16 — and is the next
block's c. Its operand class is :mod:`mpt.engines.block`; kernels: :mod:`mpt.kernels.mma` (any
inputs) and the register-blocked fast paths of :mod:`mpt.kernels.block_gemm` and
:mod:`mpt.kernels.gemm`. Oracle: :mod:`mpt.reference.mma`; hardware: the vendored V100/A100/H100
samples (tests/test_mma_hardware.py).

Besides each generation's default instructions, a preset has **instruction variants**
(``mpt.mma(..., variant=)``): the smaller ``mma.sync`` shapes, chained as blocks of their own K
(Turing ``m8n8k4``: L = 4, F = 24; Hopper and Blackwell ``m16n8k8`` fp16/bf16: L = 8, F = 25,
and ``m16n8k4`` tf32: L = 4, F = 25); the block-scaled instructions of Blackwell and RTX
Blackwell (``mxf8f6f4``, ``mxf4``, ``mxf4nvf4``: :mod:`mpt.engines.blockscaled`); and FP64 on
Ampere and Hopper (fp64 inputs: sequential float64 FMA, :mod:`mpt.engines.fma64`).

Evidence: the FP16/BF16/TF32 configurations of Volta, Ampere and Hopper reproduce every row of
the real-GPU samples (hardware-verified); Turing, Ada, Blackwell, RTX Blackwell, the variants and
every FP8 configuration follow the bit-accurate models of MMA-Sim (Xie et al., arXiv:2511.10909)
and of Khattak and Mikaitis (arXiv:2512.07004), which their authors checked on those GPUs
(reference model); the FP6 elements (e3m2, e2m3) of the f8f6f4 kinds follow the same rule by
assumption (MMA-Sim leaves them TODO). The zero-term exponents e_zero of the FP16 outputs of FP8
inputs (Hopper, Blackwell, RTX Blackwell: −21) and of RTX Blackwell (−133) are assumed to be
those of the generation's measured outputs; the vectors of tests/test_mma_variants.py avoid them.
"""
from __future__ import annotations

from mpt.engines.block import BlockOperands  # noqa: F401  (registers the "block" kind)
from mpt.engines.blockscaled import ZERO_RULE, scaled_config
from mpt.engines.fma64 import Fma64Operands  # noqa: F401  (registers the "ieee_fma64" kind)
from mpt.engines.model import MMAConfig, MMAModel, register_model

__all__ = ["PRESETS", "BlockOperands", "FP8", "F8F6F4"]

FP8 = ("fp8_e4m3fn", "fp8_e5m2")
F8F6F4 = FP8 + ("fp6_e3m2fn", "fp6_e2m3fn", "fp4_e2m1fn")
#: the f8f6f4 elements MMA-Sim models (e3m2 and e2m3 are TODO there)
_F8F4 = FP8 + ("fp4_e2m1fn",)


def _outs(fp32_rounding, fp32_e_zero, fp16_e_zero=None):
    fp32 = (("fp32", fp32_rounding, fp32_e_zero),)
    return fp32 if fp16_e_zero is None else fp32 + (("fp16", "rne_fp16", fp16_e_zero),)


def _half(instruction, block, fraction_bits, outputs, formats=("fp16", "bf16"), **kw):
    """The same parameters for FP16 and for BF16 inputs (which the hardware does not mix)."""
    return tuple(MMAConfig((f,), instruction, block, fraction_bits, outputs, **kw)
                 for f in formats)


def _f8f6f4(instruction, block, fraction_bits, outputs, **kw):
    """An f8f6f4 instruction twice: its elements as MMA-Sim models them (reference model), then
    all five, mixable (the FP6 ones by assumption); ``MMAModel.config`` picks the first that
    takes both inputs."""
    return (MMAConfig(_F8F4, instruction, block, fraction_bits, outputs, **kw),
            MMAConfig(F8F6F4, instruction, block, fraction_bits, outputs,
                      **{**kw, "evidence": "assumption"}))


def _scaled_f8f6f4(instruction):
    return tuple(scaled_config("mxf8f6f4", inputs, instruction, (("ue8m0", 32),), evidence)
                 for inputs, evidence in ((_F8F4, "reference model"), (F8F6F4, "assumption")))


def _fp64(instruction):
    return (MMAConfig(("fp64",), instruction, 1, None, (("fp64", "rne_fp64", None),),
                      kind="ieee_fma64"),)


_VERIFIED = {"evidence": "hardware-verified"}
_FP4 = ("fp4_e2m1fn",)
_NVF4_SCALES = (("ue8m0", 32), ("ue8m0", 16), ("ue4m3", 16))

# e_zero of the FP32 output is measured for Ampere/Ada (-132) and Hopper/Blackwell (-133). Volta
# and Turing take FP16 inputs only, whose products have nominal exponents >= -28, and a non-zero
# FP32 c has one >= -126, so any e_zero below -28 gives the same bits: -132 is used there.
PRESETS = tuple(register_model(m) for m in (
    MMAModel("volta", "block", "NVIDIA V100 Tensor Cores (sm_70)", _half(
        "mma.sync m8n8k4 (wmma 16x16x16 = four k4 steps)", 4, 23, _outs("rz_fp32", -132, -19),
        formats=("fp16",), **_VERIFIED), ("v100",)),
    MMAModel("turing", "block", "NVIDIA T4 Tensor Cores (sm_75)", _half(
        "mma.sync m16n8k8", 8, 24, _outs("rz_fp32", -132, -20), formats=("fp16",)) + _half(
        "mma.sync m8n8k4 (one block of 4)", 4, 24, _outs("rz_fp32", -132, -20),
        formats=("fp16",), variant="m8n8k4"), ("t4",)),
    MMAModel("ampere", "block", "NVIDIA A100/A30/A2 Tensor Cores (sm_80, sm_86)", _half(
        "mma.sync m16n8k8; m16n8k16 = 2 blocks of 8", 8, 24, _outs("rz_fp32", -132, -20),
        **_VERIFIED) + (
        MMAConfig(("tf32",), "mma.sync m16n8k4; m16n8k8 = 2 blocks of 4", 4, 24,
                  _outs("rz_fp32", -132), **_VERIFIED),
    ) + _fp64("mma.sync m8n8k4 f64 (DMMA): fma.rn.f64 per k"), ("a100", "a30", "a2")),
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
        MMAConfig(FP8, "wgmma k32 (one block of 32)", 32, 13, _outs("rz_e8m13", -133, -21)),
    ) + _half("mma.sync m16n8k8 (one block of 8)", 8, 25, _outs("rz_fp32", -133, -21),
              variant="m16n8k8") + (
        MMAConfig(("tf32",), "mma.sync m16n8k4 (one block of 4)", 4, 25, _outs("rz_fp32", -133),
                  variant="m16n8k4"),
    ) + _fp64("mma.sync m16n8k4/k8/k16 f64 (DMMA): fma.rn.f64 per k"), ("h100", "h200", "h800")),
    MMAModel("blackwell", "block", "NVIDIA B200 Tensor Cores (sm_100)", _half(
        "tcgen05.mma kind::f16 (k16)", 16, 25, _outs("rz_fp32", -133, -21)) + (
        MMAConfig(("tf32",), "tcgen05.mma kind::tf32 (k8)", 8, 25, _outs("rz_fp32", -133)),
    ) + _f8f6f4("tcgen05.mma kind::f8f6f4 (k32)", 32, 25, _outs("rz_fp32", -133, -21))
      + _half("mma.sync m16n8k8 (one block of 8)", 8, 25, _outs("rz_fp32", -133, -21),
              variant="m16n8k8") + (
        MMAConfig(("tf32",), "mma.sync m16n8k4 (one block of 4)", 4, 25, _outs("rz_fp32", -133),
                  variant="m16n8k4"),
    ) + _scaled_f8f6f4("tcgen05.mma kind::mxf8f6f4.block_scale.scale_vec::1X (k32)") + (
        scaled_config("mxf4", _FP4, "tcgen05.mma kind::mxf4.block_scale.scale_vec::2X (k64)",
                      (("ue8m0", 32),)),
        scaled_config("mxf4nvf4", _FP4, "tcgen05.mma kind::mxf4nvf4.block_scale (k64; "
                      "scale_vec::2X ue8m0/32, scale_vec::4X ue8m0/16 or ue4m3/16)",
                      _NVF4_SCALES),
    ), ("b200",), (ZERO_RULE,)),
    MMAModel("rtx_blackwell", "block", "NVIDIA RTX 5090 / RTX PRO Blackwell Tensor Cores "
             "(sm_120): mma.sync, no tcgen05", _half(
        "mma.sync m16n8k16 (one block of 16)", 16, 25, _outs("rz_fp32", -133, -21)) + (
        MMAConfig(("tf32",), "mma.sync m16n8k8 (one block of 8)", 8, 25, _outs("rz_fp32", -133)),
    ) + _f8f6f4("mma.sync m16n8k32 kind::f8f6f4 (one block of 32)", 32, 25,
                _outs("rz_fp32", -133, -21))
      + _half("mma.sync m16n8k8 (one block of 8)", 8, 25, _outs("rz_fp32", -133, -21),
              variant="m16n8k8") + (
        MMAConfig(("tf32",), "mma.sync m16n8k4 (one block of 4)", 4, 25, _outs("rz_fp32", -133),
                  variant="m16n8k4"),
        MMAConfig(FP8, "mma.sync m16n8k16 e4m3/e5m2 (one block of 16)", 16, 25,
                  _outs("rz_fp32", -133, -21), variant="m16n8k16"),
    ) + _scaled_f8f6f4("mma.sync m16n8k32 kind::mxf8f6f4.block_scale ue8m0 (k32)") + (
        scaled_config("mxf4", _FP4, "mma.sync m16n8k64 kind::mxf4.block_scale ue8m0 (k64)",
                      (("ue8m0", 32),)),
        scaled_config("mxf4nvf4", _FP4, "mma.sync m16n8k64 kind::mxf4nvf4.block_scale (k64; "
                      "ue8m0 or ue4m3 per 32 or 16)",
                      (("ue8m0", 32), ("ue8m0", 16), ("ue4m3", 32), ("ue4m3", 16))),
    ), ("rtx5090", "sm120"), (ZERO_RULE,)),
))
