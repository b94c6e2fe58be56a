"""L1: NVIDIA GPUs as targets (and the CPU): FP32 GEMMs on CUDA cores (sequential FMA), FP16,
BF16, TF32 and FP8 on the generation's Tensor Cores (the block-scaled MX/NVFP4 instructions are
variants of the B200's and RTX 5090's models), OCP FP8 formats with saturating casts (Transformer
Engine's HYBRID recipe), and no stochastic rounding in hardware casts."""
from __future__ import annotations

from mpt.targets.target import Conversions, Target, register_target

__all__ = ["TARGETS"]

_SOURCES = ("Khattak & Mikaitis, arXiv:2512.07004 (models and GPU samples)",
            "Xie et al., MMA-Sim, arXiv:2511.10909",
            "Fasi et al., PeerJ Comput. Sci. 7:e330 (2021)")
_OCP_FP8 = ("fp8_e4m3fn", "fp8_e5m2")


def _gpu(name, model, formats, description, aliases=(), fp8=False):
    mma = (("fp32", "ieee_fma"),) + tuple((f, model) for f in formats)
    if fp8:
        mma += (("fp8", model),)
    return Target(name, "NVIDIA", description, mma, _OCP_FP8 if fp8 else None, Conversions(),
                  aliases, _SOURCES)


TARGETS = tuple(register_target(t) for t in (
    Target("cpu", "any", "a CPU (or CUDA cores): every GEMM a sequential IEEE FP32 FMA",
           (("fp32", "ieee_fma"), ("tf32", "ieee_fma"), ("fp16", "ieee_fma"),
            ("bf16", "ieee_fma"), ("fp8", "ieee_fma")), _OCP_FP8, Conversions(),
           sources=("IEEE 754-2019",)),
    _gpu("v100", "volta", ("fp16",), "NVIDIA V100 (Volta, sm_70)"),
    _gpu("t4", "turing", ("fp16",), "NVIDIA T4 (Turing, sm_75)"),
    _gpu("a100", "ampere", ("fp16", "bf16", "tf32"), "NVIDIA A100 (Ampere, sm_80)",
         ("a30", "a2")),
    _gpu("l40s", "ada", ("fp16", "bf16", "tf32"), "NVIDIA L40S (Ada, sm_89)", ("rtx4090",),
         fp8=True),
    _gpu("h100", "hopper", ("fp16", "bf16", "tf32"), "NVIDIA H100 (Hopper, sm_90)",
         ("h200", "h800"), fp8=True),
    _gpu("b200", "blackwell", ("fp16", "bf16", "tf32"), "NVIDIA B200 (Blackwell, sm_100)",
         fp8=True),
    _gpu("rtx5090", "rtx_blackwell", ("fp16", "bf16", "tf32"),
         "NVIDIA GeForce RTX 5090 (Blackwell, sm_120)", fp8=True),
))
