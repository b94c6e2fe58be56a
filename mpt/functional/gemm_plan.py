"""L3: the GEMM plan of a linear layer — for each of its three GEMMs, how the operands are
quantized and which MMA model, with which software settings, runs it.

A linear layer ``Y = X·Wᵀ + b`` computes three GEMMs:

=========  ===========  ==================  ================================================
GEMM       A (M×K)      B (K×N)             reduction axis K
=========  ===========  ==================  ================================================
fprop      X            Wᵀ                  in_features (X along axis 1, W along axis 1)
dgrad      G            W                   out_features (G along axis 1, W along axis 0)
wgrad      Gᵀ           X                   the rows M (G along axis 0, X along axis 0)
=========  ===========  ==================  ================================================

A :class:`GemmPlan` holds, per tensor role (``input`` X, ``weight`` W, ``grad_output`` G), a
:class:`Quantization` — the format the operand is handed to the MMA in, its scaling rule and
rounding — and, per GEMM, a :class:`GemmSpec`: the MMA model (None: the matmul model active at
the forward, ``mpt.autocast_state().model``) and its software settings (split-K, promotion every
``promote_every`` products). FP32, TF32, FP8 with delayed scaling — and any other engine or
block-scaled recipe — are plans over the one Linear (``mpt.functional.linear``), not new classes.

Scaling rules are registered by name (:func:`register_scaling`): ``"none"`` (the tensor as
stored, or rounded RNE to ``format``; ``tf32`` keeps the fp32 pattern and lets the MMA drop its
low 13 bits, as the hardware does) and ``"delayed"`` (Transformer Engine's per-tensor delayed
scaling: the layer hands a state object with a ``quantize(values)`` method, ``mpt.fp8``, whose
result carries ``data``, ``format`` and ``scale_inv``); other modules register theirs (``"inc"``,
Intel Neural Compressor's per-tensor FP8 scales on Gaudi: :mod:`mpt.amp.inc`). A tensor used by
two GEMMs along two axes
is quantized once per axis (once in all for per-tensor rules).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from mpt.formats import Format, get_format, rounding_mode
from mpt.rounding import round as round_format

__all__ = ["Quantization", "GemmSpec", "GemmPlan", "Operand", "ROLES", "GEMMS",
           "register_scaling", "quantize_operand", "per_axis"]

ROLES = ("input", "weight", "grad_output")
GEMMS = ("fprop", "dgrad", "wgrad")


@dataclass(frozen=True)
class Quantization:
    """How one tensor role is prepared for its GEMMs.

    ``format``: the format handed to the MMA (None: the tensor's own); ``scaling``: a registered
    scaling rule; ``rounding``: ``"nearest_even"`` or ``"stochastic"`` where the rule rounds;
    ``block``: the block shape of a block-scaled rule (None: per tensor); ``params``: further
    (name, value) parameters of the rule (e.g. INC's chip, scale method and role).
    """

    format: str | None = None
    scaling: str = "none"
    rounding: str = "nearest_even"
    block: tuple[int, int] | None = None
    params: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        if self.format is not None:
            object.__setattr__(self, "format", get_format(self.format).name)
        if self.scaling not in _SCALINGS:
            raise ValueError(f"scaling must be one of {', '.join(map(repr, _SCALINGS))}; got "
                             f"{self.scaling!r}")
        object.__setattr__(self, "rounding", rounding_mode(self.rounding).value)


@dataclass(frozen=True)
class GemmSpec:
    """One GEMM: the MMA model (name, or None for the active matmul model) and its software
    settings, as ``mpt.gemm`` takes them."""

    model: str | None = None
    split_k: int = 1
    promote_every: int | None = None
    variant: str | None = None

    def gemm_kwargs(self) -> dict:
        out = {"split_k": self.split_k, "promote_every": self.promote_every}
        if self.variant is not None:
            out["variant"] = self.variant
        return out


@dataclass(frozen=True)
class GemmPlan:
    """The plan of a linear layer (module docstring): a :class:`Quantization` per role and a
    :class:`GemmSpec` per GEMM. The default plan runs every GEMM on the tensors as stored with
    the active matmul model."""

    name: str = "default"
    input: Quantization = field(default_factory=Quantization)
    weight: Quantization = field(default_factory=Quantization)
    grad_output: Quantization = field(default_factory=Quantization)
    fprop: GemmSpec = field(default_factory=GemmSpec)
    dgrad: GemmSpec = field(default_factory=GemmSpec)
    wgrad: GemmSpec = field(default_factory=GemmSpec)

    def __post_init__(self):
        for role in ROLES:
            if not isinstance(getattr(self, role), Quantization):
                raise TypeError(f"{role} must be a Quantization; got "
                                f"{type(getattr(self, role)).__name__}")
        for gemm in GEMMS:
            if not isinstance(getattr(self, gemm), GemmSpec):
                raise TypeError(f"{gemm} must be a GemmSpec; got "
                                f"{type(getattr(self, gemm)).__name__}")

    def stateful_roles(self) -> tuple[str, ...]:
        """The roles whose scaling keeps state the layer must hand in (delayed scaling)."""
        return tuple(r for r in ROLES if _SCALINGS[getattr(self, r).scaling][1])

    def replace(self, **changes) -> "GemmPlan":
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Operand:
    """One GEMM operand as ``mpt.gemm`` takes it: ``data`` in ``format``'s storage dtype (fp32
    for tf32), and the per-tensor dequantisation ``scale_inv`` (None: unscaled)."""

    data: np.ndarray
    format: Format
    scale_inv: np.float32 | None = None

    @property
    def T(self) -> "Operand":
        return Operand(self.data.T, self.format, self.scale_inv)


# ---- scaling rules --------------------------------------------------------------------------
_SCALINGS: dict = {}


def register_scaling(name: str, quantize, stateful: bool = False,
                     per_axis: bool = False) -> None:
    """Register a scaling rule: ``quantize(stored, values, quantization, state, axis) ->
    Operand`` where ``stored`` is the tensor's storage array, ``values`` its exact float32 values,
    ``state`` the layer's state for the role (``stateful`` rules) and ``axis`` the reduction axis
    of the GEMM that uses it (``per_axis`` rules quantize a tensor once per axis it is used
    along; the others once)."""
    _SCALINGS[name] = (quantize, stateful, per_axis)


def _none(stored, values, q, state, axis):
    """The tensor as stored, or rounded once (RNE) to ``q.format``; tf32 keeps the fp32 pattern
    (the MMA reads it and drops the low 13 bits)."""
    own = get_format(stored.dtype)
    fmt = own if q.format is None else get_format(q.format)
    if fmt.name == "tf32":
        return Operand(values, fmt)
    if fmt == own:
        return Operand(stored, fmt)
    return Operand(round_format(values, fmt, q.rounding), fmt)


def _delayed(stored, values, q, state, axis):
    """Per-tensor delayed scaling: the layer's state quantizes (and records the amax)."""
    if state is None or not callable(getattr(state, "quantize", None)):
        raise TypeError("delayed scaling needs the layer's per-role state (an object with "
                        "quantize(values)); got none")
    result = state.quantize(values)
    return Operand(result.data, result.format, result.scale_inv)


register_scaling("none", _none)
register_scaling("delayed", _delayed, stateful=True)


def per_axis(q: Quantization) -> bool:
    """Whether ``q`` quantizes a tensor separately along each axis it is used along."""
    return _SCALINGS[q.scaling][2]


def quantize_operand(stored: np.ndarray, values: np.ndarray, q: Quantization, state=None,
                     axis: int = 1) -> Operand:
    """The operand of one tensor role along ``axis`` under quantization ``q``."""
    return _SCALINGS[q.scaling][0](stored, values, q, state, axis)
