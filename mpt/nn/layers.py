"""L4: the layers — Linear, Conv2d, the norms, Embedding, Dropout, containers and the MLP.

Each layer computes with ``mpt.functional`` ops (their docstrings state the precision contract)
on its parameters as :meth:`~mpt.nn.Module.compute` hands them (cast to the running policy's
compute format, if any). Initialisation: PyTorch's default rules (``mpt.nn.init``), drawn from
``seed`` when a layer is built alone.
"""
from __future__ import annotations

import math

import numpy as np

import mpt.functional as F
from mpt._checks import check_bool, check_int, check_real
from mpt.formats import get_format
from mpt.nn.init import init_constant_, init_normal_, init_uniform_
from mpt.nn.module import Module, Parameter

__all__ = ["Linear", "Conv2d", "LayerNorm", "RMSNorm", "Embedding", "Dropout", "ModuleList",
           "Sequential", "MLP", "fan_in_bound"]


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
