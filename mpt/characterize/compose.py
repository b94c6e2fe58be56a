"""L5: the characterized model — one MMA model that reproduces the adapter on every probed pair.

Per (input, output) pair, the configuration that reproduces every probe, in this order:

1. the fitted block model (its L, F, rounding and e_zero; an e_zero the probes cannot see is
   taken from a matching registered block configuration with the same L, F and rounding — any
   value in the bound gives the same bits on every probe);
2. a registered configuration with its parameters changed (:func:`~mpt.characterize.fit.
   fit_family`: "gaudi2 with fraction_bits 45");
3. the configuration of a matching registered candidate (preferring the choices that match
   every pair).

Each becomes a configuration of that input format alone, with its kind stated when it is not the
model's (an FP64 instruction of kind ``ieee_fma64`` beside block configurations) and the
adapter's evidence label; configurations equal but for their outputs are merged. The first
configuration of an input format is its ``"default"`` variant; a different one for another
output of the same input is the variant ``"<output> output"``. Assumed rules come with the models
they were taken from, set to the choices of the candidates used (two different choices of one
rule: no model). :func:`compose` returns the model and, per pair, the variant that runs it.
"""
from __future__ import annotations

from dataclasses import replace

from mpt.characterize.fit import block_model
from mpt.engines import MMAConfig, MMAModel

__all__ = ["compose", "pair_configuration"]


def pair_configuration(p, preferred=frozenset()):
    """(configuration for ``p.in_format`` -> ``p.out_format`` alone, the candidate it comes
    from or None for a block fit), or None when nothing reproduces the pair. ``preferred``:
    (model name, choices) of candidates to take first among the matches."""
    fit = p.fit
    if fit is not None and fit.verified:
        fp = fit.params
        cfg = block_model("fit", [(p.in_format, fp["block"], fp["fraction_bits"],
                                   [(p.out_format, fp["rounding"], _e_zero(p))],
                                   p.evidence)]).configs[0]
        return replace(cfg, kind="block"), None
    if p.family is not None:
        cand = p.family.base
        cfg = p.family.model.config(p.in_format, p.in_format, cand.variant)
        text = ", ".join(f"{k} {new}" for k, (new, _) in p.family.changes.items())
        return _alone(p, replace(cand, model=p.family.model), cfg,
                      f"{cand.label} with {text}: "), cand
    matches = sorted(p.matches, key=lambda c: (c.candidate.model.name,
                                               c.candidate.choices) not in preferred)
    if not matches:
        return None
    cand = matches[0].candidate
    return _alone(p, cand, cand.config(p.in_format), f"as {cand.label}: "), cand


def _alone(p, cand, cfg: MMAConfig, prefix: str) -> MMAConfig:
    rounding, e_zero = cfg.output(p.out_format)
    return replace(cfg, inputs=(p.in_format,), outputs=((p.out_format, rounding, e_zero),),
                   instruction=prefix + cfg.instruction, variant="default",
                   kind=cand.model.kind_of(cfg), evidence=p.evidence)


def _e_zero(p) -> int:
    """The fitted e_zero, or, when the probes only bound it, that of a matching registered
    block configuration with the same L, F and rounding."""
    fp = p.fit.params
    if fp["e_zero_seen"] != "measured":
        for c in p.matches:
            cfg = c.candidate.config(p.in_format)
            if c.candidate.model.kind_of(cfg) == "block" and cfg.block == fp["block"] and \
                    cfg.fraction_bits == fp["fraction_bits"] and \
                    cfg.output(p.out_format)[0] == fp["rounding"]:
                return cfg.output(p.out_format)[1]
    return fp["e_zero"]


def compose(name: str, description: str, pairs, preferred=frozenset()):
    """(model, {(input, output): variant}, "") that reproduces every one of ``pairs`` (probed
    PairResults), or (None, {}, why not)."""
    configs: list[MMAConfig] = []
    variants, assumptions = {}, {}
    for p in pairs:
        found = pair_configuration(p, preferred)
        if found is None:
            return None, {}, f"nothing reproduces {p.label}"
        cfg, cand = found
        for a in cand.model.assumptions if cand is not None else ():
            choice = cand.model.choice(a.name)
            if assumptions.setdefault(a.name, (a, choice))[1] != choice:
                return None, {}, (f"the pairs need two choices of {a.name}: "
                                  f"{assumptions[a.name][1]} and {choice}")
        variants[(p.in_format, p.out_format)] = _merge(configs, cfg, p.out_format)
    kind = configs[0].kind
    configs = [replace(c, kind=None if c.kind == kind else c.kind) for c in configs]
    model = MMAModel(name, kind, description, tuple(configs),
                     assumptions=tuple(a for a, _ in assumptions.values()))
    chosen = {n: c for n, (a, c) in assumptions.items() if c != a.default}
    return (model.configure(**chosen) if chosen else model), variants, ""


def _merge(configs: list[MMAConfig], cfg: MMAConfig, out_format: str) -> str:
    """Add ``cfg`` to ``configs`` (merged into an equal one but for its outputs; a second
    configuration of its input format becomes the variant "<output> output"); its variant."""
    for i, old in enumerate(configs):
        if old.inputs != cfg.inputs:
            continue
        if replace(old, outputs=cfg.outputs) == cfg:
            configs[i] = replace(old, outputs=old.outputs + cfg.outputs)
            return old.variant
    if any(old.inputs == cfg.inputs for old in configs):
        cfg = replace(cfg, variant=f"{out_format} output")
    configs.append(cfg)
    return cfg.variant
