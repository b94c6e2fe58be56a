"""L4: gradient checkpointing (Chen et al. 2016; ``torch.utils.checkpoint``) — keep a segment's
inputs, drop its activations, recompute them in the backward pass.

``checkpoint(fn, *args)`` takes a snapshot of the thread's context (:mod:`mpt.autograd.context`:
grad mode, the autocast region and its matmul model, the cast policies of the running modules,
the dropout generator, the autograd hooks), runs ``fn`` under ``no_grad`` and records one node
that keeps only ``args``. When the backward reaches it, the node

1. replays the snapshot — every op of the recomputation sees the state of the forward (a fresh
   cast cache; with ``preserve_rng_state=False`` the dropout generator is left as it is) — and
   afterwards puts back every state as it was (the RNG stream of the rest of the run is not
   disturbed: the forward already advanced it exactly as an un-checkpointed forward would);
2. reruns ``fn`` on detached copies of ``args`` with grad mode on and backpropagates the
   incoming gradient through the recomputed graph, which is then freed.

Every op thus recomputes the same bits, and the gradient of each tensor inside the segment is
summed in the same order as without checkpointing (the engine visits the recomputed nodes in the
same relative order). The node returns the gradients of ``args`` and, when ``fn`` is a
:class:`~mpt.nn.Module`, those of its parameters (so the outer engine accumulates them as it would
without checkpointing, and a segment whose only trainable tensors are parameters — frozen
embeddings with LoRA adapters — still records its node). Hence checkpointed and plain training
give **bit-identical** gradients, dropout and autocast included — exceptions: a parameter used
more than once inside a segment *and* also outside it gets the segment's contributions summed
before they join the others (a different order), and tensors captured by a plain function (not a
Module, not an argument) receive their gradients from the inner backward directly.
``fn`` must return one Tensor.
"""
from __future__ import annotations

import math

from mpt._checks import check_int
from mpt.autograd import context
from mpt.autograd.function import Function
from mpt.autograd.tensor import Tensor, enable_grad, is_grad_enabled, no_grad
from mpt.functional.rng import RNG

__all__ = ["checkpoint", "checkpoint_sequential", "segment_sizes"]


class _Run:
    """What a checkpoint node needs to recompute: fn, its arguments, the forward's context."""

    def __init__(self, fn, args, params, preserve_rng_state):
        self.fn, self.args, self.params = fn, args, params
        self.context = context.snapshot()
        self.skip = () if preserve_rng_state else (RNG.name,)


class _Checkpoint(Function):
    @staticmethod
    def forward(ctx, run, *arrays):
        with no_grad():
            out = run.fn(*run.args)
        if not isinstance(out, Tensor):
            raise TypeError(f"checkpoint: fn must return one Tensor; got {type(out).__name__}")
        ctx.run, ctx.out_format = run, out.format
        ctx.save_for_backward(*(a.data for a in run.args if isinstance(a, Tensor)))
        return out.data

    @staticmethod
    def backward(ctx, g):
        run = ctx.run
        ctx.saved  # noqa: B018  (raises if the graph was freed or an input changed in place)
        inputs = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, Tensor) else a
                  for a in run.args]
        stashed = [p.grad for p in run.params]
        for p in run.params:
            p.grad = None
        with context.replay(run.context, skip=run.skip), enable_grad():
            out = run.fn(*inputs)
        if out.requires_grad:
            out.backward(Tensor(g, out.format))
        input_grads = [t.grad.data if isinstance(t, Tensor) and t.requires_grad and
                       t.grad is not None else None for t in inputs]
        param_grads = [None if p.grad is None else p.grad.data for p in run.params]
        for p, old in zip(run.params, stashed):
            p.grad = old
        return (None, *[g for a, g in zip(run.args, input_grads) if isinstance(a, Tensor)],
                *param_grads)


def checkpoint(fn, *args, preserve_rng_state: bool = True) -> Tensor:
    """``fn(*args)`` without keeping its activations: recomputed in the backward pass in the
    forward's context (module docstring). Outside grad mode, or
    when nothing requires grad, this is just ``fn(*args)``."""
    if not callable(fn):
        raise TypeError(f"checkpoint: fn must be callable; got {type(fn).__name__}")
    params = [p for p in fn.parameters() if p.requires_grad] if hasattr(fn, "parameters") else []
    tensors = [a for a in args if isinstance(a, Tensor)]
    if not is_grad_enabled() or not any(t.requires_grad for t in tensors + params):
        return fn(*args)
    run = _Run(fn, args, params, preserve_rng_state)
    return _Checkpoint.apply(run, *tensors, *params)


def segment_sizes(n: int, segments: int) -> list:
    """``n`` modules in ``segments`` consecutive runs as equal as possible (the first ones take
    the extra module): 8 in 3 -> [3, 3, 2]."""
    segments = min(check_int("segments", segments, min=1), max(n, 1))
    return [n // segments + (i < n % segments) for i in range(segments)]


class _Segment:
    """Modules run one after the other; its parameters are theirs (for the checkpoint node)."""

    def __init__(self, modules):
        self.modules = modules

    def __call__(self, x):
        for m in self.modules:
            x = m(x)
        return x

    def parameters(self):
        seen = set()
        for m in self.modules:
            for p in (m.parameters() if hasattr(m, "parameters") else ()):
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p


def checkpoint_sequential(modules, segments: int, x, *, preserve_rng_state: bool = True):
    """Run ``modules`` (a Sequential, ModuleList or list of callables) on ``x`` in ``segments``
    consecutive segments (:func:`segment_sizes`), each through :func:`checkpoint`: only the
    segment inputs are kept, and one segment's activations exist at a time during the backward.
    (``torch.utils.checkpoint.checkpoint_sequential`` runs its last segment without
    checkpointing; here every segment is checkpointed.) ``segments="sqrt"`` takes
    round(√n)."""
    modules = list(modules)
    if segments == "sqrt":
        segments = max(1, round(math.sqrt(len(modules))))
    start = 0
    for size in segment_sizes(len(modules), segments):
        x = checkpoint(_Segment(modules[start:start + size]), x,
                       preserve_rng_state=preserve_rng_state)
        start += size
    return x
