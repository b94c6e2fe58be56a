"""L4: Linear layers whose GEMMs take a Tensor Core path that autocast has no cast for —
TF32 (PyTorch's ``allow_tf32``) and FP8 with delayed scaling (Transformer Engine's ``te.Linear``).

Both keep ``nn.Linear``'s parameters (``weight`` (out, in), ``bias`` (out,)) and are swapped into a
model with :func:`replace_linears` (the parameters are shared, not copied). Both are GEMM plans
(:class:`mpt.functional.GemmPlan`, :func:`tf32_plan`, :func:`fp8_plan`) run by the one linear
``Function`` of ``mpt.functional``: they differ from ``nn.Linear`` only in the plan.

**Tf32Linear** — ``y = x·Wᵀ + b`` on fp32 tensors, every GEMM (forward, dgrad ``G·W``, wgrad
``Gᵀ·X``) through ``mpt.gemm(..., in_format="tf32")`` on the model's TF32 Tensor Core config (the
hardware reads the fp32 operands and drops their low 13 bits), FP32 accumulation and output; the
bias is added in FP32 after the GEMM; the bias gradient is the sequential FP32 column sum.

**Fp8Linear** — Transformer Engine's FP8 ``Linear`` under ``fp8_autocast`` with a
``DelayedScaling`` recipe (HYBRID by default), as mpt models it:

* the input is first cast to the activation format (the enclosing ``mpt.autocast`` format, else its
  own format: TE's ``cast_if_needed``); the output has that format;
* forward: input and weight (from its storage format, fp32 normally) are quantized to the forward
  FP8 format (E4M3) with their own per-tensor delayed-scaling state (``mpt.fp8``: the amax is
  recorded, the scale is the one from the previous updates); ``Y = gemm(Xq, Wqᵀ)`` on the FP8
  Tensor Core config of ``model`` with per-tensor ``scale_a = sx⁻¹``, ``scale_b = sw⁻¹`` (applied
  to the FP32 result: ``fma(RN32(sx⁻¹·sw⁻¹), acc, −0)``), bias added in FP32, one rounding to the
  output format;
* backward: the output gradient is quantized to the backward FP8 format (E5M2) with its own
  state; ``dX = gemm(Gq, Wq)`` (E5M2 × E4M3, output rounded once to the input's format),
  ``dW = gemm(Gqᵀ, Xq)`` (FP32, using the FP8 input saved by the forward as TE does), the bias
  gradient the sequential FP32 column sum of the unquantized gradient (TE's fused ``bgrad``);
* promotion: TE runs its forward GEMM with cuBLASLt's fast accumulation and its dgrad/wgrad GEMMs
  with the split accumulator (``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD = _2X_ACC_WGRAD =
  True``); mpt models the split accumulator as promotion of the partial sum into an FP32 register
  every ``promote_every`` products (128 as DeepSeek-V3 reports; cuBLASLt's own interval is not
  documented) and fast accumulation as the whole K chained in the Tensor Core's accumulator;
* the scales change only in :meth:`Fp8Linear.fp8_update` (call it after each backward: TE updates
  the forward scales when ``fp8_autocast`` exits and the backward ones after the backward pass);
  the first step runs with scale 1, as in TE.

Every quantization also counts its non-zero inputs that flush to zero and its saturated values
(``Fp8Linear.quantization_counts``, for ``mpt.train.diagnostics``). Oracle: the same ``mpt.gemm`` /
``mpt.fp8`` calls composed by hand in tests/test_linears.py.
"""
from __future__ import annotations

import numpy as np

from mpt._checks import check_bool, check_int
from mpt.functional.autocast import autocast_state
from mpt.amp.fp8 import DelayedScaling
from mpt.functional.gemm_plan import GemmPlan, GemmSpec, Quantization
from mpt.functional.linalg import Linear as _Linear
from mpt.engines import get_mma_model
from mpt.nn import Linear, Module
from mpt.autograd.tensor import opmath

__all__ = ["Tf32Linear", "Fp8Linear", "replace_linears", "tf32_plan", "fp8_plan"]

_CASTABLE = ("fp32", "fp16", "bf16")
_ROLES = ("input", "weight", "grad_output")


def tf32_plan(model: str = "hopper") -> GemmPlan:
    """Every GEMM on ``model``'s TF32 Tensor Cores, reading the fp32 operands (the hardware drops
    their low 13 bits), FP32 accumulation and output."""
    tf32, spec = Quantization("tf32"), GemmSpec(model)
    return GemmPlan(f"tf32 ({model})", tf32, tf32, tf32, spec, spec, spec)


def fp8_plan(scaling: DelayedScaling = DelayedScaling(), model: str = "hopper",
             promote_every: int = 128, split_accumulator=(False, True, True)) -> GemmPlan:
    """Transformer Engine's FP8 Linear with delayed scaling (module docstring): the forward
    format for input and weight, the backward one for the output gradient, each with its
    per-tensor delayed-scaling state; the GEMMs on ``model`` with promotion every
    ``promote_every`` products where ``split_accumulator`` (fprop, dgrad, wgrad) says so."""
    fwd, bwd = (scaling.format_for(r).name for r in ("forward", "backward"))
    specs = [GemmSpec(model, promote_every=promote_every if split else None)
             for split in split_accumulator]
    return GemmPlan(f"fp8 {fwd}/{bwd} ({model})", Quantization(fwd, "delayed"),
                    Quantization(fwd, "delayed"), Quantization(bwd, "delayed"), *specs)


def _shares(module: Module, linear: Linear) -> None:
    """Make ``module`` own ``linear``'s parameters (shared objects, same names)."""
    module.in_features, module.out_features = linear.in_features, linear.out_features
    module.weight = linear.weight
    module.bias = linear.bias


def _check_fp32_input(x, what):
    if x.format.name != "fp32":
        raise TypeError(f"{what}: input must be fp32 (TF32 GEMMs read fp32 tensors); got "
                        f"{x.format.name}")


class Tf32Linear(Module):
    """``nn.Linear`` with TF32 Tensor Core GEMMs on fp32 tensors (:func:`tf32_plan`); ``model``:
    an MMA preset with a TF32 config (Ampere, Ada, Hopper, Blackwell)."""

    def __init__(self, linear: Linear, model: str = "hopper"):
        super().__init__()
        _shares(self, linear)
        self.model = model
        self.plan = tf32_plan(model)
        if self.weight.format.name != "fp32":
            raise TypeError(f"Tf32Linear needs fp32 parameters; got {self.weight.format.name}")

    def forward(self, x):
        _check_fp32_input(x, "Tf32Linear")
        return _Linear.apply(x, self.weight, self.bias, x.format, self.plan)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, tf32 " \
               f"({self.model})"


# ---- FP8 -----------------------------------------------------------------------------------------
class _CountingState:
    """A role's delayed-scaling state, counting flushed and saturated values as it quantizes."""

    def __init__(self, layer: "Fp8Linear", role: str):
        self.layer, self.role = layer, role

    def quantize(self, values):
        return self.layer._quantize(self.role, values)


class Fp8Linear(Module):
    """Transformer Engine's FP8 ``Linear`` with delayed scaling (module docstring).

    ``linear``: the ``nn.Linear`` whose parameters it takes over; ``scaling``: the
    ``DelayedScaling`` recipe (HYBRID: E4M3 forward, E5M2 backward); ``model``: an MMA preset with
    an FP8 config (``"hopper"``, ``"ada"``, ``"blackwell"``); ``promote_every`` and
    ``split_accumulator`` (fprop, dgrad, wgrad): see the module docstring.
    """

    def __init__(self, linear: Linear, scaling: DelayedScaling = DelayedScaling(), *,
                 model: str = "hopper", promote_every: int = 128,
                 split_accumulator=(False, True, True)):
        super().__init__()
        _shares(self, linear)
        if not isinstance(scaling, DelayedScaling):
            raise TypeError(f"scaling must be an mpt.fp8.DelayedScaling; got "
                            f"{type(scaling).__name__}")
        get_mma_model(model)
        self.scaling, self.model = scaling, model
        self.promote_every = check_int("promote_every", promote_every, min=1)
        if not isinstance(split_accumulator, (tuple, list)) or len(split_accumulator) != 3:
            raise ValueError("split_accumulator must be three bools (fprop, dgrad, wgrad); got "
                             f"{split_accumulator!r}")
        self.split_accumulator = tuple(check_bool(f"split_accumulator[{i}]", s)
                                       for i, s in enumerate(split_accumulator))
        self.plan = fp8_plan(scaling, model, self.promote_every, self.split_accumulator)
        self.fp8_states = {"input": scaling.state("forward"), "weight": scaling.state("forward"),
                           "grad_output": scaling.state("backward")}
        self._counting = {role: _CountingState(self, role) for role in _ROLES}
        self.reset_counts()

    def forward(self, x):
        state = autocast_state()
        act = state.format if state.enabled else x.format
        if x.format != act and x.format.name in _CASTABLE:
            x = x.to(act)                                    # TE's cast_if_needed
        return _Linear.apply(x, self.weight, self.bias, x.format, self.plan, self._counting)

    def _quantize(self, role, values):
        """Quantize with ``role``'s delayed-scaling state and count flushed/saturated values."""
        x = opmath(values)
        state = self.fp8_states[role]
        scale = state.scale                                   # the scale this cast uses
        q = state.quantize(x)
        finite = np.isfinite(x)
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = np.abs(x * scale)                        # the f32 product quantize rounds
        counts = self.quantization_counts[role]
        counts["numel"] += x.size
        counts["nonzero"] += int(np.count_nonzero(finite & (x != 0)))
        counts["flushed"] += int(np.count_nonzero(finite & (x != 0) &
                                                  (q.data.astype(np.float32) == 0)))
        saturated = np.isinf(x) | (finite & (scaled > q.format.max))
        counts["saturated"] += int(np.count_nonzero(saturated))
        return q

    def reset_counts(self) -> None:
        """Zero :attr:`quantization_counts`: per role, ``numel``, ``nonzero`` (finite non-zero
        inputs), ``flushed`` (of those, quantized to 0) and ``saturated`` (clamped to ±max)."""
        self.quantization_counts = {r: {"numel": 0, "nonzero": 0, "flushed": 0, "saturated": 0}
                                    for r in _ROLES}

    def fp8_update(self) -> None:
        """Delayed-scaling update of the three states (new scales from the amax histories)."""
        for state in self.fp8_states.values():
            state.update()

    def fp8_state_dict(self) -> dict:
        """``{role: DelayedScalingState.state_dict()}`` for input, weight and grad_output."""
        return {role: s.state_dict() for role, s in self.fp8_states.items()}

    def load_fp8_state_dict(self, states: dict) -> None:
        """Restore the three states (checked by ``DelayedScalingState.load_state_dict``)."""
        if set(states) != set(_ROLES):
            raise ValueError(f"FP8 state must have the roles {', '.join(_ROLES)}; got "
                             f"{', '.join(sorted(states))}")
        for role, s in self.fp8_states.items():
            s.load_state_dict(states[role])

    def extra_repr(self):
        fwd, bwd = (self.scaling.format_for(r).name for r in ("forward", "backward"))
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"fp8 {fwd}/{bwd} ({self.model}, promote_every={self.promote_every})")


def replace_linears(module: Module, factory) -> list[str]:
    """Replace every ``nn.Linear`` under ``module`` by ``factory(linear)`` (e.g.
    ``lambda l: Fp8Linear(l, scaling)``), sharing its parameters; returns the dotted names of the
    replaced layers. Parameter names are unchanged (the new module owns ``weight``/``bias``)."""
    replaced = []
    for name, parent in list(module.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is Linear:
                setattr(parent, child_name, factory(child))
                replaced.append(f"{name}.{child_name}" if name else child_name)
    return replaced
