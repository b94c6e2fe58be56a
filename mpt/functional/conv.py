"""Convolution and pooling: conv2d (im2col onto the GEMM), max_pool2d, avg_pool2d.

conv2d precision contract: ``im2col`` moves the input's storage bits (exact) into the GEMM
operand (N, Ho·Wo, C·kh·kw) whose k index is ``(c·kh + i)·kw + j``; the forward, dgrad and wgrad
are ``mpt.gemm`` calls with the active matmul model (see ``linalg``), FP32 output; the bias is
added in FP32 (epilogue) and the sum rounded once to the format. dgrad scatters the FP32 column
gradient back with ``col2im`` (fixed sequential order), rounded once to the input's format;
wgrad is one GEMM per group with K = N·Ho·Wo (batch folded into k in (n, oh, ow) order); the bias
gradient is the sequential FP32 sum over (n, oh, ow). Autocast: lower precision.

Pooling works in the work dtype (float32; float64 in fp64 mode) and rounds once to the format:
max is exact; average is a sequential window sum divided by PyTorch's divisor. Autocast:
pass-through. ``ceil_mode`` and ``divisor_override`` are not offered.
"""
from __future__ import annotations

import numpy as np

from mpt._checks import check_int
from mpt.autograd.function import Function
from mpt.autograd.tensor import opmath, round_to
from mpt.formats import UNSIGNED
from mpt.functional._common import check_tensor, common_format, sum_axes
from mpt.functional.autocast import autocast_op, current_model
from mpt.functional.linalg import matmul_acc
from mpt.kernels import conv as kernels

__all__ = ["conv2d", "max_pool2d", "avg_pool2d"]



def _pair(v, arg: str, op: str, minimum: int) -> tuple:
    pair = (v, v) if isinstance(v, (int, np.integer)) else v
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ValueError(f"{op}: {arg} must be an int >= {minimum} or a pair of them; got {v!r}")
    return tuple(check_int(f"{op}: {arg}", n, min=minimum) for n in pair)


def _out_size(size, k, s, p, d, op):
    out = (size + 2 * p - d * (k - 1) - 1) // s + 1
    if out < 1:
        raise ValueError(f"{op}: input size {size} is too small for kernel {k} (padding {p}, "
                         f"dilation {d})")
    return out


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(UNSIGNED[x.dtype.itemsize])


class Conv2d(Function):
    @staticmethod
    def forward(ctx, x, w, b, fmt, geom):
        ctx.model = current_model()
        (sh, sw), (ph, pw), (dh, dw), groups, ho, wo = geom
        n, c, h, wd = x.shape
        o, cg, kh, kw = w.shape
        og, kk, L = o // groups, cg * kh * kw, ho * wo
        cols = kernels.im2col(_bits(x), kh, kw, sh, sw, ph, pw, dh, dw, ho, wo)
        cols = cols.view(x.dtype).reshape(n, L, groups, kk)                     # (n, L, G, kk)
        cols = np.ascontiguousarray(cols.transpose(0, 2, 1, 3))                 # (n, G, L, kk)
        wg = np.ascontiguousarray(w.reshape(groups, og, kk).transpose(0, 2, 1))  # (G, kk, og)
        acc = matmul_acc(cols, wg, fmt, ctx.model)                              # (n, G, L, og)
        acc = acc.transpose(0, 1, 3, 2).reshape(n, o, ho, wo)                   # (n, o, ho, wo)
        if b is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                acc = acc + opmath(b).reshape(1, o, 1, 1)                          # FP32 epilogue
        ctx.out_format, ctx.geom, ctx.x_shape = fmt, geom, x.shape
        ctx.save_for_backward(cols, w)
        return round_to(acc, fmt)

    @staticmethod
    def backward(ctx, g):
        cols, w = ctx.saved
        (sh, sw), (ph, pw), (dh, dw), groups, ho, wo = ctx.geom
        n, c, h, wd = ctx.x_shape
        o, cg, kh, kw = w.shape
        og, kk, L = o // groups, cg * kh * kw, ho * wo
        fmt = ctx.out_format
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        g4 = g.reshape(n, groups, og, L).transpose(0, 1, 3, 2)                 # (n, G, L, og)
        g4 = np.ascontiguousarray(g4)
        dx = dw_ = db = None
        if need_x:
            dcols = matmul_acc(g4, w.reshape(groups, og, kk), fmt, ctx.model)   # (n, G, L, kk)
            dcols = np.ascontiguousarray(dcols.transpose(0, 2, 1, 3)).reshape(n, L, c * kh * kw)
            dx = kernels.col2im(dcols, c, h, wd, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo)
        if need_w:
            gk = np.ascontiguousarray(g4.transpose(1, 3, 0, 2)).reshape(groups, og, n * L)
            ck = np.ascontiguousarray(cols.transpose(1, 0, 2, 3)).reshape(groups, n * L, kk)
            dw_ = matmul_acc(gk, ck, fmt, ctx.model).reshape(w.shape)                 # (G, og, kk)
        if need_b:
            db = sum_axes(opmath(g), (0, 2, 3))
        return dx, dw_, db, None, None


@autocast_op("lower")
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    """2-D cross-correlation as PyTorch's: input (N, C, H, W), weight (O, C/groups, kh, kw),
    bias (O,); GEMMs through the active matmul model (module docstring). Autocast: lower."""
    check_tensor(input, "input", "conv2d")
    check_tensor(weight, "weight", "conv2d")
    if bias is not None:
        check_tensor(bias, "bias", "conv2d")
    fmt = common_format("conv2d", input=input, weight=weight, bias=bias)
    if input.ndim != 4 or weight.ndim != 4:
        raise ValueError(f"conv2d: input must be (N, C, H, W) and weight (O, C/groups, kh, kw); "
                         f"got {input.shape} and {weight.shape}")
    if not isinstance(groups, (int, np.integer)) or groups < 1 or input.shape[1] % groups or \
            weight.shape[0] % groups or weight.shape[1] * groups != input.shape[1]:
        raise ValueError(f"conv2d: groups={groups} does not fit input channels {input.shape[1]} "
                         f"and weight {weight.shape}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"conv2d: bias must have shape ({weight.shape[0]},); got {bias.shape}")
    s, p, d = (_pair(stride, "stride", "conv2d", 1), _pair(padding, "padding", "conv2d", 0),
               _pair(dilation, "dilation", "conv2d", 1))
    ho = _out_size(input.shape[2], weight.shape[2], s[0], p[0], d[0], "conv2d")
    wo = _out_size(input.shape[3], weight.shape[3], s[1], p[1], d[1], "conv2d")
    return Conv2d.apply(input, weight, bias, fmt, (s, p, d, int(groups), ho, wo))


def _pool_geometry(input, kernel_size, stride, padding, op):
    check_tensor(input, "input", op)
    if input.ndim != 4:
        raise ValueError(f"{op}: input must be (N, C, H, W); got {input.shape}")
    k = _pair(kernel_size, "kernel_size", op, 1)
    s = k if stride is None else _pair(stride, "stride", op, 1)
    p = _pair(padding, "padding", op, 0)
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise ValueError(f"{op}: padding {p} must be at most half the kernel size {k}")
    return k, s, p


class MaxPool2d(Function):
    @staticmethod
    def forward(ctx, x, fmt, k, s, p, d, ho, wo):
        xw = np.ascontiguousarray(opmath(x))
        out, arg = kernels.max_pool2d(xw, *k, *s, *p, *d, ho, wo)
        ctx.out_format, ctx.arg, ctx.hw = fmt, arg, x.shape[2:]
        return round_to(out, fmt)

    @staticmethod
    def backward(ctx, g):
        dx = kernels.max_pool2d_backward(np.ascontiguousarray(opmath(g)), ctx.arg, *ctx.hw)
        return (dx,) + (None,) * 7


@autocast_op("passthrough")
def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1):
    """Max over windows (exact; padding takes no part; NaN propagates). Backward: g to the first
    maximal element of each window, summed sequentially in output order. Autocast: pass-through."""
    k, s, p = _pool_geometry(input, kernel_size, stride, padding, "max_pool2d")
    d = _pair(dilation, "dilation", "max_pool2d", 1)
    ho = _out_size(input.shape[2], k[0], s[0], p[0], d[0], "max_pool2d")
    wo = _out_size(input.shape[3], k[1], s[1], p[1], d[1], "max_pool2d")
    return MaxPool2d.apply(input, input.format, k, s, p, d, ho, wo)


class AvgPool2d(Function):
    @staticmethod
    def forward(ctx, x, fmt, k, s, p, ho, wo, include_pad):
        out = kernels.avg_pool2d(np.ascontiguousarray(opmath(x)), *k, *s, *p, ho, wo, include_pad)
        ctx.out_format, ctx.geom, ctx.hw = fmt, (k, s, p, include_pad), x.shape[2:]
        return round_to(out, fmt)

    @staticmethod
    def backward(ctx, g):
        k, s, p, include_pad = ctx.geom
        gw = np.ascontiguousarray(opmath(g))
        dx = kernels.avg_pool2d_backward(gw, *ctx.hw, *k, *s, *p, include_pad)
        return (dx,) + (None,) * 7


@autocast_op("passthrough")
def avg_pool2d(input, kernel_size, stride=None, padding=0, count_include_pad: bool = True):
    """Average over windows: sequential window sum in the work dtype divided by PyTorch's divisor
    (window clipped to the padded input, or to the input when ``count_include_pad=False``), one
    rounding to the format. Backward: ``g/divisor`` added to the window, sequentially in output
    order. Autocast: pass-through."""
    k, s, p = _pool_geometry(input, kernel_size, stride, padding, "avg_pool2d")
    ho = _out_size(input.shape[2], k[0], s[0], p[0], 1, "avg_pool2d")
    wo = _out_size(input.shape[3], k[1], s[1], p[1], 1, "avg_pool2d")
    return AvgPool2d.apply(input, input.format, k, s, p, ho, wo, bool(count_include_pad))
