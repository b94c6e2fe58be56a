"""L5: the study's cross-chip section — the same network, batches and initialisation trained on
the models of several chips side by side.

For each target (default: H100, AMD's MI300X where mpt has that target — else A100 —, a TPU,
Gaudi 3 and Trainium2) the section runs the portable ``bf16-amp`` recipe (FP32 weights, bf16
autocast: the same recipe everywhere, so a difference between two such rows is the chips'
arithmetic alone — their bf16 GEMM models, and conversion rules such as the TPU's flush) and the
recipes written for that chip (``mpt.amp.recipes.NATIVE_TARGETS``: ``tpu-bf16``, ``gaudi3-fp8``,
``trn-bf16-autocast``, ``trn-bf16-sr``). Every run is the main study's (``run_recipe``) with the
target changed. Columns: the target and its evidence label, the recipe, the MMA model of its
bf16 (or compute-format) GEMMs with that configuration's evidence, the held-out loss, its gap to
the first row, the underflow share (as in the main table) and the wall time.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from mpt._tables import markdown_table, text_table
from mpt.amp.recipes import NATIVE_TARGETS, get_recipe, recipes_for
from mpt.engines import get_mma_model
from mpt.study.run import RecipeRun, run_recipe
from mpt.targets import get_target, targets

__all__ = ["default_targets", "TargetRun", "TargetsResult", "run_targets",
           "targets_table_rows", "format_targets_section", "targets_markdown"]

_PORTABLE = "bf16-amp"
_COLUMNS = ("target", "evidence", "recipe", "GEMM model (evidence)", "final loss", "gap",
            "underflow %", "time s")


def default_targets() -> tuple[str, ...]:
    """H100, MI300X (A100 where mpt has no MI300X target), TPU, Gaudi 3, Trainium2."""
    amd = "mi300x" if "mi300x" in targets() else "a100"
    return ("h100", amd, "tpu", "gaudi3", "trn2")


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
    recipes are not used)."""
    names = tuple(get_target(t).name for t in (names or default_targets()))
    result = TargetsResult(names)
    for name in names:
        recipes = _recipes(name)
        on_target = dataclasses.replace(config, target=name, recipes=tuple(recipes),
                                        compare_targets=())
        for recipe_name in recipes:
            recipe = get_recipe(recipe_name, name)
            fmt = "fp32" if recipe.compute_format == "tf32" else recipe.compute_format
            model = get_mma_model(recipe.matmul_model)
            cfg = model.config(fmt, fmt) if fmt in model.input_formats else model.configs[0]
            run = run_recipe(on_target, recipe_name, corpus, progress)
            result.rows.append(TargetRun(name, recipe_name, model.name, cfg.evidence, run))
    return result


def targets_table_rows(result: TargetsResult) -> list[tuple[str, ...]]:
    """The section's rows (header first)."""
    rows = [_COLUMNS]
    base = result.rows[0].run.final_loss if result.rows else None
    for r in result.rows:
        t = r.run.totals()
        rows.append((r.target, get_target(r.target).evidence, r.recipe,
                     f"{r.model} ({r.evidence})", f"{r.run.final_loss:.4f}",
                     f"{r.run.final_loss - base:+.4f}", f"{100 * t['underflow']:.2f}",
                     f"{r.run.seconds:.1f}"))
    return rows


_TITLE = ("The same network on several chips' models: `bf16-amp` everywhere (differences are the "
          "chips' arithmetic), then each chip's own recipes; `gap`: minus the first row's loss.")


def format_targets_section(result: TargetsResult) -> str:
    return "\n".join(["Across chips", _TITLE, "",
                      text_table(targets_table_rows(result), numeric=True)])


def targets_markdown(result: TargetsResult) -> str:
    return "\n".join(["## Across chips", "", _TITLE, "", markdown_table(targets_table_rows(result)),
                      "", "Setup: `python -c \"import mpt.study.targets; "
                      "help(mpt.study.targets)\"`; targets and their evidence: `mpt targets`.",
                      ""])
