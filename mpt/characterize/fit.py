"""L5: running probes through mpt's models, and fitting the block model to an adapter's results.

:func:`run_model` computes a probe set with any MMA model (one ``mpt.mma`` call per row length,
the probes as a batch of 1×K by K×1 products). :func:`fit_block` builds the block model of
docs/tensor_cores.md §1 from the readings — L, F, an output rounding the ``block`` kind accepts
for this output format, e_zero — and checks it against every probe: a fit that reproduces every
result bit for bit is the characterized model of this format pair. e_zero is taken from the
``zero`` probes when they pin it; when they only bound it (or the formats cannot form terms small
enough to see it), the largest value the bound allows stands in, and the report says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mpt.characterize.infer import Finding, read_zero
from mpt.characterize.probes import ProbeSet, bits_of
from mpt.engines import MMAConfig, MMAModel, mma
from mpt.engines.operands import output_params, roundings
from mpt.formats import get_format

__all__ = ["run_model", "block_model", "BlockFit", "fit_block"]


def run_model(model, ps: ProbeSet, variant: str | None = None) -> np.ndarray:
    """The (P,) result bits of ``model`` (an :class:`MMAModel` or a name) on every probe."""
    out = np.zeros(len(ps), np.dtype(f"u{get_format(ps.out_format).dtype.itemsize}"))
    for k, rows in ps.groups():
        d = mma(ps.a[rows, :k][:, None, :], ps.b[rows, :k][:, :, None],             # (P, 1, 1)
                ps.c[rows][:, None, None], model=model, in_format=ps.in_format,
                out_format=ps.out_format, variant=variant)
        out[rows] = bits_of(d.reshape(-1), ps.out_format)
    return out


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
        mismatches = np.flatnonzero(run_model(model, ps) != d)
        if best is None or mismatches.size < best.mismatches.size:
            best = BlockFit({"block": block, "fraction_bits": f, "rounding": rounding,
                             "e_zero": e_zero, "e_zero_seen": seen}, mismatches, zeros=zero,
                           evidence=evidence)
    if best is None:
        return BlockFit(reason=f"not a block model: the block kind has no rounding for "
                               f"{ps.out_format} outputs with L = {block}, F = {f}")
    return best
