"""L4: automatic mixed precision — loss scaling (:mod:`~mpt.amp.scaler`), FP8 scaling
(:mod:`~mpt.amp.fp8`; Intel Neural Compressor's on Gaudi: :mod:`~mpt.amp.inc`), the TF32/FP8
linear layers as GEMM plans (:mod:`~mpt.amp.linear`) and the named training recipes
(:mod:`~mpt.amp.recipes`)."""
from mpt.amp import fp8, inc, linear, recipes
from mpt.amp.scaler import (GradScaler, LossScaler, ScaleRecord, ScalerUsageError,
                             StaticLossScale)

__all__ = ["LossScaler", "GradScaler", "StaticLossScale", "ScaleRecord", "ScalerUsageError",
           "fp8", "inc", "linear", "recipes"]
