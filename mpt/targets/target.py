"""L1: hardware targets as data — one frozen description per accelerator.

A :class:`Target` names, for one chip: the MMA model that runs its GEMMs for each input format
(``mpt.mma_models()``), the FP8 formats of its training recipes (OCP E4M3FN/E5M2, AMD's FNUZ
flavours, ...), its format-conversion rules (:class:`Conversions`: subnormal flushes,
saturation, the stochastic-rounding source it offers), and the evidence for each of these. A
recipe takes a target (``mpt.recipes``), so that the same training recipe can be run, bit for
bit, on the model of any chip mpt knows.

Evidence (``mpt.engines.model.EVIDENCE``): a target's label is the weakest label of the
matrix-engine configurations it uses (:attr:`Target.evidence`; per format:
:meth:`Target.evidence_by_format`); its conversion rules carry their own. ``mpt.targets()`` and
docs/targets.md list them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mpt._registry import Registry
from mpt.engines.model import EVIDENCE, Assumption, get_mma_model
from mpt.formats import get_format

__all__ = ["Conversions", "Target", "register_target", "get_target", "targets",
           "targets_table_rows"]

#: Input formats a target maps to an MMA model; every fp8 flavour counts as "fp8".
_FP8 = ("fp8_e4m3fn", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz")
_IEEE_KINDS = ("ieee_fma", "ieee_mul_add", "exact")


@dataclass(frozen=True)
class Conversions:
    """How a target converts between formats (outside the MMA).

    ``flush_subnormals``: formats whose conversion from fp32 flushes subnormal results to zero
    (TPU's f32→bf16); ``fp8_saturate``: FP8 casts clamp to ±max (Transformer Engine's casts) or
    overflow to Inf/NaN; ``stochastic_rounding``: the random source of the target's stochastic
    rounding (``None``: not offered; ``"philox"``: mpt's counter-based Philox stream, the
    assumption wherever the vendor does not document its generator; ``"lfsr"``: Gaudi's
    per-lane LFSR); ``evidence``: the label of these rules; ``modes``: the rounding modes the
    target's converters offer, where a source lists them (empty: not described);
    ``assumptions``: the rules of these conversions that are assumed (:class:`Assumption`,
    choices listed; the first is the one mpt applies).
    """

    flush_subnormals: tuple[str, ...] = ()
    fp8_saturate: bool = True
    stochastic_rounding: str | None = None
    evidence: str = "documented"
    modes: tuple[str, ...] = ()
    assumptions: tuple[Assumption, ...] = ()

    def __post_init__(self):
        if self.evidence not in EVIDENCE:
            raise ValueError(f"evidence must be one of {EVIDENCE}; got {self.evidence!r}")
        if not all(isinstance(a, Assumption) for a in self.assumptions):
            raise TypeError("assumptions must be a tuple of Assumption")
        object.__setattr__(self, "flush_subnormals",
                           tuple(get_format(f).name for f in self.flush_subnormals))


@dataclass(frozen=True)
class Target:
    """One accelerator (module docstring). ``mma``: (input format, MMA model name) pairs — fp8
    formats (any 8-bit float: OCP, FNUZ, Gaudi's, cFP8) under the key ``"fp8"``; ``fp8``:
    (forward, backward) FP8 formats of its recipes, or None if it has no FP8 GEMMs; ``sources``:
    where the description comes from; ``software_models``: MMA models of compiler modes a recipe
    may choose on this chip besides the per-format ones (Trainium's ``--auto-cast``: a recipe's
    explicit ``matmul_model`` among them survives ``Recipe.for_target``)."""

    name: str
    vendor: str
    description: str
    mma: tuple[tuple[str, str], ...]
    fp8: tuple[str, str] | None = None
    conversions: Conversions = field(default_factory=Conversions)
    aliases: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    software_models: tuple[str, ...] = ()

    def __post_init__(self):
        for fmt, model in self.mma:
            get_mma_model(model)   # ValueError for an unknown model
            if fmt != "fp8":
                get_format(fmt)
        for model in self.software_models:
            get_mma_model(model)
        if self.fp8 is not None:
            object.__setattr__(self, "fp8", tuple(get_format(f).name for f in self.fp8))

    def mma_model(self, fmt) -> str:
        """The MMA model this target runs GEMMs on ``fmt`` operands with."""
        name = get_format(fmt).name
        key = "fp8" if _is_fp8(name) else name
        for f, model in self.mma:
            if f == key:
                return model
        valid = ", ".join(f for f, _ in self.mma)
        raise ValueError(f"target {self.name!r} has no MMA model for {name} inputs; it has: "
                         f"{valid}")

    def evidence_by_format(self) -> dict[str, str]:
        """{input format (or "fp8"): the weakest evidence label of the MMA configurations that
        run its GEMMs by default (both operands in that format, the model's default instruction;
        ``mpt models`` lists the labels of the other variants)}."""
        out = {}
        for fmt, model_name in self.mma:
            model = get_mma_model(model_name)
            formats = [f for f in model.input_formats if (_is_fp8(f) if fmt == "fp8" else f == fmt)]
            out[fmt] = max((model.config(f, f).evidence for f in formats), key=EVIDENCE.index)
        return out

    @property
    def evidence(self) -> str:
        """The headline label: the weakest of its matrix-engine configurations (the IEEE models of
        its FP32 CUDA-core GEMMs are definitions, not evidence about the chip), or "documented"
        for a target whose every GEMM is an IEEE model."""
        labels = [label for fmt, label in self.evidence_by_format().items()
                  if get_mma_model(dict(self.mma)[fmt]).kind not in _IEEE_KINDS]
        return max(labels, key=EVIDENCE.index) if labels else "documented"

    def describe(self) -> dict:
        return {"name": self.name, "aliases": list(self.aliases), "vendor": self.vendor,
                "description": self.description, "evidence": self.evidence,
                "evidence_by_format": self.evidence_by_format(),
                "mma": dict(self.mma), "fp8": list(self.fp8) if self.fp8 else None,
                "conversions": {"flush_subnormals": list(self.conversions.flush_subnormals),
                                "fp8_saturate": self.conversions.fp8_saturate,
                                "stochastic_rounding": self.conversions.stochastic_rounding,
                                "evidence": self.conversions.evidence,
                                "modes": list(self.conversions.modes),
                                "assumptions": [{"name": a.name, "choices": list(a.choices),
                                                 "description": a.description}
                                                for a in self.conversions.assumptions]},
                "software_models": list(self.software_models),
                "sources": list(self.sources)}


def _is_fp8(name: str) -> bool:
    """Whether a format is an 8-bit float (the ``"fp8"`` key of :attr:`Target.mma`)."""
    fmt = get_format(name)
    return name in _FP8 or (fmt.kind == "float" and fmt.bits == 8)


_TARGETS = Registry(Target, "target", "targets")


def register_target(target: Target) -> Target:
    """Add a target under its name and aliases (case-insensitive); returns it."""
    return _TARGETS.register(target)


def targets() -> dict[str, Target]:
    """Every registered target by name, in registration order."""
    return _TARGETS.all()


def get_target(target) -> Target:
    """A target by name or alias (case-insensitive), or a :class:`Target` passed through."""
    return _TARGETS.get(target, "target")


def targets_table_rows() -> list[tuple[str, ...]]:
    """Every registered target as table rows (header first): vendor, evidence per format, FP8
    formats, conversion rules, aliases — ``mpt targets`` and docs/targets.md."""
    rows = [("target", "vendor", "MMA model per format (evidence)", "fp8 fwd/bwd", "conversions",
             "aliases")]
    for t in _TARGETS.all().values():
        by_format = t.evidence_by_format()
        models = ", ".join(f"{f}: {m} ({by_format[f]})" for f, m in t.mma)
        if t.software_models:
            models += ", compiler modes: " + ", ".join(t.software_models)
        c = t.conversions
        rules = "; ".join(x for x in (
            f"flush subnormals to {'/'.join(c.flush_subnormals)}" if c.flush_subnormals else "",
            "saturating fp8 casts" if c.fp8_saturate else "fp8 casts overflow",
            f"modes: {', '.join(c.modes)}" if c.modes else "",
            f"stochastic rounding: {c.stochastic_rounding}" if c.stochastic_rounding else "",
            f"({c.evidence})",
            "assumed: " + ", ".join(f"{a.name} ({'|'.join(a.choices)})" for a in c.assumptions)
            if c.assumptions else "") if x)
        rows.append((t.name, t.vendor, models, "/".join(t.fp8) if t.fp8 else "-", rules,
                     ", ".join(t.aliases) or "-"))
    return rows
