"""L5: matching — which registered MMA model computes what the adapter computed.

A *candidate* is one registered model (``mpt.mma_models()`` at the time of the call, so models
registered later are covered without a change here), one of its instruction variants that takes
the format pair, and one combination of its assumed rules' choices (every combination when there
are at most :data:`MAX_COMBINATIONS`, else the defaults and each choice changed alone). Each
candidate runs the whole battery; it *matches* when every result is identical bit for bit. The
others are ranked by the number of probes they get wrong, and the nearest ones are reported with
every differing probe (both bit patterns) and, for block models, every differing parameter.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from mpt.characterize.fit import run_model
from mpt.characterize.probes import ProbeSet
from mpt.engines import MMAModel, mma_models

__all__ = ["Candidate", "Comparison", "candidates", "choice_sets", "compare", "MAX_COMBINATIONS"]

MAX_COMBINATIONS = 16


@dataclass(frozen=True)
class Candidate:
    """A registered model with its assumed rules chosen, and an instruction variant."""

    model: MMAModel
    variant: str

    @property
    def label(self) -> str:
        text = self.model.name
        if self.variant != "default":
            text += f"[{self.variant}]"
        if self.model.choices:
            text += "{" + ", ".join(f"{k}={v}" for k, v in self.model.choices) + "}"
        return text

    def config(self, in_format: str):
        return self.model.config(in_format, in_format, self.variant)


def choice_sets(model: MMAModel):
    """Every combination of the model's assumption choices, or (when there are more than
    MAX_COMBINATIONS) the defaults and each single change."""
    names = [a.name for a in model.assumptions]
    options = [a.choices for a in model.assumptions]
    total = 1
    for o in options:
        total *= len(o)
    if total <= MAX_COMBINATIONS:
        for combo in itertools.product(*options):
            yield dict(zip(names, combo))
        return
    yield {}
    for a in model.assumptions:
        for value in a.choices[1:]:
            yield {a.name: value}


def candidates(in_format: str, out_format: str) -> list[Candidate]:
    """Every registered model, variant and choice combination that takes ``in_format`` for A
    and B and has an ``out_format`` output, in registry order."""
    found = []
    for model in mma_models().values():
        for cfg in model.configs:
            if in_format not in cfg.inputs or all(o[0] != out_format for o in cfg.outputs):
                continue
            for choices in choice_sets(model):
                configured = model.configure(**choices) if choices else model
                found.append(Candidate(configured, cfg.variant))
    return found


@dataclass
class Comparison:
    """One candidate on the battery: its result ``bits`` (None if it cannot run the probes,
    ``error`` says why) and the rows where they differ from the adapter's."""

    candidate: Candidate
    bits: np.ndarray | None
    mismatches: np.ndarray
    error: str = ""

    @property
    def matches(self) -> bool:
        return self.bits is not None and self.mismatches.size == 0


def compare(ps: ProbeSet, d: np.ndarray, candidate: Candidate) -> Comparison:
    """Run ``candidate`` on every probe and compare bit patterns with the adapter's ``d``."""
    try:
        bits = run_model(candidate.model, ps, candidate.variant)
    except (ValueError, TypeError, NotImplementedError) as exc:
        return Comparison(candidate, None, np.arange(len(ps)), str(exc))
    return Comparison(candidate, bits, np.flatnonzero(bits != d))
