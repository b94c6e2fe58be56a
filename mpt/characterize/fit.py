"""L5: fitting models to an adapter's results — the block model, and a registered
configuration with its parameters changed.

:func:`fit_block` builds the block model of docs/tensor_cores.md §1 from the readings — L, F, an
output rounding the ``block`` kind accepts for this output format, e_zero — and checks it
against every probe: a fit that reproduces every result bit for bit is the characterized model
of this format pair. e_zero is taken from the ``zero`` probes when they pin it; when they only
bound it (or the formats cannot form terms small enough to see it), the largest value the bound
allows stands in, and the report says so.

:func:`fit_family` serves every other kind (and a block model the readings cannot pin): when no
registered candidate matches, it takes the nearest ones and changes the parameters their kind
declares in :class:`~mpt.MMAConfig` — the alignment width F (from the ``align_*`` readings, or
one or two bits either side) and the block L (from the summation tree) — keeping a change that
reproduces every probe. That names what differs from a registered model in its own terms
("fraction_bits: measured 45, gaudi2 has 46") for any kind whose operand class accepts the
changed value.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from mpt.characterize.infer import Finding, read_zero
from mpt.characterize.probes import ProbeSet
from mpt.characterize.runner import run_cached
from mpt.engines import MMAConfig, MMAModel
from mpt.engines.operands import output_params, roundings
from mpt.formats import get_format

__all__ = ["block_model", "BlockFit", "fit_block", "FamilyFit", "fit_family"]


def block_model(name: str, configs: list[tuple], description: str = "") -> MMAModel:
    """A ``block``-kind model from (input format, L, F, [(output, rounding, e_zero), ...],
    evidence) tuples; ValueError if the block kind refuses a parameter."""
    return MMAModel(name, "block", description, tuple(
        MMAConfig((fin,), f"characterized: blocks of {block} products, F = {f}", block, f,
                  tuple(outputs), evidence=evidence)
        for fin, block, f, outputs, evidence in configs))


@dataclass
class BlockFit:
    """The block model fitted to one format pair: ``params`` (block, fraction_bits, rounding,
    e_zero and how e_zero was seen), the rows where it differs from the adapter (``mismatches``,
    empty when it reproduces every probe), or why no block model applies (``reason``)."""

    params: dict | None = None
    mismatches: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    reason: str = ""
    zeros: Finding | None = None
    evidence: str = "assumption"

    @property
    def verified(self) -> bool:
        return self.params is not None and not self.reason and self.mismatches.size == 0


def _e_zero(zero: Finding, out_format: str) -> tuple[int, str]:
    """(e_zero to use, how it was seen: "measured", "bound" or "not observable")."""
    top = get_format(out_format).emin - 1            # the block kind needs e_zero < emin
    value = zero.value or {}
    if value.get("e_zero") is not None:
        return value["e_zero"], "measured"
    if value.get("e_zero_at_most") is not None:
        return min(value["e_zero_at_most"], top), "bound"
    return top, "not observable"


def fit_block(ps: ProbeSet, d: np.ndarray, params: dict, evidence: str) -> BlockFit:
    """The block model (L, F from the readings; each output rounding the block kind accepts for
    this output, with the e_zero its ``zero`` probes give) that reproduces the most probes."""
    block, f = params.get("block"), params.get("fraction_bits")
    if f is None:
        return BlockFit(reason="not a block model: C and the products are not truncated at one "
                               "alignment width F")
    if block is None:
        return BlockFit(reason="not a block model: the sum is not a chain of fixed-size blocks "
                               "in increasing k")
    best = None
    fout = get_format(ps.out_format)
    for rounding in roundings():
        precision, emin, _, _ = output_params(rounding)
        if emin != fout.emin or precision > fout.precision:
            continue                        # a rounding to another format's range or precision
        zero = read_zero(ps, d, f, rounding)
        e_zero, seen = _e_zero(zero, ps.out_format)
        try:
            model = block_model("fit", [(ps.in_format, block, f,
                                         [(ps.out_format, rounding, e_zero)], evidence)])
        except ValueError:
            continue
        bits, _ = run_cached(model, ps)
        if bits is None:
            continue
        mismatches = np.flatnonzero(bits != d)
        if best is None or mismatches.size < best.mismatches.size:
            best = BlockFit({"block": block, "fraction_bits": f, "rounding": rounding,
                             "e_zero": e_zero, "e_zero_seen": seen}, mismatches, zeros=zero,
                           evidence=evidence)
    if best is None:
        return BlockFit(reason=f"not a block model: the block kind has no rounding for "
                               f"{ps.out_format} outputs with L = {block}, F = {f}")
    return best


@dataclass
class FamilyFit:
    """A registered candidate's configuration with parameters changed that reproduces every
    probe: ``base`` (the :class:`~mpt.characterize.match.Candidate`), ``changes`` {parameter:
    (fitted value, the registered value)} and ``model`` (the base model with that configuration
    changed, under ``base.variant``)."""

    base: object
    changes: dict
    model: MMAModel

    def differences(self) -> list[str]:
        return [f"{key}: measured {new}, {self.base.label} has {old}"
                for key, (new, old) in self.changes.items()]


#: how many of the nearest registered candidates (distinct configurations) :func:`fit_family` tries
NEAREST = 3


def fit_family(battery: ProbeSet, rows: np.ndarray, d: np.ndarray, nearest: list,
               findings: dict[str, Finding]) -> FamilyFit | None:
    """The first of the ``nearest`` comparisons (fewest differences first) whose configuration,
    with F and/or L changed as the readings suggest, reproduces every probe ``rows`` of the
    ``battery`` (the adapter's bits ``d``); None if none does."""
    seen = set()
    for comparison in nearest:
        cand = comparison.candidate
        cfg = cand.config(battery.in_format)
        if cfg in seen or len(seen) == NEAREST:
            continue
        seen.add(cfg)
        for changes in _perturbations(cfg, findings):
            try:
                model = _changed(cand.model, cfg, changes)
            except (ValueError, TypeError):
                continue                                  # the kind refuses the value
            bits, _ = run_cached(model, battery, cand.variant)
            if bits is not None and np.array_equal(bits[rows], d):
                return FamilyFit(cand, {k: (v, getattr(cfg, k)) for k, v in changes.items()},
                                 model)
    return None


def _perturbations(cfg: MMAConfig, findings) -> list[dict]:
    """Changes of F and L to try, most likely first: the values the readings show, then one and
    two bits of F either side; then each F with the L of the summation tree."""
    alignment = findings.get("alignment")
    shown = alignment.value if alignment is not None and alignment.value else {}
    fs = []
    if cfg.fraction_bits is not None:
        f = cfg.fraction_bits
        fs = [v for v in (shown.get("c"), shown.get("products"), f - 1, f + 1, f - 2, f + 2)
              if v is not None and v >= 0 and v != f]
    tree = findings.get("summation")
    size = (tree.value or {}).get("size") if tree is not None and isinstance(tree.value, dict) \
        else None
    blocks = [size] if size and cfg.block is not None and size != cfg.block else []
    out = [{"fraction_bits": v} for v in dict.fromkeys(fs)] + [{"block": b} for b in blocks]
    out += [{"fraction_bits": v, "block": b} for v in dict.fromkeys(fs) for b in blocks]
    return out


def _changed(model: MMAModel, cfg: MMAConfig, changes: dict) -> MMAModel:
    """``model`` with ``cfg`` (one of its configurations) changed; ValueError if its kind
    refuses the values."""
    configs = tuple(replace(c, **changes) if c is cfg else c for c in model.configs)
    text = ", ".join(f"{k}={v}" for k, v in changes.items())
    return replace(model, name=f"{model.name} ({text})", configs=configs, aliases=())
