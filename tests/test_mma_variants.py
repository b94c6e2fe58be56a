"""Instruction variants of the MMA presets (issue 14) through ``mpt.mma``: FP8 inputs with FP16
output (Hopper, Blackwell, RTX Blackwell), the smaller ``mma.sync`` shapes chained as blocks of
their own K (Turing m8n8k4; Hopper/Blackwell m16n8k8 fp16/bf16 and m16n8k4 tf32; RTX Blackwell
m16n8k16 FP8), and FP64 (sequential float64 FMA) on Ampere and Hopper.

The expected bits of the directed vectors are MMA-Sim's (github microsoft/MMA-Sim, commit
c785138; run outside this repository) for the instructions it lists, and worked out by hand from
its parameters (``simulator/nv_ptx.py``: F, L, no split for RTX Blackwell) for the two marked
"by hand". Parameters found (``isa/nv_ptx/*.py``), checked on these vectors and on 21,504 random
outputs of the same instructions (0 mismatches; the random outputs pin F for FP32 outputs, while
FP16 outputs need the tie vectors T12..T25 below):
  Hopper wgmma k32 FP8 -> FP16:          L=32, F=13, RNE-FP16
  Blackwell tcgen05 kind::f8f6f4 -> FP16: L=32, F=25, RNE-FP16
  RTX Blackwell mma.sync m16n8k32 f8f6f4: L=32, F=25, RZ-FP32 / RNE-FP16 (FP8 k16: L=16, F=25)
  Turing mma.sync m8n8k4 FP16:            L=4,  F=24
  Hopper/Blackwell mma.sync m16n8k8 f16/bf16: L=8, F=25; m16n8k4 tf32: L=4, F=25
The e_zero values are mpt's (assumed where not measured): the vectors avoid them.
"""
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpt
from mpt.kernels.ops import matmul_f64

DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "f16": np.float16,
          "bf16": ml_dtypes.bfloat16, "tf32": np.float32}

V1 = ([1.0, -1.0], [2.0, 2.0], 2.0**-13 - 2.0**-24)       # finds F (spec V1)
V3 = ([2.0**7] + [2.0**-9] * 15,) * 2 + (-(2.0**14),)      # finds L (spec V3)
V3_8 = (V3[0][:8], V3[1][:8], V3[2])
V4B = ([1.0, -1.0], [1.0, 1.0], 2.0**-10 + 2.0**-20)      # FP8 accumulator width, FP16 out
# FP16 output: 1 + 2^-11 is a tie that goes down to 1; a third term 2^-t tips it up iff kept,
# i.e. iff F >= t (anchor 2^0): F-pinning vectors that survive the final RNE-FP16
T12 = ([2.0**-5, 2.0**-6], [2.0**-6, 2.0**-7], 1.0)       # 2^-13 kept iff F >= 13
T13 = ([2.0**-5, 2.0**-7], [2.0**-6, 2.0**-7], 1.0)       # 2^-14 kept iff F >= 14
T24 = ([2.0**-5, 2.0**-13], [2.0**-6, 2.0**-12], 1.0)     # 2^-25 kept iff F >= 25 (fp16)
T25 = ([2.0**-5, 2.0**-16], [2.0**-6, 2.0**-9], 1.0)      # the same with e5m2 · e4m3

V3_32 = ([2.0**7] + [2.0**-9] * 31,) * 2 + (-(2.0**14),)  # L=32 vs 16 (32 products)

# (instruction, model, variant, inputs (a, b), output, vector, MMA-Sim's output bits)
CASES = [
    ("hopper wgmma k32 e4m3->f16 (F>=13)", "hopper", None, "e4m3", "f16", T12, 0x3C01),
    ("hopper wgmma k32 e4m3->f16 (F<=13)", "hopper", None, "e4m3", "f16", T13, 0x3C00),
    ("hopper wgmma k32 e4m3->f16", "hopper", None, "e4m3", "f16", V4B, 0x1400),
    ("blackwell tcgen05 f8f6f4 e5m2.e4m3->f16 (F>=25)", "blackwell", None, ("e5m2", "e4m3"),
     "f16", T25, 0x3C01),
    ("rtx_blackwell mma k32 e5m2.e4m3->f16 (F>=25)", "rtx_blackwell", None, ("e5m2", "e4m3"),
     "f16", T25, 0x3C01),
    ("turing mma m8n8k4 f16->f16 (F<=24)", "turing", "m8n8k4", "f16", "f16", T24, 0x3C00),
    ("hopper mma k8 f16->f16 (F>=25)", "hopper", "m16n8k8", "f16", "f16", T24, 0x3C01),
    ("blackwell tcgen05 f8f6f4 e4m3->f16", "blackwell", None, "e4m3", "f16", V4B, 0x1401),
    ("rtx_blackwell mma k32 e4m3->f16", "rtx_blackwell", None, "e4m3", "f16", V4B, 0x1401),
    ("rtx_blackwell mma k32 e4m3->f32", "rtx_blackwell", None, "e4m3", "f32", V1, 0x38FFE000),
    ("turing mma m8n8k4 f16->f32 (F)", "turing", "m8n8k4", "f16", "f32", V1, 0x38FFC000),
    ("turing mma m8n8k4 f16->f32 (L)", "turing", "m8n8k4", "f16", "f32", V3, 0x38400000),
    ("hopper mma k8 f16->f32 (F)", "hopper", "m16n8k8", "f16", "f32", V1, 0x38FFE000),
    ("hopper mma k8 f16->f32 (L)", "hopper", "m16n8k8", "f16", "f32", V3, 0x38000000),
    ("hopper mma k16 f16->f32 (L)", "hopper", None, "f16", "f32", V3, 0x00000000),
    ("hopper mma k8 bf16->f32 (L)", "hopper", "m16n8k8", "bf16", "f32", V3, 0x38000000),
    ("blackwell mma k8 bf16->f32 (L)", "blackwell", "m16n8k8", "bf16", "f32", V3, 0x38000000),
    ("blackwell mma k8 f16->f32 (F)", "blackwell", "m16n8k8", "f16", "f32", V1, 0x38FFE000),
    ("hopper mma k4 tf32 (F)", "hopper", "m16n8k4", "tf32", "f32", V1, 0x38FFE000),
    ("hopper mma k4 tf32 (L)", "hopper", "m16n8k4", "tf32", "f32", V3_8, 0x37800000),
    ("hopper mma k8 tf32 (L)", "hopper", None, "tf32", "f32", V3_8, 0x00000000),
    ("blackwell mma k4 tf32 (L)", "blackwell", "m16n8k4", "tf32", "f32", V3_8, 0x37800000),
    # by hand from MMA-Sim's parameters: RTX Blackwell's FP8 k16 is one block of 16, k32 of 32
    ("rtx_blackwell mma k16 e4m3->f32 (L, by hand)", "rtx_blackwell", "m16n8k16", "e4m3", "f32",
     V3_32, 0x38800000),
    ("rtx_blackwell mma k32 e4m3->f32 (L, by hand)", "rtx_blackwell", None, "e4m3", "f32", V3_32,
     0x00000000),
]
_FORMATS = {"f16": "fp16", "f32": "fp32"}


def run(model, variant, fmt, out, vector):
    """One output of mpt.mma on the vector (a (1, K), b (K, 1), c); returns the output's bits."""
    a, b, c = vector
    fa, fb = (fmt, fmt) if isinstance(fmt, str) else fmt
    av = np.asarray(a, np.float64).astype(DTYPES[fa])[None, :]
    bv = np.asarray(b, np.float64).astype(DTYPES[fb])[:, None]
    in_format = "tf32" if fa == "tf32" else None
    cv = np.array([[c]], np.float32 if out == "f32" else np.float16)
    d = mpt.mma(av, bv, cv, model=model, variant=variant, in_format=in_format)
    return int(d.view(np.uint32 if out == "f32" else np.uint16)[0, 0])


@pytest.mark.parametrize("name, model, variant, fmt, out, vector, want", CASES,
                         ids=[c[0] for c in CASES])
def test_variant_matches_mma_sim(name, model, variant, fmt, out, vector, want):
    assert run(model, variant, fmt, out, vector) == want


def test_the_vectors_separate_the_variants():
    """Each L vector tells a variant from its preset's default (another L gives other bits)."""
    assert run("turing", None, "f16", "f32", V3) != 0x38400000            # L=8: 2^-15
    assert run("hopper", None, "f16", "f32", V3) != run("hopper", "m16n8k8", "f16", "f32", V3)
    assert run("hopper", None, "tf32", "f32", V3_8) != 0x37800000
    assert run("rtx_blackwell", None, "e4m3", "f32", V3_32) != 0x38800000
    assert run("hopper", None, "e4m3", "f16", T12) == 0x3C01              # F=13 keeps 2^-13
    assert run("ada", None, "e4m3", "f16", T12) == 0x3C01


# ---- FP64: sequential float64 FMA ----------------------------------------------------------------
def fma_chain_reference(a, b, c):
    """c, then c = RN64(a_k·b_k + c) for each k in increasing order, in exact rationals (Python's
    float(Fraction) rounds to nearest even)."""
    acc = c
    for x, y in zip(a, b):
        acc = float(Fraction(x) * Fraction(y) + Fraction(acc))
    return acc


@settings(max_examples=25)
@given(seed=st.integers(0, 2**32 - 1), model=st.sampled_from(["ampere", "hopper"]),
       k=st.integers(0, 40))
def test_fp64_is_sequential_fma_against_exact_rationals(seed, model, k):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((3, k)) * np.exp2(rng.integers(-60, 60, (3, k)))
    b = rng.standard_normal((k, 2)) * np.exp2(rng.integers(-60, 60, (k, 2)))
    c = rng.standard_normal((3, 2))
    d = mpt.mma(a, b, c, model=model)
    assert d.dtype == np.float64
    for i in range(3):
        for j in range(2):
            want = fma_chain_reference(a[i].tolist(), b[:, j].tolist(), float(c[i, j]))
            assert d[i, j].view(np.uint64) == np.float64(want).view(np.uint64)
    assert np.array_equal(mpt.mma(a, b, model=model).view(np.uint64),
                          matmul_f64(a[None], b[None])[0].view(np.uint64))   # one kernel


def test_fp64_directed_vectors():
    """1 + 2^-53 + 2^-53: each FMA rounds the tie to 1 (sequential), where one rounding of the
    exact sum gives 1 + 2^-52; (1 + 2^-30)(1 - 2^-30) - 1 = -2^-60 exactly with an FMA (a
    separate multiply gives 0); specials propagate."""
    one = np.ones((1, 2))
    d = mpt.mma(one, np.full((2, 1), 2.0**-53), np.ones((1, 1)), model="ampere")
    assert d[0, 0] == 1.0
    d = mpt.mma(np.array([[1 + 2.0**-30]]), np.array([[1 - 2.0**-30]]), -np.ones((1, 1)),
                model="hopper")
    assert d[0, 0] == -(2.0**-60)
    d = mpt.mma(np.array([[np.inf, 1.0]]), np.array([[0.0], [1.0]]), model="h100")
    assert np.isnan(d[0, 0])
    with pytest.raises(ValueError, match="does not take inputs"):
        mpt.mma(np.ones((1, 2)), np.ones((2, 1)), model="volta")
