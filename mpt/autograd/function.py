"""L2: ``Function`` — a differentiable op written over plain arrays.

Subclass it with two static methods::

    class Square(Function):
        @staticmethod
        def forward(ctx, x):                 # x: the storage array of the input Tensor
            ctx.save_for_backward(x)
            return round_to(opmath(x) * opmath(x), get_format(x.dtype))
        @staticmethod
        def backward(ctx, g):                # g: array in the OUTPUT tensor's format
            (x,) = ctx.saved
            return 2 * opmath(x) * opmath(g)  # rounded by the engine to x's format

    y = Square.apply(x)

``apply`` hands ``forward`` the storage arrays of Tensor arguments (other arguments unchanged) and
wraps the returned array as a Tensor of ``ctx.out_format`` (default: the format of its dtype). The
gradient handed to ``backward`` is an array in the output tensor's format and must not be written
into; ``backward`` returns one gradient per positional argument of ``forward`` (``None`` for
non-tensors or inputs that need none; check ``ctx.needs_input_grad``), in any float dtype: the
engine rounds each (RNE) to its input's format before accumulating (see ``mpt.autograd.tensor``).

Arrays passed to ``ctx.save_for_backward`` that are an input's or the output's storage are
version-checked: reading ``ctx.saved`` after such a tensor was changed in place raises
``RuntimeError``.
"""
from __future__ import annotations

import itertools

import numpy as np

from mpt.autograd.hooks import notify_saved
from mpt.autograd.tensor import Tensor, is_grad_enabled, opmath, register_op, round_to
from mpt.formats import get_format

__all__ = ["Function", "Context", "Cast", "to"]


_SEQUENCE = itertools.count()


class Context:
    """What one call of a Function keeps for its backward (``ctx`` in ``forward``/``backward``).

    Attributes: ``needs_input_grad`` (one bool per positional argument), ``out_format`` (set it in
    forward to override the output format), ``saved`` (what ``save_for_backward`` stored), and any
    attribute ``forward`` sets.
    """

    def __init__(self, fn, needs_input_grad):
        self.seq = next(_SEQUENCE)  # creation order: backward runs latest first
        self.fn = fn
        self.needs_input_grad = needs_input_grad
        self.out_format = None
        self.inputs = ()            # the Tensor per positional argument needing grad, else None
        self.retained = None        # weakref to the output when it retains its grad
        self._saved = ()
        self._versions = ()         # (tensor, version at save time) for saved tensor storages
        self._released = False

    def save_for_backward(self, *items) -> None:
        """Keep arrays (or anything) for ``backward``; read them back as ``ctx.saved``."""
        self._saved = items

    @property
    def saved(self) -> tuple:
        if self._released:
            raise RuntimeError(
                f"{self.fn.__name__}: trying to backward through the graph a second time (its "
                "saved arrays were freed); call backward(retain_graph=True) the first time")
        for t, version in self._versions:
            if t._version != version:
                raise RuntimeError(
                    f"{self.fn.__name__}: a {t.format.name} tensor of shape {t.shape} saved for "
                    f"backward was modified in place (version {t._version}, saved at version "
                    f"{version}); clone it before changing it")
        return self._saved

    saved_tensors = saved

    def run_backward(self, g: np.ndarray, retain_graph: bool) -> tuple:
        """Call the Function's backward; one gradient (or None) per positional argument."""
        grads = self.fn.backward(self, g)
        if not isinstance(grads, tuple):
            grads = (grads,)
        if len(grads) != len(self.inputs):
            raise RuntimeError(f"{self.fn.__name__}.backward returned {len(grads)} gradients for "
                               f"{len(self.inputs)} forward arguments")
        if not retain_graph:  # (dropping _versions too breaks the output <-> node cycle)
            self._saved, self._released, self._versions = (), True, ()
        return grads


class Function:
    """Base class of differentiable ops (see the module docstring)."""

    @staticmethod
    def forward(ctx: Context, *args, **kwargs) -> np.ndarray:
        raise NotImplementedError("a Function subclass defines forward(ctx, *args)")

    @staticmethod
    def backward(ctx: Context, grad: np.ndarray):
        raise NotImplementedError("a Function subclass defines backward(ctx, grad) to be "
                                  "differentiated")

    @classmethod
    def apply(cls, *args, **kwargs) -> Tensor:
        """Run ``forward`` on the arrays of ``args`` and return its result as a Tensor, recording
        the graph when grad mode is on and an argument requires grad."""
        record = is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args)
        ctx = Context(cls, tuple(isinstance(a, Tensor) and a.requires_grad and record
                                 for a in args))
        out = cls.forward(ctx, *[a._data if isinstance(a, Tensor) else a for a in args], **kwargs)
        if not isinstance(out, np.ndarray):
            raise TypeError(f"{cls.__name__}.forward must return an ndarray; "
                            f"got {type(out).__name__}")
        result = Tensor(out, ctx.out_format or get_format(out.dtype), requires_grad=record)
        if record:
            ctx.inputs = tuple(a if needs else None for a, needs in zip(args, ctx.needs_input_grad))
            ctx._versions = _saved_versions(ctx._saved, args, out, result)
            result._node = ctx
            notify_saved(ctx._saved)  # autograd hooks (the memory ledger counts activations)
        return result


def _saved_versions(saved, args, out, result) -> tuple:
    """(tensor, version) for every saved array that is an input's or the output's storage."""
    versions = []
    for item in saved:
        if item is out:
            versions.append((result, 0))
            continue
        for a in args:
            if isinstance(a, Tensor) and item is a._data:
                versions.append((a, a._version))
                break
    return tuple(versions)


# ---- the one op L2 needs itself: a differentiable cast -------------------------------------------
class Cast(Function):
    """``x.to(fmt, mode)``: forward ``mpt.round(exact(x), fmt, mode)`` (one rounding from the
    exact value); backward rounds the incoming gradient (RNE) to ``x``'s format, as PyTorch's
    ``to`` does (straight-through, no mode-dependent factor)."""

    @staticmethod
    def forward(ctx, x, fmt, mode):
        ctx.out_format = fmt
        return round_to(opmath(x), fmt, mode)

    @staticmethod
    def backward(ctx, g):
        return opmath(g), None, None


def to(x: Tensor, format, mode: str = "nearest_even") -> Tensor:
    """``x`` rounded to ``format`` (``x`` itself when it already has it), differentiable."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a Tensor; got {type(x).__name__}")
    fmt = get_format(format)
    if fmt == x.format:
        return x
    return Cast.apply(x, fmt, mode)


register_op("to", to)
