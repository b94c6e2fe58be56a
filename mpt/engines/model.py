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
from pathlib import Path

from mpt._checks import check_int
from mpt._io import field as _field
from mpt._io import load_json
from mpt._registry import Registry
from mpt.engines.operands import operands_class
from mpt.formats import get_format

__all__ = ["EVIDENCE", "Assumption", "MMAConfig", "MMAModel", "register_model", "mma_models",
           "get_mma_model", "models_table_rows", "load_model"]

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
    unless a call names another; without a ``"default"``, the first listed); ``params``: further
    (name, value) parameters of the rule (``scale_block``: the instruction takes one block scale
    per that many k, ``scale_a``/``scale_b`` of ``mpt.mma``; ``scales``: the (scale format,
    block) pairs a block-scaled Tensor Core instruction takes); ``kind``: the arithmetic kind of
    this configuration when it is not the model's (a block-scaled or FP64 instruction of a Tensor
    Core model; None: the model's).
    """

    inputs: tuple[str, ...]
    instruction: str
    block: int | None
    fraction_bits: int | None
    outputs: tuple[tuple[str, str, int | None], ...]
    evidence: str = "reference model"
    variant: str = "default"
    params: tuple[tuple[str, object], ...] = ()
    kind: str | None = None

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
                "variant": self.variant, **({"kind": self.kind} if self.kind else {}),
                "block": self.block,
                "fraction_bits": self.fraction_bits, "evidence": self.evidence,
                "outputs": [{"format": o, "rounding": r, "e_zero": e} for o, r, e in self.outputs],
                **({"params": dict(self.params)} if self.params else {})}

    @classmethod
    def from_dict(cls, d: dict, where: str = "config") -> "MMAConfig":
        """The configuration a :meth:`describe` dict describes (JSON lists read back as
        tuples); ValueError naming a missing or mistyped field."""
        outputs = tuple((_get(o, "format", "str", f"{where}.outputs[{i}]"),
                         _get(o, "rounding", "str", f"{where}.outputs[{i}]"),
                         _get(o, "e_zero", "int|null", f"{where}.outputs[{i}]"))
                        for i, o in enumerate(_get(d, "outputs", "list", where)))
        params = d.get("params", {})
        if not isinstance(params, dict):
            raise ValueError(f"{where}.params must be an object; got {params!r}")
        return cls(tuple(_get(d, "inputs", "list", where)), _get(d, "instruction", "str", where),
                   _get(d, "block", "int|null", where), _get(d, "fraction_bits", "int|null", where),
                   outputs, _get(d, "evidence", "str", where), _get(d, "variant", "str", where),
                   tuple((k, _tuples(v)) for k, v in params.items()),
                   kind=d["kind"] if d.get("kind") is not None else None)


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
        operands_class(self.kind)
        if not isinstance(self.configs, tuple) or not self.configs or \
                not all(isinstance(c, MMAConfig) for c in self.configs):
            raise TypeError(f"configs must be a non-empty tuple of MMAConfig; got "
                            f"{self.configs!r}")
        for cfg in self.configs:
            operands_class(self.kind_of(cfg)).check_config(cfg)
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

    def kind_of(self, cfg: MMAConfig) -> str:
        """The arithmetic kind that runs ``cfg``: its own, else the model's."""
        return cfg.kind or self.kind

    def scaled(self, cfg: MMAConfig) -> bool:
        """Whether ``cfg`` is a block-scaled instruction: it declares its block scales
        (a ``scale_block`` or ``scales`` parameter)."""
        return bool(cfg.param("scale_block") or cfg.param("scales"))

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
                raise ValueError(f"{name} must be one of "
                                 f"{', '.join(map(repr, known[name].choices))}"
                                 f" for model {self.name!r}; got {value!r}")
        return replace(self, choices=tuple(sorted({**dict(self.choices), **choices}.items())))

    def config(self, a_format: str, b_format: str, variant: str | None = None,
               scaled: bool = False) -> MMAConfig:
        """The configuration for these input formats and instruction variant; ValueError naming
        the supported ones. ``variant`` None: the ``"default"`` one, else the first (the table
        lists a model's variants in the order its compiler prefers them) among those that take
        block scales when ``scaled`` (:meth:`scaled`) and those that do not otherwise (an
        instruction that only exists with scales runs with unit scales); block-scaled variants
        that read different scales (Blackwell's mxf8f6f4 / mxf4 / mxf4nvf4) must be named.
        A configuration takes a format its kind accepts (``Operands.accepts``: its listed
        inputs, or e.g. any FP8 format of the chip)."""
        found = [cfg for cfg in self.configs
                 if operands_class(self.kind_of(cfg)).accepts(cfg, a_format)
                 and operands_class(self.kind_of(cfg)).accepts(cfg, b_format)]
        if not found:
            groups = "; ".join(dict.fromkeys("/".join(cfg.inputs) for cfg in self.configs))
            raise ValueError(f"model {self.name!r} does not take inputs ({a_format}, {b_format}); "
                             f"it takes (mixable within a group): {groups}")
        if variant is None:
            pool = [c for c in found if self.scaled(c) == scaled]
            if not pool and scaled:
                raise ValueError(f"model {self.name!r} takes no block scales (scale_a/scale_b) "
                                 f"for ({a_format}, {b_format}) inputs")
            kinds = dict.fromkeys(c.param("scales") or c.param("scale_block") for c in pool)
            if scaled and len(kinds) > 1:   # instructions that read different scales: name one
                names = tuple(dict.fromkeys(c.variant for c in pool))
                raise ValueError(f"model {self.name!r} has {len(names)} block-scaled variants "
                                 f"for ({a_format}, {b_format}) inputs: name one with variant= "
                                 f"({', '.join(map(repr, names))})")
            pool = pool or found
            want = "default" if any(c.variant == "default" for c in pool) else pool[0].variant
        else:
            want = variant
        for cfg in found:
            if cfg.variant == want:
                return cfg
        valid = ", ".join(dict.fromkeys(repr(c.variant) for c in found))
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

    @classmethod
    def from_dict(cls, d: dict) -> "MMAModel":
        """The model a :meth:`describe` dict describes — ``MMAModel.from_dict(m.describe()) ==
        m`` for a model whose configured choices differ from the defaults. Its kind must be
        registered (ValueError listing the kinds); a missing or mistyped field is a ValueError
        naming it."""
        if not isinstance(d, dict):
            raise ValueError(f"an MMA model description must be a JSON object; got {d!r}")
        assumptions = tuple(Assumption(_get(a, "name", "str", f"assumptions[{i}]"),
                                       tuple(_get(a, "choices", "list", f"assumptions[{i}]")),
                                       _get(a, "description", "str", f"assumptions[{i}]"))
                            for i, a in enumerate(d.get("assumptions", [])))
        in_effect = {a["name"]: a.get("in_effect", c.default)
                     for a, c in zip(d.get("assumptions", []), assumptions)}
        model = cls(_get(d, "name", "str", ""), _get(d, "kind", "str", ""),
                    _get(d, "description", "str", ""),
                    tuple(MMAConfig.from_dict(c, f"configs[{i}]")
                          for i, c in enumerate(_get(d, "configs", "list", ""))),
                    tuple(d.get("aliases", [])), assumptions)
        chosen = {name: value for name, value in in_effect.items()
                  if value != model.choice(name)}
        return model.configure(**chosen) if chosen else model


def _get(d, key, kinds, where):
    return _field(d, key, kinds, where, ValueError)


def _tuples(value):
    """JSON lists read back as the tuples a frozen configuration holds."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def load_model(path) -> MMAModel:
    """An MMA model from a JSON file, for ``mpt.mma(..., model=load_model(path))``: a model
    description (:meth:`MMAModel.describe`, an entry of ``mpt models --json``) or the result of
    ``mpt characterize`` (its ``"model"`` entry). ValueError if the file holds neither, or a
    characterization that found no model."""
    path = Path(path)
    doc = load_json(path.read_bytes(), str(path), ValueError)
    if isinstance(doc, dict) and "configs" not in doc and "model" in doc:
        if doc["model"] is None:
            raise ValueError(f"{path} is a characterization that found no MMA model: "
                             f"{doc.get('verdict', 'no model reproduces every probe')}")
        doc = doc["model"]
    return MMAModel.from_dict(doc)


_MODELS = Registry(MMAModel, "MMA model", "models")


def register_model(model: MMAModel) -> MMAModel:
    """Add a model to the registry under its name and aliases (case-insensitive); returns it.
    ValueError if a name is taken."""
    return _MODELS.register(model)


def mma_models() -> dict[str, MMAModel]:
    """Every registered model by canonical name (aliases in ``MMAModel.aliases``), in the order
    they were registered (NVIDIA by generation, then the IEEE models, then other vendors)."""
    return _MODELS.all()


def get_mma_model(model) -> MMAModel:
    """A model by name or alias (case-insensitive), or an :class:`MMAModel` passed through."""
    return _MODELS.get(model, "model")


def models_table_rows() -> list[tuple[str, ...]]:
    """Every registered model as table rows (header first): kind, evidence, each family of input
    formats with its evidence (and its number of instruction variants), assumed rules, aliases —
    ``mpt models`` and docs/targets.md."""
    rows = [("model", "kind", "evidence", "inputs: evidence", "assumptions", "aliases")]
    for m in _MODELS.all().values():
        groups: dict = {}   # (inputs, evidence) -> variants (instruction variants share a line)
        for c in m.configs:
            groups.setdefault(("/".join(c.inputs), c.evidence), []).append(c.variant)
        inputs = "; ".join(f + (f" ({len(v)} variants)" if len(v) > 1 else "") + f": {e}"
                           for (f, e), v in groups.items())
        assumed = ", ".join(f"{a.name} ({_alternatives(a.choices)})" for a in m.assumptions)
        rows.append((m.name, m.kind, m.evidence, inputs, assumed or "-",
                     ", ".join(m.aliases) or "-"))
    return rows


def _alternatives(choices) -> str:
    """'a', 'a or b', 'a, b or c' (the default first)."""
    return choices[0] if len(choices) == 1 else f"{', '.join(choices[:-1])} or {choices[-1]}"
