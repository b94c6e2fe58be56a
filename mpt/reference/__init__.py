"""L1': slow, obviously-correct oracles (exact rationals, float64 reasoning) used by the tests.

Never imports ``mpt.kernels``: an oracle must be independent of the kernel it checks.
"""
from mpt.reference import ops  # noqa: E402,F401  float64 oracles of mpt.functional (autograd-core)
from mpt.reference import mma  # noqa: E402,F401  exact-rational oracles of mpt.mma / mpt.gemm
from mpt.reference import mfma  # noqa: E402,F401  exact-rational oracles of the AMD MFMA models
from mpt.reference import optim  # noqa: E402,F401  oracles of optimizers, loss scaling, FP8
from mpt.reference import quant  # noqa: E402,F401  oracles of fake quant, LSQ, NF4, requantization
from mpt.reference import rounding  # noqa: E402,F401  exact decoding and rounding, every mode
from mpt.reference import attention  # noqa: E402,F401  tiled FlashAttention oracle, fp64 attention
from mpt.reference import tpu  # noqa: E402,F401  XLA's f32-dot pass algorithms, element by element
from mpt.reference import mme  # noqa: E402,F401  Gaudi 2/3 MME trees in exact rationals
from mpt.reference import trainium  # noqa: E402,F401  Trainium's 128-deep passes into FP32 PSUM
