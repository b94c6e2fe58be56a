"""Matrix products: matmul and linear — forward, dgrad and wgrad GEMMs through ``mpt.gemm``.

Precision contract:

* Every GEMM (forward ``A·B``, dgrad ``G·Bᵀ``, wgrad ``Aᵀ·G``) calls ``mpt.gemm`` with the matmul
  model active at the forward (``mpt.autocast_state().model``; the backward reuses it) on the
  operands' storage arrays, FP32 output; the result is rounded once (RNE) to the output format.
  Under autocast these ops are "lower precision": fp32/fp16/bf16 operands are first cast to the
  region's dtype.
* fp32 operands on a Tensor Core model (anything but ``ieee_fma``, ``ieee_mul_add``, ``exact``)
  run ``ieee_fma`` instead — FP32 GEMMs run on CUDA cores, as PyTorch's default
  ``allow_tf32=False``; cast to ``"tf32"`` to use TF32 Tensor Cores.
* fp64 operands (gradient checks) use ``mpt.kernels.ops.matmul_f64``: sequential float64 FMA in
  increasing k.
* ``linear``'s bias is added to the FP32 GEMM result in FP32 and the sum is rounded once to the
  output format (cuBLASLt's bias epilogue), not fed to the GEMM as its C operand. The bias
  gradient is the sequential FP32 column sum of the output gradient.
* Batch dimensions: an N-D ``input`` times a 2-D ``weight`` is one 2-D GEMM over the flattened
  rows (as PyTorch folds it; the wgrad is then one GEMM with K = all rows); otherwise batch
  dimensions broadcast and the gradients of broadcast operands are summed (fixed order, FP32).
"""
from __future__ import annotations

import numpy as np

from mpt.autocast import autocast_op, current_model
from mpt.function import Function
from mpt.functional._common import as_rows, check_tensor, common_format, sum_axes, unbroadcast
from mpt.kernels.ops import matmul_f64
from mpt.mma import gemm as _mma_gemm
from mpt.tensor import opmath, round_to

__all__ = ["matmul", "linear", "gemm_model"]

_FP32_MODELS = ("ieee_fma", "ieee_mul_add", "exact")


def gemm_model(fmt, model: str) -> str:
    """The model a GEMM on ``fmt`` operands runs under the active ``model`` (module docstring)."""
    if fmt.name == "fp32" and model not in _FP32_MODELS:
        return "ieee_fma"
    return model


def gemm(a: np.ndarray, b: np.ndarray, fmt, model: str) -> np.ndarray:
    """``a @ b`` (batch dims broadcast) of two storage arrays of ``fmt``, as a float32 (float64 in
    fp64 mode) array, through ``model`` (the ops pass the model active at their forward: the
    backward GEMMs run on the same model even when ``backward()`` is called outside the region)."""
    if fmt.name == "fp64":
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        a3 = np.ascontiguousarray(np.broadcast_to(a, batch + (m, k))).reshape(-1, m, k)
        b3 = np.ascontiguousarray(np.broadcast_to(b, batch + (k, n))).reshape(-1, k, n)
        return matmul_f64(a3, b3).reshape(batch + (m, n))
    model = gemm_model(fmt, model)
    extra = {"in_format": fmt.name} if fmt.name == "tf32" else {}
    return _mma_gemm(np.ascontiguousarray(a), np.ascontiguousarray(b), model=model, **extra)


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


class Linear(Function):
    @staticmethod
    def forward(ctx, x, w, b, fmt):
        ctx.model = current_model()
        x2 = as_rows(x)                                                   # (M, in)
        acc = gemm(x2, _t(w), fmt, ctx.model)                                        # (M, out)
        if b is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                acc = acc + opmath(b)                                     # epilogue, FP32
        ctx.out_format, ctx.x_shape = fmt, x.shape
        ctx.save_for_backward(x, w)
        return round_to(acc, fmt).reshape(x.shape[:-1] + (w.shape[0],))

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved
        fmt = ctx.out_format
        g2 = as_rows(g)                                                   # (M, out)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = gemm(g2, w, fmt, ctx.model).reshape(ctx.x_shape) if need_x else None   # (M, in)
        x2 = as_rows(x)                                                   # (M, in)
        dw = gemm(_t(g2), x2, fmt, ctx.model) if need_w else None        # (out, in)
        db = sum_axes(opmath(g2), (0,)) if need_b else None              # (out,)
        return dx, dw, db, None


class Matmul(Function):
    @staticmethod
    def forward(ctx, a, b, fmt):
        ctx.out_format, ctx.model = fmt, current_model()
        ctx.save_for_backward(a, b)
        return round_to(gemm(a, b, fmt, ctx.model), fmt)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        fmt = ctx.out_format
        need_a, need_b = ctx.needs_input_grad[:2]
        ga = unbroadcast(gemm(g, _t(b), fmt, ctx.model), a.shape) if need_a else None
        gb = unbroadcast(gemm(_t(a), g, fmt, ctx.model), b.shape) if need_b else None
        return ga, gb, None


@autocast_op("lower")
def linear(input, weight, bias=None):
    """``input · weightᵀ + bias``: input (..., in), weight (out, in), bias (out,) or None; one
    format. Forward/dgrad/wgrad GEMMs with the active model, bias added in FP32 to the FP32 GEMM
    result, one rounding to the format (module docstring). Autocast: lower precision."""
    check_tensor(input, "input", "linear")
    check_tensor(weight, "weight", "linear")
    if bias is not None:
        check_tensor(bias, "bias", "linear")
    fmt = common_format("linear", input=input, weight=weight, bias=bias)
    if weight.ndim != 2 or input.ndim < 1 or input.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input {input.shape} and weight {weight.shape} do not match "
                         "(need input (..., in) and weight (out, in))")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"linear: bias must have shape ({weight.shape[0]},); got {bias.shape}")
    return Linear.apply(input, weight, bias, fmt)


@autocast_op("lower")
def matmul(input, other):
    """Matrix product with ``torch.matmul``'s shape rules (1-D operands get a dimension added and
    removed; batch dimensions broadcast; N-D @ 2-D folds into one GEMM). GEMMs with the active
    model, one rounding to the format. Autocast: lower precision."""
    check_tensor(input, "input", "matmul")
    check_tensor(other, "other", "matmul")
    fmt = common_format("matmul", input=input, other=other)
    if input.ndim == 0 or other.ndim == 0:
        raise ValueError("matmul: both operands need at least one dimension")
    a = input if input.ndim > 1 else input.reshape(1, -1)
    b = other if other.ndim > 1 else other.reshape(-1, 1)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {input.shape} and {other.shape} do not match "
                         f"(inner sizes {a.shape[-1]} and {b.shape[-2]})")
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: batch shapes of {input.shape} and {other.shape} do not "
                         "broadcast") from None
    if b.ndim == 2 and a.ndim > 2:  # fold: one 2-D GEMM over all rows, as a linear without bias
        out = Linear.apply(a, b.T, None, fmt)
    else:
        out = Matmul.apply(a, b, fmt)
    if input.ndim == 1:
        out = out.reshape(out.shape[:-2] + out.shape[-1:])
    if other.ndim == 1:
        out = out.reshape(out.shape[:-1])
    return out
