"""Scaled dot-product attention: the naive backend (S and P in memory) and FlashAttention-2.

**Naive backend** (``backend="naive"``). One format F for q, k, v; fp32 work dtype (float64 in
fp64 mode):

1. ``S = q·kᵀ`` — ``mpt.gemm`` with the active matmul model, FP32 output (L, S).
2. ``S = S·f32(scale)`` (``scale`` defaults to ``1/sqrt(E)`` in float64, rounded once); a boolean
   mask (True = take part) sets excluded scores to −inf, a float mask is added in FP32;
   ``is_causal`` excludes key j for query i iff ``j > i + S − L`` (bottom-right aligned, as
   flash-attention).
3. ``P = softmax(S)`` row-wise in FP32 (``mpt.kernels.ops.softmax_rows``); rows with every key
   excluded give P = 0 (so output 0), as flash-attention, not NaN.
4. Dropout (``dropout_p > 0``): ``P = (P·mask)·f32(1/(1 − p))`` with the mask of
   ``mpt.functional.dropout_mask`` (one stream of the dropout generator per call).
5. ``O = round_F(P)·v`` — P is rounded (RNE) to F before the second GEMM, as a fused kernel feeds
   it to the Tensor Cores; FP32 output rounded once to F.

Backward (the same rounding points): ``dV = round_F(P)ᵀ·dO``; ``dP = dO·vᵀ`` (FP32, then the
dropout mask and scale); ``dS = P·(dP − Σ_j dP_j·P_j)`` (softmax backward, sequential FP32 row
sums); ``dS = round_F(dS·f32(scale))``; ``dq = dS·k``, ``dk = dSᵀ·q``. Every product is
``mpt.gemm``. Oracle: ``mpt.reference.ops.attention`` (float64).

**Flash backend** (``backend="flash"``): ``mpt.kernels.attention`` — tiles of ``block_q`` query
rows and ``block_k`` keys, FP32 scores and output accumulated through the MMA model, online
softmax in FP32 (base 2 as the real kernels with ``exp2=True``, else base e), P rounded to F
before P·V, only the log-sum-exp saved; the backward recomputes P, D = rowsum(dO∘O) in FP32, dS
rounded to F before the dQ/dK GEMMs, dQ accumulated in FP32; dQ, dK, dV rounded once (RNE) to
F. The kernel docstring gives every rounding. Formats: fp16, bf16, fp32 (CUDA-core ieee_fma, as
the naive backend), fp64 (sequential fma64: gradient checks), and fp8 e4m3fn / e5m2 for the
forward only (FA3's FP8 forward: P rounded to the fp8 format, output in bf16). Models: the block
models, ``ieee_fma`` and ``ieee_mul_add`` (not ``exact``). No ``attn_mask`` (is_causal only).
Oracle: ``mpt.reference.attention`` (the same tiles in numpy; float64 exact attention).

Both backends capture the matmul model at the forward (``ctx.model``) and use it in the backward;
``enable_gqa=True`` lets k, v have fewer heads (dimension −3) than q, each shared by a group of
query heads (the naive backend repeats them; their gradients are summed). Autocast: lower
precision.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from mpt._checks import check_bool, check_int, check_real
from mpt.autograd.function import Function
from mpt.autograd.tensor import Tensor, opmath, round_to
from mpt.engines import get_mma_model
from mpt.formats import get_format
from mpt.functional._common import as_rows, check_tensor, common_format, unbroadcast, work_dtype
from mpt.functional.autocast import autocast_op, current_model
from mpt.functional.linalg import gemm_model, matmul_acc
from mpt.functional.nn_ops import dropout_mask
from mpt.functional.rng import next_stream
from mpt.functional.shape import getitem
from mpt.kernels import attention as _flash
from mpt.kernels import readonly
from mpt.kernels.ops import softmax_backward_rows, softmax_rows

__all__ = ["scaled_dot_product_attention", "causal_mask", "flash_mma_model", "flash_runs",
           "BACKENDS"]

BACKENDS = ("naive", "flash")
_FLASH_FORMATS = ("fp64", "fp32", "fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2")
_BF16 = get_format("bf16")


def causal_mask(L: int, S: int) -> np.ndarray:
    """(L, S) bool, True where query i may attend key j: ``j <= i + S − L`` (bottom-right).
    ``L`` and ``S``: ints >= 0."""
    L, S = check_int("L", L, min=0), check_int("S", S, min=0)
    return np.arange(S)[None, :] <= np.arange(L)[:, None] + (S - L)


def _t(x):
    return np.swapaxes(x, -1, -2)


# ---- naive ---------------------------------------------------------------------------------------

class Attention(Function):
    @staticmethod
    def forward(ctx, q, k, v, fmt, scale, mask, additive, dropout):
        work = work_dtype(fmt)
        ctx.model = current_model()
        s = matmul_acc(q, _t(k), fmt, ctx.model) * work(scale)        # (..., L, S) FP32
        with np.errstate(invalid="ignore", over="ignore"):
            if additive is not None:
                s = s + additive
            if mask is not None:
                s = np.where(mask, s, work(-np.inf))
            shape = s.shape
            p, m, _ = softmax_rows(as_rows(s), False)
        p[m == -np.inf] = 0                                           # all keys excluded
        p = p.reshape(shape)                                          # (..., L, S)
        keep = None
        if dropout is not None:
            rate, seed, stream = dropout
            keep = dropout_mask(shape, rate, seed, stream).astype(work)
            ctx.drop_scale = work(1.0 / (1.0 - rate))
            p_used = (p * keep) * ctx.drop_scale
        else:
            p_used = p
        p_f = round_to(p_used, fmt)                                   # P in F for the 2nd GEMM
        ctx.out_format, ctx.scale = fmt, work(scale)
        ctx.save_for_backward(q, k, v, p, p_f, keep)
        return round_to(matmul_acc(p_f, v, fmt, ctx.model), fmt)

    @staticmethod
    def backward(ctx, g):
        q, k, v, p, p_f, keep = ctx.saved
        fmt = ctx.out_format
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dv = unbroadcast(matmul_acc(_t(p_f), g, fmt, ctx.model), v.shape) if need_v else None
        if not (need_q or need_k):
            return None, None, dv, None, None, None, None, None
        dp = matmul_acc(g, _t(v), fmt, ctx.model)                     # (..., L, S) FP32
        if keep is not None:
            dp = (dp * keep) * ctx.drop_scale
        shape = p.shape
        with np.errstate(invalid="ignore", over="ignore"):
            ds = softmax_backward_rows(readonly(as_rows(p)), readonly(as_rows(dp)))
            ds = round_to(ds.reshape(shape) * ctx.scale, fmt)
        dq = unbroadcast(matmul_acc(ds, k, fmt, ctx.model), q.shape) if need_q else None
        dk = unbroadcast(matmul_acc(_t(ds), q, fmt, ctx.model), k.shape) if need_k else None
        return dq, dk, dv, None, None, None, None, None


def _masks(attn_mask, is_causal, shape, fmt):
    """(boolean mask or None, additive work-dtype mask or None), each broadcastable to shape."""
    L, S = shape[-2:]
    if is_causal:
        return causal_mask(L, S), None
    if attn_mask is None:
        return None, None
    if isinstance(attn_mask, Tensor):
        if attn_mask.format != fmt:
            raise TypeError(f"scaled_dot_product_attention: a float attn_mask must have the "
                            f"inputs' format {fmt.name}; got {attn_mask.format.name}")
        values = opmath(attn_mask.data)
    else:
        values = np.asarray(attn_mask)
        if values.dtype != np.bool_:
            raise TypeError("scaled_dot_product_attention: attn_mask must be a bool array or a "
                            f"float Tensor; got an array of dtype {values.dtype}")
    try:
        np.broadcast_shapes(values.shape, shape)
    except ValueError:
        raise ValueError(f"scaled_dot_product_attention: attn_mask of shape {values.shape} does "
                         f"not broadcast to {shape}") from None
    return (values, None) if values.dtype == np.bool_ else (None, values)


# ---- flash ---------------------------------------------------------------------------------------

def flash_mma_model(fmt, model: str) -> dict:
    """The MMA model the flash kernels run for ``fmt`` inputs under the matmul model ``model``,
    as ``mpt.reference.mma``'s dict (fp32 inputs on a Tensor Core model run ieee_fma, as every
    GEMM of ``mpt.functional``; FP32 output: the accumulators of S, O, dV, dP, dK, dQ)."""
    fmt = get_format(fmt)
    name = gemm_model(fmt, model)
    preset = get_mma_model(name)
    if preset.kind in ("ieee_fma", "ieee_mul_add"):
        return {"kind": preset.kind}
    if preset.kind == "block":
        cfg = preset.config(fmt.name, fmt.name)
        rounding, e_zero = cfg.output("fp32")
        return {"kind": "block", "block": cfg.block, "fraction_bits": cfg.fraction_bits,
                "e_zero": e_zero, "rounding": rounding}
    raise ValueError(f"scaled_dot_product_attention: backend='flash' runs the block, ieee_fma and "
                     f"ieee_mul_add models; the matmul model is {name!r} ({preset.kind}): use "
                     "backend='naive'")


def flash_runs(fmt, model: str) -> bool:
    """Whether ``backend="flash"`` runs attention on ``fmt`` tensors under the matmul model
    ``model`` (:func:`flash_mma_model`: the block and IEEE kinds; AMD's MFMA models run with
    ``backend="naive"``, whose GEMMs go through ``mpt.gemm``)."""
    try:
        flash_mma_model(fmt, model)
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class _FlashOptions:
    scale: float
    causal: bool
    block_q: int
    block_k: int
    exp2: bool
    kv_of: np.ndarray       # (Z,) key/value batch of each query batch
    kv_batch: int           # Zkv
    dropout: tuple | None   # (p, seed, stream)

    def kernel_args(self, fmt, model: dict) -> dict:
        fp64 = fmt.name == "fp64"
        return dict(scale=self.scale, causal=self.causal, block_q=self.block_q,
                    block_k=self.block_k, exp2=self.exp2, dropout=self.dropout,
                    engine=_flash.engine_params(model, fp64, fmt.emin),
                    rounding=_flash.rounding_params(fmt))


def _values(x, batch):
    """The exact work-dtype values of a storage array as a C-contiguous, writable (batch, rows,
    cols): Numba types a read-only array apart, and would compile the kernels once more for it
    (an empty gradient from ``broadcast_to`` is read-only and counts as contiguous)."""
    return np.require(opmath(x), requirements="CW").reshape(batch, x.shape[-2], x.shape[-1])


class FlashAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v, fmt, opts):
        ctx.model = current_model()
        model = {"kind": "ieee_fma"} if fmt.name == "fp64" else flash_mma_model(fmt, ctx.model)
        ctx.args = opts.kernel_args(fmt, model)
        o, lse = _flash.flash_forward(_values(q, opts.kv_of.size), _values(k, opts.kv_batch),
                                      _values(v, opts.kv_batch), opts.kv_of, **ctx.args)
        ctx.out_format = _BF16 if fmt.name.startswith("fp8") else fmt
        ctx.in_format, ctx.opts = fmt, opts
        out = round_to(o, ctx.out_format).reshape(q.shape[:-1] + v.shape[-1:])
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        if ctx.in_format.name.startswith("fp8"):
            raise RuntimeError("scaled_dot_product_attention: backend='flash' models the fp8 "
                               "forward only (FA3 trains in bf16); cast q, k, v to bf16 to train")
        q, k, v, out, lse = ctx.saved
        opts = ctx.opts
        dq, dk, dv = _flash.flash_backward(
            _values(q, opts.kv_of.size), _values(k, opts.kv_batch), _values(v, opts.kv_batch),
            _values(out, opts.kv_of.size), _values(g, opts.kv_of.size), lse, opts.kv_of,
            **ctx.args)
        return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), None, None


def _kv_index(q_batch, k_batch, enable_gqa) -> np.ndarray:
    """(Z,) index into the flattened k/v batch for each flattened query batch."""
    index = np.arange(math.prod(k_batch)).reshape(k_batch)
    if enable_gqa and k_batch and q_batch and k_batch[-1] != q_batch[-1]:
        index = np.repeat(index, q_batch[-1] // k_batch[-1], axis=-1)
    try:
        if np.broadcast_shapes(q_batch, index.shape) != tuple(q_batch):
            raise ValueError
        return np.ascontiguousarray(np.broadcast_to(index, q_batch)).ravel().astype(np.int64)
    except ValueError:
        raise ValueError(f"scaled_dot_product_attention: backend='flash' needs the key/value batch "
                         f"dimensions {tuple(k_batch)} to broadcast to the query's "
                         f"{tuple(q_batch)}") from None


def _flash_attention(query, key, value, fmt, attn_mask, is_causal, scale, dropout_p, enable_gqa,
                     block_q, block_k, exp2):
    if attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: backend='flash' takes is_causal, not "
                         "attn_mask (flash-attention has no arbitrary mask); use backend='naive'")
    if fmt.name not in _FLASH_FORMATS:
        raise TypeError(f"scaled_dot_product_attention: backend='flash' takes "
                        f"{', '.join(_FLASH_FORMATS)} inputs; got {fmt.name}")
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        check_int(f"scaled_dot_product_attention: {name}", b, min=1)
    if key.shape[:-2] != value.shape[:-2]:
        raise ValueError("scaled_dot_product_attention: backend='flash' needs k and v with the "
                         f"same batch dimensions; got {key.shape} and {value.shape}")
    kv_of = _kv_index(query.shape[:-2], key.shape[:-2], enable_gqa)
    opts = _FlashOptions(scale, bool(is_causal), int(block_q), int(block_k), bool(exp2), kv_of,
                         math.prod(key.shape[:-2]), _dropout(dropout_p))
    return FlashAttention.apply(query, key, value, fmt, opts)


# ---- the op -------------------------------------------------------------------------------------

def _check_gqa(query, key, value):
    """Check grouped-query shapes: heads (dimension −3) of k and v divide those of q."""
    if query.ndim < 3 or key.ndim < 3 or value.ndim < 3:
        raise ValueError("scaled_dot_product_attention: enable_gqa needs (..., H, L, E) inputs")
    hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
    if hk != hv or hq % hk:
        raise ValueError(f"scaled_dot_product_attention: with enable_gqa the key/value heads "
                         f"({hk}, {hv}) must be equal and divide the query heads ({hq})")
    return hq // hk


@autocast_op("lower")
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale=None, enable_gqa: bool = False, *,
                                 backend: str = "naive", block_q: int = 64, block_k: int = 64,
                                 exp2: bool = True):
    """``softmax(q·kᵀ·scale + mask)·v`` for q (..., L, E), k (..., S, E), v (..., S, Ev) of one
    format, with the rounding points of the module docstring for ``backend`` ("naive" or
    "flash"). ``attn_mask`` (naive only): bool array/broadcastable to (..., L, S) (True = attend),
    or a float Tensor added to the scores (no gradient). ``enable_gqa``: k and v may have fewer
    heads than q (dimension −3). ``block_q``, ``block_k`` (Br, Bc) and ``exp2`` (base-2
    exponentials, as the real kernels; False: base e) are the flash backend's. Autocast: lower
    precision."""
    for arg, t in (("query", query), ("key", key), ("value", value)):
        check_tensor(t, arg, "scaled_dot_product_attention")
    fmt = common_format("scaled_dot_product_attention", query=query, key=key, value=value)
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2 or query.shape[-1] != key.shape[-1] \
            or key.shape[-2] != value.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: need q (..., L, E), k (..., S, E), "
                         f"v (..., S, Ev); got {query.shape}, {key.shape}, {value.shape}")
    if backend not in BACKENDS:
        raise ValueError(f"scaled_dot_product_attention: backend must be one of "
                         f"{', '.join(map(repr, BACKENDS))}; got {backend!r}")
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa), ("exp2", exp2)):
        check_bool(f"scaled_dot_product_attention: {name}", flag)
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal, not both")
    dropout_p = check_real("scaled_dot_product_attention: dropout_p", dropout_p, min=0, lt=1)
    group = _check_gqa(query, key, value) if enable_gqa else 1
    if scale is None and query.shape[-1] == 0:
        raise ValueError("scaled_dot_product_attention: the default scale 1/sqrt(E) needs E >= 1; "
                         "pass scale for E = 0")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else \
        check_real("scaled_dot_product_attention: scale", scale)
    if backend == "flash":
        return _flash_attention(query, key, value, fmt, attn_mask, is_causal, scale, dropout_p,
                                enable_gqa, block_q, block_k, exp2)
    if group > 1:  # each key/value head repeated for its group of query heads
        heads = (Ellipsis, np.repeat(np.arange(key.shape[-3]), group), slice(None), slice(None))
        key, value = getitem(key, heads), getitem(value, heads)
    L, S = query.shape[-2], key.shape[-2]
    try:
        batch = np.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except ValueError:
        raise ValueError("scaled_dot_product_attention: batch shapes of q, k, v do not broadcast: "
                         f"{query.shape}, {key.shape}, {value.shape}") from None
    mask, additive = _masks(attn_mask, is_causal, batch + (L, S), fmt)
    return Attention.apply(query, key, value, fmt, scale, mask, additive, _dropout(dropout_p))


def _dropout(p: float):
    """(p, seed, stream) drawing the next stream of the dropout generator, or None for p = 0."""
    return (float(p), *next_stream()) if p > 0.0 else None
