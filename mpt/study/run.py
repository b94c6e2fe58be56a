"""L5: running the study — one trainer per recipe on the same batches, the results per recipe."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from mpt.amp.recipes import get_recipe
from mpt.kernels.threads import one_thread
from mpt.nn import GPT
from mpt.planning import state_bytes_per_parameter
from mpt.study.quant import QuantStudyConfig, run_quant_study
from mpt.train.corpus import MarkovCorpus, TextCorpus
from mpt.train.trainer import Trainer
from mpt.study.config import StudyConfig


__all__ = ["RecipeRun", "StudyResult", "run_recipe", "run_study"]


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
        return {
            "skipped": sum(m.skipped for m in h),
            "final_scale": h[-1].scale if h else None,
            "underflow": flushed / nonzero if nonzero else 0.0,
            "grad_zeros": sum(m.grad_zeros for m in h) / max(1, sum(m.grad_numel for m in h)),
            "lost_updates": sum(m.lost for m in h) / changed if changed else 0.0,
            "first_nonfinite": next((m.first_nonfinite for m in h if m.first_nonfinite), None),
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
    """A tqdm bar when tqdm is installed, else one stderr line rewritten at most twice a second
    (printed once at the end when stderr is not a terminal)."""

    def __init__(self, name: str, total: int, enabled: bool):
        self.name, self.total, self.enabled, self.bar = name, total, enabled, None
        self.last = 0.0
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc=f"{name:13s}", leave=True, file=sys.stderr)

    def __call__(self, metrics) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{metrics.loss:.4f}", refresh=False)
            return
        now = time.monotonic()
        if sys.stderr.isatty() and (now - self.last > 0.5 or metrics.step == self.total):
            self.last = now
            print(f"\r{self.name:13s} step {metrics.step}/{self.total} loss {metrics.loss:.4f}",
                  end="", file=sys.stderr, flush=True)

    def close(self, final_loss: float, seconds: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
            return
        end = "\r" if sys.stderr.isatty() else ""
        print(f"{end}{self.name:13s} {self.total} steps, held-out loss {final_loss:.4f} "
              f"({seconds:.1f} s)", file=sys.stderr, flush=True)


def run_recipe(config: StudyConfig, recipe: str, corpus=None, progress: bool = False) -> RecipeRun:
    """Train the study's GPT under one recipe; returns its :class:`RecipeRun`."""
    corpus = _corpus(config) if corpus is None else corpus
    recipe = get_recipe(recipe, config.target)
    network = GPT(corpus.vocab, config.d_model, config.n_layers, config.n_heads, config.seq_len,
                seed=config.seed)
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


def run_study(config: StudyConfig = StudyConfig(), progress: bool = False) -> StudyResult:
    """Run every recipe of ``config`` in order, then the cross-chip section when
    ``config.compare_targets`` names targets (:mod:`mpt.study.targets`); progress bars on stderr
    when ``progress``."""
    corpus = _corpus(config)
    result = StudyResult(config, corpus.describe())
    for name in config.recipes:
        result.runs[name] = run_recipe(config, name, corpus, progress)
    if config.compare_targets:
        from mpt.study.targets import run_targets   # the section imports run_recipe from here
        result.targets = run_targets(config, config.compare_targets, corpus, progress)
    if config.quant and config.text is None:
        if progress:
            print("quantization sections (QAT vs PTQ, LoRA) ...", file=sys.stderr, flush=True)
        with one_thread():
            result.quant = run_quant_study(config, QuantStudyConfig.for_steps(config.steps))
    return result

