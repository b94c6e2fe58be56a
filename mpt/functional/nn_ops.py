"""Neural-network ops: softmax, log_softmax, layer_norm, rms_norm, embedding, dropout.

Precision contract: inputs decoded exactly to the work dtype (float32; float64 in fp64 mode);
statistics and sums accumulate there sequentially in index order (one row per thread, see
``mpt.kernels.ops``); exp/log/1/sqrt are evaluated in float64 and rounded once to the work dtype;
the output is rounded once (RNE) to the format of the (autocast-cast) input. Oracles:
``mpt.reference.ops`` (float64) and central differences in fp64 mode.
"""
from __future__ import annotations

import math

import numpy as np

from mpt._checks import check_bool, check_real, renamed
from mpt.autograd.function import Function
from mpt.autograd.tensor import opmath, round_to
from mpt.formats import get_format
from mpt.functional._common import (as_index_array, as_rows, check_tensor, common_format,
                                    normalize_dim, sum_axes, work_dtype)
from mpt.functional.autocast import autocast_op
from mpt.functional.rng import next_stream
from mpt.kernels import readonly
from mpt.kernels.ops import (embedding_backward, layer_norm_backward_rows, layer_norm_rows,
                             log_softmax_backward_rows, rms_norm_backward_rows, rms_norm_rows,
                             softmax_backward_rows, softmax_rows)
from mpt.kernels.random import random_words

__all__ = ["softmax", "log_softmax", "layer_norm", "rms_norm", "embedding", "dropout",
           "dropout_mask"]


# ---- softmax -------------------------------------------------------------------------------------


def _rows(x: np.ndarray, axis: int) -> np.ndarray:
    """x (work dtype) with ``axis`` moved last, as a C-contiguous (R, N) array."""
    return as_rows(np.moveaxis(x, axis, -1))


def _unrows(y: np.ndarray, shape: tuple, axis: int) -> np.ndarray:
    moved = shape[:axis] + shape[axis + 1:] + (shape[axis],)
    return np.moveaxis(y.reshape(moved), -1, axis)


class Softmax(Function):
    @staticmethod
    def forward(ctx, x, fmt, axis, log):
        ctx.out_format, ctx.axis, ctx.log = fmt, axis, log
        with np.errstate(invalid="ignore"):
            y, _, _ = softmax_rows(_rows(opmath(x), axis), log)
        out = round_to(_unrows(y, x.shape, axis), fmt)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved
        kernel = log_softmax_backward_rows if ctx.log else softmax_backward_rows
        yw = _rows(opmath(y), ctx.axis)
        gw = _rows(opmath(g), ctx.axis).astype(yw.dtype, copy=False)
        return _unrows(kernel(yw, gw), y.shape, ctx.axis), None, None, None


def _softmax(input, dim, format, log: bool, name: str):
    check_tensor(input, "input", name)
    if format is not None:
        input = input.to(get_format(format))
    axis = normalize_dim(dim, input.ndim, name)
    if input.ndim == 0:
        input = input.reshape(1)
    out = Softmax.apply(input, input.format, axis, log)
    return out.reshape(()) if out.shape != input.shape else out


@autocast_op("fp32_output")
def softmax(input, dim: int = -1, format=None, *, dtype=None):
    """Softmax along ``dim`` (``format``: cast the input to it first; ``dtype`` is its PyTorch and
    mpt 0.1 name). Per row: ``m = max``,
    ``e_j = exp(x_j − m)`` (float64 exp, rounded), sequential ``s = Σ e_j``, ``y_j = e_j / s``
    in the work dtype, rounded once to the format. Backward: ``s' = Σ g_j·y_j`` (sequential),
    ``gx = y·(g − s')``. Autocast: computed and returned in fp32. Oracle:
    ``mpt.reference.ops.softmax``."""
    return _softmax(input, dim, renamed("format", format, "dtype", dtype), False, "softmax")


@autocast_op("fp32_output")
def log_softmax(input, dim: int = -1, format=None, *, dtype=None):
    """Log-softmax along ``dim`` (``format``/``dtype`` as :func:`softmax`): ``y_j = (x_j − m) −
    log(Σ e_j)`` (PyTorch's epilogue; log in float64, rounded). Backward ``gx = g − exp(y)·Σ g``
    (sequential Σ). Autocast: fp32 output."""
    return _softmax(input, dim, renamed("format", format, "dtype", dtype), True, "log_softmax")


# ---- layer norm and RMS norm ---------------------------------------------------------------------


def _norm_shape(input, normalized_shape, name: str) -> tuple:
    shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else \
        tuple(normalized_shape)
    if not shape or input.shape[input.ndim - len(shape):] != shape:
        raise ValueError(f"{name}: normalized_shape {shape} must equal the last dimensions of "
                         f"the input {input.shape}")
    return shape


def _affine(t, shape, name: str, arg: str):
    if t is None:
        return None
    check_tensor(t, arg, name)
    if t.shape != shape:
        raise ValueError(f"{name}: {arg} must have shape {shape}; got {t.shape}")
    return t


class LayerNorm(Function):
    @staticmethod
    def forward(ctx, x, w, b, fmt, n, eps):
        work = work_dtype(fmt)
        x2 = readonly(np.ascontiguousarray(opmath(x)).reshape(-1, n))
        ones, zeros = np.ones(n, work), np.zeros(n, work)
        ww = ones if w is None else opmath(w).reshape(n)
        bw = zeros if b is None else opmath(b).reshape(n)
        inv_n = work(1) / work(n)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            y, mean, rstd = layer_norm_rows(x2, ww, bw, inv_n, work(eps))
        ctx.out_format, ctx.n, ctx.inv_n = fmt, n, inv_n
        ctx.save_for_backward(x2, ww, mean, rstd)
        return round_to(y.reshape(x.shape), fmt)

    @staticmethod
    def backward(ctx, g):
        x2, ww, mean, rstd = ctx.saved
        g2 = np.ascontiguousarray(opmath(g), dtype=x2.dtype).reshape(-1, ctx.n)
        with np.errstate(invalid="ignore", over="ignore"):
            dx, gxh = layer_norm_backward_rows(x2, ww, g2, mean, rstd, ctx.inv_n)
        need_w, need_b = ctx.needs_input_grad[1:3]
        wshape = ctx.inputs[1].shape if need_w else None
        bshape = ctx.inputs[2].shape if need_b else None
        dw = sum_axes(gxh, (0,)).reshape(wshape) if need_w else None
        db = sum_axes(g2, (0,)).reshape(bshape) if need_b else None
        return dx.reshape(g.shape), dw, db, None, None, None


@autocast_op("fp32")
def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Layer norm over the last ``len(normalized_shape)`` dimensions, per row in the work dtype:
    two-pass ``mean = Σx·f32(1/n)``, ``var = Σ(x − mean)²·f32(1/n)`` (sequential sums; PyTorch's GPU
    kernels use Welford), ``rstd = 1/sqrt(var + eps)`` in float64 rounded once,
    ``y = ((x − mean)·rstd)·w + b``, rounded once to the format. Backward:
    ``dx = rstd·((g·w − m1) − x̂·m2)`` with row means m1, m2 of ``g·w`` and ``g·w·x̂``; dw, db are
    sequential sums over rows.
    Autocast: fp32. Oracle: ``mpt.reference.ops.layer_norm``."""
    check_tensor(input, "input", "layer_norm")
    shape = _norm_shape(input, normalized_shape, "layer_norm")
    weight = _affine(weight, shape, "layer_norm", "weight")
    bias = _affine(bias, shape, "layer_norm", "bias")
    fmt = common_format("layer_norm", input=input, weight=weight, bias=bias)
    eps = check_real("layer_norm: eps", eps, min=0)
    return LayerNorm.apply(input, weight, bias, fmt, math.prod(shape), eps)


class RMSNorm(Function):
    @staticmethod
    def forward(ctx, x, w, fmt, n, eps):
        work = work_dtype(fmt)
        x2 = readonly(np.ascontiguousarray(opmath(x)).reshape(-1, n))
        ww = np.ones(n, work) if w is None else opmath(w).reshape(n)
        inv_n = work(1) / work(n)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            y, rstd = rms_norm_rows(x2, ww, inv_n, work(eps))
        ctx.out_format, ctx.n, ctx.inv_n = fmt, n, inv_n
        ctx.save_for_backward(x2, ww, rstd)
        return round_to(y.reshape(x.shape), fmt)

    @staticmethod
    def backward(ctx, g):
        x2, ww, rstd = ctx.saved
        g2 = np.ascontiguousarray(opmath(g), dtype=x2.dtype).reshape(-1, ctx.n)
        with np.errstate(invalid="ignore", over="ignore"):
            dx, gxh = rms_norm_backward_rows(x2, ww, g2, rstd, ctx.inv_n)
        need_w = ctx.needs_input_grad[1]
        dw = sum_axes(gxh, (0,)).reshape(ctx.inputs[1].shape) if need_w else None
        return dx.reshape(g.shape), dw, None, None, None


@autocast_op("fp32")
def rms_norm(input, normalized_shape, weight=None, eps=None):
    """RMS norm over the last dimensions: ``ms = Σx²·f32(1/n)`` (sequential),
    ``rstd = 1/sqrt(ms + eps)`` (float64, rounded once), ``y = (x·rstd)·w``, rounded once to the
    format. ``eps=None`` is the input format's machine epsilon (``torch.finfo(dtype).eps``).
    Backward ``dx = rstd·(g·w − x̂·m2)``, ``m2`` the row mean of ``g·w·x̂``. Autocast: fp32."""
    check_tensor(input, "input", "rms_norm")
    shape = _norm_shape(input, normalized_shape, "rms_norm")
    weight = _affine(weight, shape, "rms_norm", "weight")
    fmt = common_format("rms_norm", input=input, weight=weight)
    eps = fmt.eps if eps is None else check_real("rms_norm: eps", eps, min=0)
    return RMSNorm.apply(input, weight, fmt, math.prod(shape), eps)


# ---- embedding -----------------------------------------------------------------------------------


class Embedding(Function):
    @staticmethod
    def forward(ctx, w, idx, padding_idx, fmt):
        ctx.idx, ctx.padding_idx, ctx.rows = idx, padding_idx, w.shape[0]
        ctx.out_format = fmt
        return w[idx]

    @staticmethod
    def backward(ctx, g):
        g2 = np.ascontiguousarray(opmath(g)).reshape(-1, g.shape[-1])
        pad = -1 if ctx.padding_idx is None else ctx.padding_idx
        return embedding_backward(ctx.idx.reshape(-1), g2, ctx.rows, pad), None, None, None


@autocast_op("passthrough")
def embedding(input, weight, padding_idx=None):
    """Rows of ``weight`` (V, D) at the integer indices ``input`` (any shape) — exact gather.
    Backward: ``dW[input[i]] += g[i]`` sequentially in the order of the flattened indices (work
    dtype), rows equal to ``padding_idx`` get no gradient; rounded once to the weight's format."""
    check_tensor(weight, "weight", "embedding")
    idx = as_index_array(input, "input", "embedding")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, dim); got {weight.shape}")
    rows = weight.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= rows):
        raise IndexError(f"embedding: indices must be in [0, {rows}); got min {idx.min()}, "
                         f"max {idx.max()}")
    if padding_idx is not None:
        if not isinstance(padding_idx, (int, np.integer)) or not -rows <= padding_idx < rows:
            raise ValueError(f"embedding: padding_idx must be an int in [-{rows}, {rows}); "
                             f"got {padding_idx!r}")
        padding_idx = int(padding_idx) % rows
    return Embedding.apply(weight, idx, padding_idx, weight.format)


# ---- dropout -------------------------------------------------------------------------------------


def dropout_mask(shape: tuple, p: float, seed: int, stream: int) -> np.ndarray:
    """The keep mask (bool, ``shape``): element i is kept iff word i of the Philox stream
    ``(seed, stream)`` is ≥ ``round(p·2^32)`` — kept with probability 1 − round(p·2^32)/2^32."""
    n = math.prod(shape)
    threshold = np.uint64(round(p * 2.0**32))
    return (random_words(seed, stream, n).astype(np.uint64) >= threshold).reshape(shape)


class Dropout(Function):
    @staticmethod
    def forward(ctx, x, fmt, p, seed, stream):
        work = work_dtype(fmt)
        keep = dropout_mask(x.shape, p, seed, stream).astype(work)
        scale = work(1.0 / (1.0 - p))  # 1/(1 − p) in float64, rounded once
        ctx.out_format, ctx.keep, ctx.scale = fmt, keep, scale
        return round_to((opmath(x) * keep) * scale, fmt)

    @staticmethod
    def backward(ctx, g):  # PyTorch's masked_scale: (g·mask)·scale
        return (opmath(g) * ctx.keep) * ctx.scale, None, None, None, None


@autocast_op("passthrough")
def dropout(input, p: float = 0.5, training: bool = True, *, seed=None, stream=None):
    """Inverted dropout: ``y = (x·mask)·f32(1/(1 − p))`` in the work dtype, rounded once to the
    format (a dropped −x gives −0, as PyTorch's ``x·mask·scale``). The mask comes from the Philox
    stream ``(seed, stream)`` (:func:`dropout_mask`); by default the seed of :func:`manual_seed`
    and a per-call counter (so a run is reproducible, and :func:`set_rng_state` replays it).
    ``training=False`` or ``p=0`` returns ``input`` itself; ``p=1`` zeros everything."""
    check_tensor(input, "input", "dropout")
    if not 0.0 <= check_real("dropout: p", p) <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1]; got {p}")
    if not check_bool("dropout: training", training) or p == 0.0:
        return input
    if seed is None:
        seed, stream = next_stream()
    elif stream is None:
        stream = 0
    if p == 1.0:
        return input * 0.0
    return Dropout.apply(input, input.format, float(p), seed, stream)
