"""L4: automatic mixed precision — loss scaling (:mod:`~mpt.amp.scaler`), FP8 scaling
(:mod:`~mpt.amp.fp8`), the TF32/FP8 linear layers as GEMM plans (:mod:`~mpt.amp.linear`) and the
named training recipes (:mod:`~mpt.amp.recipes`)."""
from mpt.amp import fp8, linear, recipes
from mpt.amp.scaler import (GradScaler, LossScaler, ScaleRecord, ScalerUsageError,
                             StaticLossScale)

__all__ = ["LossScaler", "GradScaler", "StaticLossScale", "ScaleRecord", "ScalerUsageError",
           "fp8", "linear", "recipes"]
