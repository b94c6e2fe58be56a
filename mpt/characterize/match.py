"""L5: matching — which registered MMA model computes what the adapter computed.

A *candidate* is one registered model (``mpt.mma_models()`` at the time of the call, so models
registered later are covered without a change here), one of its instruction variants that takes
the format pair, and one combination of its assumed rules' choices (every combination when there
are at most :data:`MAX_COMBINATIONS`, else the defaults and each choice changed alone). Each
candidate runs the whole battery as :mod:`mpt.characterize.runner` computes it (block-scaled
variants with unit scales, software configurations through ``mpt.gemm``); it *matches* when
every result is identical bit for bit. The others are ranked by the number of probes they get
wrong, and the nearest ones are reported with every differing probe.

Matching is also how the probes *settle* a model's assumed rules (:func:`consistent_choices`,
:class:`Settlement`): the choices of the candidates that match every probed pair. One choice
left is settled; several left give the same bits on every probe — indistinguishable by the
outputs of the probed pairs (the tests check that they also agree on fresh random inputs).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from mpt.characterize.probes import ProbeSet
from mpt.characterize.runner import run_cached
from mpt.engines import MMAModel, mma_models

__all__ = ["Candidate", "Comparison", "Settlement", "candidates", "choice_sets", "compare",
           "consistent_choices", "settlements", "MAX_COMBINATIONS"]

MAX_COMBINATIONS = 16


@dataclass(frozen=True)
class Candidate:
    """A registered model with its assumed rules chosen, and an instruction variant."""

    model: MMAModel
    variant: str

    @property
    def choices(self) -> tuple[tuple[str, str], ...]:
        """(assumption, choice in effect) of every assumed rule, defaults included."""
        return tuple((a.name, self.model.choice(a.name)) for a in self.model.assumptions)

    @property
    def model_label(self) -> str:
        """``cdna3{several_nans=last}``: the model and every choice in effect."""
        text = self.model.name
        if self.choices:
            text += "{" + ", ".join(f"{k}={v}" for k, v in self.choices) + "}"
        return text

    @property
    def label(self) -> str:
        """``cdna3[v_mfma_f32_32x32x8_f16]{several_nans=last}`` (no brackets for "default")."""
        name, _, rest = self.model_label.partition("{")
        variant = "" if self.variant == "default" else f"[{self.variant}]"
        return name + variant + ("{" + rest if rest else "")

    def config(self, in_format: str):
        return self.model.config(in_format, in_format, self.variant)


def choice_sets(model: MMAModel):
    """Every combination of the model's assumption choices, or (when there are more than
    MAX_COMBINATIONS) the defaults and each single change."""
    names = [a.name for a in model.assumptions]
    options = [a.choices for a in model.assumptions]
    if exhaustive(model):
        for combo in itertools.product(*options):
            yield dict(zip(names, combo))
        return
    yield {}
    for a in model.assumptions:
        for value in a.choices[1:]:
            yield {a.name: value}


def exhaustive(model: MMAModel) -> bool:
    """Whether :func:`choice_sets` tries every combination of the model's choices."""
    total = 1
    for a in model.assumptions:
        total *= len(a.choices)
    return total <= MAX_COMBINATIONS


def candidates(in_format: str, out_format: str) -> list[Candidate]:
    """Every registered model, variant and choice combination that takes ``in_format`` for A
    and B and has an ``out_format`` output, in registry order (each once)."""
    found = {}
    for model in mma_models().values():
        for cfg in model.configs:
            if in_format not in cfg.inputs or all(o[0] != out_format for o in cfg.outputs):
                continue
            for choices in choice_sets(model):
                cand = Candidate(model.configure(**choices) if choices else model, cfg.variant)
                found.setdefault((model.name, cand.variant, cand.choices), cand)
    return list(found.values())


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


def compare(battery: ProbeSet, rows: np.ndarray, d: np.ndarray,
            candidate: Candidate) -> Comparison:
    """Run ``candidate`` on the whole ``battery`` (kept for reuse: ``runner.run_cached``) and
    compare its bits on ``rows`` (the probes the adapter ran) with the adapter's ``d``."""
    bits, error = run_cached(candidate.model, battery, candidate.variant)
    if bits is None:
        return Comparison(candidate, None, np.arange(len(rows)), error)
    bits = bits[rows]
    return Comparison(candidate, bits, np.flatnonzero(bits != d))


def consistent_choices(pairs) -> dict[str, dict[tuple, Candidate]]:
    """Per registered model that matches every one of ``pairs`` (PairResults, each with some
    variant): its choice combinations that match every pair, as {choices: a matching
    candidate}, in the order they were tried."""
    common = None
    for p in pairs:
        found: dict[str, dict[tuple, Candidate]] = {}
        for c in p.matches:
            found.setdefault(c.candidate.model.name, {}).setdefault(c.candidate.choices,
                                                                    c.candidate)
        if common is None:
            common = found
        else:
            common = {name: {ch: cand for ch, cand in combos.items() if ch in found[name]}
                      for name, combos in common.items() if name in found}
        common = {name: combos for name, combos in common.items() if combos}
    return common or {}


@dataclass(frozen=True)
class Settlement:
    """What the probes say about one assumed rule of a matching model: the ``consistent``
    choices (those of candidates matching every probed pair) out of ``choices``;
    ``exhaustive``: whether every combination of the model's choices was tried."""

    model: str
    assumption: str
    consistent: tuple[str, ...]
    choices: tuple[str, ...]
    exhaustive: bool = True

    @property
    def settled(self) -> bool:
        return len(self.consistent) == 1

    @property
    def text(self) -> str:
        if self.settled:
            text = f"{self.assumption} = {self.consistent[0]} (settled by the probes)"
        else:
            text = (f"{self.assumption}: {' or '.join(self.consistent)} - indistinguishable by "
                    f"the outputs of the probed pairs")
            ruled_out = [c for c in self.choices if c not in self.consistent]
            if ruled_out:
                text += f" ({', '.join(ruled_out)} ruled out)"
        if not self.exhaustive:
            text += " [combinations tried: the defaults and each choice alone]"
        return text


def settlements(consistent: dict[str, dict[tuple, Candidate]]) -> list[Settlement]:
    """One :class:`Settlement` per assumed rule of every model in ``consistent``
    (:func:`consistent_choices`)."""
    out = []
    for name, combos in consistent.items():
        model = next(iter(combos.values())).model
        for i, a in enumerate(model.assumptions):
            seen = {choices[i][1] for choices in combos}
            out.append(Settlement(name, a.name, tuple(c for c in a.choices if c in seen),
                                  a.choices, exhaustive(model)))
    return out
