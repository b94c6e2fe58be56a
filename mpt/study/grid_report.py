"""L5: the report of a grid — the table over seeds, report.md and study.json."""
from __future__ import annotations

import json
from pathlib import Path

from mpt._io import atomic_write_bytes
from mpt._tables import markdown_table, text_table
from mpt.study.grid import GridResult
from mpt.study.report import _multiplier, corpus_line
from mpt.targets import get_target

__all__ = ["grid_rows", "format_grid_table", "write_grid_report"]


def _columns(baseline: str) -> tuple[str, ...]:
    return ("size", "lr", "recipe", "seeds", "mean loss", "spread", "min", "max",
            f"vs {baseline}", "> spread")


_VERDICT = {True: "yes", False: "no", None: "n/a"}


def grid_rows(result: GridResult) -> list[tuple[str, ...]]:
    """One row of strings per (size, lr, recipe): the final held-out loss over the seeds and
    the comparison with the baseline (``-`` on the baseline's own row)."""
    against = {(c.size, c.lr, c.recipe): c for c in result.comparisons()}
    rows = []
    for s in result.stats():
        c = against.get((s.size, s.lr, s.recipe))
        rows.append((s.size, f"{s.lr:g}", s.recipe, str(s.n), f"{s.mean:.4f}",
                     f"{s.spread:.4f}", f"{s.min:.4f}", f"{s.max:.4f}",
                     "-" if c is None else f"{c.difference:+.4f}",
                     "-" if c is None else _VERDICT[c.exceeds]))
    return rows


def _heading(result: GridResult) -> list[str]:
    g, c = result.config, result.config.study
    best = corpus_line(result.corpus)
    target = get_target(c.target)
    return [f"grid: {len(g.recipes)} recipes x {len(g.seeds)} seeds x {len(g.sizes)} sizes x "
            f"{len(g.lrs)} learning rates = {len(result.cells)} runs of a GPT (context "
            f"{c.seq_len}, batch {c.batch}, {c.steps} steps; loss x "
            f"{_multiplier(c.loss_multiplier)})",
            f"target {target.name}: {target.description} ({target.evidence})", best,
            f"spread: max - min of the final loss over the seeds; '> spread': |mean - mean of "
            f"{g.baseline}| > the larger of the two spreads (n/a with one seed)"]


def _exceeding(result: GridResult) -> list[str]:
    lines = [f"- {c.size}, lr {c.lr:g}: {c.recipe} {c.difference:+.4f} vs {c.baseline} "
             f"(spread {c.spread:.4f})" for c in result.comparisons() if c.exceeds]
    return lines or ["- none"]


def format_grid_table(result: GridResult) -> str:
    """The table over seeds as aligned text, under the workload and the rule, then the recipe
    differences that exceed the spread."""
    table = text_table([_columns(result.config.baseline)] + grid_rows(result), numeric=True)
    return "\n".join(_heading(result) + ["", table, "", "differences beyond the seeds' spread:"]
                     + _exceeding(result))


def _cell_rows(result: GridResult) -> list[tuple[str, ...]]:
    rows = [("size", "lr", "seed", "run seed", "recipe", "final loss", "skipped",
             "underflow %", "time s")]
    for cell, run in zip(result.cells, result.runs):
        t = run.totals()
        rows.append((cell.size.label(), f"{cell.lr:g}", str(cell.seed), f"{cell.run_seed:#018x}",
                     cell.recipe, f"{run.final_loss:.4f}", str(t["skipped"]),
                     f"{100 * t['underflow']:.2f}", f"{run.seconds:.1f}"))
    return rows


def _markdown(result: GridResult) -> str:
    table = markdown_table([_columns(result.config.baseline)] + grid_rows(result))
    lines = ["# mpt study grid", "", "  \n".join(_heading(result)), "", table, "",
             "Differences beyond the seeds' spread:", "", *_exceeding(result), "",
             "Each cell's run seed is derived from its seed coordinate (BLAKE2b, "
             "`mpt.study.grid.cell_seed`): every recipe, size and learning rate of one seed sees "
             "the same batches. Rules: `python -c \"import mpt.study.aggregate as a; help(a)\"`.",
             "", "## Cells", "", markdown_table(_cell_rows(result)), "",
             "Every step's metrics are in `study.json`.", ""]
    return "\n".join(lines)


def _write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, lambda fh: fh.write(text.encode()))


def write_grid_report(result: GridResult, out_dir) -> dict:
    """Write ``report.md`` and ``study.json`` (:meth:`GridResult.to_dict`) into ``out_dir``, each
    atomically; returns ``{"report": path, "json": path}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_text(out / "study.json", json.dumps(result.to_dict(), separators=(",", ":")))
    _write_text(out / "report.md", _markdown(result))
    return {"report": out / "report.md", "json": out / "study.json"}
