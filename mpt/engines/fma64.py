"""L1: the sequential float64 FMA kind (``"ieee_fma64"``) — FP64 GEMMs: ``acc = fma(a_k, b_k,
acc)`` in float64 per k, in increasing k, one RNE rounding each.

This is how MMA-Sim models NVIDIA's FP64 Tensor Cores (DMMA: ``mma.sync`` m8n8k4 f64 on Ampere,
m16n8k4/k8/k16 f64 on Hopper; reference model), and what an FP64 GEMM on CUDA cores computes.
The configurations are FP64 variants of the ``ampere`` and ``hopper`` presets
(:mod:`mpt.engines.nvidia`): fp64 operands, an fp64 output (``c`` float64; ``mpt.mma`` returns
float64). NaN results keep the payload the float64 FMA gives (no canonical NaN is written: the
FP64 pipe's NaN encoding is not modelled). Kernel: ``mpt.kernels.fma.fma64_chain``, the one
float64 FMA chain of mpt (``mpt.kernels.ops.matmul_f64`` uses it too).
"""
from __future__ import annotations

import numpy as np

from mpt.engines.operands import Operands, register_kind
from mpt.kernels.fma import fma64_chain

__all__ = ["Fma64Operands"]


@register_kind("ieee_fma64")
class Fma64Operands(Operands):
    """float64 operands and accumulator; one FMA per k (module docstring)."""

    acc_dtype = np.float64
    canonical_nan = False

    @classmethod
    def check_config(cls, cfg):
        """One product at a time (``block`` 1), fp64 inputs and the one output (fp64, RNE)."""
        if cfg.block != 1 or cfg.inputs != ("fp64",) or \
                cfg.outputs != (("fp64", "rne_fp64", None),):
            raise ValueError(f"an FP64 FMA configuration has block 1, inputs ('fp64',) and "
                             f"outputs (('fp64', 'rne_fp64', None),); got block {cfg.block}, "
                             f"inputs {cfg.inputs}, outputs {cfg.outputs}")

    def chain(self, acc, k0, k1):
        fma64_chain(self.a, self.b, acc, self.ia, self.ib, k0, k1)
