"""Losses: cross_entropy (fused log-softmax + NLL), nll_loss, mse_loss.

Precision contract: the work dtype is float32 (float64 in fp64 mode); under autocast all three
are "fp32" ops (inputs cast up). Per-row losses ``−logp_t·w_t`` are summed sequentially in row
order; ``reduction="mean"`` divides by the (sequential) sum of the weights of non-ignored rows —
the count of non-ignored rows without ``weight`` — with one IEEE division, as PyTorch's
``nll_loss``; all rows ignored gives NaN (0/0), as PyTorch. The result is rounded once to the
input's format. ``cross_entropy`` is bit-identical, forward and backward, to
``nll_loss(log_softmax(x))`` (tested). Oracle: ``mpt.reference.ops.cross_entropy``.
"""
from __future__ import annotations

import numpy as np

from mpt.autograd.function import Function
from mpt.autograd.tensor import opmath, round_to
from mpt.functional._common import (as_index_array, as_rows, check_tensor, common_format, sum_axes,
                                    work_dtype)
from mpt.functional.autocast import autocast_op
from mpt.kernels import readonly
from mpt.kernels.ops import cross_entropy_backward_rows, cross_entropy_rows

__all__ = ["cross_entropy", "nll_loss", "mse_loss"]

_REDUCTIONS = ("mean", "sum", "none")


def _class_rows(input, target, op: str):
    """(rows (R, C) work-dtype array moves, flat targets (R,), the shape of per-row results)."""
    check_tensor(input, "input", op)
    t = as_index_array(target, "target", op)
    if input.ndim == 1:
        batch = ()
    elif input.ndim >= 2:
        batch = (input.shape[0],) + input.shape[2:]
    else:
        raise ValueError(f"{op}: input must have a class dimension; got shape {input.shape}")
    if t.shape != batch:
        raise ValueError(f"{op}: target must have shape {batch} for input {input.shape}; "
                         f"got {t.shape}")
    return t.reshape(-1), batch


def _to_rows(x: np.ndarray) -> np.ndarray:
    """(C,) / (N, C) / (N, C, d1, …) → C-contiguous (R, C) with the class dimension last."""
    if x.ndim == 1:
        return x.reshape(1, -1)
    return as_rows(np.moveaxis(x, 1, -1))


def _from_rows(y: np.ndarray, shape: tuple) -> np.ndarray:
    if len(shape) == 1:
        return y.reshape(shape)
    moved = (shape[0],) + shape[2:] + (shape[1],)
    return np.moveaxis(y.reshape(moved), -1, 1)


def _row_weights(weight, t, work, valid):
    """w_t per row (0 for ignored rows); None when there are no class weights."""
    if weight is None:
        return None
    w = np.zeros(t.shape, work)
    w[valid] = opmath(weight)[t[valid]]
    return w


def _reduce(loss_rows, wt, valid, reduction, work):
    """(loss array, total weight) for a reduction; the loss is un-rounded work dtype."""
    if reduction == "none":
        return loss_rows, None
    total = sum_axes(loss_rows, (0,))
    if reduction == "sum":
        return total, None
    tw = sum_axes(wt, (0,)) if wt is not None else np.asarray(valid.sum(), work)
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / tw, tw


def _logp_grad(g, ctx):
    """Per-row gradient of the loss w.r.t. logp_t (PyTorch's nll_loss backward):
    mean ``w_t·(−(g/tw))``, sum ``w_t·(−g)``, none ``w_t·(−g_r)``; 0 on ignored rows."""
    g = opmath(g).astype(ctx.work, copy=False)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        gl = -(g / ctx.tw) if ctx.reduction == "mean" else -g
    gl = np.broadcast_to(gl.reshape(-1) if gl.ndim else gl, ctx.valid.shape)
    gl = np.where(ctx.valid, gl, ctx.work(0))
    return gl if ctx.wt is None else ctx.wt * gl


class _NLLBase(Function):
    @staticmethod
    def setup(ctx, fmt, t, weight, ignore_index, reduction, batch):
        ctx.work = work_dtype(fmt)
        ctx.valid = t != ignore_index
        ctx.wt = _row_weights(weight, t, ctx.work, ctx.valid)
        ctx.reduction, ctx.batch, ctx.out_format = reduction, batch, fmt

    @staticmethod
    def finish(ctx, logpt):
        loss = -logpt if ctx.wt is None else -logpt * ctx.wt
        loss = np.where(ctx.valid, loss, ctx.work(0))
        out, ctx.tw = _reduce(loss, ctx.wt, ctx.valid, ctx.reduction, ctx.work)
        if ctx.reduction == "none":
            out = out.reshape(ctx.batch)
        return round_to(out, ctx.out_format)


class NLLLoss(_NLLBase):
    @staticmethod
    def forward(ctx, x, weight, t, fmt, ignore_index, reduction, batch):
        _NLLBase.setup(ctx, fmt, t, weight, ignore_index, reduction, batch)
        rows = _to_rows(opmath(x))
        if np.any(ctx.valid & ((t < 0) | (t >= rows.shape[1]))):
            raise IndexError(f"nll_loss: a target is outside [0, {rows.shape[1]})")
        logpt = np.zeros(t.shape, ctx.work)
        logpt[ctx.valid] = rows[np.flatnonzero(ctx.valid), t[ctx.valid]]
        ctx.shape, ctx.t = x.shape, t
        return _NLLBase.finish(ctx, logpt)

    @staticmethod
    def backward(ctx, g):
        gl = _logp_grad(g, ctx)
        rows = np.zeros((ctx.t.size, ctx.shape[1] if len(ctx.shape) > 1 else ctx.shape[0]),
                        ctx.work)
        r = np.flatnonzero(ctx.valid)
        rows[r, ctx.t[r]] = gl[r]
        return _from_rows(rows, ctx.shape), None, None, None, None, None, None


class CrossEntropy(_NLLBase):
    @staticmethod
    def forward(ctx, x, weight, t, fmt, ignore_index, reduction, batch):
        _NLLBase.setup(ctx, fmt, t, weight, ignore_index, reduction, batch)
        rows = readonly(_to_rows(opmath(x)))    # (a view of x, or a copy: one kernel type)
        with np.errstate(invalid="ignore"):
            logpt, m, lse = cross_entropy_rows(rows, t, ignore_index)
        ctx.shape, ctx.t = x.shape, t
        ctx.save_for_backward(rows, m, lse)
        return _NLLBase.finish(ctx, logpt)

    @staticmethod
    def backward(ctx, g):
        rows, m, lse = ctx.saved
        gl = np.ascontiguousarray(_logp_grad(g, ctx))
        with np.errstate(invalid="ignore", over="ignore"):
            gx = cross_entropy_backward_rows(rows, ctx.t, m, lse, gl)
        return _from_rows(gx, ctx.shape), None, None, None, None, None, None


def _check_common(input, weight, reduction, op):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}; got {reduction!r}")
    n_classes = input.shape[1] if input.ndim > 1 else input.shape[0]
    if weight is not None:
        check_tensor(weight, "weight", op)
        if weight.shape != (n_classes,):
            raise ValueError(f"{op}: weight must have shape ({n_classes},); got {weight.shape}")
    return common_format(op, input=input, weight=weight)


@autocast_op("fp32")
def cross_entropy(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean"):
    """Cross-entropy of logits ``input`` ((C,), (N, C) or (N, C, d1, …)) against class indices
    ``target``: per row ``logp_t = (x_t − m) − log Σ exp(x_j − m)`` exactly as
    :func:`~mpt.functional.log_softmax` computes it, then :func:`nll_loss`'s reduction.
    Backward: the log-softmax backward of nll_loss's gradient, in one pass (bit-identical to the
    composition). Autocast: fp32. (``label_smoothing`` is not offered.)"""
    t, batch = _class_rows(input, target, "cross_entropy")
    fmt = _check_common(input, weight, reduction, "cross_entropy")
    return CrossEntropy.apply(input, weight, t, fmt, int(ignore_index), reduction, batch)


@autocast_op("fp32")
def nll_loss(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean"):
    """Negative log-likelihood of log-probabilities ``input`` at ``target``: per row
    ``−logp_t·w_t`` (0 for ``ignore_index``), reduced as in the module docstring. Backward
    (PyTorch's): ``w_t·(−(g/Σw))`` (mean) at the target, 0 elsewhere. Autocast: fp32."""
    t, batch = _class_rows(input, target, "nll_loss")
    fmt = _check_common(input, weight, reduction, "nll_loss")
    return NLLLoss.apply(input, weight, t, fmt, int(ignore_index), reduction, batch)


class MSELoss(Function):
    @staticmethod
    def forward(ctx, x, y, fmt, reduction):
        work = work_dtype(fmt)
        with np.errstate(over="ignore", invalid="ignore"):
            d = opmath(x) - opmath(y)
            sq = d * d
            if reduction == "none":
                out = sq
            else:
                out = sum_axes(sq, tuple(range(sq.ndim)))
                if reduction == "mean":
                    out = out * (work(1) / work(sq.size))  # as mean(): Σ·f32(1/n)
        ctx.out_format, ctx.d, ctx.reduction = fmt, d, reduction
        ctx.norm = work(2.0 / sq.size if reduction == "mean" else 2.0)
        return round_to(out, fmt)

    @staticmethod
    def backward(ctx, g):  # PyTorch's mse_backward: (f32(norm)·(x − y))·g
        with np.errstate(over="ignore", invalid="ignore"):
            gx = (ctx.norm * ctx.d) * opmath(g)
        need_x, need_y = ctx.needs_input_grad[:2]
        return gx if need_x else None, -gx if need_y else None, None, None


@autocast_op("fp32")
def mse_loss(input, target, reduction: str = "mean"):
    """Mean squared error: ``d = x − y``, ``d·d`` in the work dtype; "mean" is the sequential sum
    times ``f32(1/n)`` (as :func:`mean`), "sum" the sum; rounded once to the format. Backward
    ``(f32(2/n)·d)·g`` (PyTorch's order; ``2`` for "sum"). Autocast: fp32."""
    check_tensor(input, "input", "mse_loss")
    check_tensor(target, "target", "mse_loss")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"mse_loss: reduction must be one of {_REDUCTIONS}; got {reduction!r}")
    if input.shape != target.shape:
        raise ValueError(f"mse_loss: input {input.shape} and target {target.shape} must have "
                         "the same shape")
    fmt = common_format("mse_loss", input=input, target=target)
    return MSELoss.apply(input, target, fmt, reduction)
