"""L1: AWS Trainium as targets: every GEMM format (fp32, tf32, bf16, fp16, cFP8) on the matrix
engine with FP32 PSUM (``trainium``), the compiler's ``--auto-cast matmult`` as a compiler mode
(``trainium_autocast``), cFP8 formats, and stochastic rounding — documented by Neuron
(``NEURON_RT_STOCHASTIC_ROUNDING_EN``), with an undocumented generator that mpt replaces by its
Philox stream (a labelled assumption)."""
from __future__ import annotations

from mpt.engines.model import Assumption
from mpt.engines.trainium import CFP8_SPECIALS
from mpt.targets.target import Conversions, Target, register_target

__all__ = ["TARGETS"]

_SOURCES = ("aws-neuron-sdk: NeuronCore data types, rounding modes, neuronx-cc --auto-cast, "
            "the mixed-precision app note, nki.isa.nc_matmul",)
_CONVERSIONS = Conversions(
    fp8_saturate=False, stochastic_rounding="philox", evidence="documented",
    modes=("nearest_even", "stochastic"), assumptions=(
        Assumption("sr_source", ("philox",), "the random source of stochastic rounding "
                   "(Neuron documents neither its generator nor how many bits it compares): "
                   "mpt's Philox stream, 32 bits per element"),
        Assumption("cfp8_specials", CFP8_SPECIALS, "the encoding of Inf/NaN in cFP8 (not "
                   "documented): IEEE-like, as XLA's F8E4M3/F8E5M2 (the target's formats)")))


def _trainium(name, description):
    mma = tuple((f, "trainium") for f in ("fp32", "tf32", "bf16", "fp16", "fp8"))
    return Target(name, "AWS", description, mma, ("cfp8_e4m3", "cfp8_e5m2"), _CONVERSIONS, (),
                  _SOURCES, software_models=("trainium_autocast",))


TARGETS = tuple(register_target(t) for t in (
    _trainium("trn1", "AWS Trainium (NeuronCore-v2): 128x128 PE array, FP32 PSUM"),
    _trainium("trn2", "AWS Trainium2 (NeuronCore-v3): 128x128 PE array, FP32 PSUM"),
))
