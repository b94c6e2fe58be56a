"""L2: ``Tensor`` — an ndarray of one :class:`~mpt.formats.Format`, its gradient and the graph.

A tensor stores its values in the format's own dtype (``np.float16``, ``ml_dtypes.bfloat16``,
``np.float32``; ``np.float64`` for the ``fp64`` format used by gradient checks). Nothing rounds
implicitly: :func:`tensor` rounds its input once to the format (RNE through ``mpt.round``) and every
op states where it rounds (see ``mpt.functional``).

Autograd (the engine is :func:`Tensor.backward`):

* A tensor made by an op keeps the op's context (``_node``); leaves have none.
* ``backward()`` visits the nodes latest-created first (a topological order, and the order of
  PyTorch's engine) and calls each op's backward exactly once with the summed gradient of its
  output.
* **Gradient formats.** The gradient of a tensor is stored in the tensor's format (an fp16
  activation gets an fp16 gradient, as on a GPU). An op's input gradients are rounded (RNE) to each
  input's format. When several gradients reach one tensor they are summed in the order their
  consumers ran, each addition computed in "opmath" (float32; float64 for fp64) and rounded once
  to the format — what PyTorch's engine does when it adds fp16 gradients. The gradient of a leaf
  from one ``backward()`` call is then added to an existing ``.grad`` the same way.
* **Versions.** In-place changes (``t[...] = v``, ``copy_``, ``zero_``, ``bump_version`` after a
  direct write into ``t.data``, assigning ``t.data``) bump ``t._version``; an op that saved ``t``
  for backward raises ``RuntimeError`` if ``t`` changed since.

Operators (``+ - * / ** @``, unary ``-``, indexing) and method shortcuts (``t.sum()``,
``t.reshape(...)``) dispatch to ``mpt.functional``, which registers them with
:func:`register_op` (this module sits below it and does not import it). Comparison operators
return plain numpy ``bool`` arrays and carry no gradient.
"""
from __future__ import annotations

import contextlib
import weakref

import numpy as np

from mpt._checks import check_bool
from mpt.autograd import conversion as _conversion
from mpt.autograd.context import State
from mpt.autograd.hooks import notify_grad
from mpt.formats import Format, get_format
from mpt.kernels.half import narrow16, widen16
from mpt.rounding import round as round_format

__all__ = [
    "Tensor", "tensor", "format_of", "no_grad", "enable_grad", "set_grad_enabled",
    "is_grad_enabled",
    "register_op", "round_to", "opmath",
]


# ---- grad mode ---------------------------------------------------------------------------------
GRAD_ENABLED = State("grad_enabled", True)


def is_grad_enabled() -> bool:
    """Whether ops record the graph (``False`` inside :func:`no_grad`)."""
    return GRAD_ENABLED.get()


@contextlib.contextmanager
def set_grad_enabled(mode: bool):
    """Context manager setting grad mode to ``mode`` (thread-local), restored on exit."""
    with GRAD_ENABLED.scoped(bool(mode)):
        yield


def no_grad():
    """Context manager: ops inside record no graph (their outputs do not require grad)."""
    return set_grad_enabled(False)


def enable_grad():
    """Context manager: re-enable graph recording inside a :func:`no_grad` region."""
    return set_grad_enabled(True)


# ---- exact conversions used by every op ----------------------------------------------------------
_FP32 = get_format("fp32")
_FP64 = get_format("fp64")
_BF16 = get_format("bf16").dtype


def opmath(x: np.ndarray) -> np.ndarray:
    """The exact "opmath" value of a storage array: float64 stays float64, everything else is
    decoded to float32 (exact for every format narrower than fp32; float32 passes through).
    """
    dtype = x.dtype
    if dtype == np.float32 or dtype == np.float64:
        return x
    if dtype == _BF16 or dtype == np.float16:   # exact, vectorized (no FP conversion of NaNs)
        return widen16(x)
    with np.errstate(invalid="ignore"):  # signalling-NaN patterns: the conversion quiets them
        return x.astype(np.float32)  # fp8, ...: widening is exact


def round_to(x: np.ndarray, fmt: Format, mode: str = "nearest_even") -> np.ndarray:
    """Round a float32/float64 array once to ``fmt`` (``mpt.round``); no copy when ``x`` already
    holds that format's values (same dtype and a format whose grid is its dtype's). Under
    conversion rules (:mod:`mpt.autograd.conversion`: a TPU's flush, Trainium's stochastic
    rounding) a round-to-nearest-even into a format they name follows them instead.

    Round-to-nearest-even casts float32 → bf16 and float32 → fp16 take the vectorized kernels
    (``mpt.kernels.half.narrow16``), float64 → fp32/fp16 numpy's
    ``astype``, a single correctly rounded RNE conversion for exactly these pairs; all of them
    give ``mpt.round``'s bits (tested on random bit patterns, and on every float32 with
    ``-m exhaustive``) but for NaN payloads (a NaN stays a NaN of its sign; fp16 keeps the top
    payload bits, as numpy's conversion does). Every other case calls ``mpt.round``.
    """
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)  # numpy scalars from 0-d arithmetic
    if x.dtype == fmt.dtype and not fmt.custom and fmt.name != "tf32" and mode == "nearest_even":
        return x
    if x.dtype != np.float32 and x.dtype != np.float64:
        x = opmath(x)  # exact decode of a narrower storage dtype
    rules = _conversion.current_rules()
    if rules is not None and mode == "nearest_even" and fmt.name in rules.formats:
        return _conversion.convert(x, fmt, rules)  # the target's rule (mpt.autograd.conversion)
    if mode == "nearest_even" and x.dtype == np.float32 and fmt.name in ("bf16", "fp16"):
        return narrow16(x, fmt.dtype)
    if mode == "nearest_even" and (x.dtype, fmt.name) in _ASTYPE_RNE:
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(fmt.dtype)
    return np.asarray(round_format(x, fmt, mode))  # mpt.round returns numpy scalars for 0-d input


_ASTYPE_RNE = {(np.dtype(np.float64), "fp32"), (np.dtype(np.float64), "fp16")}


# ---- operator registry (filled by mpt.function and mpt.functional) -------------------------------
_OPS: dict = {}


def register_op(name: str, fn) -> None:
    """Register the op that ``Tensor`` operators and methods named ``name`` dispatch to."""
    _OPS[name] = fn


def _op(name):
    try:
        return _OPS[name]
    except KeyError:
        raise RuntimeError(f"Tensor op {name!r} comes from mpt.functional; import mpt") from None


class Tensor:
    """An array of one number format, with a gradient and (for op outputs) a graph node.

    ``Tensor(data, format=None, requires_grad=False)`` wraps ``data`` as is: its dtype must be the
    format's storage dtype (``format=None`` infers the format from the dtype). Use
    :func:`mpt.tensor` to round arbitrary values into a format.
    """

    __array_priority__ = 1000  # ndarray (op) Tensor defers to Tensor's reflected operator

    def __init__(self, data, format=None, requires_grad: bool = False, *, name: str | None = None):
        if not isinstance(data, np.ndarray):
            raise TypeError(f"data must be a numpy ndarray; got {type(data).__name__} "
                            "(use mpt.tensor(x, format) to round values into a format)")
        fmt = get_format(data.dtype) if format is None else get_format(format)
        if data.dtype != fmt.dtype:
            raise TypeError(f"data has dtype {data.dtype} but format {fmt.name} is stored as "
                            f"{np.dtype(fmt.dtype).name}; use mpt.tensor(x, {fmt.name!r}) to round")
        self._data = data
        self.format = fmt
        self.requires_grad = check_bool("requires_grad", requires_grad)
        self._grad = None
        self._node = None          # the Context of the op that made this tensor (None: leaf)
        self._version = 0
        self._retains_grad = False
        self.name = name

    # ---- storage -------------------------------------------------------------------------------
    @property
    def data(self) -> np.ndarray:
        """The storage array (dtype ``format.dtype``). Assigning it bumps the version; writing
        into it in place must be followed by :meth:`bump_version`."""
        return self._data

    @data.setter
    def data(self, value: np.ndarray):
        if not isinstance(value, np.ndarray) or value.dtype != self.format.dtype:
            got = value.dtype if isinstance(value, np.ndarray) else type(value).__name__
            raise TypeError(f"data of a {self.format.name} tensor must be a "
                            f"{np.dtype(self.format.dtype).name} ndarray; got {got}")
        self._data = value
        self._version += 1

    def bump_version(self) -> None:
        """Record an in-place change made directly in ``self.data`` (invalidates saved uses)."""
        self._version += 1

    @property
    def shape(self) -> tuple:
        return self._data.shape

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    def __len__(self) -> int:
        return len(self._data)

    def numpy(self) -> np.ndarray:
        """A copy of the storage array (dtype ``format.dtype``)."""
        return self._data.copy()

    def item(self) -> float:
        """The single value as a Python float (exact: every format decodes exactly to float64)."""
        if self._data.size != 1:
            raise ValueError(f"item() needs a tensor with one element; shape is {self.shape}")
        return float(opmath(self._data.reshape(1))[0])

    def tolist(self):
        return opmath(self._data).tolist()

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({opmath(self._data)!r}, format={self.format.name}{grad})"

    def __bool__(self):
        if self._data.size != 1:
            raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous")
        return bool(self._data.reshape(1)[0])

    __hash__ = object.__hash__

    # ---- gradient ------------------------------------------------------------------------------
    @property
    def grad(self):
        """The accumulated gradient: ``None`` or a Tensor of the same shape and format."""
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"grad must be a Tensor or None; got {type(value).__name__}")
            if value.format != self.format or value.shape != self.shape:
                raise ValueError(f"grad must be a {self.format.name} tensor of shape {self.shape}; "
                                 f"got {value.format.name} of shape {value.shape}")
        self._grad = value

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if not self.is_leaf and not requires_grad:
            raise RuntimeError("requires_grad can only be cleared on a leaf; use detach()")
        self.requires_grad = check_bool("requires_grad", requires_grad)
        return self

    def retain_grad(self) -> None:
        """Keep the gradient of this non-leaf tensor in ``.grad`` after ``backward()``."""
        if self.is_leaf:
            return
        self._retains_grad = True
        self._node.retained = weakref.ref(self)

    def detach(self) -> "Tensor":
        """A new leaf sharing this tensor's storage, outside the graph."""
        return Tensor(self._data, self.format)

    def backward(self, grad=None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into ``.grad`` of every leaf that requires grad.

        ``grad`` (the seed) defaults to 1 for a one-element tensor and is required otherwise; an
        array-like is rounded (RNE) to this tensor's format, a Tensor must already have it.
        ``retain_graph=False`` frees the saved arrays, so a second backward raises.
        """
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad "
                               "(no input requires grad, or it was made under no_grad())")
        _run_backward(self, self._seed(grad), retain_graph)

    def _seed(self, grad) -> np.ndarray:
        if grad is None:
            if self.size != 1:
                raise ValueError(f"backward() on a non-scalar tensor of shape {self.shape} needs "
                                 "grad= (the gradient of the output); only a one-element tensor "
                                 "gets the implicit grad 1")
            return np.ones(self.shape, self.format.dtype)
        seed = self._own_format(grad, "grad")
        if seed.shape != self.shape:
            raise ValueError(f"grad must have the output's shape {self.shape}; got {seed.shape}")
        return seed

    def _own_format(self, value, name: str) -> np.ndarray:
        """``value`` as an array of this tensor's format: a Tensor must already have it (no
        silent cast); numbers are rounded once (RNE)."""
        if isinstance(value, Tensor):
            if value.format != self.format:
                raise TypeError(f"{name} must have this tensor's format {self.format.name}; got "
                                f"{value.format.name} (cast it with .to() first)")
            return value._data
        return round_to(np.asarray(value, np.float64), self.format)

    # ---- in-place changes ----------------------------------------------------------------------
    def __setitem__(self, index, value) -> None:
        """``t[index] = value``: ``value`` (Tensor of this format, or numbers rounded RNE to it)
        written in place; bumps the version. Not recorded in the graph."""
        self._data[index] = self._own_format(value, "value")
        self._version += 1

    def copy_(self, src) -> "Tensor":
        """Overwrite all values with ``src`` (same shape; Tensor of this format or numbers rounded
        RNE to it); bumps the version."""
        if not isinstance(src, Tensor) and np.shape(src) != self.shape:
            raise ValueError(f"copy_ needs shape {self.shape}; got {np.shape(src)}")
        if isinstance(src, Tensor) and src.shape != self.shape:
            raise ValueError(f"copy_ needs shape {self.shape}; got {src.shape}")
        self[...] = src
        return self

    def zero_(self) -> "Tensor":
        self._data[...] = 0
        self._version += 1
        return self

    # ---- casts ---------------------------------------------------------------------------------
    def to(self, format, mode: str = "nearest_even") -> "Tensor":
        """This tensor rounded to ``format`` (one ``mpt.round`` from its exact value), recorded in
        the graph: the backward rounds the incoming gradient (RNE) to this tensor's format."""
        return _op("to")(self, format, mode)

    def float(self) -> "Tensor":
        return self.to(_FP32)

    def half(self) -> "Tensor":
        return self.to("fp16")

    def bfloat16(self) -> "Tensor":
        return self.to("bf16")

    def double(self) -> "Tensor":
        return self.to(_FP64)

    # ---- operators (dispatched to mpt.functional) ---------------------------------------------
    def __add__(self, other): return _op("add")(self, other)
    def __radd__(self, other): return _op("add")(other, self)
    def __sub__(self, other): return _op("sub")(self, other)
    def __rsub__(self, other): return _op("sub")(other, self)
    def __mul__(self, other): return _op("mul")(self, other)
    def __rmul__(self, other): return _op("mul")(other, self)
    def __truediv__(self, other): return _op("div")(self, other)
    def __rtruediv__(self, other): return _op("div")(other, self)
    def __pow__(self, other): return _op("pow")(self, other)
    def __rpow__(self, other): return _op("pow")(other, self)
    def __matmul__(self, other): return _op("matmul")(self, other)
    def __rmatmul__(self, other): return _op("matmul")(other, self)
    def __neg__(self): return _op("neg")(self)
    def __abs__(self): return _op("abs")(self)
    def __getitem__(self, index): return _op("getitem")(self, index)

    # comparisons: plain numpy bool arrays on the exact values, no gradient
    def _values(self, other):
        return opmath(other._data) if isinstance(other, Tensor) else other

    def __eq__(self, other): return opmath(self._data) == self._values(other)
    def __ne__(self, other): return opmath(self._data) != self._values(other)
    def __lt__(self, other): return opmath(self._data) < self._values(other)
    def __le__(self, other): return opmath(self._data) <= self._values(other)
    def __gt__(self, other): return opmath(self._data) > self._values(other)
    def __ge__(self, other): return opmath(self._data) >= self._values(other)

    @property
    def T(self) -> "Tensor":
        """The transpose (reversed dimensions), as ``permute(reversed(range(ndim)))``."""
        return _op("permute")(self, tuple(range(self.ndim - 1, -1, -1)))


def _method(name):
    def method(self, *args, **kwargs):
        return _op(name)(self, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = f"``mpt.functional.{name}(self, *args, **kwargs)``."
    return method


for _name in ("reshape", "view", "transpose", "permute", "flatten", "unsqueeze", "squeeze",
              "expand", "sum", "mean", "max", "var", "exp", "log", "sqrt", "abs", "relu",
              "softmax", "log_softmax", "clone"):
    setattr(Tensor, _name, _method(_name))


def tensor(x, format=None, requires_grad: bool = False) -> Tensor:
    """A new leaf tensor holding ``x`` rounded once (RNE, ``mpt.round``) to ``format``.

    ``x``: numbers, nested lists, an ndarray of any float dtype (ml_dtypes ones are decoded
    exactly) or a Tensor (its exact values; the result is a new leaf). ``format`` None takes the
    format from ``x``, as ``torch.tensor`` takes the dtype (:func:`format_of`): a Tensor's
    format, the format an ndarray's dtype stores (``float16`` → fp16, ``ml_dtypes.bfloat16`` →
    bf16, the float8 dtypes → their fp8 formats, ``float64`` → fp64, ...), else fp32. (mpt 0.1
    made fp32 whatever ``x`` was.)
    """
    fmt = format_of(x) if format is None else get_format(format)
    if isinstance(x, Tensor):
        x = x._data
    arr = np.asarray(x)
    if arr.dtype.kind in "iub":
        arr = arr.astype(np.float64)  # integers: exact up to 2^53
    elif arr.dtype != np.float32 and arr.dtype != np.float64:
        if _stored_format(arr.dtype) is None:
            raise TypeError(f"x must hold real numbers; got an array of dtype {arr.dtype}")
        arr = arr.astype(np.float32)  # fp16 and ml_dtypes formats decode exactly to float32
    data = round_to(arr, fmt)
    if data is arr:
        data = arr.copy()  # a tensor never aliases the caller's array
    return Tensor(data, fmt, requires_grad=requires_grad)


def format_of(x) -> Format:
    """The format :func:`tensor` gives ``x`` when none is named, following ``torch.tensor``:
    a Tensor keeps its format; an ndarray or NumPy scalar whose dtype is an mpt format's storage
    dtype takes that format (float64 → fp64, float32 → fp32, float16 → fp16, bfloat16 → bf16,
    float8_e4m3fn → fp8_e4m3fn, ..., int8 → int8); anything else — Python numbers and lists,
    integer and bool arrays of other widths — fp32, torch's default dtype (torch makes Python
    integers int64, a format mpt does not have)."""
    if isinstance(x, Tensor):
        return x.format
    if isinstance(x, (np.ndarray, np.generic)):
        return _stored_format(x.dtype) or _FP32
    return _FP32


def _stored_format(dtype: np.dtype) -> Format | None:
    """The format whose storage dtype is ``dtype`` (None for int64, bool, str, ...)."""
    try:
        return get_format(dtype)
    except ValueError:
        return None


# ---- the engine ----------------------------------------------------------------------------------
def _accumulate(acc: np.ndarray | None, g: np.ndarray, fmt: Format) -> np.ndarray:
    """``acc + g`` computed in opmath (float32, float64 for fp64) and rounded once to ``fmt``."""
    if acc is None:
        return g
    return round_to(opmath(acc) + opmath(g), fmt)


def _nodes_in_backward_order(root_node) -> list:
    """Nodes reachable from ``root_node``, latest-created first (``Context.seq`` descending).

    A node is always created after the nodes of its inputs, so this is a topological order; it
    is also the order of PyTorch's engine, which runs the ready node with the highest sequence
    number first (and the highest unprocessed one is always ready).
    """
    seen, stack = {id(root_node): root_node}, [root_node]
    while stack:
        for t in stack.pop().inputs:
            if t is not None and t._node is not None and id(t._node) not in seen:
                seen[id(t._node)] = t._node
                stack.append(t._node)
    return sorted(seen.values(), key=lambda node: node.seq, reverse=True)


def _run_backward(root: Tensor, seed: np.ndarray, retain_graph: bool) -> None:
    if root._node is None:  # a leaf: its gradient is the seed
        _add_to_grad(root, seed)
        return
    pending = {id(root._node): seed}   # node id -> summed gradient of its output
    leaf_grads: dict = {}               # leaf id -> (leaf, summed gradient)
    for node in _nodes_in_backward_order(root._node):
        g = pending.pop(id(node), None)
        if g is None:
            continue
        retained = node.retained() if node.retained is not None else None
        if retained is not None:
            _add_to_grad(retained, g)
        for t, gi in zip(node.inputs, node.run_backward(g, retain_graph)):
            if t is None or gi is None:
                continue
            gi = _input_grad(gi, t)
            if t._node is None:
                prev = leaf_grads.get(id(t), (t, None))[1]
                leaf_grads[id(t)] = (t, _accumulate(prev, gi, t.format))
            else:
                pending[id(t._node)] = _accumulate(pending.get(id(t._node)), gi, t.format)
    for leaf, g in leaf_grads.values():
        _add_to_grad(leaf, g)


def _input_grad(g, t: Tensor) -> np.ndarray:
    """An op's returned gradient for input ``t``, checked and rounded (RNE) to ``t``'s format."""
    g = np.asarray(g)
    if g.shape != t.shape:
        raise RuntimeError(f"backward returned a gradient of shape {g.shape} for an input of "
                           f"shape {t.shape}")
    return round_to(g, t.format) if g.dtype != t.format.dtype or t.format.custom else g


def _add_to_grad(t: Tensor, g: np.ndarray) -> None:
    if t._grad is None:  # a copy: op gradients may alias each other (add returns g twice)
        t._grad = Tensor(g.copy(), t.format)
    else:
        t._grad = Tensor(_accumulate(t._grad._data, g, t.format), t.format)
    notify_grad(t._grad._data)  # autograd hooks (the memory ledger counts gradients)
