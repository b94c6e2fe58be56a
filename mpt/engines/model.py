"""L1: what an MMA model is — a named description of one matrix engine's arithmetic, as data.

An :class:`MMAModel` names the arithmetic ``kind`` it runs (the operand class that implements it,
see :mod:`mpt.engines.operands`), one :class:`MMAConfig` per family of input formats (the
instruction, its block or group size and output roundings), the evidence for it, and the rules
that are assumed rather than known, each a named, selectable :class:`Assumption`. The models live
in a registry (:func:`register_model`, :func:`get_mma_model`, :func:`mma_models`); each vendor
module of :mod:`mpt.engines` registers its own.

Evidence labels (one per configuration; the model's label is the weakest of them):

``hardware-verified``  reproduces real measurements bit for bit (mpt's vendored GPU samples)
``reference model``    follows a vendor's or a paper's bit-accurate model, itself checked on
                       hardware by its authors
``documented``         follows documentation that fixes the arithmetic (IEEE 754 operations)
``assumption``         a stated model where the vendor says nothing; every assumed rule is an
                       :class:`Assumption` with its choices listed
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from mpt._checks import check_int
from mpt.engines.operands import operands_class
from mpt.formats import get_format

__all__ = ["EVIDENCE", "Assumption", "MMAConfig", "MMAModel", "register_model", "mma_models",
           "get_mma_model", "models_table_rows"]

#: Evidence labels, strongest first.
EVIDENCE = ("hardware-verified", "reference model", "documented", "assumption")


@dataclass(frozen=True)
class Assumption:
    """A rule the vendor does not document, made a parameter: ``name``, the ``choices`` (the
    first is the default), and what it decides."""

    name: str
    choices: tuple[str, ...]
    description: str

    @property
    def default(self) -> str:
        return self.choices[0]


@dataclass(frozen=True)
class MMAConfig:
    """How a model computes for one family of input formats.

    ``inputs``: format names accepted for A and B (any combination of them); ``instruction``:
    the instruction(s) modelled; ``block``: products per block / instruction step (``None``: all
    of K at once, the exact model; 1: one product at a time, the IEEE models); ``fraction_bits``:
    the alignment width F of a block model (None otherwise); ``outputs``: (output format,
    rounding, e_zero) triples; ``evidence``: one of :data:`EVIDENCE`; ``variant``: the name of an
    instruction variant when a model offers several for the same inputs (``"default"`` is chosen
    unless a call names another); ``params``: further (name, value) parameters of the rule.
    """

    inputs: tuple[str, ...]
    instruction: str
    block: int | None
    fraction_bits: int | None
    outputs: tuple[tuple[str, str, int | None], ...]
    evidence: str = "reference model"
    variant: str = "default"
    params: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        """The structure every kind relies on (each kind's operand class checks its own
        parameters when a model is built: ``Operands.check_config``)."""
        if not isinstance(self.inputs, tuple) or not self.inputs or \
                any(get_format(f).name != f or get_format(f).kind != "float" for f in self.inputs):
            raise ValueError(f"inputs must be a non-empty tuple of float format names; got "
                             f"{self.inputs!r}")
        check_int("block", self.block, min=1, optional=True)
        check_int("fraction_bits", self.fraction_bits, min=0, optional=True)
        if not isinstance(self.outputs, tuple) or not self.outputs or not all(
                isinstance(o, tuple) and len(o) == 3 and isinstance(o[1], str)
                for o in self.outputs):
            raise ValueError(f"outputs must be a non-empty tuple of (format, rounding, e_zero); "
                             f"got {self.outputs!r}")
        for name, _, e_zero in self.outputs:
            get_format(name)
            check_int(f"e_zero of output {name}", e_zero, optional=True)
        if self.evidence not in EVIDENCE:
            raise ValueError(f"evidence must be one of {EVIDENCE}; got {self.evidence!r}")

    def output(self, out_format: str) -> tuple[str, int | None]:
        """(rounding, e_zero) for an output format; ValueError naming the supported ones."""
        for name, rounding, e_zero in self.outputs:
            if name == out_format:
                return rounding, e_zero
        valid = ", ".join(repr(o[0]) for o in self.outputs)
        raise ValueError(f"out_format must be one of {valid} for {self.inputs} inputs; "
                         f"got {out_format!r}")

    def param(self, name: str, default=None):
        """The value of a rule parameter from :attr:`params`."""
        return dict(self.params).get(name, default)

    def describe(self) -> dict:
        return {"inputs": list(self.inputs), "instruction": self.instruction,
                "variant": self.variant, "block": self.block,
                "fraction_bits": self.fraction_bits, "evidence": self.evidence,
                "outputs": [{"format": o, "rounding": r, "e_zero": e} for o, r, e in self.outputs],
                **({"params": dict(self.params)} if self.params else {})}


@dataclass(frozen=True)
class MMAModel:
    """A named MMA model: its arithmetic ``kind``, one :class:`MMAConfig` per family of input
    formats (and instruction variant), its assumed rules and the choices in effect."""

    name: str
    kind: str
    description: str
    configs: tuple[MMAConfig, ...]
    aliases: tuple[str, ...] = ()
    assumptions: tuple[Assumption, ...] = ()
    choices: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self):
        """A name, a registered kind (ValueError listing the kinds), and configurations that
        kind's operand class accepts (``Operands.check_config``)."""
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str; got {self.name!r}")
        kind = operands_class(self.kind)
        if not isinstance(self.configs, tuple) or not self.configs or \
                not all(isinstance(c, MMAConfig) for c in self.configs):
            raise TypeError(f"configs must be a non-empty tuple of MMAConfig; got "
                            f"{self.configs!r}")
        for cfg in self.configs:
            kind.check_config(cfg)
        if not isinstance(self.aliases, tuple) or not all(isinstance(a, str) for a in self.aliases):
            raise TypeError(f"aliases must be a tuple of str; got {self.aliases!r}")

    @property
    def input_formats(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f for cfg in self.configs for f in cfg.inputs))

    @property
    def evidence(self) -> str:
        """The weakest evidence label of the configurations (``assumption`` if any rule is)."""
        labels = [cfg.evidence for cfg in self.configs]
        return max(labels, key=EVIDENCE.index) if labels else "assumption"

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(cfg.variant for cfg in self.configs))

    def choice(self, name: str) -> str:
        """The choice in effect for the assumption ``name`` (its default unless configured)."""
        for assumption in self.assumptions:
            if assumption.name == name:
                return dict(self.choices).get(name, assumption.default)
        raise KeyError(f"model {self.name!r} has no assumption {name!r}")

    def configure(self, **choices) -> "MMAModel":
        """A copy with assumed rules chosen: ``get_mma_model("cdna4").configure(rule=...)``.
        ValueError naming the assumption and its choices for an unknown one."""
        known = {a.name: a for a in self.assumptions}
        for name, value in choices.items():
            if name not in known:
                valid = ", ".join(known) or "none"
                raise ValueError(f"model {self.name!r} has no assumption {name!r}; its "
                                 f"assumptions: {valid}")
            if value not in known[name].choices:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, known[name].choices))}"
                                 f" for model {self.name!r}; got {value!r}")
        return replace(self, choices=tuple(sorted({**dict(self.choices), **choices}.items())))

    def config(self, a_format: str, b_format: str, variant: str | None = None) -> MMAConfig:
        """The configuration for these input formats (and instruction variant; None: the
        ``"default"`` one, else the only one); ValueError naming the supported ones."""
        kind = operands_class(self.kind)
        found = [cfg for cfg in self.configs
                 if kind.accepts(cfg, a_format) and kind.accepts(cfg, b_format)]
        if not found:
            groups = "; ".join(dict.fromkeys("/".join(cfg.inputs) for cfg in self.configs))
            raise ValueError(f"model {self.name!r} does not take inputs ({a_format}, {b_format}); "
                             f"it takes (mixable within a group): {groups}")
        want = variant or ("default" if any(c.variant == "default" for c in found)
                           else found[0].variant)
        for cfg in found:
            if cfg.variant == want:
                return cfg
        valid = ", ".join(repr(c.variant) for c in found)
        raise ValueError(f"variant must be one of {valid} for model {self.name!r} with "
                         f"({a_format}, {b_format}) inputs; got {variant!r}")

    def describe(self) -> dict:
        """The model as a JSON-ready dict."""
        return {"name": self.name, "aliases": list(self.aliases), "kind": self.kind,
                "description": self.description, "evidence": self.evidence,
                "assumptions": [{"name": a.name, "choices": list(a.choices),
                                 "in_effect": self.choice(a.name), "description": a.description}
                                for a in self.assumptions],
                "configs": [c.describe() for c in self.configs]}


_MODELS: dict[str, MMAModel] = {}
_BY_NAME: dict[str, MMAModel] = {}


def register_model(model: MMAModel) -> MMAModel:
    """Add a model to the registry under its name and aliases (case-insensitive); returns it.
    ValueError if a name is taken or its kind has no operand class (checked when it runs)."""
    if not isinstance(model, MMAModel):
        raise TypeError(f"model must be an MMAModel; got {type(model).__name__}")
    for key in (model.name, *model.aliases):
        if key.lower() in _BY_NAME:
            raise ValueError(f"MMA model name {key!r} is already registered")
    _MODELS[model.name] = model
    for key in (model.name, *model.aliases):
        _BY_NAME[key.lower()] = model
    return model


def mma_models() -> dict[str, MMAModel]:
    """Every registered model by canonical name (aliases in ``MMAModel.aliases``), in the order
    they were registered (NVIDIA by generation, then the IEEE models, then other vendors)."""
    return dict(_MODELS)


def get_mma_model(model) -> MMAModel:
    """A model by name or alias (case-insensitive), or an :class:`MMAModel` passed through."""
    if isinstance(model, MMAModel):
        return model
    if not isinstance(model, str):
        raise TypeError(f"model must be an MMA model name or an MMAModel; got "
                        f"{type(model).__name__}")
    found = _BY_NAME.get(model.lower())
    if found is None:
        valid = ", ".join(f"{m.name} ({'/'.join(m.aliases)})" if m.aliases else m.name
                          for m in _MODELS.values())
        raise ValueError(f"unknown MMA model {model!r}; valid models: {valid}")
    return found


def models_table_rows() -> list[tuple[str, ...]]:
    """Every registered model as table rows (header first): kind, evidence, each configuration's
    inputs (and variant) with its evidence, assumed rules, aliases — ``mpt models`` and
    docs/targets.md."""
    rows = [("model", "kind", "evidence", "inputs: evidence", "assumptions", "aliases")]
    for m in _MODELS.values():
        inputs = "; ".join("/".join(c.inputs) + ("" if c.variant == "default" else
                                                 f" [{c.variant}]") + f": {c.evidence}"
                           for c in m.configs)
        assumed = ", ".join(f"{a.name} ({'|'.join(a.choices)})" for a in m.assumptions)
        rows.append((m.name, m.kind, m.evidence, inputs, assumed or "-",
                     ", ".join(m.aliases) or "-"))
    return rows
