"""The AMD Matrix Core (MFMA) instructions mpt models, as data: one row per instruction variant.

A *variant* fixes everything the arithmetic depends on: the rule (see ``mpt.reference.mfma``),
K per instruction (per output element), the group size, CDNA2's flush, the input formats (any
combination of them for A and B) and the output format. Instructions of one model that differ
only in M×N or in the number of blocks (``_2b``, ``_4b``, ``_16b``) compute each output element
the same way, so they share a row. Rows are listed per model in the order a GEMM library would
pick them; the first row that takes a pair of input formats is the model's default for it
(:func:`default_variant`).

Evidence: "reference model" = MMA-Sim (arXiv:2511.10909, github microsoft/MMA-Sim,
``mmasim/isa/amd.py`` and ``simulator/amd.py``), checked on MI100/MI250/MI300 by its authors;
"assumption" = CDNA4, for which no arithmetic model is published (its accumulation is a named
choice of :data:`CDNA4_ACCUMULATIONS`).

Instruction names are AMD's ISA mnemonics (CDNA1/2 write ``v_mfma_f32_32x32x8f16``, CDNA3/4
``v_mfma_f32_32x32x8_f16``). Formats are mpt's names: ``tf32`` stands for xf32 (FP32 operands
whose low 13 bits are dropped), FNUZ fp8 is MI300's fp8/bf8, OCP fp8 is CDNA4's.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MFMAVariant", "MFMAModel", "CDNA4_ACCUMULATIONS", "MFMA_MODELS", "get_mfma_model",
           "default_variant"]

REFERENCE = "reference model"
ASSUMPTION = "assumption"

#: CDNA4's accumulation (an assumption): name -> what it means. Only one published candidate.
CDNA4_ACCUMULATIONS = {
    "cdna3": "CDNA3's FP8 rule (groups of 16, even/odd halves truncated at 24 bits, rounded "
             "toward -inf to 24 bits, C dropped 25 binades below, RNE to FP32 per group), with "
             "the two E8M0 scale exponents added to every product's exponent",
}


@dataclass(frozen=True)
class MFMAVariant:
    """One instruction variant: ``instructions`` it covers, ``k`` products per output element,
    ``rule`` ("fma", "pairwise", "fused", "fused_fp8"), ``group`` products per group, ``inputs``
    (format names, mixable between A and B), ``output`` ("fp32"/"fp64"), CDNA2's ``flush``,
    ``scaled`` (E8M0 scales per 32 k, CDNA4), ``evidence``."""

    instructions: tuple[str, ...]
    k: int
    rule: str
    group: int
    inputs: tuple[str, ...]
    output: str = "fp32"
    flush: bool = False
    scaled: bool = False
    evidence: str = REFERENCE

    @property
    def name(self) -> str:
        """The variant's first instruction (its name in messages and tables)."""
        return self.instructions[0]

    def as_dict(self) -> dict:
        """The description ``mpt.reference.mfma`` takes."""
        return {"rule": self.rule, "k": self.k, "group": self.group, "flush": self.flush,
                "out": self.output}

    def describe(self) -> dict:
        return {"instructions": list(self.instructions), "k": self.k, "rule": self.rule,
                "group": self.group, "inputs": list(self.inputs), "output": self.output,
                "flush": self.flush, "scaled": self.scaled, "evidence": self.evidence}


@dataclass(frozen=True)
class MFMAModel:
    """A CDNA generation: name, aliases, description, evidence label and its variants."""

    name: str
    aliases: tuple[str, ...]
    description: str
    evidence: str
    variants: tuple[MFMAVariant, ...]
    accumulation: str | None = None      # CDNA4's assumed rule (a key of CDNA4_ACCUMULATIONS)

    def describe(self) -> dict:
        return {"name": self.name, "aliases": list(self.aliases), "description": self.description,
                "evidence": self.evidence, "accumulation": self.accumulation,
                "variants": [v.describe() for v in self.variants]}


def _v(instructions, k, rule, group, inputs, **kw):
    return MFMAVariant(tuple(instructions.split()), k, rule, group, tuple(inputs.split()), **kw)


_FNUZ = "fp8_e4m3fnuz fp8_e5m2fnuz"
_OCP8 = "fp8_e4m3fn fp8_e5m2"
_F8F6F4 = _OCP8 + " fp6_e2m3fn fp6_e3m2fn fp4_e2m1fn"


def _cdna12(flush):
    """The f32, f16 and (pre-_1k) bf16 instructions CDNA1 introduced (CDNA2 keeps them)."""
    return (
        _v("v_mfma_f32_32x32x2f32", 2, "fma", 1, "fp32"),
        _v("v_mfma_f32_16x16x4f32", 4, "fma", 1, "fp32"),
        _v("v_mfma_f32_32x32x1f32 v_mfma_f32_16x16x1f32 v_mfma_f32_4x4x1f32", 1, "fma", 1,
           "fp32"),
        _v("v_mfma_f32_16x16x16f16", 16, "pairwise", 4, "fp16", flush=flush),
        _v("v_mfma_f32_32x32x8f16", 8, "pairwise", 4, "fp16", flush=flush),
        _v("v_mfma_f32_32x32x4f16 v_mfma_f32_16x16x4f16 v_mfma_f32_4x4x4f16", 4, "pairwise", 4,
           "fp16", flush=flush),
        _v("v_mfma_f32_16x16x8bf16", 8, "pairwise", 2, "bf16", flush=flush),
        _v("v_mfma_f32_32x32x4bf16", 4, "pairwise", 2, "bf16", flush=flush),
        _v("v_mfma_f32_32x32x2bf16 v_mfma_f32_16x16x2bf16 v_mfma_f32_4x4x2bf16", 2, "pairwise",
           2, "bf16", flush=flush),
    )


_CDNA2_ONLY = (
    _v("v_mfma_f32_16x16x16bf16_1k", 16, "pairwise", 4, "bf16", flush=True),
    _v("v_mfma_f32_32x32x8bf16_1k", 8, "pairwise", 4, "bf16", flush=True),
    _v("v_mfma_f32_32x32x4bf16_1k v_mfma_f32_16x16x4bf16_1k v_mfma_f32_4x4x4bf16_1k", 4,
       "pairwise", 4, "bf16", flush=True),
    _v("v_mfma_f64_16x16x4f64 v_mfma_f64_4x4x4f64", 4, "fma", 1, "fp64", output="fp64"),
)

_CDNA3 = (
    _v("v_mfma_f32_16x16x16_f16", 16, "fused", 8, "fp16"),
    _v("v_mfma_f32_32x32x8_f16", 8, "fused", 8, "fp16"),
    _v("v_mfma_f32_32x32x4_2b_f16 v_mfma_f32_16x16x4_4b_f16 v_mfma_f32_4x4x4_16b_f16", 4, "fused",
       4, "fp16"),
    _v("v_mfma_f32_16x16x16_bf16", 16, "fused", 8, "bf16"),
    _v("v_mfma_f32_32x32x8_bf16", 8, "fused", 8, "bf16"),
    _v("v_mfma_f32_32x32x4_2b_bf16 v_mfma_f32_16x16x4_4b_bf16 v_mfma_f32_4x4x4_16b_bf16", 4,
       "fused", 4, "bf16"),
    _v("v_mfma_f32_16x16x8_xf32", 8, "fused", 4, "tf32"),
    _v("v_mfma_f32_32x32x4_xf32", 4, "fused", 4, "tf32"),
    _v("v_mfma_f32_16x16x32_fp8_fp8 v_mfma_f32_16x16x32_fp8_bf8 v_mfma_f32_16x16x32_bf8_fp8 "
       "v_mfma_f32_16x16x32_bf8_bf8", 32, "fused_fp8", 16, _FNUZ),
    _v("v_mfma_f32_32x32x16_fp8_fp8 v_mfma_f32_32x32x16_fp8_bf8 v_mfma_f32_32x32x16_bf8_fp8 "
       "v_mfma_f32_32x32x16_bf8_bf8", 16, "fused_fp8", 16, _FNUZ),
    _v("v_mfma_f32_16x16x4_f32", 4, "fma", 1, "fp32"),
    _v("v_mfma_f32_32x32x2_f32", 2, "fma", 1, "fp32"),
    _v("v_mfma_f32_32x32x1_2b_f32 v_mfma_f32_16x16x1_4b_f32 v_mfma_f32_4x4x1_16b_f32", 1, "fma",
       1, "fp32"),
    _v("v_mfma_f64_16x16x4_f64 v_mfma_f64_4x4x4_4b_f64", 4, "fma", 1, "fp64", output="fp64"),
)

_CDNA4 = (
    _v("v_mfma_f32_16x16x32_fp8_fp8 v_mfma_f32_16x16x32_fp8_bf8 v_mfma_f32_16x16x32_bf8_fp8 "
       "v_mfma_f32_16x16x32_bf8_bf8", 32, "fused_fp8", 16, _OCP8, evidence=ASSUMPTION),
    _v("v_mfma_f32_32x32x16_fp8_fp8 v_mfma_f32_32x32x16_fp8_bf8 v_mfma_f32_32x32x16_bf8_fp8 "
       "v_mfma_f32_32x32x16_bf8_bf8", 16, "fused_fp8", 16, _OCP8, evidence=ASSUMPTION),
    _v("v_mfma_scale_f32_16x16x128_f8f6f4", 128, "fused_fp8", 16, _F8F6F4, scaled=True,
       evidence=ASSUMPTION),
    _v("v_mfma_scale_f32_32x32x64_f8f6f4", 64, "fused_fp8", 16, _F8F6F4, scaled=True,
       evidence=ASSUMPTION),
    _v("v_mfma_f32_16x16x128_f8f6f4", 128, "fused_fp8", 16, _F8F6F4, evidence=ASSUMPTION),
    _v("v_mfma_f32_32x32x64_f8f6f4", 64, "fused_fp8", 16, _F8F6F4, evidence=ASSUMPTION),
)

MFMA_MODELS = {m.name: m for m in (
    MFMAModel("cdna1", ("mi100",), "AMD Instinct MI100 Matrix Cores (gfx908)", REFERENCE,
              _cdna12(flush=False)),
    MFMAModel("cdna2", ("mi200", "mi210", "mi250", "mi250x"),
              "AMD Instinct MI200-series Matrix Cores (gfx90a): CDNA1's arithmetic with "
              "FP16/BF16 subnormals flushed", REFERENCE, _CDNA2_ONLY[:3] + _cdna12(flush=True)
              + _CDNA2_ONLY[3:]),
    MFMAModel("cdna3", ("mi300", "mi300a", "mi300x", "mi325x"),
              "AMD Instinct MI300-series Matrix Cores (gfx942)", REFERENCE, _CDNA3),
    MFMAModel("cdna4", ("mi350", "mi355x"),
              "AMD Instinct MI350-series Matrix Cores (gfx950): OCP fp8 and MX f8f6f4 with E8M0 "
              "block scales; accumulation assumed (CDNA3's FP8 rule, scales as exponent adds)",
              ASSUMPTION, _CDNA4, accumulation="cdna3"),
)}

_BY_NAME = {key: m for m in MFMA_MODELS.values() for key in (m.name, *m.aliases)}


def get_mfma_model(name: str) -> MFMAModel:
    """A model by name or alias (case-insensitive); ValueError listing the valid ones."""
    found = _BY_NAME.get(name.lower()) if isinstance(name, str) else None
    if found is None:
        valid = ", ".join(f"{m.name} ({'/'.join(m.aliases)})" for m in MFMA_MODELS.values())
        raise ValueError(f"unknown MFMA model {name!r}; valid models: {valid}")
    return found


def default_variant(model: str, a_format: str, b_format: str, *, scaled: bool = False,
                    instruction: str | None = None,
                    accumulation: str | None = None) -> MFMAVariant:
    """The variant of ``model`` for these input formats: the named ``instruction``, else the
    first (the default) that takes both formats (and scales, if ``scaled``).

    ``accumulation``: CDNA4's assumed rule, one of :data:`CDNA4_ACCUMULATIONS` (None: the
    model's default); other models have no assumed rule and take None only.
    """
    m = get_mfma_model(model)
    if accumulation is not None and accumulation != m.accumulation:
        if m.accumulation is None:
            raise ValueError(f"model {m.name!r} has no assumed accumulation rule; "
                             f"accumulation must be None, got {accumulation!r}")
        raise ValueError(f"accumulation must be one of {list(CDNA4_ACCUMULATIONS)}; "
                         f"got {accumulation!r}")
    for v in m.variants:
        if instruction is not None:
            if instruction in v.instructions:
                if a_format in v.inputs and b_format in v.inputs:
                    return v
                raise ValueError(f"{instruction} takes {'/'.join(v.inputs)} inputs; got "
                                 f"({a_format}, {b_format})")
        elif a_format in v.inputs and b_format in v.inputs and v.scaled == scaled:
            return v
    if instruction is not None:
        names = ", ".join(i for v in m.variants for i in v.instructions)
        raise ValueError(f"model {m.name!r} has no instruction {instruction!r}; it has: {names}")
    takes = "; ".join(sorted({"/".join(v.inputs) + (" (scaled)" if v.scaled else "")
                              for v in m.variants}))
    raise ValueError(f"model {m.name!r} does not take inputs ({a_format}, {b_format})"
                     f"{' with scales' if scaled else ''}; it takes: {takes}")
