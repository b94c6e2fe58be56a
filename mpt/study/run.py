"""L5: ``mpt study`` — train one small GPT under every precision recipe and compare what each did.

**Workload.** ``mpt.nn.GPT`` (default: vocabulary 32, d_model 32, one block of two heads, context
16, batch 16) learns a random first-order Markov chain (``mpt.corpus.MarkovCorpus``) whose
entropy rate ``H`` is the best achievable loss; ``--text FILE`` trains on the file's bytes instead
(vocabulary 256, no known optimum). Every recipe starts from the same FP32 initialisation and sees
the same batches, so the differences between rows are the recipes' alone. ``seed`` sets the
initialisation, the order of the training batches and the stochastic-rounding key;
``corpus_seed`` the chain (the held-out batches depend on it alone). AdamW (β = (0.9, 0.95), no
weight decay, eps 1e-8), learning rate 3e-3 with 20 warm-up steps and cosine decay to 3e-4, 400
steps. The Numba kernels run on one thread (small tensors: faster, and the bits never depend on
it).

**Why the loss is multiplied by 2⁻¹¹.** The gradient of a mean loss over ``N`` tokens carries a
factor ``1/N``: the logits gradient of one token is ``(softmax − onehot)/N``. A real run averages
over its whole batch — GPT-3 Small used 0.5M = 2¹⁹ tokens per step (Brown et al. 2020, Table
2.1), and Megatron-LM divides each micro-batch's loss by the number of micro-batches it
accumulates — so each micro-batch backward sees gradients ``2¹⁹/n`` times smaller than the mean
over its own ``n`` tokens. The study's micro-batch has ``n = 16·16 = 2⁸`` tokens; multiplying its
mean loss by ``n/2¹⁹ = 2⁻¹¹`` gives its backward the gradient magnitudes of such a run (the
default ``global_batch_tokens = 2**19``). That is conservative: with GPT-2's 50257-token
vocabulary instead of 32, the probabilities, hence the logits gradients, of the non-target tokens
are about 2¹¹ times smaller again. AdamW's update does not depend on the gradient scale (except
through ``eps``), so the FP32 run barely notices the factor; FP16 without loss scaling does — the
effect loss scaling exists for (Micikevicius et al., ICLR 2018). Setting ``global_batch_tokens``
to the micro-batch's size turns the factor off (then FP16 flushes far fewer gradients: the
study reports what it measures, it does not assume it).

**Table columns.** ``final loss``: mean loss on 8 held-out batches with the recipe's own forward
(no dropout); ``gap fp32``: minus the fp32 row's; ``skipped``: steps the loss scaler skipped;
``scale``: the final loss scale; ``underflow %``: share of the non-zero gradient values flushed
to zero at the casts the trainer measures exactly — the logits gradient (as scaled) rounded into
the backward format (the first rounding of every backward pass) and, for FP8 layers, the E5M2
quantization of their output gradients; ``zero grads %``: parameter-gradient elements that are
exactly zero (the consequence); ``lost upd %``: for recipes without master weights, the share of
the elements whose FP32 update left the low-precision weight unchanged (below half an ULP);
``B/param``: bytes per parameter of weights + gradients + master + AdamW states
(``mpt.planning``); ``time s``: wall time of the recipe's run.

**Quantization sections** (``quant``, default on for the Markov corpus; ``--no-quant`` skips
them): QAT vs post-training quantization of a bigram MLP into integer-only models, and LoRA
fine-tunes over fp16/bf16/int8/NF4 bases — ``mpt.study_quant``; their step counts scale with
``steps``.

The report folder holds ``report.md``, ``study.json`` (every step's metrics) and, with matplotlib
installed (``pip install 'mpt[plot]'``), PNG plots: loss curves, loss-scale trajectories, lost
updates, and the gradient-magnitude histogram of the FP32 run against the FP16 range.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mpt._checks import check_bool, check_int
from mpt._io import atomic_write_bytes
from mpt.corpus import MarkovCorpus, TextCorpus
from mpt.formats import get_format
from mpt.kernels.threads import one_thread
from mpt.nn import GPT
from mpt.planning import state_bytes_per_parameter
from mpt.recipes import get_recipe, recipe_names
from mpt.targets import get_target
from mpt.study_quant import QuantStudyConfig, format_quant_sections, quant_markdown, \
    run_quant_study
from mpt.training import TrainConfig, Trainer

__all__ = ["StudyConfig", "RecipeRun", "StudyResult", "run_study", "format_table",
           "format_quant_sections", "write_report"]

_FP16 = get_format("fp16")


@dataclass(frozen=True)
class StudyConfig:
    """Everything a study run depends on (see the module docstring for the defaults' reasons)."""

    recipes: tuple[str, ...] | None = None
    target: str = "h100"
    steps: int = 400
    vocab: int = 32
    sharpness: int = 8
    d_model: int = 32
    n_layers: int = 1
    n_heads: int = 2
    seq_len: int = 16
    batch: int = 16
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 20
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    global_batch_tokens: int = 2 ** 19
    eval_batches: int = 8
    seed: int = 0
    corpus_seed: int = 0
    text: str | None = None
    quant: bool = True

    def __post_init__(self):
        target = get_target(self.target)
        object.__setattr__(self, "target", target.name)
        if self.recipes is None:   # every built-in recipe the target can run
            names = [r for r in recipe_names() if target.fp8 or get_recipe(r).fp8 is None]
        else:
            names = [get_recipe(r).name for r in self.recipes]
        object.__setattr__(self, "recipes", tuple(get_recipe(r, target).name for r in names))
        if not self.recipes:
            raise ValueError("recipes must name at least one recipe")
        for name in ("steps", "d_model", "n_layers", "n_heads", "seq_len", "batch",
                     "eval_batches", "global_batch_tokens", "sharpness"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), min=1))
        object.__setattr__(self, "vocab", check_int("vocab", self.vocab, min=2))
        object.__setattr__(self, "corpus_seed",
                           check_int("corpus_seed", self.corpus_seed, min=0, max=2**64 - 1))
        object.__setattr__(self, "quant", check_bool("quant", self.quant))
        if self.text is not None and not isinstance(self.text, (str, os.PathLike)):
            raise TypeError(f"text must be None or a file path; got {type(self.text).__name__}")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads={self.n_heads} must divide d_model={self.d_model}")
        if self.global_batch_tokens < self.micro_tokens:
            raise ValueError(f"global_batch_tokens ({self.global_batch_tokens}) must be at least "
                             f"the micro-batch's {self.micro_tokens} tokens")
        self.train_config()          # checks lr, min_lr, warmup_steps, betas, weight_decay, seed

    @property
    def micro_tokens(self) -> int:
        return self.batch * self.seq_len

    @property
    def loss_multiplier(self) -> float:
        """``micro_tokens / global_batch_tokens`` (module docstring)."""
        return self.micro_tokens / self.global_batch_tokens

    def detail_steps(self) -> tuple[int, ...]:
        return tuple(sorted({1, max(1, self.steps // 2), self.steps}))

    def train_config(self) -> TrainConfig:
        return TrainConfig(lr=self.lr, min_lr=self.min_lr, warmup_steps=self.warmup_steps,
                           total_steps=self.steps, betas=self.betas, eps=1e-8,
                           weight_decay=self.weight_decay, loss_multiplier=self.loss_multiplier,
                           seed=self.seed, detail_steps=self.detail_steps())

    def describe(self) -> dict:
        out = dataclasses.asdict(self)
        out["loss_multiplier"] = self.loss_multiplier
        return out


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
    quant: object = None  # mpt.study_quant.QuantStudyResult, or None when not run

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
    model = GPT(corpus.vocab, config.d_model, config.n_layers, config.n_heads, config.seq_len,
                seed=config.seed)
    trainer = Trainer(model, recipe, config.train_config())
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


# ---- the table ---------------------------------------------------------------------------------
_COLUMNS = ("recipe", "final loss", "gap fp32", "skipped", "scale", "underflow %",
            "zero grads %", "lost upd %", "B/param", "time s")


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def table_rows(result: StudyResult) -> list[tuple[str, ...]]:
    """One row of strings per recipe (the columns of :func:`format_table`)."""
    base = result.runs.get("fp32")
    rows = []
    for name, run in result.runs.items():
        recipe = get_recipe(name)
        t = run.totals()
        gap = "-" if base is None else f"{run.final_loss - base.final_loss:+.4f}"
        scaled = recipe.loss_scaling.kind != "none"
        no_master = recipe.param_format != "fp32" and recipe.master_format is None
        rows.append((name, f"{run.final_loss:.4f}", gap, str(t["skipped"]),
                     f"{t['final_scale']:g}" if scaled else "-", _pct(t["underflow"]),
                     _pct(t["grad_zeros"]), _pct(t["lost_updates"]) if no_master else "-",
                     f"{run.bytes_per_parameter:g}", f"{run.seconds:.1f}"))
    return rows


def _multiplier(x: float) -> str:
    m, e = math.frexp(x)
    return f"2^{e - 1}" if m == 0.5 else f"{x:g}"


def _heading(result: StudyResult) -> list[str]:
    c = result.config
    h = result.corpus.get("entropy_rate")
    best = (f"best achievable loss (entropy rate of the Markov chain): {h:.4f}; uniform guess: "
            f"{result.corpus['uniform_loss']:.4f}") if h is not None else \
        f"text corpus {result.corpus.get('path')}: best achievable loss unknown"
    target = get_target(c.target)
    return [f"GPT d_model={c.d_model} layers={c.n_layers} heads={c.n_heads} context={c.seq_len}, "
            f"batch {c.batch}, {c.steps} steps; loss x {_multiplier(c.loss_multiplier)} (the "
            f"gradient size of a {c.global_batch_tokens}-token batch)",
            f"target {target.name}: {target.description} ({target.evidence})", best]


def format_table(result: StudyResult) -> str:
    """The comparison table as aligned text, under two lines naming the workload and the
    corpus's best achievable loss."""
    rows = [_COLUMNS] + table_rows(result)
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                       enumerate(zip(r, widths))).rstrip() for r in rows]
    return "\n".join(_heading(result) + [""] + lines)


# ---- the report --------------------------------------------------------------------------------
_LEGEND = (
    "`final loss`: held-out loss with the recipe's own forward; `gap fp32`: minus the fp32 row's; "
    "`skipped`: steps the loss scaler skipped; `scale`: final loss scale; `underflow %`: non-zero "
    "gradient values flushed to zero where the backward rounds them (the logits gradient into "
    "the backward format; FP8 layers' E5M2 output gradients); `zero grads %`: parameter-gradient "
    "values that are exactly zero; `lost upd %`: updates below half an ULP of a weight kept "
    "without master (its value did not change); `B/param`: bytes per parameter of weights, "
    "gradients, master and AdamW states.")


def _write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, lambda fh: fh.write(text.encode()))


def _markdown(result: StudyResult, plots: list[str]) -> str:
    rows = [_COLUMNS] + table_rows(result)
    md = ["| " + " | ".join(r) + " |" for r in rows]
    md.insert(1, "|" + "---|" * len(_COLUMNS))
    lines = ["# mpt study", "", "  \n".join(_heading(result)), "", *md, "", _LEGEND, "",
             "Recipes:", ""]
    lines += [f"- `{name}`: {get_recipe(name).description}" for name in result.runs]
    lines += ["", "Workload and columns in detail: `python -c \"import mpt.study; "
              "help(mpt.study)\"`. Every step's metrics are in `study.json`.", ""]
    lines += [f"![{p}]({p})" for p in plots]
    if result.quant is not None:
        lines += ["", quant_markdown(result.quant)]
    return "\n".join(lines) + "\n"


def write_report(result: StudyResult, out_dir, plots: bool = True) -> dict:
    """Write ``report.md``, ``study.json`` and (matplotlib permitting) PNG plots into ``out_dir``,
    each file atomically. Returns ``{"report": path, "json": path, "plots": [paths],
    "plots_skipped": reason or None}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = [], None
    if plots:
        try:
            import matplotlib  # noqa: F401  (optional: the 'plot' extra)
        except ImportError:
            skipped = "matplotlib is not installed (pip install 'mpt[plot]')"
        else:
            written = _plots(result, out)
    else:
        skipped = "plots disabled"
    _write_text(out / "study.json", json.dumps(result.to_dict(), separators=(",", ":")))
    _write_text(out / "report.md", _markdown(result, [p.name for p in written]))
    return {"report": out / "report.md", "json": out / "study.json", "plots": written,
            "plots_skipped": skipped}


def _plots(result: StudyResult, out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []

    def save(fig, name):
        path = out / name
        atomic_write_bytes(path, lambda fh: fig.savefig(fh, format="png", dpi=110))
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, run in result.runs.items():
        ax.plot([m.step for m in run.history], _smooth([m.loss for m in run.history]), label=name)
    if result.corpus.get("entropy_rate") is not None:
        ax.axhline(result.corpus["entropy_rate"], color="k", ls=":", label="entropy rate")
    ax.set(xlabel="step", ylabel="training loss (moving mean of 20)", title="Loss by recipe")
    ax.legend(fontsize=8)
    save(fig, "loss.png")

    scaled = {n: r for n, r in result.runs.items() if get_recipe(n).loss_scaling.kind != "none"}
    if scaled:
        fig, ax = plt.subplots(figsize=(8, 4))
        for name, run in scaled.items():
            ax.semilogy([m.step for m in run.history], [m.scale for m in run.history], label=name)
        ax.set(xlabel="step", ylabel="loss scale", title="Loss-scale trajectory")
        ax.legend(fontsize=8)
        save(fig, "loss_scale.png")

    pure = {n: r for n, r in result.runs.items()
            if get_recipe(n).param_format != "fp32" and get_recipe(n).master_format is None}
    if pure:
        fig, ax = plt.subplots(figsize=(8, 4))
        for name, run in pure.items():
            ax.plot([m.step for m in run.history],
                    [100 * m.lost / m.changed if m.changed else 0 for m in run.history],
                    label=name)
        ax.set(xlabel="step", ylabel="% of updated weights left unchanged",
               title="Lost updates: the copy-down left the low-precision weight as it was")
        ax.legend(fontsize=8)
        save(fig, "lost_updates.png")

    hist_run = result.runs.get("fp32") or next(iter(result.runs.values()))
    steps = [m for m in hist_run.history if "loss_grad" in m.histograms]
    if steps:
        fig, ax = plt.subplots(figsize=(8, 4))
        for m in steps:
            h = m.histograms["loss_grad"]
            total = max(1, sum(h.counts) + h.below + h.above)
            ax.step(list(h.exponents), [100 * c / total for c in h.counts], where="mid",
                    label=f"step {m.step}")
        ax.axvspan(math.log2(_FP16.min_subnormal) - 0.5, math.log2(_FP16.min_normal) - 0.5,
                   color="orange", alpha=0.2, label="fp16 subnormal")
        ax.axvspan(h.lo, math.log2(_FP16.min_subnormal) - 0.5, color="red", alpha=0.15,
                   label="flushed to 0 in fp16")
        used = [e for m in steps for e, c in zip(m.histograms["loss_grad"].exponents,
                                                 m.histograms["loss_grad"].counts) if c]
        ax.set_xlim(min(used + [-26]) - 2, max(used + [-14]) + 2)
        ax.set(xlabel="log2 |logits gradient| (binade)", ylabel="% of non-zero values",
               title=f"{hist_run.recipe}: gradient magnitudes vs the FP16 range "
                     "(Micikevicius et al. 2018, Fig. 3)")
        ax.legend(fontsize=8)
        save(fig, "grad_histogram.png")
    return paths


def _smooth(values, window: int = 20) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
