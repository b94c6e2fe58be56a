"""L5: the study's report — the comparison table, report.md, study.json and the plots."""
from __future__ import annotations

import json
import math
from pathlib import Path

from mpt._io import atomic_write_bytes
from mpt._tables import markdown_table, text_table
from mpt.amp.recipes import get_recipe
from mpt.formats import get_format
from mpt.study.quant import quant_markdown
from mpt.study.run import StudyResult
from mpt.study.targets import targets_markdown
from mpt.targets import get_target

__all__ = ["table_rows", "format_table", "write_report"]

_FP16 = get_format("fp16")


_COLUMNS = ("recipe", "final loss", "gap fp32", "skipped", "scale", "underflow %",
            "zero grads %", "lost upd %", "B/param", "qerr %", "sat %", "time s")


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
                     f"{run.bytes_per_parameter:g}",
                     "-" if t["quant_error"] is None else _pct(t["quant_error"]),
                     "-" if t["saturated"] is None else f"{100 * t['saturated']:.3f}",
                     f"{run.seconds:.1f}"))
    return rows


def _multiplier(x: float) -> str:
    m, e = math.frexp(x)
    return f"2^{e - 1}" if m == 0.5 else f"{x:g}"


def corpus_line(corpus: dict) -> str:
    """The report line on the corpus: its best achievable loss, or that it is unknown."""
    h = corpus.get("entropy_rate")
    if h is None:
        return f"text corpus {corpus.get('path')}: best achievable loss unknown"
    return (f"best achievable loss (entropy rate of the Markov chain): {h:.4f}; uniform guess: "
            f"{corpus['uniform_loss']:.4f}")


def _heading(result: StudyResult) -> list[str]:
    c = result.config
    best = corpus_line(result.corpus)
    target = get_target(c.target)
    return [f"GPT d_model={c.d_model} layers={c.n_layers} heads={c.n_heads} context={c.seq_len}, "
            f"batch {c.batch}, {c.steps} steps; loss x {_multiplier(c.loss_multiplier)} (the "
            f"gradient size of a {c.global_batch_tokens}-token batch)",
            f"target {target.name}: {target.description} ({target.evidence}); attention "
            f"{c.attention}", best]


def format_table(result: StudyResult) -> str:
    """The comparison table as aligned text, under two lines naming the workload and the
    corpus's best achievable loss."""
    return "\n".join(_heading(result) + ["", text_table([_COLUMNS] + table_rows(result),
                                                          numeric=True)])


# ---- the report --------------------------------------------------------------------------------
_LEGEND = (
    "`final loss`: held-out loss with the recipe's own forward; `gap fp32`: minus the fp32 row's; "
    "`skipped`: steps the loss scaler skipped; `scale`: final loss scale; `underflow %`: non-zero "
    "gradient values flushed to zero where the backward rounds them (the logits gradient into "
    "the backward format; FP8 layers' E5M2 output gradients); `zero grads %`: parameter-gradient "
    "values that are exactly zero; `lost upd %`: updates below half an ULP of a weight kept "
    "without master (its value did not change); `B/param`: bytes per parameter of weights, "
    "gradients, master and AdamW states; `qerr %`: the block-scaled recipes' relative "
    "quantization error of their GEMM operands, sqrt(sum (q - x)^2 / sum x^2) over every "
    "quantization of the run; `sat %`: the share of their non-zero inputs above their block's "
    "largest code (clamped). The `nvfp4-no-*` rows are the NVFP4 ablation: the recipe without "
    "the random Hadamard transform, without stochastic rounding of gradients, without 16x16 "
    "weight tiles.")


def _write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, lambda fh: fh.write(text.encode()))


def _markdown(result: StudyResult, plots: list[str]) -> str:
    md = markdown_table([_COLUMNS] + table_rows(result))
    lines = ["# mpt study", "", "  \n".join(_heading(result)), "", md, "", _LEGEND, "",
             "Recipes:", ""]
    lines += [f"- `{name}`: {get_recipe(name).description}" for name in result.runs]
    lines += ["", "Workload and columns in detail: `python -c \"import mpt.study; "
              "help(mpt.study)\"`. Every step's metrics are in `study.json`.", ""]
    lines += [f"![{p}]({p})" for p in plots]
    if result.targets is not None:
        lines += ["", targets_markdown(result.targets)]
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
