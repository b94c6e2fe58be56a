"""L5: running the study — one trainer per recipe on the same batches, the results per recipe."""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass, field

from mpt.amp.recipes import NATIVE_TARGETS, get_recipe, recipes_for
from mpt.engines import get_mma_model
from mpt.kernels.threads import one_thread
from mpt.nn import GPT
from mpt.planning import state_bytes_per_parameter
from mpt.study.config import StudyConfig, attention_backend
from mpt.study.quant import QuantStudyConfig, run_quant_study
from mpt.targets import get_target
from mpt.tasks import Progress
from mpt.train.corpus import MarkovCorpus, TextCorpus
from mpt.train.trainer import Trainer

__all__ = ["RecipeRun", "StudyResult", "run_recipe", "run_study", "TargetRun", "TargetsResult",
           "run_targets", "default_targets"]


@dataclass
class RecipeRun:
    """One recipe's run: its final held-out loss, every step's metrics and the wall time."""

    recipe: str
    final_loss: float
    history: list
    seconds: float
    parameters: int
    bytes_per_parameter: float

    def totals(self) -> dict:
        """Sums over the run (see the table columns in the module docstring)."""
        h = self.history
        lg = [m.loss_grad for m in h]
        nonzero = sum(s.nonzero for s in lg) + sum(m.fp8_grad["nonzero"] for m in h)
        flushed = sum(s.underflow for s in lg) + sum(m.fp8_grad["flushed"] for m in h)
        changed = sum(m.changed for m in h)
        block = {key: sum(m.block_scaled.get(key, 0) for m in h)
                 for key in ("nonzero", "saturated", "sq_err", "sq")}
        return {
            "skipped": sum(m.skipped for m in h),
            "final_scale": h[-1].scale if h else None,
            "underflow": flushed / nonzero if nonzero else 0.0,
            "grad_zeros": sum(m.grad_zeros for m in h) / max(1, sum(m.grad_numel for m in h)),
            "lost_updates": sum(m.lost for m in h) / changed if changed else 0.0,
            "first_nonfinite": next((m.first_nonfinite for m in h if m.first_nonfinite), None),
            "quant_error": math.sqrt(block["sq_err"] / block["sq"]) if block["sq"] else None,
            "saturated": block["saturated"] / block["nonzero"] if block["nonzero"] else None,
        }


@dataclass
class StudyResult:
    config: StudyConfig
    corpus: dict
    runs: dict = field(default_factory=dict)
    quant: object = None  # mpt.study.quant.QuantStudyResult, or None when not run
    targets: object = None  # mpt.study.targets.TargetsResult, or None when not run

    def to_dict(self) -> dict:
        return {"config": self.config.describe(), "corpus": self.corpus,
                "quant": None if self.quant is None else self.quant.to_dict(),
                "targets": None if self.targets is None else self.targets.to_dict(),
                "runs": {name: {"recipe": get_recipe(name).describe(),
                                "final_loss": r.final_loss, "seconds": r.seconds,
                                "parameters": r.parameters,
                                "bytes_per_parameter": r.bytes_per_parameter,
                                "totals": r.totals(),
                                "history": [m.to_dict() for m in r.history]}
                         for name, r in self.runs.items()}}


def _corpus(config: StudyConfig):
    if config.text is not None:
        return TextCorpus(config.text, seed=config.corpus_seed)
    return MarkovCorpus(config.vocab, config.sharpness, seed=config.corpus_seed)


def _bytes_per_parameter(recipe) -> float:
    return state_bytes_per_parameter(recipe.param_format, recipe.grad_format,
                                     recipe.master_format, "adamw", recipe.state_format)["total"]


class _Progress:
    """The progress of one recipe's run (:class:`mpt.tasks.Progress`: a tqdm bar, else a stderr
    line), its held-out loss at the end."""

    def __init__(self, name: str, total: int, enabled: bool):
        self.name, self.total = name, total
        self.bar = Progress(f"{name:13s}", total, enabled, unit="step")

    def __call__(self, metrics) -> None:
        self.bar.update(1, loss=f"{metrics.loss:.4f}")

    def close(self, final_loss: float, seconds: float) -> None:
        self.bar.close(f"{self.name:13s} {self.total} steps, held-out loss {final_loss:.4f} "
                       f"({seconds:.1f} s)")


def run_recipe(config: StudyConfig, recipe: str, corpus=None, progress: bool = False) -> RecipeRun:
    """Train the study's GPT under one recipe; returns its :class:`RecipeRun`."""
    corpus = _corpus(config) if corpus is None else corpus
    recipe = get_recipe(recipe, config.target)
    network = GPT(corpus.vocab, config.d_model, config.n_layers, config.n_heads, config.seq_len,
                  seed=config.seed, backend=config.attention)
    trainer = Trainer(network, recipe, config.train_config())
    bar = _Progress(recipe.name, config.steps, progress)
    start = time.perf_counter()
    stream = f"train.{config.seed}"
    with one_thread():
        trainer.train(lambda step, micro: corpus.batch(config.batch, config.seq_len, stream,
                                                       step), config.steps, bar)
        final = trainer.evaluate([corpus.batch(config.batch, config.seq_len, "eval", k)
                                  for k in range(config.eval_batches)])
    seconds = time.perf_counter() - start
    bar.close(final, seconds)
    return RecipeRun(recipe.name, final, trainer.history, seconds,
                     trainer.parameters_summary()["parameters"], _bytes_per_parameter(recipe))


def default_targets() -> tuple[str, ...]:
    """H100, MI300X, TPU, Gaudi 3, Trainium2."""
    return ("h100", "mi300x", "tpu", "gaudi3", "trn2")


# ---- the cross-chip section (mpt.study.targets) -----------------------------------------------
_PORTABLE = "bf16-amp"


@dataclass
class TargetRun:
    """One (target, recipe) run: the recipe resolved on the target and its :class:`RecipeRun`."""

    target: str
    recipe: str
    model: str
    evidence: str
    run: RecipeRun


@dataclass
class TargetsResult:
    targets: tuple[str, ...]
    rows: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"targets": list(self.targets),
                "rows": [{"target": r.target, "recipe": r.recipe, "model": r.model,
                          "evidence": r.evidence, "final_loss": r.run.final_loss,
                          "seconds": r.run.seconds, "totals": r.run.totals()}
                         for r in self.rows]}


def _recipes(target: str) -> list[str]:
    """The portable bf16 recipe (where the target runs it) and the target's own."""
    runnable = recipes_for(target)
    native = [r for r in runnable if target in NATIVE_TARGETS.get(r, ())]
    return ([_PORTABLE] if _PORTABLE in runnable else []) + native


def run_targets(config, names=None, corpus=None, progress: bool = False) -> TargetsResult:
    """Train ``config``'s network on each target of ``names`` (default :func:`default_targets`)
    under its recipes (module docstring); ``config`` is a ``StudyConfig`` (its own target and
    recipes are not used). Attention runs on one backend for every row
    (:func:`~mpt.study.config.attention_backend` of all the recipes on all the targets)."""
    names = tuple(get_target(t).name for t in (names or default_targets()))
    plans = {name: _recipes(name) for name in names}
    attention = attention_backend(get_recipe(r, name) for name in names for r in plans[name])
    if config.attention == "naive":
        attention = "naive"
    result = TargetsResult(names)
    for name, recipes in plans.items():
        on_target = dataclasses.replace(config, target=name, recipes=tuple(recipes),
                                        compare_targets=(), attention=attention)
        for recipe_name in recipes:
            recipe = get_recipe(recipe_name, name)
            fmt = "fp32" if recipe.compute_format == "tf32" else recipe.compute_format
            model = get_mma_model(recipe.matmul_model)
            cfg = model.config(fmt, fmt) if fmt in model.input_formats else model.configs[0]
            run = run_recipe(on_target, recipe_name, corpus, progress)
            result.rows.append(TargetRun(name, recipe_name, model.name, cfg.evidence, run))
    return result


def run_study(config: StudyConfig = StudyConfig(), progress: bool = False) -> StudyResult:
    """Run every recipe of ``config`` in order, then the cross-chip section when
    ``config.compare_targets`` names targets (:mod:`mpt.study.targets`); progress bars on stderr
    when ``progress``."""
    corpus = _corpus(config)
    result = StudyResult(config, corpus.describe())
    for name in config.recipes:
        result.runs[name] = run_recipe(config, name, corpus, progress)
    if config.compare_targets:
        result.targets = run_targets(config, config.compare_targets, corpus, progress)
    if config.quant and config.text is None:
        if progress:
            print("quantization sections (QAT vs PTQ, LoRA) ...", file=sys.stderr, flush=True)
        with one_thread():
            result.quant = run_quant_study(config, QuantStudyConfig.for_steps(config.steps))
    return result

