"""L5: the published test vectors — V1–V9 and F3–F15 of docs/tensor_cores.md §3, and the open
zero-rule vectors D1–D5 of docs/accelerators.md §1 with their two candidate answers.

Each vector is one probe of length 16 (the instruction K the sources used; rounded up to a
multiple of the adapter's instruction K), run on every (input, output) pair whose formats hold its
values. Its result is reported with what the documented answers mean (``meanings``: result bits
-> text); an answer not in the table is shown as it is. The D vectors name the preset their two
answers were computed for: a GPU of that family answers with mpt's rule or MMA-Sim's.

Sources: Khattak & Mikaitis, arXiv:2512.07004 (V1–V9, F3–F15, measured on V100/A100/H100);
Fasi et al., PeerJ Comput. Sci. 7:e330 (2021); Xie et al. (MMA-Sim), arXiv:2511.10909 (the
D-vector answers of its zero rule).
"""
from __future__ import annotations

from dataclasses import dataclass

from mpt.characterize.probes import ProbeBuilder

__all__ = ["SpecVector", "VECTORS", "add_spec_vectors", "LENGTH"]

#: K of every spec vector (the sources' instruction shape)
LENGTH = 16
_FLT_MAX = float.fromhex("0x1.fffffep127")


@dataclass(frozen=True)
class SpecVector:
    """One published vector: ``a``, ``b`` (values, or raw storage bits with ``bits=True``), ``c``
    (a value, or raw output bits), the output format, the input formats it is defined for
    (``()``: any that holds its values), what it shows and the documented answers."""

    name: str
    shows: str
    a: tuple
    b: tuple
    c: float | int
    out: str = "fp32"
    inputs: tuple[str, ...] = ()
    meanings: tuple[tuple[int, str], ...] = ()
    bits: bool = False


def _v(name, shows, a, b, c, out="fp32", inputs=(), meanings=(), bits=False):
    return SpecVector(name, shows, tuple(a), tuple(b), c, out, tuple(inputs), tuple(meanings),
                      bits)


def _d(name, preset, fmt, a, b, c, mpt_bits, sim_bits, out="fp32"):
    """A zero-rule vector (bit patterns) and its two candidate answers on ``preset``."""
    return _v(name, f"zero rule ({preset} {fmt} -> {out})", a, b, c, out, (fmt,), (
        (mpt_bits, f"as mpt's zero rule on {preset} (e_zero, signed zeros kept)"),
        (sim_bits, f"as MMA-Sim's zero rule on {preset} (zeros at 2^-126, zero results +0)")),
        bits=True)


VECTORS = (
    _v("V1", "F, the alignment bits", [1, -1], [2, 2], 2.0**-13 - 2.0**-24,
       meanings=((0x38FF8000, "F = 23 (Volta)"), (0x38FFC000, "F = 24 (Turing, Ampere, Ada)"),
                 (0x38FFE000, "F = 25 (Hopper, Blackwell)"))),
    _v("V2", "the generation", [-2.0**13, -0.5, -0.25, -0.125], [2.0**10, 1, 1, 1], 2.0**23,
       meanings=((0xBF600000, "exact (-0.875)"), (0x00000000, "+0: Volta; Ada, Hopper FP8"),
                 (0xBF000000, "-0.5: Turing, Ampere, Ada (fp16/bf16/tf32)"),
                 (0xBF400000, "-0.75: Hopper, Blackwell"))),
    _v("V3", "L, the block size (fp16, K = 16)", [2.0**7] + [2.0**-9] * 15,
       [2.0**7] + [2.0**-9] * 15, -2.0**14,
       meanings=((0x38400000, "1.5*2^-15: 4 blocks (Volta)"),
                 (0x38000000, "2^-15: 2 blocks (Turing, Ampere)"),
                 (0x00000000, "0: 1 block (Hopper)"))),
    _v("V4", "the FP8 accumulator", [0], [0], 0x3F800008, bits=True,
       meanings=((0x3F800000, "13 fraction bits kept (Ada, Hopper FP8)"),
                 (0x3F800008, "unchanged (FP32 accumulator)"))),
    _v("V4b", "the FP8 accumulator", [1, -1], [1, 1], 2.0**-10 + 2.0**-20,
       meanings=((0x3A800000, "Hopper FP8"), (0x3A802000, "Blackwell FP8 (FP32 kept)"))),
    _v("V5", "one FP16 rounding", [0.5] * 4, [1, 1, 2.0**-10, 2.0**-23], 0.0, out="fp16",
       meanings=((0x3C01, "one rounding to FP16 (every preset)"),)),
    _v("V6a", "RNE to FP16", [0.5], [1], 1024.0, out="fp16",
       meanings=((0x6400, "1024: ties to even"),)),
    _v("V6b", "RNE to FP16", [1.5], [1], 1024.0, out="fp16", meanings=((0x6402, "1026"),)),
    _v("V6c", "FP16 overflow", [16], [1], 65504.0, out="fp16", meanings=((0x7C00, "+Inf"),)),
    _v("V6d", "FP16 overflow", [8], [1], 65504.0, out="fp16", meanings=((0x7BFF, "65504"),)),
    _v("V7", "RZ to FP32", [0.25] * 4, [1] * 4, 0.75 * 2.0**-23,
       meanings=((0x3F800000, "1.0: toward zero"),)),
    _v("V7-", "RZ to FP32", [-0.25] * 4, [1] * 4, -0.75 * 2.0**-23,
       meanings=((0xBF800000, "-1.0: toward zero"),)),
    _v("V7b", "FP32 overflow under RZ", [0.75, 0.75], [2.0**127, 2.0**127], _FLT_MAX / 4,
       inputs=("bf16",), meanings=((0x7F7FFFFF, "FLT_MAX: RZ saturates below 2^128"),)),
    _v("V7b2", "FP32 overflow", [1, 1], [2.0**127, 2.0**127], 0.0, inputs=("bf16",),
       meanings=((0x7F800000, "+Inf"),)),
    _v("V8", "sign of zero (FP32)", [-0.0] * LENGTH, [1] * LENGTH, -0.0,
       meanings=((0x00000000, "+0"), (0x80000000, "-0 (IEEE addition)"))),
    _v("V8h", "sign of zero (FP16)", [-0.0] * LENGTH, [1] * LENGTH, -0.0, out="fp16",
       meanings=((0x0000, "+0"), (0x8000, "-0 (IEEE addition)"))),
    _v("V9", "TF32 truncation", [0x3F800600], [0x3F800000], 0, inputs=("tf32",), bits=True,
       meanings=((0x3F800000, "1.0: low 13 bits dropped"),)),
    _v("V9n", "TF32 truncation of a NaN", [0x7F800001], [0x3F800000], 0, inputs=("tf32",),
       bits=True, meanings=((0x7F800000, "+Inf: the NaN's payload was in the dropped bits"),)),
    _v("F3", "exact products", [1 - 2.0**-11], [1 - 2.0**-11], 0.0,
       meanings=((0x3F7FC004, "1 - 2^-10 + 2^-22: exact"),)),
    _v("F10", "extra bits", [1], [1], -(1 - 2.0**-24),
       meanings=((0x34000000, "2^-23 (Volta)"), (0x33800000, "2^-24 (Turing, Ampere)"))),
    _v("F11", "non-monotonic (Volta)", [1] * 4, [2.0**-24] * 4, 1 - 2.0**-24,
       meanings=((0x3F800001, "1 + 2^-23: non-monotonic (Volta)"),)),
    _v("F11c", "non-monotonic (Volta), larger c", [1] * 4, [2.0**-24] * 4, 1.0,
       meanings=((0x3F800000, "1"),)),
    _v("F11t", "non-monotonic (Turing, Ampere)", [0.5] * 4,
       [2.0**-24, 2.0**-24, 2.0**-24, 2.0**-23 + 2.0**-24], 1 - 2.0**-24,
       meanings=((0x3F800001, "1 + 2^-23: non-monotonic (Turing, Ampere)"),)),
    _v("F11tc", "non-monotonic (Turing, Ampere), larger c", [0.5] * 4,
       [2.0**-24, 2.0**-24, 2.0**-24, 2.0**-23 + 2.0**-24], 1.0, meanings=((0x3F800000, "1"),)),
    _v("F12", "extra bits", [1, 1], [1, -2.0**-24], -1 + 2.0**-24,
       meanings=((0x34000000, "2^-23 (Volta)"), (0x00000000, "0 (Turing, Ampere)"))),
    _v("F14", "carries", [1] * 4, [1, 1.5, 1.75, 1.875], 1.875, meanings=((0x41000000, "8"),)),
    _v("F15", "RZ", [1] * 4, [1] * 4, 1 + 2.0**-22 + 2.0**-23,
       meanings=((0x40A00000, "5: toward zero"),)),
    _v("F15-", "RZ", [-1] * 4, [1] * 4, -(1 + 2.0**-22 + 2.0**-23),
       meanings=((0xC0A00000, "-5: toward zero"),)),
    _d("D1", "Hopper", "bf16", [0x0000, 0x2180], [0x7180, 0x2180], 0, 0x03800000, 0x00000000),
    _d("D2", "Hopper", "bf16", [0x1980] * 16, [0x1980] * 16, 0, 0x00000002, 0x00000000),
    _d("D3", "Ampere", "fp16", [0x0000] * 16, [0x7800] * 16, 0x00800001, 0x00800001,
       0x00800000),
    _d("D4", "Hopper", "fp16", [0x8C00], [0x0400], 0, 0x8000, 0x0000, out="fp16"),
    _d("D5", "Ampere", "fp16", [0x0C00, 0x0001], [0x0800, 0x0001], 0, 0x0000, 0x0001,
       out="fp16"),
)


def add_spec_vectors(builder: ProbeBuilder, length: int = LENGTH) -> None:
    """Add every vector defined for the builder's formats that they hold exactly (family
    ``"spec"``, key ``("spec", name)``), each of K = ``length``."""
    for v in VECTORS:
        if v.out != builder.fout.name or (v.inputs and builder.fin.name not in v.inputs):
            continue
        note = f"{v.shows}: a = {list(v.a)}, b = {list(v.b)}, c = {v.c!r}"
        if v.bits:
            builder.add_bits("spec", (v.name,), v.a, v.b, v.c, note, length)
        else:
            terms = {k: (float(x), float(y)) for k, (x, y) in enumerate(zip(v.a, v.b))}
            builder.add("spec", (v.name,), terms, float(v.c), note, length)


def meaning(name: str, bits: int) -> str:
    """What the documented answers say a result of spec vector ``name`` means ('' if none)."""
    for v in VECTORS:
        if v.name == name:
            return dict(v.meanings).get(int(bits), "")
    return ""
