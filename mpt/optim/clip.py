"""L4: ``clip_grad_norm_`` — PyTorch's gradient clipping, in float32 in a fixed order."""
from __future__ import annotations

import math

import numpy as np

from mpt._checks import check_bool, check_real
from mpt.autograd.tensor import opmath
from mpt.kernels.optim import sum_abs_pow
from mpt.optim.optimizer import _F32, _bump, _format_of
from mpt.rounding import round as round_format

__all__ = ["clip_grad_norm_"]


def _vector_norm(x: np.ndarray, norm_type: float) -> np.float32:
    """f32 of the ``norm_type`` norm of float32 ``x``: a sequential float64 sum of |x|^p in index
    order, then ^(1/p) in float64 (``math.sqrt`` for p = 2), rounded once; max |x| for inf."""
    if x.size == 0:
        return _F32(0)
    if math.isinf(norm_type):
        return np.max(np.abs(x))
    total = sum_abs_pow(x, float(norm_type))
    if math.isnan(total):
        return _F32(math.nan)
    return _F32(math.sqrt(total) if norm_type == 2.0 else total ** (1.0 / norm_type))


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False) -> np.float32:
    """``torch.nn.utils.clip_grad_norm_``: scale every gradient by
    ``min(1, f32(1 / (total + f32(1e-6))) · f32(max_norm))`` and return ``total`` (float32).

    The coefficient is PyTorch's ``max_norm / (total_norm + 1e-6)``: a Python float divided by a
    tensor is ``tensor.reciprocal() * float`` there, two float32 roundings.

    ``total`` is the norm of the per-tensor norms (as PyTorch structures it), each computed by
    :func:`_vector_norm` on the gradient decoded to float32, in parameter order — a fixed order,
    so the same bits on every machine. The scaling is computed in float32 and rounded (RNE) to each
    gradient's format. ``norm_type``: p > 0 or ``inf``; ``max_norm`` >= 0 (``inf``: no clipping;
    PyTorch sets no range, a negative one would flip the gradients and is refused).
    """
    if hasattr(parameters, "data"):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    norm_type = check_real("norm_type", norm_type, gt=0, finite=False)
    max_norm = check_real("max_norm", max_norm, min=0, finite=False)
    error_if_nonfinite = check_bool("error_if_nonfinite", error_if_nonfinite)
    if not grads:
        return _F32(0)
    norms = np.array([_vector_norm(opmath(g.data).reshape(-1), norm_type) for g in grads], _F32)
    total = _vector_norm(norms, norm_type)
    if error_if_nonfinite and not np.isfinite(total):
        raise RuntimeError(f"the total norm of order {norm_type} of the gradients is non-finite, "
                           "so it cannot be clipped; pass error_if_nonfinite=False to scale by it")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        coef = np.minimum((_F32(1) / (total + _F32(1e-6))) * _F32(max_norm), _F32(1))
        for g in grads:
            fmt = _format_of(g)
            if fmt.name == "fp32":
                g.data *= coef
            else:
                g.data[...] = round_format(opmath(g.data) * coef, fmt, "nearest_even")
            _bump(g)
    return total
