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
from mpt.tasks import Progress


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

    def to_dict(self) -> dict:
        return {"config": self.config.describe(), "corpus": self.corpus,
                "quant": None if self.quant is None else self.quant.to_dict(),
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
    """Run every recipe of ``config`` in order; progress bars on stderr when ``progress``."""
    corpus = _corpus(config)
    result = StudyResult(config, corpus.describe())
    for name in config.recipes:
        result.runs[name] = run_recipe(config, name, corpus, progress)
    if config.quant and config.text is None:
        if progress:
            print("quantization sections (QAT vs PTQ, LoRA) ...", file=sys.stderr, flush=True)
        with one_thread():
            result.quant = run_quant_study(config, QuantStudyConfig.for_steps(config.steps))
    return result

