"""L4: ``Parameter`` and ``Module`` — the containers of ``mpt.nn``.

PyTorch-shaped (``torch.nn``): a :class:`Module` owns :class:`Parameter` s and child modules set as
attributes, ``module(x)`` calls ``forward``, ``state_dict``/``load_state_dict`` move numpy arrays
keyed by dotted names. Every computation is an op of ``mpt.functional`` with its own precision
contract; the modules add no rounding of their own except the explicit casts named below.

**Storage formats.** Parameters are created in fp32 (``format=`` on the constructors, or
:meth:`Module.to` afterwards, which rounds RNE through ``mpt.round``). An fp64 network
(``module.to("fp64")``) runs every op in float64: that is the mode the gradient checks use.

**Casts.** Modules never cast silently. Three explicit mechanisms exist:

* ``mpt.autocast(format, model=...)`` casts per op (PyTorch's CUDA autocast, by cast
  category: ``mpt.functional.autocast``);
* :meth:`Module.to` rounds the stored parameters once (Apex O2/O3 style fp16/bf16 networks);
* :meth:`Module.set_policy` attaches an :class:`mpt.Policy` (jmp / Haiku style, see there).

Leaf layers take ``seed`` (default 0, so two layers of one shape built with one seed are equal:
pass distinct seeds, or build them inside a composite, which re-draws each parameter keyed by its
dotted name; ``seed=None`` leaves zeros for the parent): ``mpt.nn.init``.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from mpt.autograd.context import State
from mpt.autograd.tensor import Tensor, round_to
from mpt.formats import Format, get_format
from mpt.nn.policy import Policy, get_policy

__all__ = ["Parameter", "Module"]


class Parameter(Tensor):
    """A leaf tensor a :class:`Module` owns and an optimizer updates (``requires_grad=True``).

    ``Parameter(data)``: ``data`` is a Tensor (its storage and format are taken over, not copied)
    or an ndarray in a format's storage dtype (``format=None`` infers it). ``.grad`` is assignable:
    ``None`` or a Tensor of the parameter's shape and format (``TypeError``/``ValueError``
    otherwise) — what loss scalers and gradient clipping write back.
    """

    def __init__(self, data, format=None, requires_grad: bool = True):
        if isinstance(data, Tensor):
            if format is not None and get_format(format) != data.format:
                raise ValueError(f"format {get_format(format).name} differs from the tensor's "
                                 f"{data.format.name}; cast it with .to() first")
            data, format = data.data, data.format
        super().__init__(data, format, requires_grad=requires_grad)

    def _cast_(self, fmt: Format) -> None:
        """Round the stored values (and the grad) RNE to ``fmt`` in place (``Module.to``)."""
        grad = self.grad
        self.format, self._data = fmt, round_to(self.data, fmt)
        self.bump_version()
        self.grad = None if grad is None else Tensor(round_to(grad.data, fmt), fmt)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


#: The policies of the modules whose forward is running, innermost last (a context state: a
#: checkpointed segment recomputed in the backward pass sees the policies of its forward).
POLICIES = State("module_policies", ())


class Module:
    """Base class of layers (``torch.nn.Module``-shaped).

    Attributes holding a :class:`Parameter` or a :class:`Module` are registered in assignment
    order; ``named_parameters`` lists each parameter once (the first name it is reachable by).
    ``training`` is toggled by :meth:`train`/:meth:`eval` (only :class:`Dropout` reads it).
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "policy", None)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call Module.__init__() "
                                 "before setting attributes")
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        object.__delattr__(self, name)

    # ---- calling -------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args, **kwargs):
        policy = self.policy
        if policy is None:
            return self.forward(*args, **kwargs)
        args, kwargs = policy.cast_to_compute((args, kwargs))
        with _policy_scope(policy):
            out = self.forward(*args, **kwargs)
        return policy.cast_to_output(out)

    def compute(self, param: Tensor | None) -> Tensor | None:
        """``param`` as a forward uses it: cast (RNE, differentiable) to the compute format of the
        innermost running module with a policy, else ``param`` itself. Layers read their
        parameters through this."""
        policies = POLICIES.get()
        if param is None or not policies:
            return param
        return policies[-1].cast_to_compute(param)

    def set_policy(self, policy) -> "Module":
        """Run this module under ``policy`` (an :class:`mpt.Policy` or a jmp string; None removes).

        Haiku's ``mixed_precision.set_policy`` semantics for one module tree: the parameters of
        this module and of its descendants without a policy of their own are rounded (RNE) now to
        ``param_format`` and stored so; on each call the floating tensor inputs are cast to
        ``compute_format``, each parameter is cast to ``compute_format`` where a layer uses it
        (the cast is differentiable: its gradient is rounded to ``param_format``), and floating
        outputs are cast to ``output_format``. A descendant with its own policy applies its own
        instead: ``norm.set_policy("p=f32,c=f32,o=bf16")`` inside a ``"p=bf16"`` network keeps a
        norm in fp32 and hands bf16 on (descendants without a policy do not cast their inputs, so
        the formats must meet). Returns ``self``.
        """
        if policy is not None and not isinstance(policy, Policy):
            policy = get_policy(policy)
        object.__setattr__(self, "policy", policy)
        if policy is not None:
            for p in _own_tree_parameters(self):
                if p.format != policy.param_format:
                    p._cast_(policy.param_format)
        return self

    # ---- traversal -----------------------------------------------------------------------------
    def named_modules(self, prefix: str = ""):
        """``(dotted name, module)`` for this module and every descendant, each once, pre-order."""
        seen, stack = set(), [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = [(f"{name}.{n}" if name else n, m) for n, m in module._modules.items()]
            stack.extend(reversed(children))

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_children(self):
        return iter(self._modules.items())

    def children(self):
        return iter(self._modules.values())

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        """``(dotted name, parameter)``, each parameter once (a tied one under its first name)."""
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mod_name, module in modules:
            for name, p in module._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self, recurse: bool = True):
        return (p for _, p in self.named_parameters(recurse=recurse))

    # ---- modes and gradients -------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every parameter's grad (``set_to_none``, PyTorch's default) or zero it in place."""
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

    def to(self, format) -> "Module":
        """Round every parameter (and its grad) RNE to ``format`` in place; returns ``self``."""
        fmt = get_format(format)
        if fmt.kind != "float":
            raise ValueError(f"format must be a floating format; got {fmt.name}")
        for p in self.parameters():
            if p.format != fmt:
                p._cast_(fmt)
        return self

    # ---- state dict ----------------------------------------------------------------------------
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Copies of the parameter storage arrays (dtype = format dtype) keyed by dotted name."""
        return OrderedDict((name, p.numpy()) for name, p in self.named_parameters())

    def load_state_dict(self, state: dict, strict: bool = True) -> tuple:
        """Copy arrays into the parameters (bumping their versions); returns ``(missing,
        unexpected)`` key lists. ``strict`` raises ``KeyError`` if either is non-empty. Each array
        must have the parameter's shape and storage dtype and hold values of its format
        (``ValueError``/``TypeError``): nothing is rounded on load. Nothing is written unless
        every check passes.
        """
        params = dict(self.named_parameters())
        missing = [k for k in params if k not in state]
        unexpected = [k for k in state if k not in params]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for name, p in params.items():
            if name in state:
                _check_loadable(name, state[name], p)
        for name, p in params.items():
            if name in state:
                p.data = np.array(state[name], dtype=p.format.dtype, copy=True)
        return missing, unexpected

    # ---- initialisation ------------------------------------------------------------------------
    def reset_parameters(self, seed: int = 0) -> "Module":
        """Re-draw every parameter from ``seed``: each module's own rule (:meth:`_init_parameter`)
        keyed by the parameter's dotted name under ``self``. Returns ``self``."""
        for mod_name, module in self.named_modules():
            for name, p in module._parameters.items():
                module._init_parameter(name, p, seed, f"{mod_name}.{name}" if mod_name else name)
        return self

    def _init_parameter(self, name: str, param: Parameter, seed: int, key: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no init rule for {name!r}")

    # ---- printing ------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        children = [f"({n}): " + repr(m).replace("\n", "\n  ") for n, m in self._modules.items()]
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = ([self.extra_repr()] if self.extra_repr() else []) + children
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"


def _policy_scope(policy: Policy):
    return POLICIES.scoped(POLICIES.get() + (policy,))


def _own_tree_parameters(module: Module):
    """Parameters of ``module`` and of its descendants that have no policy of their own."""
    yield from module._parameters.values()
    for child in module._modules.values():
        if child.policy is None:
            yield from _own_tree_parameters(child)


def _check_loadable(name: str, array, p: Parameter) -> None:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"state[{name!r}] must be a numpy ndarray; got {type(array).__name__}")
    if array.shape != p.shape:
        raise ValueError(f"state[{name!r}] has shape {array.shape}; the parameter has {p.shape}")
    if array.dtype != p.format.dtype:
        raise TypeError(f"state[{name!r}] has dtype {array.dtype}; the {p.format.name} parameter "
                        f"is stored as {np.dtype(p.format.dtype).name} (cast it explicitly)")
    exact = round_to(array, p.format)  # no-op unless the format is narrower than its dtype
    if exact is not array and not np.array_equal(exact.view(np.uint8), array.view(np.uint8)):
        raise ValueError(f"state[{name!r}] holds values that are not {p.format.name} numbers")


