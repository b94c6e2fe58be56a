"""L2: autograd — tensors stored in their format (:mod:`~mpt.autograd.tensor`), differentiable
Functions (:mod:`~mpt.autograd.function`), the thread-local context every op reads
(:mod:`~mpt.autograd.context`), autograd hooks (:mod:`~mpt.autograd.hooks`) and the memory ledger
that observes them (:mod:`~mpt.autograd.memory`)."""
from mpt.autograd.function import Function
from mpt.autograd.memory import MemoryLedger
from mpt.autograd.tensor import (Tensor, enable_grad, is_grad_enabled, no_grad, set_grad_enabled,
                                 tensor)

__all__ = ["Tensor", "tensor", "Function", "no_grad", "enable_grad", "set_grad_enabled",
           "is_grad_enabled", "MemoryLedger"]
