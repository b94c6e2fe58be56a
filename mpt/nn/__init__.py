"""L4: modules — ``Parameter``, ``Module``, the layers, attention, a small GPT, cast policies and
gradient checkpointing (PyTorch's ``torch.nn`` shape; every computation an ``mpt.functional`` op).

Submodules: :mod:`~mpt.nn.module` (Parameter, Module), :mod:`~mpt.nn.init` (reproducible
initialisation), :mod:`~mpt.nn.layers`, :mod:`~mpt.nn.attention`, :mod:`~mpt.nn.gpt`,
:mod:`~mpt.nn.policy` (jmp's precision policies), :mod:`~mpt.nn.checkpoint`.
"""
from mpt.nn.attention import (ATTENTION_BACKENDS, MultiheadAttention, TransformerBlock,
                              register_attention_backend)
from mpt.nn.checkpoint import checkpoint, checkpoint_sequential
from mpt.nn.gpt import GPT
from mpt.nn.init import gaussian, init_constant_, init_normal_, init_uniform_, uniform
from mpt.nn.layers import (MLP, Conv2d, Dropout, Embedding, LayerNorm, Linear, ModuleList,
                           RMSNorm, Sequential)
from mpt.nn.module import Module, Parameter
from mpt.nn.policy import Policy, get_policy

__all__ = [
    "Parameter", "Module", "Linear", "Conv2d", "LayerNorm", "RMSNorm", "Embedding", "Dropout",
    "Sequential", "ModuleList", "MLP", "MultiheadAttention", "TransformerBlock", "GPT",
    "gaussian", "uniform", "init_normal_", "init_uniform_", "init_constant_",
    "ATTENTION_BACKENDS", "register_attention_backend", "Policy", "get_policy", "checkpoint",
    "checkpoint_sequential",
]
