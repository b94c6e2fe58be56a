"""L5: the characterization of one adapter — probe, read, fit, match, report.

For each (input, output) format pair of the adapter: build the battery
(:mod:`mpt.characterize.battery`), run it (one adapter call per row length), read every family
(:mod:`mpt.characterize.infer`), fit the block model (:mod:`mpt.characterize.fit`), run every
registered candidate on the same probes (:mod:`mpt.characterize.match`) and, when none matches,
fit the nearest registered configurations with their parameters changed. The result is a
:class:`Characterization`: per pair the findings, the fitted block model and whether it
reproduces every probe, the matching registered models (with the assumed-rule choices the probes
settle) or the nearest ones with every difference; over all pairs the MMA model that reproduces
the adapter — the fitted block model when every pair is one, else the registered model that
matches every pair, else one composed of what reproduces each pair
(:mod:`mpt.characterize.compose`) — as an :class:`~mpt.MMAModel` that ``mpt.mma`` runs and
:meth:`Characterization.write` stores as JSON (``mpt.engines.load_model`` reads it back).
Nothing is skipped silently: pairs the adapter cannot compute, rows it rejects and the
configurations it does not offer (``adapter.not_probed()``) are listed in the report.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from mpt._io import atomic_write_bytes
from mpt._version import __version__
from mpt.characterize.battery import build_battery
from mpt.characterize.compose import compose
from mpt.characterize.fit import BlockFit, FamilyFit, fit_block, fit_family
from mpt.characterize.infer import Finding, read_all
from mpt.characterize.match import (Comparison, Settlement, candidates, compare, consistent_choices,
                                    settlements)
from mpt.characterize.probes import ProbeSet, bits_of
from mpt.characterize.report import format_text
from mpt.characterize.spec import meaning
from mpt.engines import MMAModel, get_mma_model, mma_models
from mpt.formats import get_format

__all__ = ["characterize", "Characterization", "PairResult", "Difference", "SCHEMA"]

SCHEMA = "mpt-characterization/2"
#: parameters of a block configuration compared with the fitted block model
_BLOCK_PARAMS = ("block", "fraction_bits", "rounding", "e_zero")


@dataclass(frozen=True)
class Difference:
    """One probe on which the adapter and a model disagree (hex bit patterns)."""

    probe: str
    note: str
    adapter: str
    model: str


@dataclass
class PairResult:
    """Everything learned about one (input, output) format pair. ``note``: how the adapter
    computes it (unit block scales, software); ``evidence``: the label a model fitted to it
    earns; ``family``: a registered configuration with parameters changed that reproduces every
    probe, when no registered model does."""

    in_format: str
    out_format: str
    error: str = ""
    note: str = ""
    evidence: str = "assumption"
    probes: ProbeSet | None = field(default=None, repr=False)
    bits: np.ndarray | None = field(default=None, repr=False)
    not_run: list[str] = field(default_factory=list, repr=False)
    findings: dict[str, Finding] = field(default_factory=dict, repr=False)
    fit: BlockFit | None = field(default=None, repr=False)
    family: FamilyFit | None = field(default=None, repr=False)
    comparisons: list[Comparison] = field(default_factory=list, repr=False)

    @property
    def label(self) -> str:
        return f"{self.in_format} -> {self.out_format}"

    @property
    def probed(self) -> bool:
        return not self.error

    @property
    def matches(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.matches]

    @property
    def nearest(self) -> list[Comparison]:
        """Candidates that ran but differ, fewest differences first."""
        return [c for c in self.comparisons if c.bits is not None and not c.matches]

    @property
    def reproduced(self) -> bool:
        """Whether a block fit, a registered model or a changed registered configuration
        reproduces every probe."""
        return bool(self.matches) or self.family is not None or \
            (self.fit is not None and self.fit.verified)

    def _hex(self, bits) -> str:
        return f"{int(bits):0{2 * get_format(self.out_format).dtype.itemsize}x}"

    def differences(self, comparison: Comparison) -> list[Difference]:
        """Every probe on which ``comparison``'s model differs from the adapter."""
        ps = self.probes
        return [Difference(ps.names[i], ps.notes[i], self._hex(self.bits[i]),
                           self._hex(comparison.bits[i])) for i in comparison.mismatches]

    def parameter_differences(self, comparison: Comparison) -> list[str]:
        """Parameters where the fitted model and a candidate disagree: the block parameters
        of a block candidate, or the changes of the family fit based on this candidate."""
        cand = comparison.candidate
        if self.family is not None and self.family.base == cand:
            return self.family.differences()
        fit = self.fit
        cfg = cand.config(self.in_format)
        if fit is None or fit.params is None or cand.model.kind_of(cfg) != "block":
            return []
        rounding, e_zero = cfg.output(self.out_format)
        theirs = {"block": cfg.block, "fraction_bits": cfg.fraction_bits, "rounding": rounding,
                  "e_zero": e_zero}
        out = []
        for key in _BLOCK_PARAMS:
            ours = fit.params[key]
            if key == "e_zero" and fit.params["e_zero_seen"] != "measured":
                if fit.params["e_zero_seen"] == "bound" and theirs[key] > ours:
                    out.append(f"e_zero: measured at most {ours}, {cand.label} has {theirs[key]}")
                continue
            if ours != theirs[key]:
                out.append(f"{key}: measured {ours}, {cand.label} has {theirs[key]}")
        return out

    def spec_results(self) -> list[tuple[str, str, str]]:
        """(vector, result bits, what the documented answers say it means) of each spec
        vector run on this pair."""
        ps = self.probes
        return [(ps.keys[i][1], self._hex(self.bits[i]), meaning(ps.keys[i][1], self.bits[i]))
                for i in ps.rows("spec")]

    def to_dict(self, max_nearest: int = 3) -> dict:
        out = {"inputs": self.in_format, "output": self.out_format, "probed": self.probed,
               "how": self.note}
        if not self.probed:
            return {**out, "error": self.error}
        fit = self.fit
        block = {"reason": fit.reason} if fit.params is None else {
            **fit.params, "reproduces_every_probe": fit.verified,
            "mismatches": [self.probes.names[i] for i in fit.mismatches]}
        family = None if self.family is None else {
            "base": self.family.base.label, "differences": self.family.differences()}
        return {**out, "probes": len(self.probes), "not_run": self.not_run,
                "findings": {k: {"value": f.value, "text": f.text}
                             for k, f in self.findings.items()},
                "block_model": block, "changed_registered_model": family,
                "spec_vectors": [{"name": n, "result": r, "meaning": m}
                                 for n, r, m in self.spec_results()],
                "matches": [c.candidate.label for c in self.matches],
                "nearest": [{"model": c.candidate.label, "differing_probes": int(c.mismatches.size),
                             "parameters": self.parameter_differences(c),
                             "differences": [d.__dict__ for d in self.differences(c)]}
                            for c in self.nearest[:max_nearest]],
                "cannot_run": {c.candidate.label: c.error for c in self.comparisons
                               if c.bits is None},
                "results": dict(zip(self.probes.names, map(self._hex, self.bits)))}


@dataclass
class Characterization:
    """The result of :func:`characterize`: per-pair results, the model that reproduces the
    adapter (or None), how it was found (``source``) and the variant of it that runs each pair
    (``variants``), the registered models that match every probed pair with the assumed-rule
    choices that do (``recognised``), what the probes say of each assumed rule
    (``settlements``), what the adapter did not offer (``not_probed``) and a one-line
    ``verdict``."""

    adapter: str
    pairs: list[PairResult]
    model: MMAModel | None
    source: str
    recognised: list[str]
    verdict: str
    expect: str | None = None
    settlements: list[Settlement] = field(default_factory=list)
    variants: dict = field(default_factory=dict)
    not_probed: list[str] = field(default_factory=list)

    @property
    def probed(self) -> list[PairResult]:
        return [p for p in self.pairs if p.probed]

    def matches(self, model) -> bool:
        """Whether the registered model ``model`` (a name, alias or MMAModel) reproduces every
        probe of every probed pair, with some variant and choice of its assumed rules."""
        name = get_mma_model(model).name
        return bool(self.probed) and name in consistent_choices(self.probed)

    def comparison(self, pair: PairResult, model) -> Comparison | None:
        """The closest candidate of the registered ``model`` on one pair."""
        name = get_mma_model(model).name
        own = [c for c in pair.comparisons if c.candidate.model.name == name and c.bits is not None]
        return min(own, key=lambda c: c.mismatches.size) if own else None

    def variant(self, pair: PairResult) -> str | None:
        """The variant of :attr:`model` that computes ``pair`` (for ``mpt.mma(variant=)``)."""
        return self.variants.get((pair.in_format, pair.out_format))

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "mpt_version": __version__, "adapter": self.adapter,
                "verdict": self.verdict, "recognised": self.recognised, "source": self.source,
                "assumptions": [{"model": s.model, "assumption": s.assumption,
                                 "consistent": list(s.consistent), "settled": s.settled,
                                 "text": s.text} for s in self.settlements],
                "not_probed": self.not_probed,
                "model": None if self.model is None else self.model.describe(),
                "pairs": [{**p.to_dict(), "model_variant": self.variant(p)} for p in self.pairs]}

    def write(self, path) -> None:
        """The JSON (atomically): ``mpt.engines.load_model(path)`` returns :attr:`model`."""
        data = json.dumps(self.to_dict(), indent=1).encode()
        atomic_write_bytes(path, lambda fh: fh.write(data))

    def text(self, max_differences: int | None = None) -> str:
        """The report ``mpt characterize`` prints (:mod:`mpt.characterize.report`)."""
        return format_text(self, max_differences=max_differences)


def characterize(adapter, pairs=None, *, seed: int = 0, expect=None) -> Characterization:
    """Characterize ``adapter``'s matrix unit on ``pairs`` ((input, output) format names; None:
    every pair it computes). ``seed``: of the random probes; ``expect``: a registered model to
    report every difference from (name or alias). See the module docstring."""
    available = tuple(dict.fromkeys(adapter.pairs()))
    if pairs is None:
        pairs = available
    for pair in pairs:
        if tuple(pair) not in available:
            raise ValueError(f"adapter {adapter.name} does not compute {pair[0]} -> {pair[1]}; "
                             f"it computes: {', '.join(f'{i}->{o}' for i, o in available)}")
    expected = None if expect is None else get_mma_model(expect).name
    results = [_pair(adapter, fin, fout, seed) for fin, fout in pairs]
    not_probed = list(getattr(adapter, "not_probed", lambda: [])())
    return _conclude(adapter.name, results, expected, not_probed)


def _pair(adapter, fin: str, fout: str, seed: int) -> PairResult:
    """Probe one format pair; an adapter that cannot (a ValueError, TypeError,
    NotImplementedError or RuntimeError — a device error — from ``accepts`` or ``run``) leaves
    the pair "not probed" with its message."""
    note = getattr(adapter, "note", lambda i, o: "")(fin, fout)
    result = PairResult(fin, fout, note=note, evidence=adapter.evidence(fin, fout))
    battery = build_battery(fin, fout, k_multiple=adapter.instruction_k(fin, fout), seed=seed)
    rows = np.arange(len(battery))
    try:
        accepts = getattr(adapter, "accepts", None)
        if accepts is not None:
            ok = np.zeros(len(battery), bool)
            for k, group in battery.groups():
                ok[group] = accepts(battery.a[group, :k], battery.b[group, :k],
                                    battery.c[group], fin, fout)
            result.not_run = [n for n, good in zip(battery.names, ok) if not good]
            rows = np.flatnonzero(ok)
        ps = battery if rows.size == len(battery) else battery.take(rows)
        bits = np.zeros(len(ps), np.dtype(f"u{get_format(fout).dtype.itemsize}"))
        for k, group in ps.groups():
            d = np.asarray(adapter.run(ps.a[group, :k], ps.b[group, :k], ps.c[group], fin, fout))
            bits[group] = bits_of(d.astype(get_format(fout).dtype, copy=False), fout)
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as exc:
        result.error = f"not probed: {exc}"
        return result
    result.probes, result.bits = ps, bits
    result.findings, params = read_all(ps, bits)
    result.fit = fit_block(ps, bits, params, result.evidence)
    if result.fit.zeros is not None:
        result.findings["zeros"] = result.fit.zeros
    comparisons = [compare(battery, rows, bits, cand) for cand in candidates(fin, fout)]
    result.comparisons = sorted(comparisons, key=lambda c: (c.bits is None, c.mismatches.size))
    if not result.matches and not result.fit.verified:
        result.family = fit_family(battery, rows, bits, result.nearest, result.findings)
    return result


def _conclude(adapter: str, results: list[PairResult], expect, not_probed) -> Characterization:
    probed = [p for p in results if p.probed]
    consistent = consistent_choices(probed)
    order = list(mma_models())
    names = sorted(consistent, key=order.index)
    labels = [cand.model_label for name in names for cand in consistent[name].values()]
    preferred = frozenset((name, choices) for name in names for choices in consistent[name])
    model, variants, source = None, {}, ""
    if probed and all(p.fit.verified for p in probed):
        model, variants, _ = compose(f"characterized {adapter}", _described(adapter), probed)
        source = "block model fitted to every pair"
    elif names:
        first = next(iter(consistent[names[0]].values()))
        model, source = first.model, f"registered model {first.model_label}"
        variants = {(p.in_format, p.out_format): _variant(p, first) for p in probed}
    elif probed and all(p.reproduced for p in probed):
        model, variants, why = compose(f"characterized {adapter}", _described(adapter), probed,
                                       preferred)
        source = "composed per pair of fitted, changed or matching configurations" if model \
            else why
    verdict = _verdict(results, labels, model, source)
    return Characterization(adapter, results, model, source, labels, verdict, expect,
                            settlements(consistent), variants, not_probed)


def _described(adapter: str) -> str:
    return f"the model mpt characterize found for {adapter}: per pair the fitted block model, " \
           f"a changed or a matching registered configuration"


def _variant(p: PairResult, chosen) -> str:
    """The variant of the chosen registered model (with its choices) that matches ``p``."""
    for c in p.matches:
        if c.candidate.model.name == chosen.model.name and \
                c.candidate.choices == chosen.choices:
            return c.candidate.variant
    raise AssertionError(f"{chosen.model_label} does not match {p.label}")


def _verdict(results, recognised, model, source) -> str:
    probed = [p for p in results if p.probed]
    if not probed:
        return "nothing was probed: " + "; ".join(f"{p.label}: {p.error}" for p in results)
    parts = []
    if model is not None and source.startswith("block"):
        parts.append("a block model reproduces every probe of every pair")
    if recognised:
        parts.append("matches " + ", ".join(recognised))
    if not recognised:
        near = []
        for p in probed:
            if not p.matches and p.nearest:
                c = p.nearest[0]
                near.append(f"{p.label}: nearest {c.candidate.label} "
                            f"({c.mismatches.size} of {len(p.probes)} probes differ)")
        parts.append("no registered model matches every pair" + (": " + "; ".join(near)
                                                                  if near else ""))
        changed = sorted({f"{p.family.base.model_label} with "
                          + ", ".join(f"{k} {new}" for k, (new, _) in p.family.changes.items())
                          for p in probed if p.family is not None})
        if changed:
            parts.append("reproduced by " + "; ".join(changed))
    if model is None:
        parts.append("no model reproduces every probe")
    return "; ".join(parts)
