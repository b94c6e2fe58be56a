"""L4: LoRA adapters over a frozen, possibly quantized base (Hu et al. 2021; QLoRA, Dettmers et al.
2023; docs/techniques.md §4).

``LoRALinear`` computes ``y = base(x) + s · B(A(dropout(x)))`` with FP32 adapters ``A`` (r, in)
and ``B`` (out, r) and ``s = α/r`` (rsLoRA: ``α/√r``), peft's defaults: r = 8, α = 8, A
kaiming-uniform with ``a = √5`` — uniform in ``±1/√in`` — from mpt's seeded Philox stream keyed by
the layer's dotted name (``nn.init_uniform_``), B = 0, so a fresh adapter leaves the network's
output bit-identical (see below).

**Base formats.** The frozen weight is stored as

* ``fp32``/``fp16``/``bf16``: a frozen Parameter in that format (``None`` keeps the Linear's own);
* ``int8``: symmetric per-output-channel int8 codes + float32 scales (``mpt.quant.Int8Weight``,
  PyTorch's per-channel qint8 qparams and fake-quant arithmetic);
* ``nf4``: NF4 codes in blocks of 64 with float32 absmax, optionally double-quantized
  (``mpt.quant.NF4Weight``).

**Precision contract of forward.** The base matmul runs in the *compute format*: the float base's
own format, or for int8/NF4 ``compute_format`` (default bf16, QLoRA's compute dtype); quantized
weights are dequantized every call to float32 (``fl32(code·scale)``, ``fl32(level·absmax)``) then
rounded RNE to the compute format (bitsandbytes computes the float product then converts); ``x``
and the bias are cast (RNE) to the compute format; ``F.linear`` with the active MMA model. The
adapter path casts ``dropout(x)`` to FP32 and runs two FP32 ``F.linear`` GEMMs, then multiplies by
``fl32(s)``. The two are summed in FP32 (the base output decoded exactly) and rounded once to the
compute format — peft's ``result + lora_B(lora_A(x))·scaling`` promoted to FP32, then
``.to(result_dtype)``. With B = 0 the adapter adds ±0, so the output equals the base output bit
for bit (an exact −0 base output would become +0).

**Merge** (peft): ``delta = fl32(s · fl32(B·A))`` rounded to the base format, ``W ← W + delta``
(FP32 add, one rounding to the base format); ``unmerge`` subtracts the same delta (so it restores
W only up to that rounding). A quantized base is dequantized, updated in FP32 and re-quantized
(lossy, as peft does for bitsandbytes layers).
"""
from __future__ import annotations

import math

import numpy as np

import mpt.functional as F
from mpt import nn
from mpt._checks import check_bool, check_int, check_real
from mpt.autograd.tensor import Tensor, no_grad, opmath, round_to
from mpt.formats import get_format
from mpt.nn.layers import fan_in_bound
from mpt.quant.storage import Int8Weight, int8_quantize_per_channel, nf4_dequantize, nf4_quantize

__all__ = ["LoRALinear", "apply", "merge", "unmerge", "trainable_parameters"]

_FLOAT_BASES = ("fp32", "fp16", "bf16")
_QUANT_BASES = ("int8", "nf4")


def _scaling(r: int, alpha: float, use_rslora: bool) -> float:
    return alpha / math.sqrt(r) if use_rslora else alpha / r


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update (module docstring).

    ``LoRALinear(base, r=8, alpha=8, dropout=0.0, use_rslora=False, base_format=None,
    compute_format=None, double_quant=False, seed=0, key="lora")``.
    """

    def __init__(self, base: nn.Linear, r: int = 8, alpha: float = 8, dropout: float = 0.0,
                 use_rslora: bool = False, base_format=None, compute_format=None,
                 double_quant: bool = False, seed: int = 0, key: str = "lora"):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"base must be an mpt.nn.Linear (the layer LoRA adapts); got "
                            f"{type(base).__name__}")
        out_features, in_features = base.weight.shape
        self.in_features, self.out_features = in_features, out_features
        self.r = check_int("r", r, min=1)
        self.alpha = check_real("alpha", alpha)
        self.use_rslora = check_bool("use_rslora", use_rslora)
        self.scaling = _scaling(self.r, self.alpha, self.use_rslora)
        self.dropout = check_real("dropout", dropout, min=0, lt=1)
        self.merged = False
        self.base_format = base.weight.format.name if base_format is None else \
            get_format(base_format).name
        if self.base_format in _FLOAT_BASES:
            self.compute_format = self.base_format
        elif self.base_format in _QUANT_BASES:
            self.compute_format = get_format(compute_format or "bf16").name
        else:
            raise ValueError(f"base_format must be one of {_FLOAT_BASES + _QUANT_BASES}; got "
                             f"{base_format!r}")
        self.double_quant = check_bool("double_quant", double_quant)
        self._store_base(opmath(base.weight.data).astype(np.float32))
        self.bias = None if base.bias is None else nn.Parameter(
            round_to(opmath(base.bias.data), get_format(self.compute_format)),
            self.compute_format, requires_grad=False)
        self.lora_A = nn.Parameter(np.zeros((self.r, in_features), np.float32))
        self.lora_B = nn.Parameter(np.zeros((out_features, self.r), np.float32))
        nn.init_uniform_(self.lora_A, fan_in_bound(in_features), seed=seed, key=f"{key}.lora_A")

    # ---- the frozen base ---------------------------------------------------------------------
    def _store_base(self, w: np.ndarray) -> None:
        """Store float32 ``w`` (out, in) in the base format (RNE, or quantized)."""
        if self.base_format in _FLOAT_BASES:
            fmt = get_format(self.base_format)
            self.weight = nn.Parameter(round_to(w, fmt), fmt, requires_grad=False)
            self.qweight = None
        elif self.base_format == "int8":
            self.weight, self.qweight = None, int8_quantize_per_channel(w, axis=0)
        else:
            self.weight, self.qweight = None, nf4_quantize(w, double_quant=self.double_quant)

    def base_weight_fp32(self) -> np.ndarray:
        """The frozen weight's values as float32 (out, in) (dequantized if quantized)."""
        if self.qweight is None:
            return opmath(self.weight.data).astype(np.float32)
        if isinstance(self.qweight, Int8Weight):
            return self.qweight.dequantize()
        return nf4_dequantize(self.qweight)

    def compute_weight(self) -> Tensor:
        """The frozen weight in the compute format (a Tensor without grad)."""
        if self.qweight is None:
            return self.weight
        fmt = get_format(self.compute_format)
        return Tensor(round_to(self.base_weight_fp32(), fmt), fmt)

    @property
    def base_nbytes(self) -> int:
        """Bytes of the stored frozen weight (codes and scales for int8/NF4)."""
        return self.weight.data.nbytes if self.qweight is None else self.qweight.nbytes

    # ---- forward -----------------------------------------------------------------------------
    def delta_weight(self) -> np.ndarray:
        """float32 ``fl32(fl32(s) · fl32(B·A))`` (out, in)."""
        with no_grad():
            ba = F.matmul(Tensor(self.lora_B.data), Tensor(self.lora_A.data))  # (out, in)
        return ba.data * np.float32(self.scaling)

    def forward(self, x: Tensor) -> Tensor:
        compute = self.compute_format
        y = F.linear(x.to(compute), self.compute_weight(), self.bias)          # (..., out)
        if self.merged:
            return y
        h = F.dropout(x, self.dropout, self.training) if self.dropout else x
        a = F.linear(h.to("fp32"), self.lora_A)                                # (..., r)
        lora = F.linear(a, self.lora_B) * float(np.float32(self.scaling))     # (..., out) fp32
        return (y.to("fp32") + lora).to(compute)

    # ---- merge / unmerge ---------------------------------------------------------------------
    def _update_base(self, sign: float) -> None:
        delta = self.delta_weight()
        if self.qweight is None:
            fmt = get_format(self.base_format)
            w = opmath(self.weight.data) + sign * opmath(round_to(delta, fmt))
            self.weight.data = round_to(w, fmt)
        else:
            self._store_base(self.base_weight_fp32() + np.float32(sign) * delta)

    def merge(self) -> None:
        """Fold ``s·B·A`` into the frozen weight (module docstring); forward then skips the
        adapter."""
        if not self.merged:
            self._update_base(1.0)
            self.merged = True

    def unmerge(self) -> None:
        """Subtract the delta folded in by :meth:`merge`."""
        if self.merged:
            self._update_base(-1.0)
            self.merged = False

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, r={self.r}, "
                f"alpha={self.alpha}, scaling={self.scaling:g}, base={self.base_format}, "
                f"compute={self.compute_format}, merged={self.merged}")


def _targets(network: nn.Module, targets):
    """(parent, child name, dotted name) of each nn.Linear to adapt: all of them when ``targets``
    is None, else those whose dotted name equals or ends with ``.t`` for a ``t`` in targets."""
    for name, module in list(network.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is not nn.Linear:
                continue
            if targets is None or any(full == t or full.endswith("." + t) for t in targets):
                yield module, child_name, full


def apply(network: nn.Module, r: int = 8, alpha: float = 8, dropout: float = 0.0, targets=None,
          use_rslora: bool = False, base_format=None, compute_format=None,
          double_quant: bool = False, seed: int = 0) -> nn.Module:
    """Freeze every parameter of ``network`` and replace the targeted ``nn.Linear`` layers (in
    place, keeping their position) by :class:`LoRALinear` with the given options; adapter ``A``
    of a layer is drawn from ``(seed, "<dotted name>.lora_A")``. Returns ``network``; raises
    ValueError when no layer matches ``targets`` (None, one name or a sequence of names)."""
    if isinstance(targets, str):
        targets = (targets,)                    # one name, not its characters
    if targets is not None and not all(isinstance(t, str) for t in targets):
        raise TypeError(f"targets must be None, a layer name or a sequence of names; got "
                        f"{targets!r}")
    found = list(_targets(network, targets))
    if not found:
        raise ValueError(f"targets {targets!r} match no nn.Linear of the network")
    layers = [LoRALinear(getattr(parent, child_name), r, alpha, dropout, use_rslora, base_format,
                         compute_format, double_quant, seed, key=full)
              for parent, child_name, full in found]        # every argument checked first
    for p in network.parameters():
        p.requires_grad = False
    for (parent, child_name, _), layer in zip(found, layers):
        parent._modules[child_name] = layer
        object.__setattr__(parent, child_name, layer)
    return network


def _lora_layers(network: nn.Module):
    return [m for m in network.modules() if isinstance(m, LoRALinear)]


def merge(network: nn.Module) -> nn.Module:
    """:meth:`LoRALinear.merge` on every adapter of ``network``."""
    for m in _lora_layers(network):
        m.merge()
    return network


def unmerge(network: nn.Module) -> nn.Module:
    """:meth:`LoRALinear.unmerge` on every adapter of ``network``."""
    for m in _lora_layers(network):
        m.unmerge()
    return network


def trainable_parameters(network: nn.Module) -> dict:
    """peft's ``print_trainable_parameters`` as a dict: ``trainable`` (elements of parameters with
    ``requires_grad``), ``total`` (all parameters plus the logical size of quantized frozen
    weights), ``percent`` (100·trainable/total), and ``base_bytes`` (stored frozen LoRA bases)."""
    trainable = sum(p.size for p in network.parameters() if p.requires_grad)
    total = sum(p.size for p in network.parameters())
    layers = _lora_layers(network)
    total += sum(m.in_features * m.out_features for m in layers if m.qweight is not None)
    return {"trainable": trainable, "total": total,
            "percent": 100.0 * trainable / total if total else 0.0,
            "base_bytes": sum(m.base_nbytes for m in layers)}
