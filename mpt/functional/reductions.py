"""Reductions: sum, mean, var, max.

Precision contract: the input is decoded exactly to the work dtype (float32; float64 in fp64 mode)
and accumulated there in a fixed order — for each output element a sequential sum over the
reduced elements in row-major order of the reduced axes (``mpt.kernels.ops.sum_anb``), the same
for any thread count — then rounded once (RNE) to the output format (the input's; under autocast
``sum`` is an fp32-output reduction). Oracle: ``np.cumsum(..., dtype=work)`` (sequential) and
float64 sums; gradients by central differences in fp64 mode.
"""
from __future__ import annotations

import math

import numpy as np

from mpt._checks import check_bool, check_real
from mpt.autograd.function import Function
from mpt.autograd.tensor import opmath, round_to
from mpt.functional._common import check_tensor, normalize_dim, sum_axes, work_dtype
from mpt.functional.autocast import autocast_op

__all__ = ["sum", "mean", "var", "max"]


def _axes(dim, ndim: int, op: str) -> tuple:
    """``dim`` (None, int or sequence of ints) as a sorted tuple of axes (None: all)."""
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    axes = tuple(sorted({normalize_dim(d, ndim, op) for d in dims}))
    if len(axes) != len(dims):
        raise ValueError(f"{op}: dim {dim} repeats an axis")
    return axes


def _kept_shape(shape: tuple, axes: tuple) -> tuple:
    """``shape`` with the reduced axes set to 1 (keepdim layout)."""
    return tuple(1 if i in axes else n for i, n in enumerate(shape))


def _count(shape: tuple, axes: tuple) -> int:
    return math.prod([shape[i] for i in axes])


def _expand(g: np.ndarray, shape: tuple, axes: tuple) -> np.ndarray:
    """A reduced gradient broadcast back to the input's shape (a read-only view)."""
    return np.broadcast_to(g.reshape(_kept_shape(shape, axes)), shape)


class Sum(Function):
    @staticmethod
    def forward(ctx, x, fmt, axes, keepdim):
        ctx.out_format = fmt
        ctx.shape, ctx.axes = x.shape, axes
        s = sum_axes(opmath(x), axes)
        return round_to(s.reshape(_kept_shape(x.shape, axes)) if keepdim else s, fmt)

    @staticmethod
    def backward(ctx, g):
        return _expand(g, ctx.shape, ctx.axes), None, None, None


class Mean(Function):
    @staticmethod
    def forward(ctx, x, fmt, axes, keepdim):
        work = work_dtype(fmt)
        n = _count(x.shape, axes)
        ctx.out_format = fmt
        ctx.shape, ctx.axes, ctx.n = x.shape, axes, n
        with np.errstate(invalid="ignore", divide="ignore"):
            factor = work(1) / work(n)  # PyTorch's CUDA MeanOps: sum · f32(1/n)
            s = sum_axes(opmath(x), axes) * factor      # n = 0: 0·inf = NaN, as PyTorch
        return round_to(s.reshape(_kept_shape(x.shape, axes)) if keepdim else s, fmt)

    @staticmethod
    def backward(ctx, g):  # PyTorch's mean_backward: g / n
        work = work_dtype(ctx.out_format)
        with np.errstate(invalid="ignore", divide="ignore"):
            gx = opmath(g) / work(ctx.n)
        return _expand(gx, ctx.shape, ctx.axes), None, None, None


class Var(Function):
    @staticmethod
    def forward(ctx, x, fmt, axes, correction, keepdim):
        work = work_dtype(fmt)
        n = _count(x.shape, axes)
        xw = opmath(x)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            mean = (sum_axes(xw, axes) * (work(1) / work(n))).reshape(_kept_shape(x.shape, axes))
            d = xw - mean
            # divided by max(n − c, 0)
            v = sum_axes(d * d, axes) / work(n - correction if n > correction else 0)
        ctx.out_format = fmt
        ctx.c = work(2.0 / (n - correction)) if n > correction else work(np.inf)
        ctx.shape, ctx.axes = x.shape, axes
        ctx.save_for_backward(d)
        return round_to(v.reshape(_kept_shape(x.shape, axes)) if keepdim else v, fmt)

    @staticmethod
    def backward(ctx, g):  # PyTorch's var_backward: (2/(n − correction) · g) · (x − mean)
        (d,) = ctx.saved
        g = opmath(g).reshape(_kept_shape(ctx.shape, ctx.axes))
        with np.errstate(invalid="ignore", over="ignore"):
            return (ctx.c * g) * d, None, None, None, None


class Max(Function):
    @staticmethod
    def forward(ctx, x, fmt, axis, keepdim):
        ctx.out_format = fmt
        ctx.shape, ctx.axis, ctx.keepdim = x.shape, axis, keepdim
        xw = opmath(x)
        if axis is None:
            ctx.index = int(np.argmax(xw))
            return round_to(np.asarray(xw.reshape(-1)[ctx.index]), fmt)
        ctx.index = np.expand_dims(np.argmax(xw, axis=axis), axis)
        out = np.take_along_axis(xw, ctx.index, axis)
        return round_to(out if keepdim else out.squeeze(axis), fmt)

    @staticmethod
    def backward(ctx, g):  # the gradient goes to the first maximal element
        g = opmath(g)
        gx = np.zeros(ctx.shape, g.dtype)
        if ctx.axis is None:
            gx.reshape(-1)[ctx.index] = g
        else:
            np.put_along_axis(gx, ctx.index, g if ctx.keepdim else np.expand_dims(g, ctx.axis),
                              ctx.axis)
        return gx, None, None, None


@autocast_op("fp32_output")
def sum(input, dim=None, keepdim: bool = False):
    """Σ over ``dim`` (None: all), accumulated in the work dtype in the fixed order of the module
    docstring, rounded once to the format. Autocast: fp32 output. Backward: g broadcast."""
    check_tensor(input, "input", "sum")
    return Sum.apply(input, input.format, _axes(dim, input.ndim, "sum"),
                     check_bool("sum: keepdim", keepdim))


@autocast_op("passthrough")
def mean(input, dim=None, keepdim: bool = False):
    """Mean over ``dim``: the fixed-order sum times ``f32(1/n)`` (PyTorch's CUDA ``MeanOps``),
    rounded once to the format. Backward ``g / n`` broadcast."""
    check_tensor(input, "input", "mean")
    return Mean.apply(input, input.format, _axes(dim, input.ndim, "mean"),
                      check_bool("mean: keepdim", keepdim))


@autocast_op("passthrough")
def var(input, dim=None, *, correction: int = 1, keepdim: bool = False):
    """Variance over ``dim``, two passes in the work dtype: ``mean = Σx·f32(1/n)``,
    ``Σ(x − mean)²`` (fixed order) divided by ``max(n − correction, 0)``, as PyTorch's divisor:
    with ``correction >= n`` the result is ``+inf`` (or NaN where every deviation is 0, 0/0),
    never a negative variance; rounded once to the format. (PyTorch's GPU kernels use Welford's
    update, whose bits differ.) Backward ``(f32(2/(n − correction))·g)·(x − mean)``, with the
    factor ``+inf`` when ``correction >= n``. ``correction``: a finite real (PyTorch's Scalar)."""
    check_tensor(input, "input", "var")
    correction = check_real("var: correction", correction)
    return Var.apply(input, input.format, _axes(dim, input.ndim, "var"), correction,
                     check_bool("var: keepdim", keepdim))


@autocast_op("passthrough")
def max(input, dim=None, keepdim: bool = False):
    """Maximum over all elements (``dim=None``) or along ``dim`` — the values only (exact; NaN
    propagates). Backward: g to the first maximal element."""
    check_tensor(input, "input", "max")
    if input.size == 0:
        raise ValueError("max: input has no elements")
    axis = None if dim is None else normalize_dim(dim, input.ndim, "max")
    return Max.apply(input, input.format, axis, check_bool("max: keepdim", keepdim))
