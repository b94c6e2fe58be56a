"""L5: the study's cross-chip section — the same network, batches and initialisation trained on
the models of several chips side by side (run by ``mpt.study.run.run_targets``; here its table).

For each target (default: H100, AMD's MI300X, a TPU, Gaudi 3 and Trainium2) the section runs the
portable ``bf16-amp`` recipe (FP32 weights, bf16 autocast: the same recipe everywhere, so a
difference between two such rows is the chips' arithmetic alone — their bf16 GEMM models, and
conversion rules such as the TPU's flush) and the recipes written for that chip
(``mpt.amp.recipes.NATIVE_TARGETS``: ``tpu-bf16``, ``gaudi3-fp8``, ``trn-bf16-autocast``,
``trn-bf16-sr``). Every run is the main study's (``run_recipe``) with the target changed.
Columns: the target and its evidence label, the recipe, the MMA model of its bf16 (or
compute-format) GEMMs with that configuration's evidence, the held-out loss, its gap to the first
row, the underflow share (as in the main table) and the wall time.
"""
from __future__ import annotations

from mpt._tables import markdown_table, text_table
from mpt.study.run import TargetsResult, default_targets, run_targets
from mpt.targets import get_target

__all__ = ["default_targets", "run_targets", "targets_table_rows", "format_targets_section",
           "targets_markdown"]

_COLUMNS = ("target", "evidence", "recipe", "GEMM model (evidence)", "final loss", "gap",
            "underflow %", "time s")


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
