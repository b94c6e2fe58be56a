"""L1: Intel Gaudi 2 and Gaudi 3 as targets: every GEMM format (fp32, tf32, bf16, fp16, fp8) on
the chip's MME model (Habana's reference model), Gaudi's FP8 formats, and the converters'
rounding modes with stochastic rounding fed by a per-lane LFSR (``mpt.engines.gaudi.convert``),
whose polynomial and seeds are unpublished (labelled assumptions)."""
from __future__ import annotations

from mpt.engines.gaudi import CONVERSION_MODES, DEFAULT_LFSR_POLYNOMIAL
from mpt.engines.model import Assumption
from mpt.targets.target import Conversions, Target, register_target

__all__ = ["TARGETS"]

_SOURCES = ("HabanaAI/Intel_Gaudi3_Software mme/mme_reference/chip_fma (MME, converters)",
            "intel/neural-compressor fp8_quant (FP8 scale methods)")
_CONVERSIONS = Conversions(
    fp8_saturate=True, stochastic_rounding="lfsr", evidence="reference model",
    modes=tuple(CONVERSION_MODES), assumptions=(
        Assumption("lfsr_polynomial", (hex(DEFAULT_LFSR_POLYNOMIAL),), "the LFSR tap mask of "
                   "stochastic rounding (unpublished; the default is maximal-length; "
                   "mpt.engines.gaudi.lfsr_words takes any non-zero 32-bit mask)"),
        Assumption("lfsr_seeds", ("lane+2",), "the lanes' initial states (the reference's "
                   "default: lane i starts at i + 2; lfsr_words takes any non-zero seeds)")))


def _gaudi(name, description, fp8):
    mma = tuple((f, name) for f in ("fp32", "tf32", "bf16", "fp16", "fp8"))
    return Target(name, "Intel", description, mma, fp8, _CONVERSIONS, (), _SOURCES)


TARGETS = tuple(register_target(t) for t in (
    _gaudi("gaudi2", "Intel Gaudi 2 (HL-225): MME with RNE trees, FP8 via fp16, IEEE-like E4M3 "
           "(max 240) and E5M2", ("gaudi_e4m3_b7_full", "gaudi_e4m3_b7_full")),
    _gaudi("gaudi3", "Intel Gaudi 3 (HL-325): MME with the 9-term RZ step, FP8 E4M3/E5M2 of any "
           "bias in three Inf/NaN modes", ("fp8_e4m3fn", "fp8_e5m2")),
))
