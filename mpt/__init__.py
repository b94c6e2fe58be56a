"""mpt: every rounding of mixed-precision training, explicit and bit-exact on a CPU.

The public API is re-exported here; no logic lives in this file.
"""
from mpt._version import __version__

from mpt.formats import FORMATS, Format, RoundingMode, custom_format, get_format
# L1 rounding: every conversion to a format (`mpt.round` shadows the builtin inside mpt only)
from mpt.rounding import decode, round
# L1 Tensor Core models and the GEMM around them (mpt.mma: `mpt.mma` is the function)
from mpt.engines import MMAConfig, MMAModel, gemm, get_mma_model, mma, mma_models
# L2-L3 autograd-core: tensors, functions, ops, autocast
from mpt.tensor import Tensor, enable_grad, is_grad_enabled, no_grad, set_grad_enabled, tensor
from mpt.function import Function
from mpt import functional
from mpt.autocast import (AutocastState, autocast, autocast_policy, autocast_state, matmul_model,
                          register_autocast, replay_autocast)
from mpt.functional import get_rng_state, manual_seed, set_rng_state
# L3-L4 nn: module-level cast policies (mpt.nn is a submodule: `from mpt import nn`)
from mpt.policy import Policy, get_policy
# L4 quant: fake quantization, observers, QAT and the integer model, NF4 (mpt.quant, mpt.lora)
from mpt import lora, quant
from mpt.quant import (FakeQuantize, fake_quantize_learnable_per_tensor_affine,
                       fake_quantize_per_channel_affine, fake_quantize_per_tensor_affine)
# L4 optim: optimizers with FP32 state, loss scaling, FP8 scaling (submodules optim, amp, fp8)
from mpt import amp, fp8, optim
from mpt.amp import GradScaler, StaticLossScale
# L2/L4 attention & memory: the memory ledger (mpt.memory), gradient checkpointing; the flash
# backend is mpt.functional.scaled_dot_product_attention(..., backend="flash")
from mpt import memory
from mpt.memory import MemoryLedger
from mpt.checkpoint import checkpoint, checkpoint_sequential
# L4-L5 training: recipes, TF32/FP8 Linear layers, the trainer, checkpoints, diagnostics, study
from mpt import diagnostics, linears, recipes, study, train_state, training
from mpt.recipes import Recipe, get_recipe
from mpt.training import TrainConfig, Trainer
from mpt.train_state import load_checkpoint, save_checkpoint

__all__ = [
    "__version__",
    # L0 formats
    "FORMATS", "Format", "RoundingMode", "custom_format", "get_format",
    # L1 rounding
    "round", "decode",
    # L1 Tensor Core models
    "mma", "gemm", "mma_models", "get_mma_model", "MMAModel", "MMAConfig",
    # L2-L3 autograd-core
    "Tensor", "tensor", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "Function",
    "functional", "autocast", "matmul_model", "autocast_state", "replay_autocast", "AutocastState",
    "register_autocast", "autocast_policy", "manual_seed", "get_rng_state", "set_rng_state",
    # L3-L4 nn
    "Policy", "get_policy",
    # L4 quant
    "quant", "lora", "FakeQuantize", "fake_quantize_per_tensor_affine",
    "fake_quantize_per_channel_affine", "fake_quantize_learnable_per_tensor_affine",
    # L4 optim
    "optim", "amp", "fp8", "GradScaler", "StaticLossScale",
    # L2/L4 attention & memory
    "memory", "MemoryLedger", "checkpoint", "checkpoint_sequential",
    # L4-L5 training
    "recipes", "linears", "training", "train_state", "diagnostics", "study", "Recipe",
    "get_recipe", "Trainer", "TrainConfig", "save_checkpoint", "load_checkpoint",
]
