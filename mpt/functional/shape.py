"""Shape ops: reshape/view, transpose, permute, flatten, (un)squeeze, expand, indexing, cat, stack.

Precision contract: exact (values are moved, never rounded); the output has the input's format.
Outputs that share storage with their input (reshape of a contiguous tensor, transpose, permute,
expand, basic indexing) are read-only views: write through the base tensor instead. Backward:
the inverse move; where one input element feeds several outputs (expand, repeated advanced
indices) the gradients are summed in the work dtype sequentially in index order
(``np.add.at``, unbuffered and ordered; ``sum_axes`` for expand).
"""
from __future__ import annotations

import numpy as np

from mpt._checks import check_int
from mpt.autograd.function import Function
from mpt.autograd.tensor import Tensor, opmath
from mpt.functional._common import (check_tensor, common_format, normalize_dim, unbroadcast,
                                    work_dtype)
from mpt.functional.autocast import autocast_op

__all__ = ["reshape", "view", "transpose", "permute", "flatten", "unsqueeze", "squeeze", "expand",
           "getitem", "cat", "stack"]


def _readonly(out: np.ndarray, x: np.ndarray) -> np.ndarray:
    if out.base is not None and np.shares_memory(out, x):
        out = out.view()
        out.flags.writeable = False
    return out


def _shape_arg(shape, op: str) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = tuple(check_int(f"{op}: shape[{i}]", n, min=-1) for i, n in enumerate(shape))
    if shape.count(-1) > 1:
        raise ValueError(f"{op}: only one dimension of shape can be -1 (inferred); got {shape}")
    return shape


class Reshape(Function):
    @staticmethod
    def forward(ctx, x, fmt, shape):
        ctx.out_format, ctx.shape = fmt, x.shape
        return _readonly(x.reshape(shape), x)

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.shape), None, None


class Permute(Function):
    @staticmethod
    def forward(ctx, x, fmt, dims):
        ctx.out_format, ctx.inverse = fmt, tuple(np.argsort(dims))
        return _readonly(x.transpose(dims), x)

    @staticmethod
    def backward(ctx, g):
        return g.transpose(ctx.inverse), None, None


class Expand(Function):
    @staticmethod
    def forward(ctx, x, fmt, shape):
        ctx.out_format, ctx.shape = fmt, x.shape
        return _readonly(np.broadcast_to(x, shape), x)

    @staticmethod
    def backward(ctx, g):
        return unbroadcast(g, ctx.shape), None, None


def _is_basic(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return all(isinstance(i, (int, np.integer, slice)) or i is None or i is Ellipsis
               for i in items)


def _plain_index(index):
    """Tensor indices replaced by their storage arrays."""
    if isinstance(index, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return index.data if isinstance(index, Tensor) else index


class GetItem(Function):
    @staticmethod
    def forward(ctx, x, fmt, index):
        ctx.out_format, ctx.shape, ctx.index = fmt, x.shape, index
        return _readonly(np.asarray(x[index]), x)

    @staticmethod
    def backward(ctx, g):
        gx = np.zeros(ctx.shape, work_dtype(ctx.out_format))
        if _is_basic(ctx.index):
            gx[ctx.index] = opmath(g)
        else:  # repeated indices: sequential adds in index order
            np.add.at(gx, ctx.index, opmath(g))
        return gx, None, None


class Cat(Function):
    @staticmethod
    def forward(ctx, fmt, axis, *xs):
        ctx.out_format, ctx.axis = fmt, axis
        ctx.bounds = np.cumsum([x.shape[axis] for x in xs])[:-1]
        return np.concatenate(xs, axis=axis)

    @staticmethod
    def backward(ctx, g):
        return (None, None, *np.split(g, ctx.bounds, axis=ctx.axis))


@autocast_op("passthrough")
def reshape(input, *shape):
    """``input`` with a new shape (one −1 allowed), row-major order (exact)."""
    check_tensor(input, "input", "reshape")
    shape = _shape_arg(shape, "reshape")
    try:
        np.empty(input.shape, np.bool_).reshape(shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape {input.shape} into {shape}") from None
    return Reshape.apply(input, input.format, shape)


view = reshape


@autocast_op("passthrough")
def permute(input, *dims):
    """``input`` with its dimensions reordered (a view, exact)."""
    check_tensor(input, "input", "permute")
    dims = tuple(normalize_dim(d, input.ndim, "permute") for d in _shape_arg(dims, "permute"))
    if sorted(dims) != list(range(input.ndim)):
        raise ValueError(f"permute: dims {dims} is not a permutation of {input.ndim} dimensions")
    return Permute.apply(input, input.format, dims)


@autocast_op("passthrough")
def transpose(input, dim0: int, dim1: int):
    """``input`` with dimensions ``dim0`` and ``dim1`` swapped (a view, exact)."""
    check_tensor(input, "input", "transpose")
    dims = list(range(input.ndim))
    a = normalize_dim(dim0, input.ndim, "transpose")
    b = normalize_dim(dim1, input.ndim, "transpose")
    dims[a], dims[b] = dims[b], dims[a]
    return Permute.apply(input, input.format, tuple(dims))


@autocast_op("passthrough")
def flatten(input, start_dim: int = 0, end_dim: int = -1):
    """Dimensions ``start_dim..end_dim`` merged into one (a reshape)."""
    check_tensor(input, "input", "flatten")
    if input.ndim == 0:
        return reshape(input, (1,))
    s, e = normalize_dim(start_dim, input.ndim, "flatten"), normalize_dim(end_dim, input.ndim,
                                                                          "flatten")
    if s > e:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    return reshape(input, input.shape[:s] + (-1,) + input.shape[e + 1:])


@autocast_op("passthrough")
def unsqueeze(input, dim: int):
    """``input`` with a new dimension of size 1 at ``dim``."""
    check_tensor(input, "input", "unsqueeze")
    d = normalize_dim(dim, input.ndim + 1, "unsqueeze")
    return reshape(input, input.shape[:d] + (1,) + input.shape[d:])


@autocast_op("passthrough")
def squeeze(input, dim=None):
    """``input`` without its size-1 dimensions (only ``dim`` if given and of size 1)."""
    check_tensor(input, "input", "squeeze")
    if dim is None:
        return reshape(input, tuple(n for n in input.shape if n != 1))
    d = normalize_dim(dim, input.ndim, "squeeze")
    return reshape(input, tuple(n for i, n in enumerate(input.shape) if i != d or n != 1))


@autocast_op("passthrough")
def expand(input, *sizes):
    """``input`` broadcast to ``sizes`` (−1 keeps a size); a read-only view. Backward: the
    gradient summed over the broadcast dimensions (fixed order)."""
    check_tensor(input, "input", "expand")
    sizes = _shape_arg(sizes, "expand")
    lead = len(sizes) - input.ndim
    if lead < 0:
        raise ValueError(f"expand: {len(sizes)} sizes for a tensor with {input.ndim} dimensions")
    shape = tuple(input.shape[i - lead] if n == -1 and i >= lead else n
                  for i, n in enumerate(sizes))
    try:
        np.broadcast_to(np.empty(input.shape, np.bool_), shape)
    except ValueError:
        raise ValueError(f"expand: cannot expand {input.shape} to {sizes}") from None
    return Expand.apply(input, input.format, shape)


@autocast_op("passthrough")
def getitem(input, index):
    """``input[index]`` with numpy's indexing rules (ints, slices, None, Ellipsis, integer or
    boolean arrays / Tensors). Backward: the gradient scattered back; repeated advanced indices
    accumulate sequentially in index order."""
    check_tensor(input, "input", "getitem")
    index = _plain_index(index)
    try:
        np.empty(input.shape, np.bool_)[index]
    except IndexError as e:
        raise IndexError(f"getitem: {e} (tensor of shape {input.shape})") from None
    return GetItem.apply(input, input.format, index)


def _sequence(tensors, op: str) -> list:
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)) or not tensors:
        raise TypeError(f"{op}: tensors must be a non-empty list or tuple of Tensors")
    for i, t in enumerate(tensors):
        check_tensor(t, f"tensors[{i}]", op)
    return list(tensors)


@autocast_op("promote")
def cat(tensors, dim: int = 0):
    """The tensors joined along ``dim`` (all other sizes equal; one format — autocast promotes to
    the widest). Exact. Backward: the gradient split back."""
    tensors = _sequence(tensors, "cat")
    fmt = common_format("cat", **{f"tensors[{i}]": t for i, t in enumerate(tensors)})
    axis = normalize_dim(dim, tensors[0].ndim, "cat")
    ref = tensors[0].shape
    for i, t in enumerate(tensors):
        if t.ndim != len(ref) or t.shape[:axis] + t.shape[axis + 1:] != ref[:axis] + ref[axis + 1:]:
            raise ValueError(f"cat: tensors[{i}] has shape {t.shape}, which differs from "
                             f"tensors[0]'s {ref} outside dim {axis}")
    return Cat.apply(fmt, axis, *tensors)


@autocast_op("promote")
def stack(tensors, dim: int = 0):
    """The tensors (all one shape) stacked along a new dimension ``dim`` (exact)."""
    tensors = _sequence(tensors, "stack")
    for i, t in enumerate(tensors):
        if t.shape != tensors[0].shape:
            raise ValueError(f"stack: tensors[{i}] has shape {t.shape}, tensors[0] has "
                             f"{tensors[0].shape}")
    d = normalize_dim(dim, tensors[0].ndim + 1, "stack")
    return cat([unsqueeze(t, d) for t in tensors], d)
