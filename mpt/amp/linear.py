"""L4: Linear layers whose GEMMs take a Tensor Core path that autocast has no cast for —
TF32 (PyTorch's ``allow_tf32``), FP8 with delayed scaling (Transformer Engine's ``te.Linear``)
and the block-scaled formats (MXFP8, NVFP4, MXFP4: :class:`BlockScaledLinear`).

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
from mpt.amp.fp8 import DelayedScaling
from mpt.autograd.tensor import opmath
from mpt.engines import get_mma_model
from mpt.functional.autocast import autocast_state
from mpt.functional.gemm_plan import GemmPlan, GemmSpec, Quantization
from mpt.functional.linalg import Linear as _Linear
from mpt.nn import Linear, Module

__all__ = ["Tf32Linear", "Fp8Linear", "BlockScaledLinear", "PlanLinear", "replace_linears",
           "tf32_plan", "fp8_plan", "mxfp8_plan", "nvfp4_plan", "mxfp4_plan"]

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


def mxfp8_plan(model: str = "blackwell", fp8_format: str = "E4M3") -> GemmPlan:
    """Transformer Engine's ``MXFP8BlockScaling``: every tensor quantized in 1×32 blocks along
    the reduction axis of each GEMM that uses it (a tensor used along two axes is quantized
    twice), E8M0 scales by TE's rule (``"te"``: the exponent rounded up, so a block's maximum
    never saturates), RNE; E4M3 for the three GEMMs by default (``fp8_format`` "HYBRID": E5M2
    gradients); the GEMMs on ``model``'s kind::mxf8f6f4, the whole K chained in its FP32
    accumulator."""
    fwd, bwd = _FP8_FORMATS[fp8_format]
    q, g = (Quantization(f, "mx", block=(1, 32), scale_rule="te") for f in (fwd, bwd))
    spec = GemmSpec(model, variant="mxf8f6f4")
    return GemmPlan(f"mxfp8 {fwd}/{bwd} ({model})", q, q, g, spec, spec, spec)


def nvfp4_plan(model: str = "blackwell", rht: bool = True, stochastic: bool = True,
               two_d: bool = True) -> GemmPlan:
    """The NVFP4 training recipe (NVIDIA, arXiv:2509.25149; Transformer Engine's
    ``NVFP4BlockScaling``): E2M1 elements with UE4M3 scales and a per-tensor scale (TE's rule);
    activations and gradients in 1×16 blocks, weights in 16×16 tiles (``two_d``; else 1×16);
    the 16×16 random Hadamard transform on the wgrad GEMM's inputs (``rht``); stochastic
    rounding of the gradients (``stochastic``: the hardware's 8-bit ``cvt.rs``), RNE elsewhere;
    the GEMMs on ``model``'s kind::mxf4nvf4 with TE's alpha."""
    return _fp4_plan("nvfp4", "nvfp4", 16, model, "mxf4nvf4", rht, stochastic, two_d, None)


def mxfp4_plan(model: str = "blackwell", rht: bool = True, stochastic: bool = True,
               two_d: bool = True, scale_rule: str = "ocp") -> GemmPlan:
    """:func:`nvfp4_plan` with MXFP4 instead (the comparison of arXiv:2509.25149): no per-tensor
    scale, E8M0 block scales (OCP's rule by default) over 1×32 blocks and 32×32 weight tiles,
    the GEMMs on ``model``'s kind::mxf4."""
    return _fp4_plan("mxfp4", "mx", 32, model, "mxf4", rht, stochastic, two_d, scale_rule)


def _fp4_plan(name, scaling, size, model, variant, rht, stochastic, two_d, scale_rule):
    fp4 = "fp4_e2m1fn"
    act = Quantization(fp4, scaling, block=(1, size), scale_rule=scale_rule, wgrad_rht=rht)
    weight = Quantization(fp4, scaling, block=(size, size) if two_d else (1, size),
                          scale_rule=scale_rule)
    grad = Quantization(fp4, scaling, "stochastic_8bit" if stochastic else "nearest_even",
                        (1, size), scale_rule, rht)
    spec = GemmSpec(model, variant=variant)
    off = [word for word, on in (("rht", rht), ("sr", stochastic), ("2d", two_d)) if not on]
    label = f"{name}{''.join(' no-' + w for w in off)} ({model})"
    return GemmPlan(label, act, weight, grad, spec, spec, spec)


_FP8_FORMATS = {"E4M3": ("fp8_e4m3fn", "fp8_e4m3fn"), "HYBRID": ("fp8_e4m3fn", "fp8_e5m2"),
                "E5M2": ("fp8_e5m2", "fp8_e5m2")}


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
    ``DelayedScaling`` recipe (HYBRID: E4M3 forward, E5M2 backward; ``flavour="fnuz"`` on MI300);
    ``model``: an MMA preset with an FP8 config (``"hopper"``, ``"ada"``, ``"blackwell"``,
    ``"cdna3"`` for FNUZ, ``"cdna4"``); ``promote_every`` (a multiple of the instruction's K) and
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


# ---- block-scaled ----------------------------------------------------------------------------
class _BlockState:
    """A role's state for the block-scaled rules: the Philox stream of its stochastic rounding
    and the statistics of its quantizations (``mpt.functional.gemm_plan``'s protocol)."""

    def __init__(self, layer: "BlockScaledLinear", role: str):
        self.layer, self.code = layer, _ROLES.index(role)

    def stream(self, axis: int) -> tuple[int, int]:
        """(seed, stream): one stream per (step, micro-batch, layer, role, axis)."""
        layer = self.layer
        step, micro = layer.step
        return layer.seed, (((step << 8 | micro) << 13 | layer.index) << 3) | (2 * self.code + axis)

    def record(self, values, result) -> None:
        self.layer._record(_ROLES[self.code], values, result)


class BlockScaledLinear(Module):
    """A Linear layer whose GEMMs run a block-scaled plan (:func:`mxfp8_plan`,
    :func:`nvfp4_plan`, :func:`mxfp4_plan`) on Blackwell's block-scaled MMA.

    The input is first cast to the activation format (the enclosing autocast dtype, as
    :class:`Fp8Linear`); the output has that format. ``seed`` and ``index`` (the layer's number,
    below 2^13) key the stochastic rounding of the gradients: the Philox stream of each
    quantization is a function of (:attr:`step` = (optimizer step, micro-batch) — the trainer
    sets it with :meth:`set_step` —, index, role, axis), so a run is reproducible and resumable.
    :attr:`quantization_counts` per role: ``numel``, ``nonzero`` (finite non-zero inputs),
    ``saturated`` (of those, values above their block's largest code, clamped), ``sq_err`` and
    ``sq`` (Σ(decoded − x)² and Σx² over finite x, float64: the relative quantization error is
    √(sq_err/sq)).
    """

    def __init__(self, linear: Linear, plan: GemmPlan, *, seed: int = 0, index: int = 0):
        super().__init__()
        _shares(self, linear)
        if not isinstance(plan, GemmPlan):
            raise TypeError(f"plan must be a GemmPlan; got {type(plan).__name__}")
        self.plan = plan
        self.seed = check_int("seed", seed, min=0, max=2**64 - 1)
        self.index = check_int("index", index, min=0, max=(1 << 13) - 1)
        self.step = (0, 0)
        self.states = {role: _BlockState(self, role) for role in _ROLES}
        self.reset_counts()

    def set_step(self, step: int, micro: int = 0) -> None:
        """The (step, micro-batch) whose stochastic-rounding streams the next quantizations use."""
        self.step = (check_int("step", step, min=0, max=(1 << 40) - 1),
                     check_int("micro", micro, min=0, max=255))

    def forward(self, x):
        state = autocast_state()
        act = state.dtype if state.enabled else x.format
        if x.format != act and x.format.name in _CASTABLE:
            x = x.to(act)
        return _Linear.apply(x, self.weight, self.bias, x.format, self.plan, self.states)

    def _record(self, role, values, result):
        """Add one quantization to :attr:`quantization_counts` (float64 sums, numpy's pairwise
        summation: statistics, not an emulated rounding)."""
        x = np.asarray(values, np.float64).ravel()
        d = result.decode().ravel()
        top = (np.abs(result.element_values()) == result.element_format.max).ravel()
        diff = d - x
        finite = np.isfinite(diff)                 # NaN or Inf in x, or a NaN scale
        if not finite.all():
            x, d, diff, top = x[finite], d[finite], diff[finite], top[finite]
        counts = self.quantization_counts[role]
        counts["numel"] += values.size
        counts["nonzero"] += int(np.count_nonzero(x))
        counts["saturated"] += int(np.count_nonzero(top & (np.abs(x) > np.abs(d))))
        counts["sq_err"] += float(np.square(diff).sum())
        counts["sq"] += float(np.square(x).sum())

    def reset_counts(self) -> None:
        """Zero :attr:`quantization_counts` (class docstring)."""
        self.quantization_counts = {r: {"numel": 0, "nonzero": 0, "saturated": 0, "sq_err": 0.0,
                                        "sq": 0.0} for r in _ROLES}

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"{self.plan.name}"


class PlanLinear(Module):
    """``nn.Linear`` whose GEMMs run a fixed GEMM plan with stateless scaling rules (the FP8
    layers of the Gaudi recipes: ``mpt.amp.inc.inc_fp8_plan``). The input is first cast to the
    enclosing autocast dtype (else kept), as :class:`Fp8Linear` does; the weight is quantized
    from its storage format; the output has the input's format."""

    def __init__(self, linear: Linear, plan: GemmPlan):
        super().__init__()
        _shares(self, linear)
        if not isinstance(plan, GemmPlan):
            raise TypeError(f"plan must be a GemmPlan; got {type(plan).__name__}")
        if plan.stateful_roles():
            raise ValueError(f"PlanLinear runs stateless plans; plan {plan.name!r} keeps state for "
                             f"{', '.join(plan.stateful_roles())} (use Fp8Linear)")
        self.plan = plan

    def forward(self, x):
        state = autocast_state()
        act = state.dtype if state.enabled else x.format
        if x.format != act and x.format.name in _CASTABLE:
            x = x.to(act)
        return _Linear.apply(x, self.weight, self.bias, x.format, self.plan)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"{self.plan.name}"


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
