"""L1: AMD Instinct GPUs as targets: every GEMM on the generation's Matrix Cores
(``mpt.engines.amd``) — FP32 GEMMs included, which rocBLAS/hipBLASLt run on the f32 MFMA
instructions (a sequential FMA per k: the bits of ``ieee_fma`` but for NaN payloads) — FNUZ FP8
on MI300, OCP FP8 on MI355, and saturating FP8 casts (Transformer Engine's on ROCm, as on
CUDA).

Not modelled: the stochastic-rounding conversions of CDNA3/CDNA4 (``v_cvt_sr_*``, which take their
random bits from software) and any subnormal flush outside the MFMA instructions (CDNA2 flushes
FP16/BF16 subnormals inside them: ``mpt.engines.amd``)."""
from __future__ import annotations

from mpt.engines.amd import FNUZ_FP8
from mpt.engines.nvidia import FP8 as OCP_FP8
from mpt.targets.target import Conversions, Target, register_target

__all__ = ["TARGETS"]

_SOURCES = ("Xie et al., MMA-Sim, arXiv:2511.10909 (CDNA1-3 bit-accurate models)",
            "AMD Instinct MI200 / MI300 / MI355X (CDNA2-4) ISA reference guides",
            "Triton AMD backend, MfmaGroup.cpp (default instructions)")


def _gpu(name, model, formats, description, aliases, fp8=None):
    mma = tuple((f, model) for f in ("fp32",) + formats) + ((("fp8", model),) if fp8 else ())
    return Target(name, "AMD", description, mma, fp8, Conversions(), aliases, _SOURCES)


TARGETS = tuple(register_target(t) for t in (
    _gpu("mi250x", "cdna2", ("fp16", "bf16", "fp64"), "AMD Instinct MI250X (CDNA2, gfx90a)",
         ("mi250", "mi210")),
    _gpu("mi300x", "cdna3", ("fp16", "bf16", "tf32", "fp64"),
         "AMD Instinct MI300X (CDNA3, gfx942); tf32 is the xf32 instructions",
         ("mi300", "mi300a", "mi325x"), fp8=FNUZ_FP8),
    _gpu("mi355x", "cdna4", ("fp16", "bf16", "fp64"),
         "AMD Instinct MI355X (CDNA4, gfx950; its arithmetic is assumed: mpt.engines.amd)",
         ("mi350x", "mi350"), fp8=OCP_FP8),
))
