"""L5: the text report of a characterization (what ``mpt characterize`` prints)."""
from __future__ import annotations

__all__ = ["format_text"]

_ORDER = ("alignment", "summation", "passes", "rounding", "zeros", "signs", "subnormals",
          "products", "specials", "nans")


def format_text(ch, *, max_differences: int | None = None) -> str:
    """The report: per pair how it was probed, the findings, the fitted block model (or a changed
    registered configuration), the spec vectors, the matching models or the nearest one with
    every differing parameter and probe; then what was not probed, the verdict and what the
    probes say of each assumed rule of the matching models."""
    lines = [f"adapter: {ch.adapter}", ""]
    for p in ch.pairs:
        lines += _pair(ch, p, max_differences) + [""]
    lines += [f"not probed: {text}" for text in ch.not_probed]
    lines.append(f"verdict: {ch.verdict}")
    lines += [f"  {s.model}: {s.text}" for s in ch.settlements]
    if ch.model is not None:
        lines.append(f"model: {ch.source} (loadable with mpt.engines.load_model)")
    return "\n".join(lines)


def _pair(ch, p, max_differences) -> list[str]:
    if not p.probed:
        return [f"{p.label}: {p.error}"]
    head = f"{p.label}: {len(p.probes)} probes"
    if p.not_run:
        head += f" ({len(p.not_run)} more the adapter cannot run)"
    lines = [head] + ([f"  {'how ':.<14} {p.note}"] if p.note else [])
    for name in _ORDER:
        if name in p.findings:
            lines.append(f"  {name + ' ':.<14} {p.findings[name].text}")
    fit = p.fit
    if fit.params is None:
        lines.append(f"  block model   {fit.reason}")
    else:
        fp = fit.params
        seen = "" if fp["e_zero_seen"] == "measured" else f" ({fp['e_zero_seen']})"
        state = "reproduces every probe" if fit.verified else \
            f"differs on {fit.mismatches.size} probes: " + \
            ", ".join(p.probes.names[i] for i in fit.mismatches[:8]) + \
            (" ..." if fit.mismatches.size > 8 else "")
        lines.append(f"  block model   L = {fp['block']}, F = {fp['fraction_bits']}, "
                     f"{fp['rounding']}, e_zero = {fp['e_zero']}{seen}: {state}")
    if p.family is not None:
        lines.append(f"  {'changed ':.<14} {p.family.base.label} with "
                     + ", ".join(f"{k} = {new}" for k, (new, _) in p.family.changes.items())
                     + " reproduces every probe")
    spec = p.spec_results()
    if spec:
        lines.append("  spec vectors  " + "; ".join(
            f"{n} {r}" + (f" ({m})" if m else "") for n, r, m in spec))
    if p.matches:
        lines.append("  matches       " + ", ".join(c.candidate.label for c in p.matches))
    shown = []
    if ch.expect is not None and not any(c.candidate.model.name == ch.expect for c in p.matches):
        expected = ch.comparison(p, ch.expect)
        if expected is not None:
            shown.append(("expected", expected))
    if not p.matches and p.nearest and not any(c is p.nearest[0] for _, c in shown):
        shown.append(("nearest", p.nearest[0]))
    for what, c in shown:
        lines.append(f"  {what + ' ':.<14} {c.candidate.label}: {c.mismatches.size} of "
                     f"{len(p.probes)} probes differ")
        lines += [f"    {d}" for d in p.parameter_differences(c)]
        diffs = p.differences(c)
        for d in diffs[:max_differences]:
            lines.append(f"    {d.probe}: adapter {d.adapter}, {c.candidate.label} {d.model}  "
                         f"[{d.note}]")
        if max_differences is not None and len(diffs) > max_differences:
            lines.append(f"    ... {len(diffs) - max_differences} more (all in the JSON)")
    cannot = [c for c in p.comparisons if c.bits is None]
    if cannot:
        lines.append("  not compared  " + "; ".join(f"{c.candidate.label}: {c.error}"
                                                   for c in cannot))
    return lines
