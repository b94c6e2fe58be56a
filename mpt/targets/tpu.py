"""L1: Google TPUs as a target: bf16 GEMMs on the MXU (one pass of an assumed inner model), f32
GEMMs as XLA compiles a TPU f32 dot at JAX's default precision (one bf16 pass: the ``tpu``
model's fp32 configuration, run by ``mpt.gemm``), and the TPU's f32→bf16 conversion, which
flushes subnormals (cloud.google.com/tpu/docs/bfloat16, "Format conversion details"). TPUs of
this generation have no fp16 or FP8 matrix path in mpt's model."""
from __future__ import annotations

from mpt.engines.model import Assumption
from mpt.targets.target import Conversions, Target, register_target

__all__ = ["TARGET"]

TARGET = register_target(Target(
    "tpu", "Google", "Google TPU (v5e and later: bf16 MXU, FP32 accumulation; f32 dots as XLA's "
    "bf16 pass algorithms, JAX precision='default' = one pass)",
    (("fp32", "tpu"), ("bf16", "tpu")), None,
    Conversions(flush_subnormals=("bf16",), evidence="documented",
                modes=("nearest_even",), assumptions=(
                    Assumption("bf16_flush", ("result", "input"), "which side of an f32->bf16 "
                               "convert the flush applies to: the rounded result (inputs just "
                               "below 2^-126 round up to it) or the input (DAZ)"),)),
    ("tpu-v5e",),
    ("Google Cloud TPU docs, 'The bfloat16 numerical format' (conversion rules)",
     "JAX jax.lax.Precision and DotAlgorithmPreset docs (passes per precision)",
     "openxla/xla dot_algorithm_rewriter.cc and the Triton lowering (pass algorithms)")))
