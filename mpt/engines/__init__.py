"""L1: matrix engines — the MMA models of every accelerator mpt emulates, and the GEMM around them.

``mpt.mma(a, b, c, model=...)`` runs one model's instructions bit for bit; ``mpt.gemm`` adds the
software around them (split-K, promotion, scales, epilogue; for the TPU, XLA's pass algorithms
of an f32 dot). Models are data (:class:`MMAModel`, one :class:`MMAConfig` per family of input
formats) in a registry; each arithmetic kind has an operand class (:mod:`mpt.engines.operands`).
Vendor modules register their models when this package is imported: NVIDIA Tensor Cores
(:mod:`mpt.engines.nvidia`), the IEEE and exact models (:mod:`mpt.engines.ieee`), AMD Matrix
Cores (:mod:`mpt.engines.amd`), Google's TPU (:mod:`mpt.engines.tpu`), Intel Gaudi
(:mod:`mpt.engines.gaudi`) and AWS Trainium (:mod:`mpt.engines.trainium`).
"""
from mpt.engines import nvidia, ieee, amd  # noqa: F401  (register their models, in this order)
from mpt.engines import tpu, gaudi, trainium  # noqa: F401  (then the other vendors')
from mpt.engines.gemm import Scale, gemm, mma
from mpt.engines.model import (EVIDENCE, Assumption, MMAConfig, MMAModel, get_mma_model,
                               load_model, mma_models, models_table_rows, register_model)
from mpt.engines.operands import Operands, register_kind

__all__ = ["mma", "gemm", "Scale", "MMAModel", "MMAConfig", "Assumption", "EVIDENCE",
           "mma_models", "get_mma_model", "register_model", "load_model", "Operands",
           "register_kind", "models_table_rows"]
