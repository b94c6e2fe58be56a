"""L4: modules — ``Parameter``, ``Module`` and the layers of a small GPT.

PyTorch-shaped (``torch.nn``): a :class:`Module` owns :class:`Parameter` s and child modules set as
attributes, ``module(x)`` calls ``forward``, ``state_dict``/``load_state_dict`` move numpy arrays
keyed by dotted names. Every computation is an op of ``mpt.functional`` with its own precision
contract; the modules add no rounding of their own except the explicit casts named below.

**Storage formats.** Parameters are created in fp32 (``format=`` on the constructors, or
:meth:`Module.to` afterwards, which rounds RNE through ``mpt.round``). An fp64 model
(``module.to("fp64")``) runs every op in float64: that is the mode the gradient checks use.

**Casts.** Modules never cast silently. Three explicit mechanisms exist:

* ``mpt.autocast(dtype=..., model=...)`` casts per op (PyTorch's CUDA policy, ``mpt.autocast``);
* :meth:`Module.to` rounds the stored parameters once (Apex O2/O3 style fp16/bf16 models);
* :meth:`Module.set_policy` attaches an :class:`mpt.Policy` (jmp / Haiku style, see there).

**Initialisation** (:func:`gaussian`, :func:`init_normal_`, :func:`init_uniform_`): every random
value is a function of ``(seed, key, index)`` only, where ``key`` is the parameter's dotted name
under the module that initialised it. The words come from mpt's counter-based Philox4x32-10 stream
(``mpt.kernels.random``, stream id = first 8 bytes of BLAKE2b of the key); uniforms take 53 bits;
normals use Marsaglia's polar method with a logarithm written in IEEE ``+ - * /`` only
(:func:`_log`), so the float64 samples do not depend on the platform's libm or numpy's SIMD
paths, and they are rounded once (RNE) to the parameter's format. Same seed → same bits on every
machine, every run, any thread count. Leaf layers take ``seed`` (default 0, so two layers of one
shape built with one seed are equal: pass distinct seeds, or build them inside a composite, which
re-draws each parameter keyed by its dotted name; ``seed=None`` leaves zeros for the parent).
Default rules follow PyTorch (Linear/Conv2d uniform ``±1/sqrt(fan_in)``, Embedding normal(0, 1),
norms 1 and 0); :class:`GPT` uses GPT-2's.
"""
from __future__ import annotations

import functools
import hashlib
import math
from collections import OrderedDict

import numpy as np

import mpt.functional as F
from mpt._checks import check_bool, check_int, check_real
from mpt.autograd.context import State
from mpt.checkpoint import checkpoint_sequential
from mpt.formats import Format, get_format
from mpt.kernels.random import random_words
from mpt.policy import Policy, get_policy
from mpt.tensor import Tensor, round_to

__all__ = [
    "Parameter", "Module", "Linear", "Conv2d", "LayerNorm", "RMSNorm", "Embedding", "Dropout",
    "Sequential", "ModuleList", "MLP", "MultiheadAttention", "TransformerBlock", "GPT",
    "gaussian", "uniform", "init_normal_", "init_uniform_", "init_constant_",
]


# ---- reproducible initialisation --------------------------------------------------------------
_LN2_HI = float.fromhex("0x1.62e42feep-1")           # ln 2, high 32 bits: e * _LN2_HI is exact
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")     # ln 2 - _LN2_HI
_SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")
_ATANH_TERMS = tuple(1.0 / (2 * k + 1) for k in range(11))  # 1/1, 1/3, ..., 1/21


def _log(x: np.ndarray) -> np.ndarray:
    """Natural log of positive float64 ``x`` from IEEE ``+ - * /`` only (platform-independent).

    ``x = m 2^e`` with ``m`` in ``[√½, √2)`` (``frexp``, exact); ``ln m = 2 atanh(f)``,
    ``f = (m-1)/(m+1)``, ``|f| <= 0.1716``: the series ``2f Σ f^2k/(2k+1)`` truncated after 11
    terms leaves ``< 0.0295^11/23 < 2^-59``. Error a few float64 ulps (checked against
    ``math.log`` in ``tests/test_nn.py``).
    """
    m, e = np.frexp(x)
    low = m < _SQRT_HALF
    m = np.where(low, m * 2.0, m)
    e = (e - low).astype(np.float64)
    f = (m - 1.0) / (m + 1.0)
    z = f * f
    p = np.full_like(z, _ATANH_TERMS[-1])
    for c in _ATANH_TERMS[-2::-1]:
        p = p * z + c
    return e * _LN2_HI + (e * _LN2_LO + 2.0 * f * p)


def _stream(key: str) -> int:
    """The Philox stream id of a parameter key (64 bits of BLAKE2b: stable across runs)."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a str (a parameter's dotted name); got {type(key).__name__}")
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def uniform(seed: int, key: str, n: int) -> np.ndarray:
    """``n`` float64 uniforms in ``[0, 1)``: value ``i`` is ``(w[2i] 2^21 + w[2i+1] >> 11) 2^-53``
    for the Philox words ``w`` of stream ``(seed, key)`` (53 random bits, exact)."""
    n = check_int("n", n, min=0)
    w = random_words(seed, _stream(key), 2 * n).astype(np.uint64)  # (2n,)
    bits = (w[0::2] << np.uint64(21)) | (w[1::2] >> np.uint64(11))  # (n,) 53-bit integers
    return bits.astype(np.float64) * 2.0**-53


def gaussian(seed: int, key: str, n: int) -> np.ndarray:
    """``n`` float64 standard normals of stream ``(seed, key)`` (Marsaglia's polar method).

    Pairs ``u, v = 2U - 1`` (exact) with ``s = u² + v²`` in ``(0, 1)`` are accepted in stream
    order; each gives ``u k, v k`` with ``k = sqrt(-2 ln s / s)``. The first ``n`` values do not
    depend on ``n`` (a longer draw extends a shorter one).
    """
    n = check_int("n", n, min=0)
    pairs = (n + 1) // 2
    draw = pairs * 4 // 3 + 64  # acceptance is π/4 ≈ 0.785
    while True:
        u = 2.0 * uniform(seed, key, 2 * draw) - 1.0  # (2 draw,)
        u, v = u[0::2], u[1::2]
        s = u * u + v * v
        ok = (s > 0.0) & (s < 1.0)
        if np.count_nonzero(ok) >= pairs:
            break
        draw *= 2
    u, v, s = u[ok][:pairs], v[ok][:pairs], s[ok][:pairs]
    k = np.sqrt(-2.0 * _log(s) / s)
    return np.stack([u * k, v * k], axis=1).reshape(-1)[:n]


def init_normal_(param: Tensor, std: float, *, seed: int, key: str, mean: float = 0.0) -> Tensor:
    """Fill ``param`` with ``mean + std·gaussian(seed, key)`` (float64), rounded RNE to its
    format."""
    std = check_real("std", std, min=0)
    values = check_real("mean", mean) + std * gaussian(seed, key, param.size)
    param.copy_(values.reshape(param.shape))
    return param


def init_uniform_(param: Tensor, bound: float, *, seed: int, key: str) -> Tensor:
    """Fill ``param`` with ``bound·(2U - 1)``, uniform in ``[-bound, bound)`` (float64), rounded
    RNE to its format."""
    values = check_real("bound", bound, min=0) * (2.0 * uniform(seed, key, param.size) - 1.0)
    param.copy_(values.reshape(param.shape))
    return param


def init_constant_(param: Tensor, value: float) -> Tensor:
    """Fill ``param`` with ``value`` rounded RNE to its format."""
    param.copy_(np.full(param.shape, value, np.float64))
    return param


# ---- parameters and modules -------------------------------------------------------------------
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
        instead: ``norm.set_policy("p=f32,c=f32,o=bf16")`` inside a ``"p=bf16"`` model keeps a
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


# ---- layers ----------------------------------------------------------------------------------
def _new_parameter(shape, format) -> Parameter:
    fmt = get_format(format)
    if fmt.kind != "float":
        raise ValueError(f"format must be a floating format; got {fmt.name}")
    return Parameter(np.zeros(shape, fmt.dtype), fmt)


def _shape(normalized_shape) -> tuple:
    """``normalized_shape`` (an int or a sequence of them, each >= 0) as a tuple of ints."""
    shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else \
        normalized_shape
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"normalized_shape must be an int or a sequence of ints; got "
                        f"{type(normalized_shape).__name__}")
    return tuple(check_int(f"normalized_shape[{i}]", n, min=0) for i, n in enumerate(shape))


def _kernel_size(kernel_size) -> tuple:
    """(kh, kw) of an int or a pair of ints, each >= 1."""
    pair = (kernel_size, kernel_size) if isinstance(kernel_size, (int, np.integer)) else \
        kernel_size
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"kernel_size must be an int or a pair of ints; got {kernel_size!r}")
    return tuple(check_int("kernel_size", k, min=1) for k in pair)


def fan_in_bound(fan_in: int) -> float:
    """PyTorch's default init bound ``1/sqrt(fan_in)``, and 0 for a layer without inputs
    (``fan_in = 0``: PyTorch's ``bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0``)."""
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def _seeded(module: Module, seed) -> None:
    """Draw ``module``'s parameters from ``seed`` (``None``: leave them zero, for a parent that
    calls :meth:`Module.reset_parameters` on the whole tree)."""
    if seed is not None:
        module.reset_parameters(seed)


class Linear(Module):
    """``y = x·Wᵀ + b`` (``F.linear``: GEMMs with the active matmul model, bias in the FP32
    epilogue). ``weight`` (out, in), ``bias`` (out,) or None. Init (PyTorch's default): weight and
    bias uniform in ``±1/sqrt(in_features)`` (:func:`fan_in_bound`: with ``in_features = 0``, as
    PyTorch allows, the bias is 0 and the output is the bias)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 format="fp32", seed: int | None = 0):
        super().__init__()
        self.in_features = check_int("in_features", in_features, min=0)
        self.out_features = check_int("out_features", out_features, min=0)
        self.weight = _new_parameter((self.out_features, self.in_features), format)
        self.bias = _new_parameter((self.out_features,), format) \
            if check_bool("bias", bias) else None
        _seeded(self, seed)

    def _init_parameter(self, name, param, seed, key):
        if self.in_features == 0:
            init_constant_(param, 0.0)          # uniform in ±0: +0 (the weight has no element)
        else:
            init_uniform_(param, fan_in_bound(self.in_features), seed=seed, key=key)

    def forward(self, x):
        return F.linear(x, self.compute(self.weight), self.compute(self.bias))  # (..., out)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, format={self.weight.format.name}")


class Conv2d(Module):
    """2-D convolution (``F.conv2d``: im2col onto the GEMM). ``weight`` (O, C/groups, kh, kw).
    Init (PyTorch's default): uniform in ``±1/sqrt(C/groups·kh·kw)`` for weight and bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, *, format="fp32",
                 seed: int | None = 0):
        super().__init__()
        in_channels = check_int("in_channels", in_channels, min=0)
        out_channels = check_int("out_channels", out_channels, min=0)
        groups = check_int("groups", groups, min=1)
        kh, kw = _kernel_size(kernel_size)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"groups={groups} must divide in_channels={in_channels} and "
                             f"out_channels={out_channels}")
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.fan_in = in_channels // groups * kh * kw
        self.weight = _new_parameter((out_channels, in_channels // groups, kh, kw), format)
        self.bias = _new_parameter((out_channels,), format) if check_bool("bias", bias) else None
        _seeded(self, seed)

    def _init_parameter(self, name, param, seed, key):
        if self.fan_in == 0:
            init_constant_(param, 0.0)          # uniform in ±0: +0 (the weight has no element)
        else:
            init_uniform_(param, fan_in_bound(self.fan_in), seed=seed, key=key)

    def forward(self, x):  # (N, C, H, W) -> (N, O, Ho, Wo)
        return F.conv2d(x, self.compute(self.weight), self.compute(self.bias), self.stride,
                        self.padding, self.dilation, self.groups)

    def extra_repr(self):
        o, c, kh, kw = self.weight.shape
        return (f"{c * self.groups}, {o}, kernel_size=({kh}, {kw}), stride={self.stride}, "
                f"padding={self.padding}, format={self.weight.format.name}")


class LayerNorm(Module):
    """``F.layer_norm`` over the last dimensions; weight 1, bias 0 at init."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, *, format="fp32"):
        super().__init__()
        shape = _shape(normalized_shape)
        self.normalized_shape, self.eps = shape, check_real("eps", eps, min=0)
        affine = check_bool("elementwise_affine", elementwise_affine)
        self.weight = _new_parameter(shape, format) if affine else None
        self.bias = _new_parameter(shape, format) if affine and check_bool("bias", bias) else None
        self.reset_parameters()

    def _init_parameter(self, name, param, seed, key):
        init_constant_(param, 1.0 if name == "weight" else 0.0)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.compute(self.weight),
                            self.compute(self.bias), self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(Module):
    """``F.rms_norm`` over the last dimensions (``eps=None``: the format's epsilon); weight 1."""

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, *, format="fp32"):
        super().__init__()
        shape = _shape(normalized_shape)
        self.normalized_shape = shape
        self.eps = check_real("eps", eps, min=0, optional=True)
        affine = check_bool("elementwise_affine", elementwise_affine)
        self.weight = _new_parameter(shape, format) if affine else None
        self.reset_parameters()

    def _init_parameter(self, name, param, seed, key):
        init_constant_(param, 1.0)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.compute(self.weight), self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class Embedding(Module):
    """Rows of ``weight`` (num_embeddings, embedding_dim) at integer indices (``F.embedding``).
    Init (PyTorch's default): normal(0, 1); the ``padding_idx`` row 0."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, *,
                 format="fp32", seed: int | None = 0):
        super().__init__()
        num_embeddings = check_int("num_embeddings", num_embeddings, min=0)
        embedding_dim = check_int("embedding_dim", embedding_dim, min=0)
        self.padding_idx = check_int("padding_idx", padding_idx, min=-num_embeddings,
                                     max=num_embeddings - 1, optional=True)
        self.weight = _new_parameter((num_embeddings, embedding_dim), format)
        _seeded(self, seed)

    def _init_parameter(self, name, param, seed, key):
        init_normal_(param, 1.0, seed=seed, key=key)
        if self.padding_idx is not None:
            param[self.padding_idx] = 0.0

    def forward(self, idx):  # (...) ints -> (..., D)
        return F.embedding(idx, self.compute(self.weight), self.padding_idx)

    def extra_repr(self):
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}, format={self.weight.format.name}"


class Dropout(Module):
    """``F.dropout(x, p, self.training)``: masks from the dropout generator of
    ``mpt.functional`` (``F.manual_seed``; one Philox stream per call, replayable with
    ``F.get_rng_state``/``F.set_rng_state``). Identity in eval mode or when ``p == 0``."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= check_real("p", p) <= 1.0:
            raise ValueError(f"p must be in [0, 1]; got {p}")
        self.p = float(p)

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class ModuleList(Module):
    """Modules registered under the names ``"0"``, ``"1"``, …; indexable and iterable."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> "ModuleList":
        if not isinstance(module, Module):
            raise TypeError(f"module must be a Module; got {type(module).__name__}")
        setattr(self, str(len(self._modules)), module)
        return self

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class Sequential(ModuleList):
    """``Sequential(a, b, c)(x) == c(b(a(x)))``."""

    def __init__(self, *modules):
        super().__init__(modules)

    def forward(self, x):
        for m in self:
            x = m(x)
        return x


class MLP(Module):
    """``fc2(gelu(fc1(x)))`` then dropout: ``fc1`` (d_model → hidden, default 4·d_model),
    ``fc2`` (hidden → d_model). ``approximate="tanh"`` is GPT-2's GELU (``"none"``: the erf form).
    Init: each Linear's default, keyed ``fc1.*``/``fc2.*`` under ``seed``."""

    def __init__(self, d_model: int, hidden: int | None = None, dropout: float = 0.0,
                 approximate: str = "tanh", bias: bool = True, *, format="fp32",
                 seed: int | None = 0):
        super().__init__()
        d_model = check_int("d_model", d_model, min=1)
        hidden = 4 * d_model if hidden is None else check_int("hidden", hidden, min=1)
        self.approximate = approximate
        self.fc1 = Linear(d_model, hidden, bias, format=format, seed=None)
        self.fc2 = Linear(hidden, d_model, bias, format=format, seed=None)
        self.dropout = Dropout(dropout)
        _seeded(self, seed)

    def forward(self, x):  # (..., d) -> (..., d)
        return self.dropout(self.fc2(F.gelu(self.fc1(x), self.approximate)))


#: Attention implementations by name: ``fn(q, k, v, attn_mask=None, dropout_p=0.0,
#: is_causal=False)`` on (B, H, T, hd) tensors, ``F.scaled_dot_product_attention``'s signature.
#: "flash" is its FlashAttention-2 backend (tiled, O(T) memory; no attn_mask).
ATTENTION_BACKENDS = {"naive": F.scaled_dot_product_attention,
                      "flash": functools.partial(F.scaled_dot_product_attention, backend="flash")}


def register_attention_backend(name: str, fn) -> None:
    """Make ``fn`` (``F.scaled_dot_product_attention``'s signature) selectable as
    ``MultiheadAttention(..., backend=name)`` (looked up when the module runs)."""
    if not isinstance(name, str) or not callable(fn):
        raise TypeError("register_attention_backend needs a str name and a callable fn")
    ATTENTION_BACKENDS[name] = fn


class MultiheadAttention(Module):
    """Multi-head self-attention on (B, T, d_model) inputs, batch first.

    ``qkv = in_proj(x)`` (one fused Linear d → 3d, GPT-2's ``c_attn``), heads split to
    (B, H, T, d/H), attention by ``backend`` (a name in :data:`ATTENTION_BACKENDS` or a callable;
    default ``"flash"``, FlashAttention-2; ``"naive"`` materialises the score matrix; dropout_p =
    ``dropout`` in training),
    heads merged, ``out_proj`` (d → d), then residual dropout (GPT-2's ``resid_dropout``).
    ``causal=True``: query i attends keys ``j <= i``.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 causal: bool = False, backend="flash", *, format="fp32", seed: int | None = 0):
        super().__init__()
        d_model = check_int("d_model", d_model, min=1)
        n_heads = check_int("n_heads", n_heads, min=1)
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.d_model, self.n_heads, self.backend = d_model, n_heads, backend
        self.causal = check_bool("causal", causal)
        self.attn_dropout = check_real("dropout", dropout, min=0, lt=1)
        self.in_proj = Linear(d_model, 3 * d_model, bias, format=format, seed=None)
        self.out_proj = Linear(d_model, d_model, bias, format=format, seed=None)
        self.resid_dropout = Dropout(dropout)
        _seeded(self, seed)

    def _attention(self):
        if callable(self.backend):
            return self.backend
        try:
            return ATTENTION_BACKENDS[self.backend]
        except KeyError:
            raise ValueError(f"unknown attention backend {self.backend!r}; registered: "
                             f"{', '.join(ATTENTION_BACKENDS)}") from None

    def forward(self, x, attn_mask=None):
        B, T, d = x.shape
        H = self.n_heads
        qkv = self.in_proj(x).reshape(B, T, 3, H, d // H).permute(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
        p = self.attn_dropout if self.training else 0.0
        y = self._attention()(qkv[0], qkv[1], qkv[2], attn_mask=attn_mask, dropout_p=p,
                              is_causal=self.causal)                             # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, d)                                   # (B, T, d)
        return self.resid_dropout(self.out_proj(y))

    def extra_repr(self):
        return f"d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal}"


class TransformerBlock(Module):
    """Pre-LN GPT-2 block: ``x = x + attn(ln1(x))``, ``x = x + mlp(ln2(x))``, causal attention.
    The residual additions are ``F.add`` in the activations' format (one rounding each)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, *, mlp_ratio: int = 4,
                 backend="flash", format="fp32", seed: int | None = 0):
        super().__init__()
        mlp_ratio = check_int("mlp_ratio", mlp_ratio, min=1)
        self.ln1 = LayerNorm(d_model, format=format)
        self.attn = MultiheadAttention(d_model, n_heads, dropout, causal=True, backend=backend,
                                       format=format, seed=None)
        self.ln2 = LayerNorm(d_model, format=format)
        self.mlp = MLP(d_model, mlp_ratio * d_model, dropout, format=format, seed=None)
        _seeded(self, seed)

    def forward(self, x):  # (B, T, d) -> (B, T, d)
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(Module):
    """A small GPT-2: token + position embeddings, dropout, ``n_layers`` pre-LN blocks, final
    LayerNorm, LM head **tied** to the token embedding (``logits = x·wteᵀ``, GPT-2's choice; the
    head adds no parameters and its gradient accumulates into ``wte.weight``).

    ``model(idx)`` maps int token ids (B, T), T <= seq_len, to logits (B, T, vocab) in the
    activations' format; ``model.loss(idx, targets)`` is the mean ``F.cross_entropy``.

    Init (GPT-2 / nanoGPT, drawn by :meth:`reset_parameters` from ``seed``, each parameter keyed
    by its dotted name): every Linear and Embedding weight normal(0, 0.02); the residual
    projections (``attn.out_proj.weight``, ``mlp.fc2.weight``) normal(0, 0.02/sqrt(2·n_layers));
    biases 0; LayerNorm weights 1. Parameters are stored in ``format`` (fp32 by default), each
    value rounded once (RNE) from its float64 draw.

    ``checkpoint``: gradient checkpointing of the blocks (``mpt.checkpoint_sequential``): False,
    True (round(√n_layers) segments) or a number of segments; only segment inputs are kept and
    each segment is recomputed in the backward pass (bit-identical gradients).
    """

    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, seq_len: int,
                 dropout: float = 0.0, seed: int = 0, *, backend="flash", format="fp32",
                 checkpoint=False):
        super().__init__()
        self.vocab = check_int("vocab", vocab, min=1)
        self.seq_len = check_int("seq_len", seq_len, min=1)
        self.n_layers = n_layers = check_int("n_layers", n_layers, min=0)
        if not isinstance(checkpoint, bool) and checkpoint != "sqrt" and \
                (isinstance(checkpoint, str) or not isinstance(checkpoint, (int, np.integer))
                 or checkpoint < 0):
            raise ValueError(f"checkpoint must be False, True, 'sqrt' or a number of segments "
                             f"(an int >= 0); got {checkpoint!r}")
        self.checkpoint = "sqrt" if checkpoint is True else checkpoint
        self.wte = Embedding(vocab, d_model, format=format, seed=None)
        self.wpe = Embedding(seq_len, d_model, format=format, seed=None)
        self.drop = Dropout(dropout)
        self.blocks = ModuleList(TransformerBlock(d_model, n_heads, dropout, backend=backend,
                                                  format=format, seed=None)
                                 for _ in range(n_layers))
        self.ln_f = LayerNorm(d_model, format=format)
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int = 0) -> "GPT":
        std = 0.02
        residual = {id(b.attn.out_proj.weight) for b in self.blocks} | \
                   {id(b.mlp.fc2.weight) for b in self.blocks}
        for mod_name, module in self.named_modules():
            for name, p in module._parameters.items():
                key = f"{mod_name}.{name}" if mod_name else name
                if isinstance(module, (Linear, Embedding)) and name == "weight":
                    scale = 1.0 / math.sqrt(2 * self.n_layers) if id(p) in residual else 1.0
                    init_normal_(p, std * scale, seed=seed, key=key)
                elif isinstance(module, Linear):
                    init_constant_(p, 0.0)
                else:
                    module._init_parameter(name, p, seed, key)
        return self

    def forward(self, idx):  # (B, T) ints -> (B, T, vocab)
        idx = _token_ids(idx, "idx")
        if idx.ndim != 2 or idx.shape[1] > self.seq_len:
            raise ValueError(f"idx must be (batch, T) token ids with T <= {self.seq_len}; "
                             f"got shape {idx.shape}")
        x = self.drop(self.wte(idx) + self.wpe(np.arange(idx.shape[1])))  # (B, T, d)
        if self.checkpoint:
            x = checkpoint_sequential(self.blocks, self.checkpoint, x)
        else:
            for block in self.blocks:
                x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.compute(self.wte.weight))  # tied head, (B, T, vocab)

    def loss(self, idx, targets):
        """Mean cross-entropy of the next-token logits against ``targets`` (B, T) ints."""
        logits = self(idx)
        B, T, V = logits.shape
        targets = _token_ids(targets, "targets")
        if targets.shape != (B, T):
            raise ValueError(f"targets must have the shape of idx {(B, T)}; got {targets.shape}")
        return F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))

    def extra_repr(self):
        return f"vocab={self.vocab}, seq_len={self.seq_len}, n_layers={self.n_layers}"


def _token_ids(x, arg: str) -> np.ndarray:
    """Token ids (an int ndarray, nested lists or an integer Tensor) as an int ndarray."""
    ids = np.asarray(x.data if isinstance(x, Tensor) else x)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{arg} must hold integer token ids; got dtype {ids.dtype}")
    return ids
