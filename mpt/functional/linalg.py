"""Matrix products: matmul and linear — forward, dgrad and wgrad GEMMs through ``mpt.gemm``.

Precision contract:

* Every GEMM (forward ``A·B``, dgrad ``G·Bᵀ``, wgrad ``Aᵀ·G``) calls ``mpt.gemm`` with the matmul
  model active at the forward (``mpt.autocast_state().model``; the backward reuses it) on the
  operands' storage arrays, FP32 output; the result is rounded once (RNE) to the output format.
  Under autocast these ops are "lower precision": fp32/fp16/bf16 operands are first cast to the
  region's dtype.
* fp32 operands on a model without an fp32 configuration (NVIDIA's Tensor Cores) run
  ``ieee_fma`` instead — FP32 GEMMs run on CUDA cores, as PyTorch's default
  ``allow_tf32=False``; cast to ``"tf32"`` (or use a TF32 :class:`~mpt.functional.GemmPlan`) to
  use TF32 Tensor Cores. A model with one runs them itself: AMD's f32 MFMA (a sequential FMA per
  k, the same bits as ``ieee_fma`` but for NaN payloads), Gaudi's MME, Trainium's engine, a TPU's
  f32 dot (XLA's bf16 passes at JAX's default precision).
* fp64 operands (gradient checks) use ``mpt.kernels.ops.matmul_f64``: sequential float64 FMA in
  increasing k.
* ``linear`` runs a :class:`~mpt.functional.gemm_plan.GemmPlan` (default: the operands as stored,
  the active model): each role's operands are quantized as the plan says, once per tensor (once
  per axis for block rules), the GEMMs take the plan's models and software settings, the
  operands' dequantisation scales and the instruction's block scales (block rules; for NVFP4
  the per-tensor factor is Transformer Engine's alpha from both operands' amaxes). The bias is
  added to the FP32 GEMM result in FP32 and the sum is rounded once to the output format, the
  input's (cuBLASLt's bias epilogue), not fed to the GEMM as its C operand. The bias gradient is
  the sequential FP32 column sum of the (unquantized) output gradient.
* Batch dimensions: an N-D ``input`` times a 2-D ``weight`` is one 2-D GEMM over the flattened
  rows (as PyTorch folds it; the wgrad is then one GEMM with K = all rows); otherwise batch
  dimensions broadcast and the gradients of broadcast operands are summed (fixed order, FP32).
"""
from __future__ import annotations

import numpy as np

from mpt.autograd.function import Function
from mpt.autograd.tensor import opmath, round_to
from mpt.engines import gemm as _mma_gemm
from mpt.engines import get_mma_model
from mpt.functional._common import as_rows, check_tensor, common_format, sum_axes, unbroadcast
from mpt.functional.autocast import autocast_op, current_model
from mpt.functional.gemm_plan import GemmPlan, Operand, per_axis, quantize_operand
from mpt.kernels.ops import matmul_f64
from mpt.microscaling import nvfp4_gemm_alpha

__all__ = ["matmul", "linear", "gemm_model"]

_FP32_MODELS = ("ieee_fma", "ieee_mul_add", "exact")
_DEFAULT_PLAN = GemmPlan()


def gemm_model(fmt, model: str) -> str:
    """The model a GEMM on ``fmt`` operands runs under the active ``model`` (module docstring)."""
    if fmt.name == "fp32" and model not in _FP32_MODELS and \
            "fp32" not in get_mma_model(model).input_formats:
        return "ieee_fma"
    return model


def matmul_acc(a: np.ndarray, b: np.ndarray, fmt, model: str) -> np.ndarray:
    """``a @ b`` (batch dims broadcast) of two storage arrays of ``fmt``, as a float32 (float64 in
    fp64 mode) array, through ``model`` (the ops pass the model active at their forward: the
    backward GEMMs run on the same model even when ``backward()`` is called outside the region)."""
    return _run(Operand(a, fmt), Operand(b, fmt), model)


def _run(a: Operand, b: Operand, model, settings=None) -> np.ndarray:
    """One GEMM of two operands (module docstring): float32 (float64 for fp64 operands)."""
    if a.format.name == "fp64":
        batch = np.broadcast_shapes(a.data.shape[:-2], b.data.shape[:-2])
        m, k, n = a.data.shape[-2], a.data.shape[-1], b.data.shape[-1]
        a3 = np.ascontiguousarray(np.broadcast_to(a.data, batch + (m, k))).reshape(-1, m, k)
        b3 = np.ascontiguousarray(np.broadcast_to(b.data, batch + (k, n))).reshape(-1, k, n)
        return matmul_f64(a3, b3).reshape(batch + (m, n))
    if a.format.name == "fp32" and b.format.name == "fp32":
        model = gemm_model(a.format, model)
    scale_a, scale_b = a.scale_inv, b.scale_inv
    if a.amax is not None and b.amax is not None:   # NVFP4: TE's alpha from both amaxes
        scale_a, scale_b = nvfp4_gemm_alpha(a.amax, b.amax), None
    return _mma_gemm(a.data, b.data, model=model, in_format=(a.format.name, b.format.name),
                     scale_a=scale_a, scale_b=scale_b, block_scale_a=a.block_scales,
                     block_scale_b=b.block_scales, **(settings or {}))


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


class _Quantizer:
    """The plan's quantization of one tensor role, computed once per axis (once in all for
    per-tensor rules) and only when a GEMM needs it; the exact float32 values are decoded once,
    and only when a rule or the bias gradient needs them."""

    def __init__(self, stored, quantization, state):
        self.stored, self.q, self.state = stored, quantization, state
        self._values = None
        self.done = {}

    def values(self) -> np.ndarray:
        if self._values is None:
            self._values = opmath(self.stored)
        return self._values

    def along(self, axis: int) -> Operand:
        key = axis if per_axis(self.q) else None
        if key not in self.done:
            self.done[key] = quantize_operand(self.stored, self.values, self.q, self.state, axis)
        return self.done[key]


class Linear(Function):
    """``y = x·Wᵀ + b`` with the GEMMs of a plan (module docstring); the quantized operands the
    backward needs (X along the rows, W along the outputs) are made in the forward, as
    Transformer Engine does."""

    @staticmethod
    def forward(ctx, x, w, b, fmt, plan=_DEFAULT_PLAN, states=None):
        states = states or {}
        ctx.model = current_model()
        x2 = as_rows(x)                                   # (M, in)
        qx = _Quantizer(x2, plan.input, states.get("input"))
        qw = _Quantizer(w, plan.weight, states.get("weight"))
        acc = _run(qx.along(1), qw.along(1).T, plan.fprop.model or ctx.model,
                   plan.fprop.gemm_kwargs())                              # (M, out)
        if b is not None:
            with np.errstate(over="ignore", invalid="ignore"):             # epilogue, FP32
                np.add(acc, opmath(b), out=acc)           # acc: the GEMM's own fresh array
        ctx.out_format, ctx.x_shape, ctx.plan, ctx.states = fmt, x.shape, plan, states
        if plan.input.scaling == "none" and plan.weight.scaling == "none":
            ctx.save_for_backward(x, w)                  # the stored tensors (version-checked)
        else:
            ctx.save_for_backward(qx.along(0), qw.along(0))
        return round_to(acc, fmt).reshape(x.shape[:-1] + (w.shape[0],))

    @staticmethod
    def backward(ctx, g):
        plan = ctx.plan
        saved = ctx.saved
        if plan.input.scaling == "none" and plan.weight.scaling == "none":
            x, w = saved
            ox = _Quantizer(as_rows(x), plan.input, None).along(0)
            ow = _Quantizer(w, plan.weight, None).along(0)
        else:
            ox, ow = saved
        g2 = as_rows(g)                                   # (M, out)
        qg = _Quantizer(g2, plan.grad_output, ctx.states.get("grad_output"))
        if "grad_output" in plan.stateful_roles():
            qg.along(1)               # a stateful rule sees every gradient (it records amax)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = _run(qg.along(1), ow, plan.dgrad.model or ctx.model,
                  plan.dgrad.gemm_kwargs()).reshape(ctx.x_shape) if need_x else None  # (M, in)
        dw = _run(qg.along(0).T, ox, plan.wgrad.model or ctx.model,
                  plan.wgrad.gemm_kwargs()) if need_w else None           # (out, in)
        db = sum_axes(qg.values(), (0,)) if need_b else None               # (out,)
        return (dx, dw, db) + (None,) * (len(ctx.needs_input_grad) - 3)


class Matmul(Function):
    @staticmethod
    def forward(ctx, a, b, fmt):
        ctx.out_format, ctx.model = fmt, current_model()
        ctx.save_for_backward(a, b)
        return round_to(matmul_acc(a, b, fmt, ctx.model), fmt)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        fmt = ctx.out_format
        need_a, need_b = ctx.needs_input_grad[:2]
        ga = unbroadcast(matmul_acc(g, _t(b), fmt, ctx.model), a.shape) if need_a else None
        gb = unbroadcast(matmul_acc(_t(a), g, fmt, ctx.model), b.shape) if need_b else None
        return ga, gb, None


@autocast_op("lower")
def linear(input, weight, bias=None, *, plan: GemmPlan | None = None, states=None):
    """``input · weightᵀ + bias``: input (..., in), weight (out, in), bias (out,) or None; one
    format. Forward/dgrad/wgrad GEMMs as ``plan`` says (default: the operands as stored, the
    active model), bias added in FP32 to the FP32 GEMM result, one rounding to the format (module
    docstring). ``states``: {role: state} for the plan's stateful scaling rules (delayed
    scaling), owned by the layer. Autocast: lower precision."""
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
    plan = _DEFAULT_PLAN if plan is None else plan
    if not isinstance(plan, GemmPlan):
        raise TypeError(f"linear: plan must be a GemmPlan or None; got {type(plan).__name__}")
    missing = [r for r in plan.stateful_roles() if r not in (states or {})]
    if missing:
        raise ValueError(f"linear: plan {plan.name!r} needs states for {', '.join(missing)}")
    return Linear.apply(input, weight, bias, fmt, plan, states)


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
