"""L5: the characterization of one adapter — probe, read, fit, match, report.

For each (input, output) format pair of the adapter: build the battery
(:mod:`mpt.characterize.battery`), run it (one adapter call per row length), read every family
(:mod:`mpt.characterize.infer`), fit the block model (:mod:`mpt.characterize.fit`) and run every
registered candidate on the same probes (:mod:`mpt.characterize.match`). The result is a
:class:`Characterization`: per pair the findings, the fitted block model and whether it
reproduces every probe, the matching registered models or the nearest ones with every
difference; over all pairs the MMA model that reproduces the adapter — the fitted block model
when every pair is one, else the registered model that matches every pair — as an
:class:`~mpt.MMAModel` that ``mpt.mma`` runs and :meth:`Characterization.write` stores as JSON
(``mpt.engines.load_model`` reads it back).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from mpt._version import __version__
from mpt._io import atomic_write_bytes
from mpt.characterize.battery import build_battery
from mpt.characterize.fit import BlockFit, block_model, fit_block
from mpt.characterize.infer import Finding, read_all
from mpt.characterize.match import Candidate, Comparison, candidates, compare
from mpt.characterize.probes import ProbeSet, bits_of
from mpt.characterize.report import format_text
from mpt.characterize.spec import meaning
from mpt.engines import EVIDENCE, MMAModel, get_mma_model, mma_models
from mpt.formats import get_format

__all__ = ["characterize", "Characterization", "PairResult", "Difference", "SCHEMA"]

SCHEMA = "mpt-characterization/1"
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
    """Everything learned about one (input, output) format pair."""

    in_format: str
    out_format: str
    error: str = ""
    probes: ProbeSet | None = None
    bits: np.ndarray | None = None
    not_run: list[str] = field(default_factory=list)
    findings: dict[str, Finding] = field(default_factory=dict)
    fit: BlockFit | None = None
    comparisons: list[Comparison] = field(default_factory=list)

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

    def _hex(self, bits) -> str:
        return f"{int(bits):0{2 * get_format(self.out_format).dtype.itemsize}x}"

    def differences(self, comparison: Comparison) -> list[Difference]:
        """Every probe on which ``comparison``'s model differs from the adapter."""
        ps = self.probes
        return [Difference(ps.names[i], ps.notes[i], self._hex(self.bits[i]),
                           self._hex(comparison.bits[i])) for i in comparison.mismatches]

    def parameter_differences(self, comparison: Comparison) -> list[str]:
        """Block parameters where the fitted model and a block candidate disagree."""
        fit = self.fit
        if fit is None or fit.params is None or comparison.candidate.model.kind != "block":
            return []
        cfg = comparison.candidate.config(self.in_format)
        rounding, e_zero = cfg.output(self.out_format)
        theirs = {"block": cfg.block, "fraction_bits": cfg.fraction_bits, "rounding": rounding,
                  "e_zero": e_zero}
        name = comparison.candidate.label
        out = []
        for key in _BLOCK_PARAMS:
            ours = fit.params[key]
            if key == "e_zero" and fit.params["e_zero_seen"] != "measured":
                if fit.params["e_zero_seen"] == "bound" and theirs[key] > ours:
                    out.append(f"e_zero: measured at most {ours}, {name} has {theirs[key]}")
                continue
            if ours != theirs[key]:
                out.append(f"{key}: measured {ours}, {name} has {theirs[key]}")
        return out

    def spec_results(self) -> list[tuple[str, str, str]]:
        """(vector, result bits, what the documented answers say it means) of each spec
        vector run on this pair."""
        ps = self.probes
        return [(ps.keys[i][1], self._hex(self.bits[i]), meaning(ps.keys[i][1], self.bits[i]))
                for i in ps.rows("spec")]

    def to_dict(self, max_nearest: int = 3) -> dict:
        out = {"inputs": self.in_format, "output": self.out_format, "probed": self.probed}
        if not self.probed:
            return {**out, "error": self.error}
        fit = self.fit
        block = {"reason": fit.reason} if fit.params is None else {
            **fit.params, "reproduces_every_probe": fit.verified,
            "mismatches": [self.probes.names[i] for i in fit.mismatches]}
        return {**out, "probes": len(self.probes), "not_run": self.not_run,
                "findings": {k: {"value": f.value, "text": f.text}
                             for k, f in self.findings.items()},
                "block_model": block,
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
    adapter (or None) and how it was found (``source``), the registered models that match every
    probed pair (``recognised``) and a one-line ``verdict``."""

    adapter: str
    pairs: list[PairResult]
    model: MMAModel | None
    source: str
    recognised: list[str]
    verdict: str
    expect: str | None = None

    @property
    def probed(self) -> list[PairResult]:
        return [p for p in self.pairs if p.probed]

    def matches(self, model) -> bool:
        """Whether the registered model ``model`` (a name, alias or MMAModel) reproduces every
        probe of every probed pair, with some variant and choice of its assumed rules."""
        name = get_mma_model(model).name
        return bool(self.probed) and all(
            any(c.candidate.model.name == name for c in p.matches) for p in self.probed)

    def comparison(self, pair: PairResult, model) -> Comparison | None:
        """The closest candidate of the registered ``model`` on one pair."""
        name = get_mma_model(model).name
        own = [c for c in pair.comparisons if c.candidate.model.name == name and c.bits is not None]
        return min(own, key=lambda c: c.mismatches.size) if own else None

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "mpt_version": __version__, "adapter": self.adapter,
                "verdict": self.verdict, "recognised": self.recognised, "source": self.source,
                "model": None if self.model is None else self.model.describe(),
                "pairs": [p.to_dict() for p in self.pairs]}

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
    available = tuple(adapter.pairs())
    if pairs is None:
        pairs = available
    for pair in pairs:
        if tuple(pair) not in available:
            raise ValueError(f"adapter {adapter.name} does not compute {pair[0]} -> {pair[1]}; "
                             f"it computes: {', '.join(f'{i}->{o}' for i, o in available)}")
    expected = None if expect is None else get_mma_model(expect).name
    results = [_pair(adapter, fin, fout, seed) for fin, fout in pairs]
    return _conclude(adapter.name, results, expected)


def _pair(adapter, fin: str, fout: str, seed: int) -> PairResult:
    """Probe one format pair; an adapter that cannot (a ValueError, TypeError,
    NotImplementedError or RuntimeError — a device error — from ``accepts`` or ``run``) leaves
    the pair "not probed" with its message."""
    result = PairResult(fin, fout)
    ps = build_battery(fin, fout, k_multiple=adapter.instruction_k(fin, fout), seed=seed)
    try:
        accepts = getattr(adapter, "accepts", None)
        if accepts is not None:
            ok = np.zeros(len(ps), bool)
            for k, rows in ps.groups():
                ok[rows] = accepts(ps.a[rows, :k], ps.b[rows, :k], ps.c[rows], fin, fout)
            result.not_run = [n for n, good in zip(ps.names, ok) if not good]
            ps = ps.take(np.flatnonzero(ok))
        bits = np.zeros(len(ps), np.dtype(f"u{get_format(fout).dtype.itemsize}"))
        for k, rows in ps.groups():
            d = np.asarray(adapter.run(ps.a[rows, :k], ps.b[rows, :k], ps.c[rows], fin, fout))
            bits[rows] = bits_of(d.astype(get_format(fout).dtype, copy=False), fout)
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as exc:
        result.error = f"not probed: {exc}"
        return result
    result.probes, result.bits = ps, bits
    result.findings, params = read_all(ps, bits)
    result.fit = fit_block(ps, bits, params, adapter.evidence(fin, fout))
    if result.fit.zeros is not None:
        result.findings["zeros"] = result.fit.zeros
    comparisons = [compare(ps, bits, cand) for cand in candidates(fin, fout)]
    result.comparisons = sorted(comparisons, key=lambda c: (c.bits is None, c.mismatches.size))
    return result


def _conclude(adapter: str, results: list[PairResult], expect) -> Characterization:
    probed = [p for p in results if p.probed]
    common = None      # (model, its choices) matching every probed pair with some variant
    for p in probed:
        found = {(c.candidate.model.name, c.candidate.model.choices): c.candidate.model
                 for c in p.matches}
        common = found if common is None else {k: v for k, v in common.items() if k in found}
    order = list(mma_models())
    recognised = sorted(common or {}, key=lambda key: (order.index(key[0]), key[1]))
    labels = [Candidate(common[key], "default").label for key in recognised]
    model, source = None, ""
    if probed and all(p.fit.verified for p in probed):
        model, source = _fitted_model(adapter, probed), "block model fitted to every pair"
    elif recognised:
        model, source = common[recognised[0]], f"registered model {labels[0]}"
    verdict = _verdict(results, labels, model, source)
    return Characterization(adapter, results, model, source, labels, verdict, expect)


def _fitted_model(adapter: str, probed: list[PairResult]) -> MMAModel:
    """The block model of every pair, one configuration per input format (and per (L, F) if
    two outputs of one input differ). e_zero that the probes cannot pin is taken from a matching
    registered block configuration with the same L, F and rounding when there is one."""
    groups: dict[tuple, list] = {}
    evidence: dict[tuple, list] = {}
    for p in probed:
        fp = p.fit.params
        key = (p.in_format, fp["block"], fp["fraction_bits"])
        groups.setdefault(key, []).append((p.out_format, fp["rounding"], _e_zero(p)))
        evidence.setdefault(key, []).append(p.fit.evidence)
    configs = [(*key, outputs, max(evidence[key], key=EVIDENCE.index))
               for key, outputs in groups.items()]
    return block_model(f"characterized {adapter}", configs,
                       f"the block model mpt characterize fitted to {adapter}")


def _e_zero(p: PairResult) -> int:
    """The fitted e_zero, or, when the probes only bound it, that of a matching registered
    block configuration with the same L, F and rounding (any value in the bound gives the same
    bits on every probe)."""
    fp = p.fit.params
    if fp["e_zero_seen"] != "measured":
        for c in p.matches:
            cfg = c.candidate.config(p.in_format)
            if c.candidate.model.kind == "block" and cfg.block == fp["block"] and \
                    cfg.fraction_bits == fp["fraction_bits"] and \
                    cfg.output(p.out_format)[0] == fp["rounding"]:
                return cfg.output(p.out_format)[1]
    return fp["e_zero"]


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
    if model is None:
        parts.append("no model reproduces every probe")
    return "; ".join(parts)
