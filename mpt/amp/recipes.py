"""L4: precision recipes — one frozen object names every precision choice of a training run.

A :class:`Recipe` is data only (``mpt.train.Trainer`` carries it out):

=================  ==============================================================================
``param_format``   the model copy the forward and backward read (fp32, fp16 or bf16); parameter
                   gradients are stored in it too (``grad_format``), as on a GPU
``master_format``  ``"fp32"``: the optimizer updates a persistent FP32 master and copies it down
                   (Apex O2); ``None``: it updates the parameters themselves
``compute_format`` what the GEMMs and ops run in: ``param_format`` (no casts), ``"fp16"``/``"bf16"``
                   with ``autocast=True`` (per-op casts of fp32 weights, PyTorch AMP / Apex O1),
                   ``"tf32"`` (fp32 tensors, ``mpt.amp.linear.Tf32Linear``: the Linear layers'
                   GEMMs on TF32 Tensor Cores, as ``allow_tf32``; mpt's matmul and attention
                   have no TF32 route for fp32 tensors, so those stay FP32)
``output_format``  the logits are cast to it before the loss (Apex O2 casts model outputs to fp32;
                   Megatron computes the cross-entropy in fp32)
``state_format``   optimizer states (AdamW's m and v): always fp32
``target``         the hardware (``mpt.targets``, default ``"h100"``): it decides the MMA model of
                   the GEMMs and the FP8 formats' flavour
``matmul_model``   the MMA model of every GEMM (``mpt.mma``); None (the default): the target's
                   model for the compute format (``"hopper"`` for bf16 on h100; FP32 GEMMs run
                   ``"ieee_fma"``, CUDA cores). Set it to override the target
``loss_scaling``   :class:`LossScaling`: none, static or dynamic (``mpt.amp.GradScaler`` kwargs)
``fp8``            :class:`Fp8Config` or None: Transformer Engine FP8 Linear layers
``block_scaled``   :class:`BlockScaledConfig` or None: MXFP8 / NVFP4 / MXFP4 Linear layers on the
                   target's block-scaled MMA (``mpt.amp.linear.BlockScaledLinear``)
``rounding``       the copy-down (FP32 working copy → ``param_format``): ``"nearest_even"`` or
                   ``"stochastic"``
``inc``            :class:`~mpt.amp.inc.IncConfig` or None: FP8 Linear layers with Intel Neural
                   Compressor's per-tensor scales on a Gaudi target (``mpt.amp.inc``)
``cast_rounding``  how every op result is rounded into a narrower format: ``"nearest_even"``, or
                   ``"stochastic"`` with the target's stochastic-rounding source (Trainium under
                   ``XLA_USE_BF16``); the target's subnormal flushes apply either way
                   (:mod:`mpt.autograd.conversion`)
=================  ==============================================================================

The named recipes (:data:`RECIPES`, :func:`get_recipe`) follow the systems users run
(docs/amp.md §6): ``fp32``; ``tf32``; ``fp16-amp`` / ``bf16-amp`` (fp32 weights,
autocast per op; fp16 with PyTorch's dynamic GradScaler); ``fp16-o2`` / ``bf16-o2`` (the Apex O2
layout: a low-precision model copy plus FP32 masters; fp16 with dynamic scaling); ``bf16-pure``
and ``bf16-pure-sr`` (bf16 weights and no master: every update is rounded into bf16, to nearest or
stochastically); ``fp16-noscale`` (fp16-o2 without loss scaling: what fails); ``fp8-hybrid``
(Transformer Engine's HYBRID recipe: E4M3 forward, E5M2 gradients, delayed scaling, the target's
FP8 GEMMs with promotion, the rest under bf16 autocast); the block-scaled recipes on ``b200`` by
default — ``mxfp8`` (Transformer Engine's MXFP8BlockScaling), ``nvfp4`` (arXiv:2509.25149) with
its ablations ``nvfp4-no-rht``, ``nvfp4-no-sr``, ``nvfp4-no-2d``, and ``mxfp4`` (the same with
MXFP4) — each with FP32 weights (the masters), gradients and states and the rest under bf16
autocast. Recipes of one vendor's chips: ``tpu-bf16`` (JAX's policy params=float32,
compute=bfloat16, output=float32: FP32 masters, every op in bf16 with the TPU's flushing casts,
bf16 GEMMs one MXU pass with FP32 accumulation); ``gaudi2-fp8`` / ``gaudi3-fp8`` (FP8 Linear
layers with INC's ``maxabs_hw`` scales on the MME, the rest under bf16 autocast; the backward
format in ``mpt.amp.inc``); ``trn-bf16-autocast`` (fp32 everything, every GEMM compiled with
``--auto-cast matmult`` to bf16, FP32 results); ``trn-bf16-sr`` (``XLA_USE_BF16``: every float
tensor bf16, no master, stochastic rounding of every op result and update).

:meth:`Recipe.for_target` (or ``get_recipe(name, target=...)``) runs a recipe on another chip's
model; a recipe refuses a target without the FP8 or block-scaled MMA it needs; :func:`recipes_for`
lists the recipes a target runs. (A recipe written for one chip is a generic layout on that chip:
``tpu-bf16`` computes what ``bf16-o2`` computes on the ``tpu`` target, named as a TPU user knows
it.)

This module imports ``mpt.fp8`` (a sibling at L4) for the one thing it needs from it: the FP8
configuration *is* a Transformer Engine ``DelayedScaling`` recipe.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from mpt._checks import check_int
from mpt.amp.fp8 import DelayedScaling
from mpt.amp.inc import IncConfig
from mpt.amp.linear import mxfp4_plan, mxfp8_plan, nvfp4_plan
from mpt.engines import get_mma_model
from mpt.engines.gaudi import CHIPS as _GAUDI_CHIPS
from mpt.formats import get_format, rounding_mode
from mpt.functional.attention import flash_runs
from mpt.targets import get_target

__all__ = ["Recipe", "LossScaling", "Fp8Config", "BlockScaledConfig", "RECIPES", "get_recipe",
           "recipe_names", "recipes_for"]

_MODEL_FORMATS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class LossScaling:
    """How the loss is scaled: ``kind`` ``"none"``, ``"static"`` (``init_scale`` forever, a step
    with a non-finite gradient still skipped) or ``"dynamic"`` (``mpt.amp.GradScaler`` with
    PyTorch's defaults unless overridden here)."""

    kind: str = "none"
    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    min_scale: float | None = None
    max_scale: float | None = None

    def __post_init__(self):
        if self.kind not in ("none", "static", "dynamic"):
            raise ValueError(f"loss scaling kind must be 'none', 'static' or 'dynamic'; got "
                             f"{self.kind!r}")

    def scaler_kwargs(self) -> dict:
        """Keyword arguments of ``GradScaler`` (dynamic) or ``StaticLossScale`` (static)."""
        if self.kind == "static":
            return {"scale": self.init_scale}
        if self.kind == "dynamic":
            return {"init_scale": self.init_scale, "growth_factor": self.growth_factor,
                    "backoff_factor": self.backoff_factor,
                    "growth_interval": self.growth_interval, "min_scale": self.min_scale,
                    "max_scale": self.max_scale}
        return {}


@dataclass(frozen=True)
class Fp8Config:
    """FP8 Linear layers as Transformer Engine runs them (``mpt.amp.linear.Fp8Linear``).

    ``scaling``: TE's ``DelayedScaling`` (margin, fp8_format, amax history, flavour); ``model``:
    the MMA model of the FP8 GEMMs (None: the recipe's target's); ``promote_every``: products per
    promotion of the partial sum into an FP32 register (DeepSeek-V3's 128) for the GEMMs that use
    TE's split accumulator; ``split_accumulator``: (fprop, dgrad, wgrad) — TE's defaults
    ``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD = _2X_ACC_WGRAD = True`` (the forward GEMM uses
    cuBLASLt's fast accumulation, the backward ones promote).
    """

    scaling: DelayedScaling = field(default_factory=DelayedScaling)
    model: str | None = None
    promote_every: int = 128
    split_accumulator: tuple[bool, bool, bool] = (False, True, True)

    def __post_init__(self):
        if not isinstance(self.scaling, DelayedScaling):
            raise TypeError(f"scaling must be an mpt.fp8.DelayedScaling; got "
                            f"{type(self.scaling).__name__}")
        if self.model is not None:
            get_mma_model(self.model)
        object.__setattr__(self, "promote_every",
                           check_int("promote_every", self.promote_every, min=1))
        split = tuple(self.split_accumulator)
        if len(split) != 3 or not all(isinstance(s, bool) for s in split):
            raise ValueError("split_accumulator must be three bools (fprop, dgrad, wgrad); got "
                             f"{self.split_accumulator!r}")
        object.__setattr__(self, "split_accumulator", split)

    def describe(self) -> dict:
        return {"scaling": dataclasses.asdict(self.scaling), "model": self.model,
                "promote_every": self.promote_every,
                "split_accumulator": dict(zip(("fprop", "dgrad", "wgrad"),
                                              self.split_accumulator))}


@dataclass(frozen=True)
class BlockScaledConfig:
    """Block-scaled Linear layers (``mpt.amp.linear.BlockScaledLinear``).

    ``kind``: ``"mxfp8"`` (:func:`~mpt.amp.linear.mxfp8_plan`, ``fp8_format`` "E4M3" or
    "HYBRID"), ``"nvfp4"`` or ``"mxfp4"`` (:func:`~mpt.amp.linear.nvfp4_plan`,
    :func:`~mpt.amp.linear.mxfp4_plan`: ``rht``, ``stochastic``, ``two_d``); ``model``: the MMA
    model of the GEMMs (None: the recipe's target's); ``bf16_last``: the last Linear layers of
    the network (in module order) kept in bf16 — the NVFP4 paper keeps the final ~15 % of its
    layers in BF16; the study's GPT has four, and its tied LM head runs in bf16 anyway.
    """

    kind: str
    model: str | None = None
    fp8_format: str = "E4M3"
    rht: bool = True
    stochastic: bool = True
    two_d: bool = True
    bf16_last: int = 0

    def __post_init__(self):
        if self.kind not in _BLOCK_KINDS:
            raise ValueError(f"kind must be one of {', '.join(map(repr, _BLOCK_KINDS))}; got "
                             f"{self.kind!r}")
        if self.model is not None:
            get_mma_model(self.model)
        object.__setattr__(self, "bf16_last", check_int("bf16_last", self.bf16_last, min=0))
        self.plan("blackwell")                       # checks fp8_format and the flags

    @property
    def variant(self) -> str:
        """The block-scaled MMA instruction its GEMMs need."""
        return self.plan("blackwell").fprop.variant

    def plan(self, model=None):
        """The layers' GEMM plan on ``model`` (default: :attr:`model`)."""
        model = model or self.model
        if self.kind == "mxfp8":
            if self.fp8_format not in ("E4M3", "HYBRID"):
                raise ValueError(f"fp8_format must be 'E4M3' or 'HYBRID'; got "
                                 f"{self.fp8_format!r}")
            return mxfp8_plan(model, self.fp8_format)
        make = nvfp4_plan if self.kind == "nvfp4" else mxfp4_plan
        return make(model, self.rht, self.stochastic, self.two_d)

    def describe(self) -> dict:
        return dataclasses.asdict(self)


_BLOCK_KINDS = ("mxfp8", "nvfp4", "mxfp4")


@dataclass(frozen=True)
class Recipe:
    """Every precision choice of a training run (see the module docstring)."""

    name: str
    description: str
    param_format: str = "fp32"
    master_format: str | None = None
    compute_format: str = "fp32"
    autocast: bool = False
    output_format: str = "fp32"
    state_format: str = "fp32"
    matmul_model: str | None = None
    loss_scaling: LossScaling = field(default_factory=LossScaling)
    fp8: Fp8Config | None = None
    rounding: str = "nearest_even"
    target: str = "h100"
    block_scaled: BlockScaledConfig | None = None
    inc: IncConfig | None = None
    cast_rounding: str = "nearest_even"

    def __post_init__(self):
        for role in ("param_format", "compute_format", "output_format", "state_format"):
            object.__setattr__(self, role, get_format(getattr(self, role)).name)
        if self.param_format not in _MODEL_FORMATS:
            raise ValueError(f"param_format must be one of {', '.join(_MODEL_FORMATS)}; got "
                             f"{self.param_format!r}")
        if self.master_format is not None:
            object.__setattr__(self, "master_format", get_format(self.master_format).name)
            if self.master_format != "fp32" or self.param_format == "fp32":
                raise ValueError("master_format must be None or 'fp32' (with a fp16/bf16 "
                                 f"param_format); got {self.master_format!r} for "
                                 f"{self.param_format} parameters")
        if self.state_format != "fp32":
            raise ValueError(f"state_format must be 'fp32' (mpt.optim keeps FP32 states); got "
                             f"{self.state_format!r}")
        self._check_linear_layers()
        self._check_compute()
        self._resolve_target()
        object.__setattr__(self, "rounding", rounding_mode(self.rounding).value)
        if self.rounding not in ("nearest_even", "stochastic"):
            raise ValueError(f"rounding must be 'nearest_even' or 'stochastic'; got "
                             f"{self.rounding!r}")
        if not isinstance(self.loss_scaling, LossScaling):
            raise TypeError("loss_scaling must be a LossScaling")

    def _check_linear_layers(self):
        """At most one kind of low-precision Linear layer, each given as its config class."""
        kinds = (("fp8", Fp8Config), ("block_scaled", BlockScaledConfig), ("inc", IncConfig))
        for name, cls in kinds:
            value = getattr(self, name)
            if value is not None and not isinstance(value, cls):
                raise TypeError(f"{name} must be a {cls.__name__} or None; got "
                                f"{type(value).__name__}")
        chosen = [name for name, _ in kinds if getattr(self, name) is not None]
        if len(chosen) > 1:
            raise ValueError(f"a recipe has one kind of low-precision Linear layer (fp8: "
                             f"Transformer Engine's delayed scaling, block_scaled, inc: Intel "
                             f"Neural Compressor's Gaudi scales); got {' and '.join(chosen)}")

    def _resolve_target(self):
        """Fill the GEMM models and FP8 flavour the target decides (module docstring)."""
        target = get_target(self.target)
        object.__setattr__(self, "target", target.name)
        if self.matmul_model is None:
            gemm_format = "fp32" if self.compute_format == "fp32" else self.compute_format
            object.__setattr__(self, "matmul_model", target.mma_model(gemm_format))
        get_mma_model(self.matmul_model)
        self._resolve_fp8(target)
        if self.block_scaled is not None and self.block_scaled.model is None:
            object.__setattr__(self, "block_scaled", dataclasses.replace(
                self.block_scaled, model=_block_scaled_model(self.name, target,
                                                             self.block_scaled)))
        self._resolve_inc(target)
        self._resolve_cast_rounding(target)

    def _resolve_fp8(self, target):
        """Transformer Engine's FP8 Linear: the target's FP8 model and format flavour."""
        if self.fp8 is None:
            return
        if self.fp8.model is None:
            if target.fp8 is None:
                raise ValueError(f"recipe {self.name!r} uses FP8 GEMMs, which target "
                                 f"{target.name!r} does not have")
            flavour = "fnuz" if target.fp8[0].endswith("fnuz") else "ocp"
            fp8 = dataclasses.replace(self.fp8, model=target.mma_model(target.fp8[0]),
                                      scaling=dataclasses.replace(self.fp8.scaling,
                                                                  flavour=flavour))
            object.__setattr__(self, "fp8", fp8)
        fwd, bwd = (self.fp8.scaling.format_for(r).name for r in ("forward", "backward"))
        model = get_mma_model(self.fp8.model)       # it must take the recipe's FP8 formats
        model.config(fwd, fwd), model.config(bwd, fwd)

    def _resolve_cast_rounding(self, target):
        """How op results round into narrower formats; stochastic needs a Philox target."""
        object.__setattr__(self, "cast_rounding", rounding_mode(self.cast_rounding).value)
        if self.cast_rounding not in ("nearest_even", "stochastic"):
            raise ValueError(f"cast_rounding must be 'nearest_even' or 'stochastic'; got "
                             f"{self.cast_rounding!r}")
        if self.cast_rounding == "stochastic" and \
                target.conversions.stochastic_rounding != "philox":
            raise ValueError(f"cast_rounding='stochastic' needs a target whose stochastic "
                             f"rounding mpt models with Philox (trn1, trn2); target "
                             f"{target.name!r} has {target.conversions.stochastic_rounding}")

    def _resolve_inc(self, target):
        """INC's FP8 Linear: a Gaudi target's chip, FP8 formats and MME model."""
        if self.inc is None:
            return
        if target.name not in _GAUDI_CHIPS or target.fp8 is None:
            raise ValueError(f"recipe {self.name!r} uses Intel Neural Compressor's Gaudi FP8 "
                             f"scales, which target {target.name!r} does not have (gaudi2, "
                             f"gaudi3)")
        inc = self.inc
        inc = dataclasses.replace(inc, chip=inc.chip or target.name,
                                  model=inc.model or target.mma_model(target.fp8[0]),
                                  formats=inc.formats or target.fp8)
        object.__setattr__(self, "inc", inc)

    def for_target(self, target) -> "Recipe":
        """This recipe on another target: the GEMM models and FP8 formats that target's
        (an explicit ``matmul_model`` or FP8 model is replaced by the target's too, unless the
        target offers it as a compiler mode: ``Target.software_models``)."""
        target = get_target(target)
        fp8 = None if self.fp8 is None else dataclasses.replace(self.fp8, model=None)
        block = None if self.block_scaled is None else \
            dataclasses.replace(self.block_scaled, model=None)
        inc = None if self.inc is None else dataclasses.replace(self.inc, chip=None, model=None,
                                                                formats=None)
        matmul = self.matmul_model if self.matmul_model in target.software_models else None
        return self.replace(target=target.name, matmul_model=matmul, fp8=fp8, inc=inc,
                            block_scaled=block)

    @property
    def flash_attention(self) -> bool:
        """Whether ``backend="flash"`` attention runs this recipe's GEMM model (the NVIDIA and
        IEEE models; AMD's, a TPU's, Gaudi's and Trainium's run attention as plain GEMMs,
        ``backend="naive"``)."""
        fmt = "fp32" if self.compute_format == "tf32" else self.compute_format
        return flash_runs(fmt, self.matmul_model)

    def _check_compute(self):
        c, p = self.compute_format, self.param_format
        if self.autocast:
            if c not in ("fp16", "bf16") or p != "fp32":
                raise ValueError(f"autocast needs fp32 parameters and compute_format fp16 or "
                                 f"bf16; got param {p}, compute {c}")
        elif c == "tf32":
            if p != "fp32":
                raise ValueError(f"compute_format tf32 needs fp32 parameters; got {p}")
        elif c != p:
            raise ValueError(f"compute_format {c} differs from param_format {p}: set "
                             "autocast=True for per-op casts")

    @property
    def grad_format(self) -> str:
        """Parameter gradients live in the parameters' format (``mpt.Tensor``'s rule)."""
        return self.param_format

    @property
    def backward_format(self) -> str:
        """The format activation gradients are rounded to in the backward pass: the compute
        format (bf16 for the non-FP8 ops of ``fp8-hybrid``; fp32 for tf32's fp32 tensors)."""
        return "fp32" if self.compute_format == "tf32" else self.compute_format

    def replace(self, **changes) -> "Recipe":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict:
        """The recipe as JSON-ready data."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("loss_scaling", "fp8", "block_scaled", "inc")}
        out["grad_format"] = self.grad_format
        out["loss_scaling"] = dataclasses.asdict(self.loss_scaling)
        out["fp8"] = None if self.fp8 is None else self.fp8.describe()
        out["block_scaled"] = None if self.block_scaled is None else self.block_scaled.describe()
        out["inc"] = None if self.inc is None else self.inc.describe()
        return out


def _block_scaled_model(name, target, config) -> str:
    """The target's model for the FP8 family, if it has the block-scaled instruction the
    recipe's GEMMs need; ValueError otherwise."""
    element = "fp8_e4m3fn" if config.kind == "mxfp8" else "fp4_e2m1fn"
    try:
        model = target.mma_model("fp8_e4m3fn")
        get_mma_model(model).config(element, element, config.variant)
    except ValueError:
        raise ValueError(f"recipe {name!r} needs block-scaled MMA (kind::{config.variant}), which "
                         f"target {target.name!r} does not have") from None
    return model


_DYNAMIC = LossScaling("dynamic")
_BLOCK = {"compute_format": "bf16", "autocast": True, "target": "b200"}

RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("fp32", "FP32 everything; GEMMs as sequential FP32 FMA (CUDA cores / CPU)"),
    Recipe("tf32", "FP32 tensors; the Linear layers' GEMMs on the target's TF32 Tensor Cores "
           "(allow_tf32=True); attention and the tied LM head stay FP32",
           compute_format="tf32"),
    Recipe("fp16-amp", "FP32 weights, autocast fp16 per op (Apex O1 / torch.autocast), dynamic "
           "loss scaling", compute_format="fp16", autocast=True,
           loss_scaling=_DYNAMIC),
    Recipe("fp16-o2", "fp16 model copy + FP32 master weights (Apex O2), dynamic loss scaling",
           param_format="fp16", master_format="fp32", compute_format="fp16",
           loss_scaling=_DYNAMIC),
    Recipe("bf16-amp", "FP32 weights, autocast bf16 per op; no loss scaling",
           compute_format="bf16", autocast=True),
    Recipe("bf16-o2", "bf16 model copy + FP32 master weights; no loss scaling",
           param_format="bf16", master_format="fp32", compute_format="bf16"),
    Recipe("bf16-pure", "bf16 weights, no master: each update rounded to nearest into bf16",
           param_format="bf16", compute_format="bf16"),
    Recipe("bf16-pure-sr", "bf16 weights, no master: each update rounded stochastically into "
           "bf16", param_format="bf16", compute_format="bf16",
           rounding="stochastic"),
    Recipe("fp16-noscale", "fp16 model copy + FP32 master weights without loss scaling: small "
           "gradients flush to zero", param_format="fp16", master_format="fp32",
           compute_format="fp16"),
    Recipe("fp8-hybrid", "Transformer Engine HYBRID: FP8 Linear layers (E4M3 forward, E5M2 "
           "gradients, delayed scaling, the target's FP8 GEMMs with promotion every 128), the rest "
           "under bf16 autocast; FP32 weights", compute_format="bf16", autocast=True,
           fp8=Fp8Config()),
    Recipe("mxfp8", "Transformer Engine MXFP8BlockScaling: Linear layers in E4M3 with E8M0 "
           "scales per 1x32 block along each GEMM's reduction axis (TE's scale rule), Blackwell "
           "kind::mxf8f6f4; the rest under bf16 autocast; FP32 weights", **_BLOCK,
           block_scaled=BlockScaledConfig("mxfp8")),
    Recipe("nvfp4", "NVFP4 (arXiv:2509.25149): Linear layers in E2M1 with UE4M3 scales per 1x16 "
           "block (16x16 for weights) and a per-tensor scale, RHT on the wgrad inputs, "
           "stochastic rounding of gradients, Blackwell kind::mxf4nvf4; the rest under bf16 "
           "autocast; FP32 weights", **_BLOCK, block_scaled=BlockScaledConfig("nvfp4")),
    Recipe("nvfp4-no-rht", "nvfp4 without the random Hadamard transform", **_BLOCK,
           block_scaled=BlockScaledConfig("nvfp4", rht=False)),
    Recipe("nvfp4-no-sr", "nvfp4 with gradients rounded to nearest", **_BLOCK,
           block_scaled=BlockScaledConfig("nvfp4", stochastic=False)),
    Recipe("nvfp4-no-2d", "nvfp4 with 1x16 weight blocks (a different quantization of the "
           "weight in the forward and the backward GEMMs)", **_BLOCK,
           block_scaled=BlockScaledConfig("nvfp4", two_d=False)),
    Recipe("mxfp4", "nvfp4's recipe in MXFP4: E8M0 scales (OCP's rule) per 1x32 block (32x32 "
           "for weights), no per-tensor scale, Blackwell kind::mxf4", **_BLOCK,
           block_scaled=BlockScaledConfig("mxfp4")),
    Recipe("tpu-bf16", "TPU, as JAX runs a policy params=float32, compute=bfloat16, "
           "output=float32: FP32 masters, every op in bf16 (the TPU's flushing f32->bf16 casts), "
           "bf16 GEMMs one MXU pass into FP32, FP32 logits and loss", param_format="bf16",
           master_format="fp32", compute_format="bf16", target="tpu"),
    Recipe("gaudi2-fp8", "Gaudi 2: FP8 Linear layers (E4M3 both ways, INC maxabs_hw scales, "
           "pow2 gradient scales) on the MME, the rest under bf16 autocast; FP32 weights",
           compute_format="bf16", autocast=True, inc=IncConfig(), target="gaudi2"),
    Recipe("gaudi3-fp8", "Gaudi 3: FP8 Linear layers (E4M3 forward, E5M2 gradients, INC "
           "maxabs_hw scales, pow2 gradient scales) on the MME, the rest under bf16 autocast; FP32 "
           "weights", compute_format="bf16", autocast=True, inc=IncConfig(), target="gaudi3"),
    Recipe("trn-bf16-autocast", "Trainium: FP32 weights, masters, optimizer and ops; every GEMM "
           "compiled with --auto-cast matmult --auto-cast-type bf16 (operands RNE to bf16, FP32 "
           "PSUM result)", matmul_model="trainium_autocast", target="trn2"),
    Recipe("trn-bf16-sr", "Trainium under XLA_USE_BF16: every float tensor bf16, no FP32 master, "
           "stochastic rounding of every op result and update (Philox: the labelled source)",
           param_format="bf16", compute_format="bf16", rounding="stochastic",
           cast_rounding="stochastic", target="trn2"),
)}

#: Recipes written for one vendor's chips: name -> the targets they are meant for (every other
#: recipe is portable: :func:`recipes_for` offers it on any target that can run it).
NATIVE_TARGETS = {"tpu-bf16": ("tpu",), "gaudi2-fp8": ("gaudi2",), "gaudi3-fp8": ("gaudi3",),
                  "trn-bf16-autocast": ("trn1", "trn2"), "trn-bf16-sr": ("trn1", "trn2")}


def recipe_names() -> list[str]:
    """The names of the built-in recipes, in table order."""
    return list(RECIPES)


def recipes_for(target) -> list[str]:
    """The built-in recipes that run on ``target``, in table order: the portable ones whose
    formats, FP8 GEMMs and roundings it has, and the ones written for it (:data:`NATIVE_TARGETS`).
    """
    target = get_target(target)
    names = []
    for name in RECIPES:
        if target.name not in NATIVE_TARGETS.get(name, (target.name,)):
            continue
        try:
            get_recipe(name, target)
        except ValueError:            # a format, FP8 path or rounding the target does not have
            continue
        names.append(name)
    return names


def get_recipe(name, target=None) -> Recipe:
    """A built-in recipe by name (a :class:`Recipe` is passed through), on ``target`` when
    given (:meth:`Recipe.for_target`)."""
    if isinstance(name, Recipe):
        recipe = name
    elif not isinstance(name, str):
        raise TypeError(f"recipe must be a name or a Recipe; got {type(name).__name__}")
    elif name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; valid recipes: {', '.join(RECIPES)}")
    else:
        recipe = RECIPES[name]
    return recipe if target is None else recipe.for_target(target)
