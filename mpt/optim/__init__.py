"""L4: optimizers with FP32 state (SGD, Adam, AdamW in PyTorch's operation order, master weights,
a fused step) and gradient clipping."""
from mpt.optim.algorithms import SGD, Adam, AdamW
from mpt.optim.clip import clip_grad_norm_
from mpt.optim.optimizer import CopyDownStats, Optimizer

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "CopyDownStats", "clip_grad_norm_"]
