"""mpt: every rounding of mixed-precision training, explicit and bit-exact on a CPU.

The public API is re-exported here; no logic lives in this file. The package is grouped by area
and layer (docs/design.md): formats and rounding (L0–L1), ``kernels``/``reference``/``engines``/
``targets`` (L1), ``autograd`` (L2), ``functional`` (L3), ``nn``/``optim``/``amp``/``quant``
(L4), ``train``/``study``/``golden``/``planning``/``testing``/``cli`` (L5).
"""
from mpt._version import __version__

from mpt import _compat
from mpt.formats import FORMATS, Format, RoundingMode, custom_format, get_format
from mpt import tasks  # L0: independent tasks, serially or on Dask (study grids, golden, sweeps)
from mpt import runtime  # L0: retain_freed_memory, a process setting for speed
# L1 rounding: every conversion to a format (`mpt.round` shadows the builtin inside mpt only)
from mpt.rounding import decode, round
# L1 matrix engines: MMA models of every accelerator and the GEMM around them; hardware targets
from mpt.engines import Assumption, MMAConfig, MMAModel, gemm, get_mma_model, mma, mma_models
from mpt import targets
from mpt.targets import Target, get_target
# L2 autograd: tensors in their format, Functions, the memory ledger
from mpt import autograd
from mpt.autograd import memory
from mpt.autograd.function import Function
from mpt.autograd.memory import MemoryLedger
from mpt.autograd.tensor import (Tensor, enable_grad, is_grad_enabled, no_grad, set_grad_enabled,
                                 tensor)
# L3 functional: ops, autocast by cast category, the dropout generator, GEMM plans
from mpt import functional
from mpt.functional.autocast import (AutocastState, autocast, autocast_categories, autocast_state,
                                     matmul_model, register_autocast, replay_autocast)
from mpt.functional.autocast import autocast_categories as autocast_policy  # the 0.1 name
from mpt.functional.gemm_plan import GemmPlan, GemmSpec, Quantization
from mpt.functional.rng import get_rng_state, manual_seed, set_rng_state
# L4 nn, optim, amp, quant (mpt.nn, mpt.optim, mpt.amp, mpt.quant are packages)
from mpt import amp, nn, optim, quant
from mpt.amp import fp8, linear, recipes
from mpt.amp import linear as linears  # the 0.1 name
from mpt.amp.recipes import Recipe, get_recipe, recipes_for
from mpt.amp.scaler import GradScaler, StaticLossScale
from mpt.nn.checkpoint import checkpoint, checkpoint_sequential
from mpt.nn.policy import Policy, get_policy
from mpt.quant import lora
from mpt.quant.fake_quant import (FakeQuantize, fake_quantize_learnable_per_tensor_affine,
                                  fake_quantize_per_channel_affine,
                                  fake_quantize_per_tensor_affine)
# L5 tools: training, checkpoints, diagnostics, the study (golden, planning, testing, cli are
# imported by name: `from mpt import golden`)
from mpt import study, train
from mpt.train import corpus, diagnostics, trainer
from mpt.train import state as train_state  # the 0.1 name
from mpt.train import trainer as training  # the 0.1 name
from mpt.train.state import load_checkpoint, save_checkpoint
from mpt.train.trainer import TrainConfig, Trainer

_compat.install()

__all__ = [
    "__version__",
    # L0 formats
    "FORMATS", "Format", "RoundingMode", "custom_format", "get_format", "tasks", "runtime",
    # L1 rounding
    "round", "decode",
    # L1 matrix engines and targets
    "mma", "gemm", "mma_models", "get_mma_model", "MMAModel", "MMAConfig", "Assumption",
    "targets", "Target", "get_target",
    # L2 autograd
    "autograd", "Tensor", "tensor", "no_grad", "enable_grad", "set_grad_enabled",
    "is_grad_enabled", "Function", "memory", "MemoryLedger",
    # L3 functional
    "functional", "autocast", "matmul_model", "autocast_state", "replay_autocast",
    "AutocastState", "register_autocast", "autocast_categories", "autocast_policy",
    "manual_seed", "get_rng_state", "set_rng_state", "GemmPlan", "GemmSpec", "Quantization",
    # L4 nn, quant, optim, amp
    "nn", "Policy", "get_policy", "checkpoint", "checkpoint_sequential",
    "quant", "lora", "FakeQuantize", "fake_quantize_per_tensor_affine",
    "fake_quantize_per_channel_affine", "fake_quantize_learnable_per_tensor_affine",
    "optim", "amp", "fp8", "linear", "linears", "recipes", "GradScaler", "StaticLossScale",
    "Recipe", "get_recipe", "recipes_for",
    # L5 training and the study
    "train", "trainer", "training", "train_state", "corpus", "diagnostics", "study", "Trainer",
    "TrainConfig", "save_checkpoint", "load_checkpoint",
]
