"""L5: a training loop that carries out a precision recipe and records what each step did to the
numbers.

:class:`Trainer` takes a network built in fp32 (``network(idx)`` → logits (B, T, vocab), e.g.
``mpt.nn.GPT``), a recipe (``mpt.recipes``) and a :class:`TrainConfig`, and sets up:

* the **network copy**: Linear layers swapped for ``mpt.amp.linear.Fp8Linear`` (recipes with
  ``fp8``), ``PlanLinear`` with the recipe's INC plan (``inc``: Gaudi FP8 recipes),
  ``BlockScaledLinear`` (``block_scaled``: all but the last ``bf16_last``, numbered in module
  order, their stochastic rounding keyed by ``config.seed``, the step and the micro-batch) or
  ``Tf32Linear`` (compute format tf32), then the parameters rounded (RNE) to
  ``recipe.param_format``; attention runs on the network's own backend (``backend="flash"``
  needs a model the flash kernels take: ``mpt.functional.attention.flash_runs``);
* the **optimizer**: ``mpt.optim.AdamW`` with FP32 states, FP32 masters when
  ``recipe.master_format`` is set (``master_weights=True``), the copy-down in ``recipe.rounding``
  (stochastic rounding keyed by ``config.seed``, the parameter and the step), the fused kernel;
* the **loss scaler**: ``mpt.amp.GradScaler`` (dynamic) or ``StaticLossScale``, recording;
* the **conversion rules** of the target (:mod:`mpt.autograd.conversion`: a TPU's flushing
  f32→bf16 casts; with ``recipe.cast_rounding="stochastic"``, stochastic rounding of every op
  result, keyed by ``config.seed`` and the step), in effect for every step and evaluation.

One :meth:`Trainer.train_step` over ``k`` micro-batches (gradient accumulation):

1. zero the gradients; set the learning rate of this step (linear warm-up, then cosine decay to
   ``min_lr``, computed in float64);
2. per micro-batch: forward inside the recipe's region (``mpt.autocast(format, model)`` for autocast
   recipes, else ``mpt.matmul_model(model)``), logits cast to ``recipe.output_format`` (fp32: the
   cross-entropy runs in fp32), ``loss·f32(loss_multiplier/k)`` (Megatron-LM divides each
   micro-batch loss by the number of micro-batches), scaled by the scaler, ``backward()`` — the
   gradients accumulate in ``param.grad`` in the parameters' format (each addition in fp32,
   rounded once: ``mpt.autograd.tensor``); FP8 scales are updated after each backward;
3. optional clipping: ``scaler.unscale_`` then ``mpt.optim.clip_grad_norm_`` (PyTorch's order;
   recipes whose fp16 gradients cannot be unscaled refuse clipping at construction);
4. ``scaler.step(optimizer)`` (skipped on Inf/NaN; unscaling on the fly for master-weight
   optimizers) and ``scaler.update()``, or ``optimizer.step()`` without a scaler;
5. a :class:`StepMetrics` record (see there).

``loss_multiplier`` (default 1) multiplies the loss before backward. A power of two changes no
bits of an FP32 AdamW run except through ``eps`` (the update is ``m/(√v + eps)``, scale-free
otherwise), but it moves every gradient by that factor in the low-precision formats: it is how
``mpt study`` gives a small network the tiny per-micro-batch gradients of a large-batch run (see
``mpt.study``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

import mpt.functional as F
from mpt._checks import check_bool, check_int, check_real
from mpt.amp.linear import BlockScaledLinear, Fp8Linear, PlanLinear, Tf32Linear, replace_linears
from mpt.amp.recipes import Recipe, get_recipe
from mpt.amp.scaler import GradScaler, StaticLossScale
from mpt.autograd.conversion import ConversionRules, conversion_rules
from mpt.autograd.tensor import no_grad, opmath
from mpt.functional.autocast import autocast, matmul_model
from mpt.nn import Linear
from mpt.optim import AdamW, clip_grad_norm_
from mpt.targets import get_target
from mpt.train.diagnostics import (CastStats, Log2Histogram, cast_stats, first_non_finite,
                                   log2_histogram, lost_update_fraction, tensor_cast_stats)

__all__ = ["TrainConfig", "StepMetrics", "Trainer", "learning_rate"]


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer and loop settings (AdamW defaults are PyTorch's).

    ``total_steps`` None: constant ``lr`` after warm-up; else cosine decay from ``lr`` to
    ``min_lr`` (default ``lr/10``) at ``total_steps``. ``grad_accum``: micro-batches per step.
    ``clip_grad_norm``: max gradient norm or None. ``seed``: stochastic rounding key.
    ``detail_steps``: steps (1-based) that also record gradient histograms and per-tensor cast
    statistics (see :class:`StepMetrics`).
    """

    lr: float = 1e-3
    min_lr: float | None = None
    warmup_steps: int = 0
    total_steps: int | None = None
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2
    grad_accum: int = 1
    clip_grad_norm: float | None = None
    loss_multiplier: float = 1.0
    seed: int = 0
    fused: bool = True
    detail_steps: tuple[int, ...] = ()

    def __post_init__(self):
        """Check every field (type and range, as the optimizer would; never NaN or Inf) and
        store it as a plain Python value."""
        betas = self.betas
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2) of real numbers in [0, 1); got "
                            f"{type(betas).__name__} {betas!r}")
        if isinstance(self.detail_steps, (str, bytes)) or \
                not hasattr(self.detail_steps, "__iter__"):
            raise TypeError(f"detail_steps must be a sequence of steps (ints >= 1); got "
                            f"{type(self.detail_steps).__name__}")
        checked = dict(
            lr=check_real("lr", self.lr, min=0),
            min_lr=check_real("min_lr", self.min_lr, min=0, optional=True),
            warmup_steps=check_int("warmup_steps", self.warmup_steps, min=0),
            total_steps=check_int("total_steps", self.total_steps, min=1, optional=True),
            betas=tuple(check_real(f"betas[{i}]", b, min=0, lt=1) for i, b in enumerate(betas)),
            eps=check_real("eps", self.eps, min=0),
            weight_decay=check_real("weight_decay", self.weight_decay, min=0),
            grad_accum=check_int("grad_accum", self.grad_accum, min=1),
            clip_grad_norm=check_real("clip_grad_norm", self.clip_grad_norm, gt=0,
                                      optional=True),
            loss_multiplier=check_real("loss_multiplier", self.loss_multiplier, gt=0),
            seed=check_int("seed", self.seed, min=0, max=2**64 - 1),
            fused=check_bool("fused", self.fused),
            detail_steps=tuple(check_int(f"detail_steps[{i}]", s, min=1)
                               for i, s in enumerate(self.detail_steps)))
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def describe(self) -> dict:
        return asdict(self)


def learning_rate(config: TrainConfig, step: int) -> float:
    """The learning rate of 1-based ``step``: linear warm-up over ``warmup_steps``, then constant
    or cosine decay to ``min_lr`` at ``total_steps`` (float64)."""
    step = check_int("step", step, min=1)
    if step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    if config.total_steps is None:
        return config.lr
    low = config.lr / 10 if config.min_lr is None else config.min_lr
    span = max(config.total_steps - config.warmup_steps, 1)
    progress = min((step - config.warmup_steps) / span, 1.0)
    return low + 0.5 * (config.lr - low) * (1.0 + math.cos(math.pi * progress))


@dataclass
class StepMetrics:
    """What one step did (counts are summed over its micro-batches).

    ``loss``: mean micro-batch loss (fp32 values, unscaled, before the multiplier); ``scale``:
    the loss scale used (1.0 without a scaler); ``skipped``: the scaler skipped the update;
    ``first_nonfinite``: the first parameter whose gradient held Inf/NaN; ``loss_grad``:
    :class:`~mpt.train.diagnostics.CastStats` of the logits gradient (as scaled) cast into
    ``recipe.backward_format`` — exactly the first rounding of the backward pass;
    ``fp8_grad``: totals of the FP8 layers' output-gradient quantizations (``nonzero``,
    ``flushed``, ``saturated``); ``block_scaled``: totals of the block-scaled layers'
    quantizations (``numel``, ``nonzero``, ``saturated``, ``sq_err``, ``sq``: see
    ``BlockScaledLinear``); ``grad_zeros`` / ``grad_subnormal`` / ``grad_numel``: parameter
    gradient elements that are exactly zero / subnormal in their format; ``lost``/``changed``:
    the copy-down statistics of the optimizer (elements whose FP32 working copy changed, and
    those whose low-precision value did not); ``grad_norm``: the total norm when clipping.
    On ``config.detail_steps`` only: ``tensors``, per parameter the ``CastStats`` of its gradient
    (as scaled) cast into the backward format, and ``histograms``, log2-magnitude histograms
    (``loss_grad``: the scaled logits gradient; ``params``: all parameter gradients, unscaled).
    """

    step: int
    lr: float
    loss: float
    scale: float
    skipped: bool
    first_nonfinite: str | None
    loss_grad: CastStats
    fp8_grad: dict
    grad_zeros: int
    grad_subnormal: int
    grad_numel: int
    lost: int
    changed: int
    grad_norm: float | None = None
    tensors: dict = field(default_factory=dict)
    histograms: dict = field(default_factory=dict)
    block_scaled: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["tensors"] = {k: asdict(v) for k, v in self.tensors.items()}
        out["histograms"] = {k: h.to_dict() for k, h in self.histograms.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "StepMetrics":
        data = dict(data)
        data["loss_grad"] = CastStats(**data["loss_grad"])
        data["tensors"] = {k: CastStats(**v) for k, v in data["tensors"].items()}
        data["histograms"] = {k: Log2Histogram(**{**h, "counts": tuple(h["counts"])})
                              for k, h in data["histograms"].items()}
        return cls(**data)


def _make_scaler(recipe: Recipe):
    kind = recipe.loss_scaling.kind
    kwargs = recipe.loss_scaling.scaler_kwargs()
    if kind == "dynamic":
        return GradScaler(**kwargs, record=True)
    if kind == "static":
        return StaticLossScale(**kwargs, record=True)
    return None


class Trainer:
    """Carries out ``recipe`` on ``network`` (module docstring). ``network`` is changed in place
    (its Linear layers swapped, its parameters rounded to the recipe's format)."""

    def __init__(self, network, recipe, config: TrainConfig = TrainConfig()):
        self.recipe = get_recipe(recipe)
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig; got {type(config).__name__}")
        self.config = config
        self.network = network
        self.fp8_layers = self._swap_linears()
        self.block_layers = {name: m for name, m in network.named_modules()
                             if isinstance(m, BlockScaledLinear)}
        if self.recipe.param_format != "fp32":
            network.to(self.recipe.param_format)
        self.optimizer = AdamW(network.named_parameters(), lr=config.lr, betas=config.betas,
                               eps=config.eps, weight_decay=config.weight_decay,
                               master_weights=self.recipe.master_format is not None,
                               rounding=self.recipe.rounding, seed=config.seed,
                               fused=config.fused)
        self.scaler = _make_scaler(self.recipe)
        if config.clip_grad_norm is not None and self.scaler is not None \
                and self.recipe.grad_format == "fp16":
            raise ValueError(f"clip_grad_norm: recipe {self.recipe.name} keeps scaled fp16 "
                             "gradients, which cannot be unscaled for clipping (PyTorch refuses "
                             "too; Apex clips FP32 master gradients, which mpt does not model)")
        self.step_count = 0
        self.history: list[StepMetrics] = []

    def _swap_linears(self) -> dict:
        recipe = self.recipe
        if recipe.inc is not None:
            plan = recipe.inc.plan()
            replace_linears(self.network, lambda lin: PlanLinear(lin, plan))
        elif recipe.fp8 is not None:
            fp8 = recipe.fp8
            replace_linears(self.network, lambda lin: Fp8Linear(
                lin, fp8.scaling, model=fp8.model, promote_every=fp8.promote_every,
                split_accumulator=fp8.split_accumulator))
        elif recipe.block_scaled is not None:
            self._swap_block_scaled(recipe.block_scaled)
        elif recipe.compute_format == "tf32":
            replace_linears(self.network, lambda lin: Tf32Linear(lin, recipe.matmul_model))
        return {name: m for name, m in self.network.named_modules() if isinstance(m, Fp8Linear)}

    def _swap_block_scaled(self, config):
        """Every Linear but the last ``config.bf16_last`` becomes a BlockScaledLinear."""
        linears = [m for _, m in self.network.named_modules() if type(m) is Linear]
        keep = {id(m) for m in linears[len(linears) - config.bf16_last:]} \
            if config.bf16_last else set()
        plan, index = config.plan(), {id(m): i for i, m in enumerate(linears)}
        replace_linears(self.network, lambda lin: lin if id(lin) in keep else BlockScaledLinear(
            lin, plan, seed=self.config.seed, index=index[id(lin)]))

    def conversions(self, step: int):
        """Context manager: the conversion rules of the recipe's target for ``step``
        (:mod:`mpt.autograd.conversion`: its subnormal flushes; with ``cast_rounding=
        "stochastic"``, stochastic rounding of every op result into bf16/fp16, keyed by
        ``config.seed`` and the step)."""
        r = self.recipe
        flush = get_target(r.target).conversions.flush_subnormals
        stochastic = ("bf16", "fp16") if r.cast_rounding == "stochastic" else ()
        rules = ConversionRules(flush, stochastic, self.config.seed, step) \
            if flush or stochastic else None
        return conversion_rules(rules)

    # ---- forward ---------------------------------------------------------------------------
    @property
    def model(self):
        """The network (``network``; the name of mpt 0.1, where "model" also meant the network)."""
        return self.network

    def region(self):
        """The context a forward runs in: autocast (per-op casts) or the recipe's MMA model."""
        r = self.recipe
        if r.autocast:
            return autocast(r.compute_format, model=r.matmul_model)
        return matmul_model(r.matmul_model)

    def _logits_and_loss(self, idx, targets):
        with self.region():
            logits = self.network(idx)                                    # (B, T, V)
            if logits.format.name != self.recipe.output_format:
                logits = logits.to(self.recipe.output_format)
            B, T, V = logits.shape
            loss = F.cross_entropy(logits.reshape(B * T, V), np.asarray(targets).reshape(-1))
        return logits, loss

    def evaluate(self, batches) -> float:
        """Mean loss over ``(idx, targets)`` batches with the recipe's forward, no graph, eval
        mode (dropout off); float64 mean of the fp32 batch losses. The training state is left as
        it was: FP8 layers quantize with their current scales, and the amaxes they record are
        discarded afterwards."""
        batches = list(batches)
        if not batches:
            raise ValueError("batches must hold at least one (idx, targets) batch to average over")
        fp8 = {name: layer.fp8_state_dict() for name, layer in self.fp8_layers.items()}
        self.network.eval()
        try:
            with no_grad(), self.conversions(self.step_count):
                losses = [float(self._logits_and_loss(i, t)[1].item()) for i, t in batches]
        finally:
            self.network.train()
            for name, layer in self.fp8_layers.items():
                layer.load_fp8_state_dict(fp8[name])
                layer.reset_counts()
            for layer in self.block_layers.values():
                layer.reset_counts()
        return math.fsum(losses) / len(losses)

    # ---- one step --------------------------------------------------------------------------
    def train_step(self, batches) -> StepMetrics:
        """One optimizer step over ``batches``: a list of ``config.grad_accum`` micro-batches
        ``(idx, targets)`` (module docstring). Appends and returns its :class:`StepMetrics`."""
        batches = list(batches)
        if len(batches) != self.config.grad_accum:
            raise ValueError(f"batches must hold grad_accum={self.config.grad_accum} "
                             f"micro-batches; got {len(batches)}")
        step = self.step_count + 1
        lr = learning_rate(self.config, step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        detail = step in self.config.detail_steps
        losses, loss_grad, histograms = [], None, {}
        with self.conversions(step):
            for micro, (idx, targets) in enumerate(batches):
                for layer in self.block_layers.values():
                    layer.set_step(step, micro)
                stats, g_hist, loss = self._micro_step(idx, targets, detail)
                losses.append(loss)
                loss_grad = stats if loss_grad is None else loss_grad + stats
                if detail:
                    histograms["loss_grad"] = histograms["loss_grad"] + g_hist \
                        if "loss_grad" in histograms else g_hist
            scale = 1.0 if self.scaler is None else self.scaler.get_scale()
            report = self._gradient_report(scale, detail)
            histograms.update(report.pop("histograms"))
            norm, skipped = self._apply()
        lost, changed, _ = (0, 0, 0.0) if skipped else \
            lost_update_fraction(self.optimizer.lost_updates)
        metrics = StepMetrics(step, lr, math.fsum(losses) / len(losses), scale, skipped,
                              loss_grad=loss_grad, fp8_grad=self._fp8_counts(), lost=lost,
                              changed=changed, grad_norm=norm, histograms=histograms,
                              block_scaled=self._block_counts(), **report)
        self.step_count = step
        self.history.append(metrics)
        return metrics

    def _micro_step(self, idx, targets, detail):
        logits, loss = self._logits_and_loss(idx, targets)
        logits.retain_grad()
        factor = self.config.loss_multiplier / self.config.grad_accum
        scaled = loss * factor if factor != 1.0 else loss
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        scaled.backward()
        g = logits.grad.data                                            # fp32, as scaled
        stats = cast_stats(g, self.recipe.backward_format)
        for layer in self.fp8_layers.values():
            layer.fp8_update()
        return stats, log2_histogram(g) if detail else None, float(loss.item())

    def _gradient_report(self, scale, detail) -> dict:
        """Counts over the parameter gradients before the step; on detail steps also each
        gradient's cast statistics into the backward format (as scaled) and the binade histogram
        of all of them (unscaled, exact in float64)."""
        named = [(n, p.grad) for n, p in self.optimizer.named_parameters() if p.grad is not None]
        zeros = subnormal = numel = 0
        for _, g in named:
            v = np.abs(opmath(g.data))
            zeros += int(np.count_nonzero(v == 0))
            subnormal += int(np.count_nonzero((v > 0) & (v < g.format.min_normal)))
            numel += v.size
        report = {"first_nonfinite": first_non_finite(named), "grad_zeros": zeros,
                  "grad_subnormal": subnormal, "grad_numel": numel, "tensors": {},
                  "histograms": {}}
        if detail and named:
            report["tensors"] = tensor_cast_stats(named, self.recipe.backward_format)
            hists = [log2_histogram(opmath(g.data).astype(np.float64) / scale) for _, g in named]
            report["histograms"]["params"] = sum(hists[1:], hists[0])
        return report

    def _apply(self):
        """Clip (if configured) and step through the scaler; returns (norm or None, skipped)."""
        norm = None
        if self.config.clip_grad_norm is not None:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            norm = float(clip_grad_norm_([p for _, p in self.optimizer.named_parameters()],
                                         self.config.clip_grad_norm))
        if self.scaler is None:
            self.optimizer.step()
            return norm, False
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return norm, self.scaler.records[-1].skipped

    def _fp8_counts(self) -> dict:
        total = {"nonzero": 0, "flushed": 0, "saturated": 0}
        for layer in self.fp8_layers.values():
            counts = layer.quantization_counts["grad_output"]
            for key in total:
                total[key] += counts[key]
            layer.reset_counts()
        return total

    def _block_counts(self) -> dict:
        """The block-scaled layers' quantization statistics of the step, summed; then reset."""
        total = {}
        for layer in self.block_layers.values():
            for counts in layer.quantization_counts.values():
                for key, value in counts.items():
                    total[key] = total.get(key, 0) + value
            layer.reset_counts()
        return total

    # ---- loops -----------------------------------------------------------------------------
    def train(self, data, steps: int, progress=None) -> list[StepMetrics]:
        """Run ``steps`` steps; ``data(step, micro)`` returns micro-batch ``micro`` of the 1-based
        ``step`` as ``(idx, targets)``. ``progress(metrics)`` is called after each step."""
        out = []
        for _ in range(steps):
            step = self.step_count + 1
            out.append(self.train_step([data(step, m) for m in range(self.config.grad_accum)]))
            if progress is not None:
                progress(out[-1])
        return out

    def parameters_summary(self) -> dict:
        """Parameter count and the formats in use (for reports)."""
        n = sum(p.size for _, p in self.optimizer.named_parameters())
        return {"parameters": int(n), "fp8_layers": sorted(self.fp8_layers)}
