"""Elementwise ops: arithmetic, transcendentals, activations.

Precision contract (every op here): inputs are decoded exactly to the work dtype (float32, or
float64 for fp64 tensors — PyTorch's "opmath"), the result is rounded once (RNE, ``mpt.round``)
to the input's format, which is also the output's format.

* ``+ − × ÷`` and ``sqrt`` are single IEEE float32 operations (correctly rounded on every machine).
* Transcendentals and activations built on them (exp, log, tanh, sigmoid, gelu, silu, pow) are
  evaluated in float64 from the exact input and rounded to float32 first, then to the storage
  format (``mpt.kernels.ops.unary``): no float32 SIMD approximation whose bits vary by CPU.
* Python numbers are rounded once (RNE) to the work dtype. Tensor operands must share one format
  (TypeError otherwise; autocast promotes first).
* Backward: gradients follow PyTorch's formulas, each operation rounded in the work dtype
  (documented per op), then summed down to a broadcast input's shape (sequential, fp32) and
  rounded to the input's format by the engine.

Oracle: float64 numpy (gradients: central differences in fp64 mode, ``tests/test_gradcheck.py``).
"""
from __future__ import annotations

import numbers

import numpy as np

from mpt.autograd.function import Function
from mpt.autograd.tensor import Tensor, opmath, round_to
from mpt.functional._common import check_tensor, common_format, operand, unbroadcast, work_dtype
from mpt.functional.autocast import autocast_op
from mpt.kernels.ops import UNARY_OPS, pow_elementwise, unary, unary_backward

__all__ = ["add", "sub", "mul", "div", "neg", "abs", "exp", "log", "sqrt", "pow", "relu", "gelu",
           "silu", "tanh", "sigmoid", "clone"]


# ---- binary arithmetic ---------------------------------------------------------------------------


def _binary_format(op: str, a, b):
    """The format of a binary op on Tensors / Python numbers, after checks."""
    tensors = {}
    for arg, v in (("input", a), ("other", b)):
        if isinstance(v, Tensor):
            tensors[arg] = check_tensor(v, arg, op)
        elif not isinstance(v, numbers.Real) or isinstance(v, bool):
            raise TypeError(f"{op}: {arg} must be a Tensor or a real number; "
                            f"got {type(v).__name__}")
    if not tensors:
        raise TypeError(f"{op}: at least one argument must be a Tensor")
    fmt = common_format(op, **tensors)
    if len(tensors) == 2:
        try:
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise ValueError(f"{op}: shapes {a.shape} and {b.shape} do not broadcast") from None
    return fmt


class _Arithmetic(Function):
    """Shared forward/backward of add/sub/mul/div: ``round(x op y)`` in the work dtype."""

    saves = True  # whether backward needs the operands

    @staticmethod
    def compute(x, y):
        raise NotImplementedError

    @staticmethod
    def grads(g, x, y):
        raise NotImplementedError

    @classmethod
    def forward(cls, ctx, a, b, fmt):
        work = work_dtype(fmt)
        ctx.out_format = fmt
        ctx.shapes = (np.shape(a), np.shape(b))
        if cls.saves:
            ctx.save_for_backward(a, b)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return round_to(cls.compute(operand(a, work), operand(b, work)), fmt)

    @classmethod
    def backward(cls, ctx, g):
        work = work_dtype(ctx.out_format)
        a, b = ctx.saved if cls.saves else (None, None)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            ga, gb = cls.grads(g, operand(a, work), operand(b, work))
        need_a, need_b = ctx.needs_input_grad[:2]
        return (unbroadcast(ga, ctx.shapes[0]) if need_a else None,
                unbroadcast(gb, ctx.shapes[1]) if need_b else None, None)


class Add(_Arithmetic):
    saves = False
    compute = staticmethod(lambda x, y: x + y)
    grads = staticmethod(lambda g, x, y: (g, g))


class Sub(_Arithmetic):
    saves = False
    compute = staticmethod(lambda x, y: x - y)
    grads = staticmethod(lambda g, x, y: (g, -opmath(g)))


class Mul(_Arithmetic):
    compute = staticmethod(lambda x, y: x * y)
    grads = staticmethod(lambda g, x, y: (opmath(g) * y, opmath(g) * x))


class Div(_Arithmetic):
    compute = staticmethod(lambda x, y: x / y)
    grads = staticmethod(lambda g, x, y: (opmath(g) / y, -opmath(g) * ((x / y) / y)))


@autocast_op("passthrough")
def add(input, other):
    """``input + other``: one float32 (float64 in fp64 mode) addition, rounded once (RNE) to the
    format. Backward: g to both inputs (summed down to broadcast shapes)."""
    return Add.apply(input, other, _binary_format("add", input, other))


@autocast_op("passthrough")
def sub(input, other):
    """``input − other`` (as :func:`add`); backward g and −g."""
    return Sub.apply(input, other, _binary_format("sub", input, other))


@autocast_op("passthrough")
def mul(input, other):
    """``input · other`` (one IEEE multiply in the work dtype, rounded once to the format).
    Backward: ``g·other``, ``g·input`` in the work dtype."""
    return Mul.apply(input, other, _binary_format("mul", input, other))


@autocast_op("passthrough")
def div(input, other):
    """``input / other`` (one IEEE division, rounded once). Backward: ``g/other`` and
    ``−g·((input/other)/other)`` (PyTorch's order), in the work dtype."""
    return Div.apply(input, other, _binary_format("div", input, other))


# ---- unary ops with exact or IEEE forward --------------------------------------------------------


class Neg(Function):
    @staticmethod
    def forward(ctx, x, fmt):
        ctx.out_format = fmt
        return round_to(-opmath(x), fmt)

    @staticmethod
    def backward(ctx, g):
        return -opmath(g), None


class Abs(Function):
    @staticmethod
    def forward(ctx, x, fmt):
        ctx.out_format = fmt
        ctx.save_for_backward(x)
        return round_to(np.abs(opmath(x)), fmt)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved
        return opmath(g) * np.sign(opmath(x)), None


class Sqrt(Function):
    @staticmethod
    def forward(ctx, x, fmt):
        ctx.out_format = fmt
        with np.errstate(invalid="ignore"):
            y = round_to(np.sqrt(opmath(x)), fmt)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved
        y = opmath(y)
        with np.errstate(divide="ignore", invalid="ignore"):
            return opmath(g) / (y + y), None


class Relu(Function):
    @staticmethod
    def forward(ctx, x, fmt):
        ctx.out_format = fmt
        y = round_to(np.maximum(opmath(x), 0), fmt)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved
        return np.where(opmath(y) <= 0, 0, opmath(g)), None


class Clone(Function):
    @staticmethod
    def forward(ctx, x, fmt):
        ctx.out_format = fmt
        return x.copy()

    @staticmethod
    def backward(ctx, g):
        return g, None


def _unary(cls, name, doc):
    def op(input):
        check_tensor(input, "input", name)
        return cls.apply(input, input.format)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    return op


neg = autocast_op("passthrough")(_unary(Neg, "neg", "``−input`` (exact)."))
abs = autocast_op("passthrough")(_unary(
    Abs, "abs", "``|input|`` (exact). Backward ``g·sign(input)`` (0 at 0, as PyTorch)."))
sqrt = autocast_op("passthrough")(_unary(
    Sqrt, "sqrt", "``sqrt(input)``: IEEE float32 (float64 in fp64 mode) square root, correctly "
    "rounded, then rounded to the format. Backward ``g / (y + y)`` in the work dtype."))
relu = autocast_op("passthrough")(_unary(
    Relu, "relu", "``max(input, 0)`` (exact). Backward ``g`` where the output is > 0, else 0."))
clone = autocast_op("passthrough")(_unary(Clone, "clone", "A copy of ``input`` (same format)."))


# ---- transcendentals (float64 evaluation) --------------------------------------------------------


def _eval64(x: np.ndarray, name: str, fmt) -> np.ndarray:
    """f(x) evaluated in float64, rounded to the work dtype, then once more to ``fmt``."""
    xw = np.ascontiguousarray(opmath(x)).reshape(-1)
    return round_to(unary(xw, UNARY_OPS[name]).reshape(x.shape), fmt)


class _Transcendental(Function):
    """Forward ``f(x)`` in float64; subclasses give the name and the backward."""

    name = ""

    @classmethod
    def forward(cls, ctx, x, fmt):
        ctx.out_format = fmt
        y = _eval64(x, cls.name, fmt)
        ctx.save_for_backward(y)
        return y


class Exp(_Transcendental):
    name = "exp"

    @staticmethod
    def backward(ctx, g):  # d exp = g·y
        (y,) = ctx.saved
        return opmath(g) * opmath(y), None


class Tanh(_Transcendental):
    name = "tanh"

    @staticmethod
    def backward(ctx, g):  # PyTorch's tanh_backward: g·(1 − y·y)
        (y,) = ctx.saved
        y = opmath(y)
        return opmath(g) * (1 - y * y), None


class Sigmoid(_Transcendental):
    name = "sigmoid"

    @staticmethod
    def backward(ctx, g):  # PyTorch's sigmoid_backward: (g·(1 − y))·y
        (y,) = ctx.saved
        y = opmath(y)
        return (opmath(g) * (1 - y)) * y, None


class Log(Function):
    @staticmethod
    def forward(ctx, x, fmt):
        ctx.out_format = fmt
        ctx.save_for_backward(x)
        return _eval64(x, "log", fmt)

    @staticmethod
    def backward(ctx, g):  # g / x
        (x,) = ctx.saved
        with np.errstate(divide="ignore", invalid="ignore"):
            return opmath(g) / opmath(x), None


class Smooth(Function):
    """gelu / gelu_tanh / silu: forward and derivative both evaluated in float64."""

    @staticmethod
    def forward(ctx, x, fmt, name):
        ctx.out_format = fmt
        ctx.name = name
        ctx.save_for_backward(x)
        return _eval64(x, name, fmt)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved
        xw = np.ascontiguousarray(opmath(x)).reshape(-1)
        gw = np.ascontiguousarray(opmath(g), dtype=xw.dtype).reshape(-1)
        return unary_backward(xw, gw, UNARY_OPS[ctx.name]).reshape(x.shape), None, None


exp = autocast_op("fp32")(_unary(
    Exp, "exp", "``exp(input)`` evaluated in float64, rounded to float32 then to the format. "
    "Backward ``g·y`` (work dtype). Autocast: fp32."))
log = autocast_op("fp32")(_unary(
    Log, "log", "``log(input)`` evaluated in float64, rounded to float32 then to the format "
    "(−inf at 0, NaN below). Backward ``g / input``. Autocast: fp32."))
tanh = autocast_op("passthrough")(_unary(
    Tanh, "tanh", "``tanh(input)`` in float64, rounded to float32 then to the format. "
    "Backward ``g·(1 − y·y)``."))
sigmoid = autocast_op("passthrough")(_unary(
    Sigmoid, "sigmoid", "``1/(1+exp(−x))`` in float64 (as ``(tanh(x/2)+1)/2``), rounded to float32 "
    "then to the format. Backward ``(g·(1 − y))·y``."))


@autocast_op("passthrough")
def gelu(input, approximate: str = "none"):
    """GELU ``x·Φ(x) = x/2·(1 + erf(x/√2))`` (``approximate="tanh"``:
    ``x/2·(1 + tanh(√(2/π)(x + 0.044715x³)))``), the whole formula evaluated in float64 and
    rounded once to float32, then to the format. Backward ``g·f'(x)`` with f' and the product in
    float64, rounded once."""
    check_tensor(input, "input", "gelu")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh'; got {approximate!r}")
    return Smooth.apply(input, input.format, "gelu" if approximate == "none" else "gelu_tanh")


@autocast_op("passthrough")
def silu(input):
    """SiLU ``x·sigmoid(x)`` evaluated in float64, rounded once to float32, then to the format.
    Backward ``g·σ(x)(1 + x(1 − σ(x)))`` in float64, rounded once."""
    check_tensor(input, "input", "silu")
    return Smooth.apply(input, input.format, "silu")


# ---- pow -----------------------------------------------------------------------------------------


class Pow(Function):
    """``a ** b`` with a, b Tensors or numbers (evaluated by ``pow_elementwise`` in float64)."""

    @staticmethod
    def forward(ctx, a, b, fmt):
        work = work_dtype(fmt)
        ctx.out_format = fmt
        ctx.shapes = (np.shape(a), np.shape(b))
        shape = np.broadcast_shapes(*ctx.shapes)
        # own copies: np.broadcast_arrays' views are flagged "warn on write", and handing one to
        # a Numba kernel raises NumPy's FutureWarning about writing to broadcast arrays
        x, y = (np.array(np.broadcast_to(operand(v, work), shape)).reshape(-1) for v in (a, b))
        ctx.save_for_backward(x, y)
        return round_to(pow_elementwise(x, y, x, 0).reshape(shape), fmt)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved
        gw = np.ascontiguousarray(opmath(g), dtype=x.dtype).reshape(-1)
        grads = []
        for mode, shape, need in zip((1, 2), ctx.shapes, ctx.needs_input_grad):
            grads.append(unbroadcast(pow_elementwise(x, y, gw, mode).reshape(g.shape), shape)
                         if need else None)
        return grads[0], grads[1], None


@autocast_op("fp32")
def pow(input, exponent):
    """``input ** exponent`` (Tensors or numbers), ``math.pow`` in float64 from the exact
    operands, rounded to float32 then to the format (NaN for a negative base with a non-integer
    exponent). Backward ``g·b·a^(b−1)`` and ``g·a^b·log(a)``, each in float64, rounded once.
    Autocast: fp32."""
    fmt = _binary_format("pow", input, exponent)
    return Pow.apply(input, exponent, fmt)
