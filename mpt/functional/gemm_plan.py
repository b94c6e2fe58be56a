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
two GEMMs along two axes is quantized once per axis (once in all for per-tensor rules).

**Block-scaled rules** (per axis): ``"mx"`` (``mpt.microscaling.quantize_mx``: ``format`` the
element format, E8M0 scales per ``block`` along the GEMM's reduction axis, ``scale_rule`` "ocp",
"te" or "trainium") and ``"nvfp4"`` (``quantize_nvfp4``: E2M1 elements, UE4M3 scales, the
per-tensor amax; ``scale_rule`` "te", "te_v2.8" or "te_v2.8_rowwise"). A 1×16 / 1×32 block runs
along the reduction axis; a 16×16 / 32×32 block (weights) tiles the matrix the same way whichever
axis reduces, so the forward and backward GEMMs see one quantized weight. ``wgrad_rht``: the
16×16 random Hadamard transform (``mpt.microscaling.hadamard_transform``, bf16 tensors) is
applied along the wgrad reduction axis (axis 0 of the input and the output gradient) before
quantizing. The operand carries its codes, the instruction's block scales (one code per block
along the reduction axis: the ``scale_a``/``scale_b`` of ``mpt.mma``, 2-D scales repeated
across the other axis) and, for NVFP4, its amax: the GEMM's per-tensor factor is Transformer
Engine's alpha = fl(fl(amax_A·amax_B)·fl32(1/2688²)) (``mpt.microscaling.nvfp4_gemm_alpha``),
applied by ``mpt.gemm`` to the FP32 result. Stochastic rounding (``"stochastic"``, or
``"stochastic_8bit"``: the hardware's ``cvt.rs`` for FP4, 8 random bits per element) takes its
Philox stream from the layer's state for the role: ``state.stream(axis)`` returns ``(seed,
stream)``; a state with ``record(values, result)`` is shown each quantization (statistics).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from mpt import microscaling as _ms
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
    scaling rule; ``rounding``: ``"nearest_even"`` or ``"stochastic"`` where the rule rounds
    (block rules also ``"stochastic_8bit"``); ``block``: the block shape of a block-scaled rule
    (None: per tensor); ``scale_rule``: a block rule's scale rule (None: its default);
    ``wgrad_rht``: the random Hadamard transform before the wgrad quantization (block rules);
    ``params``: further (name, value) parameters of a rule (e.g. INC's chip, scale method, role).
    """

    format: str | None = None
    scaling: str = "none"
    rounding: str = "nearest_even"
    block: tuple[int, int] | None = None
    scale_rule: str | None = None
    wgrad_rht: bool = False
    params: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        if self.format is not None:
            object.__setattr__(self, "format", get_format(self.format).name)
        if self.scaling not in _SCALINGS:
            raise ValueError(f"scaling must be one of {', '.join(map(repr, _SCALINGS))}; got "
                             f"{self.scaling!r}")
        block_rule = self.scaling in _BLOCK_RULES
        if not (block_rule and self.rounding == "stochastic_8bit"):
            object.__setattr__(self, "rounding", rounding_mode(self.rounding).value)
        if block_rule:
            object.__setattr__(self, "block", _BLOCK_RULES[self.scaling](self))
        elif self.scale_rule is not None or self.wgrad_rht:
            raise ValueError(f"scale_rule and wgrad_rht belong to the block-scaled rules "
                             f"({', '.join(_BLOCK_RULES)}); got scaling {self.scaling!r}")


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
    for tf32), the per-tensor dequantisation ``scale_inv`` (None: unscaled), the instruction's
    ``block_scales`` (E8M0 / UE4M3 codes along the reduction axis, laid out as ``data``; None:
    none) and an NVFP4 operand's tensor ``amax`` (the GEMM's alpha comes from both amaxes)."""

    data: np.ndarray
    format: Format
    scale_inv: np.float32 | None = None
    block_scales: np.ndarray | None = None
    amax: np.float32 | None = None

    @property
    def T(self) -> "Operand":
        scales = None if self.block_scales is None else self.block_scales.T
        return Operand(self.data.T, self.format, self.scale_inv, scales, self.amax)


# ---- scaling rules --------------------------------------------------------------------------
_SCALINGS: dict = {}


def register_scaling(name: str, quantize, stateful: bool = False,
                     per_axis: bool = False) -> None:
    """Register a scaling rule: ``quantize(stored, values, quantization, state, axis) ->
    Operand`` where ``stored`` is the tensor's storage array, ``values()`` returns its exact
    float32 values (decoded on the first call only: a rule that hands the MMA the stored array
    never pays for the decode), ``state`` the layer's state for the role (``stateful`` rules)
    and ``axis`` the reduction axis of the GEMM that uses it (``per_axis`` rules quantize a
    tensor once per axis it is used along; the others once)."""
    _SCALINGS[name] = (quantize, stateful, per_axis)


def _none(stored, values, q, state, axis):
    """The tensor as stored, or rounded once (RNE) to ``q.format``; tf32 keeps the fp32 pattern
    (the MMA reads it and drops the low 13 bits)."""
    own = get_format(stored.dtype)
    fmt = own if q.format is None else get_format(q.format)
    if fmt.name == "tf32":
        return Operand(values(), fmt)
    if fmt == own:
        return Operand(stored, fmt)
    return Operand(round_format(values(), fmt, q.rounding), fmt)


def _delayed(stored, values, q, state, axis):
    """Per-tensor delayed scaling: the layer's state quantizes (and records the amax)."""
    if state is None or not callable(getattr(state, "quantize", None)):
        raise TypeError("delayed scaling needs the layer's per-role state (an object with "
                        "quantize(values)); got none")
    result = state.quantize(values())
    return Operand(result.data, result.format, result.scale_inv)


def _random(q, state, axis):
    """The stochastic-rounding keywords of a block rule: {} for RNE, else the layer's stream."""
    if q.rounding == "nearest_even":
        return {}
    if state is None or not callable(getattr(state, "stream", None)):
        raise TypeError(f"{q.rounding} rounding needs the layer's per-role state (an object with "
                        f"stream(axis) -> (seed, stream)); got none")
    seed, stream = state.stream(axis)
    return {"mode": q.rounding, "seed": seed, "stream": stream}


def _mma_scales(result, axis):
    """The instruction's block scales of a quantized matrix along reduction ``axis``: 1-D
    blocks' scales as they are; a 2-D block's repeated across the other axis."""
    if result.block[0] == 1:
        return result.scales
    rows, cols = result.shape
    size = result.block[0]
    if axis == 1:
        return np.repeat(result.scales, size, axis=0)[:rows]             # (R, C/b)
    return np.repeat(result.scales, size, axis=1)[:, :cols]              # (R/b, C)


def _block_scaled(stored, values, q, state, axis):
    """MX or NVFP4 along ``axis`` (module docstring)."""
    x = values()
    if x.shape[axis] % q.block[1]:
        raise ValueError(f"a block-scaled GEMM needs its reduction length to be a multiple of "
                         f"the block: {x.shape[axis]} is not a multiple of {q.block[1]}")
    if q.wgrad_rht and axis == 0:
        if get_format(stored.dtype).name != "bf16":
            raise TypeError(f"the random Hadamard transform runs on bf16 tensors (Transformer "
                            f"Engine's); got {get_format(stored.dtype).name}")
        x = np.asarray(_ms.hadamard_transform(stored, axis=0), np.float32)
    kw = dict(axis=axis, block=q.block, **_random(q, state, axis))
    if q.scale_rule is not None:
        kw["scale_rule"] = q.scale_rule
    if q.scaling == "mx":
        result = _ms.quantize_mx(x, q.format, **kw)
    else:
        result = _ms.quantize_nvfp4(x, **kw)
    if callable(getattr(state, "record", None)):
        state.record(x, result)
    return Operand(result.codes, result.element_format, None, _mma_scales(result, axis),
                   result.amax)


def _mx_block(q):
    if q.format not in _ms.MX_ELEMENT_FORMATS or q.format == "int8":
        raise ValueError(f"mx scaling needs an MX float element format "
                         f"({', '.join(_ms.MX_ELEMENT_FORMATS[:-1])}); got {q.format!r}")
    return _block_shape(q, (32, 32))


def _nvfp4_block(q):
    if q.format != "fp4_e2m1fn":
        raise ValueError(f"nvfp4 scaling needs format 'fp4_e2m1fn'; got {q.format!r}")
    return _block_shape(q, (16, 16))


def _block_shape(q, default):
    """The block as a (rows, cols) tuple (default: 1×cols)."""
    block = (1, default[1]) if q.block is None else tuple(q.block)
    if block not in _ms.BLOCKS:
        raise ValueError(f"block must be one of {_ms.BLOCKS}; got {q.block!r}")
    return block


register_scaling("none", _none)
register_scaling("delayed", _delayed, stateful=True)
register_scaling("mx", _block_scaled, per_axis=True)
register_scaling("nvfp4", _block_scaled, per_axis=True)
#: block-scaled rules -> their block check
_BLOCK_RULES = {"mx": _mx_block, "nvfp4": _nvfp4_block}


def per_axis(q: Quantization) -> bool:
    """Whether ``q`` quantizes a tensor separately along each axis it is used along."""
    return _SCALINGS[q.scaling][2]


def quantize_operand(stored: np.ndarray, values, q: Quantization, state=None,
                     axis: int = 1) -> Operand:
    """The operand of one tensor role along ``axis`` under quantization ``q``; ``values()``:
    the exact float32 values of ``stored`` (:func:`register_scaling`)."""
    return _SCALINGS[q.scaling][0](stored, values, q, state, axis)
