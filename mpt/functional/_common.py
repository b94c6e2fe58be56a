"""Helpers shared by the ops: argument checks, opmath operands, fixed-order sums."""
from __future__ import annotations

import math

import numpy as np

from mpt._checks import check_int
from mpt.autograd.tensor import Tensor, opmath
from mpt.formats import Format
from mpt.kernels.ops import sum_anb

__all__ = ["check_tensor", "common_format", "work_dtype", "operand", "sum_axes", "unbroadcast",
           "normalize_dim", "as_index_array", "as_rows"]


def check_tensor(x, arg: str, op: str) -> Tensor:
    """``x`` if it is a Tensor of a floating format, else TypeError naming ``op`` and ``arg``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {arg} must be a Tensor; got {type(x).__name__}")
    if x.format.kind != "float":
        raise TypeError(f"{op}: {arg} must have a floating format; got {x.format.name}")
    return x


def common_format(op: str, **tensors) -> Format:
    """The one format of the given tensors (None values skipped).

    mpt does not promote: tensors of different formats raise TypeError naming each argument's
    format (inside an autocast region the policy has already made them agree).
    """
    named = {k: t for k, t in tensors.items() if t is not None}
    formats = {t.format for t in named.values()}
    if len(formats) > 1:
        listed = ", ".join(f"{k} is {t.format.name}" for k, t in named.items())
        raise TypeError(f"{op}: inputs have different formats ({listed}); mpt does not promote "
                        "formats outside autocast: cast explicitly with .to(format)")
    return formats.pop()


def work_dtype(fmt: Format):
    """The "opmath" dtype of a format: float64 for fp64, float32 for everything else."""
    return np.float64 if fmt.dtype == np.float64 else np.float32


def operand(v, work):
    """An op's input in its work dtype: the exact decode of an array, or a Python number rounded
    once (RNE) to the work dtype (a 0-d array, so numpy keeps the array's dtype)."""
    if isinstance(v, np.ndarray):
        return opmath(v)
    return np.asarray(v, dtype=work)


def as_rows(x: np.ndarray) -> np.ndarray:
    """``x`` as a C-contiguous (R, N) array of rows along its last axis, R the product of the
    other dimensions (also when N = 0, where ``reshape(-1, 0)`` is ambiguous)."""
    return np.ascontiguousarray(x).reshape(math.prod(x.shape[:-1]), x.shape[-1])


def normalize_dim(dim: int, ndim: int, op: str) -> int:
    check_int(f"{op}: dim", dim)
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise ValueError(f"{op}: dim {dim} is out of range for a tensor with {ndim} dimensions")
    return dim % max(ndim, 1)


def sum_axes(x: np.ndarray, axes: tuple) -> np.ndarray:
    """Σ of x (float32/float64) over ``axes`` (the kept axes' shape is returned, no keepdims).

    Order: for each output element, a sequential sum over the reduced elements in row-major order
    of the reduced axes (``mpt.kernels.ops.sum_anb``), in x's dtype.
    """
    axes = tuple(sorted(set(axes)))
    kept = tuple(i for i in range(x.ndim) if i not in axes)
    out_shape = tuple(x.shape[i] for i in kept)
    if not axes:
        return x.copy()
    lo, hi = axes[0], axes[-1] + 1
    if axes == tuple(range(lo, hi)):  # one contiguous block of axes: no transposition
        a = math.prod(x.shape[:lo])
        b = math.prod(x.shape[hi:])
        x3 = np.ascontiguousarray(x).reshape(a, -1, b)
    else:
        x3 = np.ascontiguousarray(x.transpose(kept + axes)).reshape(-1, math.prod(
            [x.shape[i] for i in axes]), 1)
    return sum_anb(x3).reshape(out_shape)


def unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """The gradient ``g`` (of a broadcast result) summed down to ``shape`` (``sum_axes`` order)."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and g.shape[lead + i] != 1)
    return sum_axes(opmath(g), axes).reshape(shape)


def as_index_array(idx, arg: str, op: str) -> np.ndarray:
    """Integer indices (a numpy int array, list or int Tensor) as an int64 ndarray."""
    if isinstance(idx, Tensor):
        idx = idx.data
    arr = np.asarray(idx)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{op}: {arg} must hold integers; got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)
