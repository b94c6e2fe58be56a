"""AMD Matrix Core (MFMA) kernels: against their exact oracle, directed vectors, chaining.

Kernel level: ``_run`` decodes bit patterns and drives ``mpt.kernels.mfma.MFMAOperands``.
Expectations are bit patterns: the property tests compare with ``mpt.reference.mfma`` (exact
rationals) on random patterns with zeros, subnormals, Inf, NaN and extreme exponents; the
directed vectors carry their derivation in a comment. NVIDIA results come from ``mpt.mma``.
"""
import math
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpt
from mpt.formats import get_format
from mpt.kernels.mfma import MFMAOperands, decode
from mpt.kernels.mfma_variants import MFMA_MODELS, default_variant, get_mfma_model
from mpt.reference.mfma import mfma_reference

NVIDIA = ["volta", "turing", "ampere", "ada", "hopper", "blackwell"]


def _width(fmt):
    return {"tf32": 32, "fp32": 32, "fp64": 64}.get(fmt) or get_format(fmt).bits


def _array(bits, fmt):
    """An array of fmt (float32 for tf32) holding the bit patterns ``bits`` (uint64 array)."""
    bits = np.asarray(bits, np.uint64)
    if fmt in ("fp32", "tf32"):
        return bits.astype(np.uint32).view(np.float32)
    if fmt == "fp64":
        return bits.view(np.float64)
    storage = np.uint8 if get_format(fmt).bits <= 8 else np.uint16
    return bits.astype(storage).view(get_format(fmt).dtype)


def _run(variant, a, b, c, fa, fb, scale_a=None, scale_b=None, steps=None):
    """D bits of the kernels for (M, K), (K, N), (M, N) bit patterns (one batch element), the
    chain run in one call or, with ``steps``, one call per k-range boundary in steps."""
    zero = np.zeros(1, np.int64)
    sa = None if scale_a is None else np.asarray(scale_a, np.uint8)[None]
    sb = None if scale_b is None else np.asarray(scale_b, np.uint8)[None]
    ops = MFMAOperands(variant, _array(a, fa)[None], _array(b, fb)[None], zero, zero, fa, fb,
                       sa, sb)
    acc = ops.new_acc(_array(c, variant.output)[None])
    k = np.shape(a)[1]
    bounds = [0] + list(steps or []) + [k]
    for k0, k1 in zip(bounds[:-1], bounds[1:]):
        ops.chain(acc, k0, k1)
    d = ops.values(acc)[0]
    return d.view(np.uint64 if variant.output == "fp64" else np.uint32).astype(np.uint64)


def _patterns(rng, fmt, shape, center, mix):
    """Bit patterns of fmt: uniformly random (every exponent, subnormals, Inf, NaN), exponent
    fields within ±2 of ``center`` (cancellation, truncation), and specials, mixed by ``mix``."""
    f = get_format("fp32" if fmt == "tf32" else fmt)
    width, m, e = _width(fmt), f.mantissa_bits, f.exponent_bits
    top = (1 << e) - 1
    center = min(max(center, 0), top)
    uniform = rng.integers(0, 1 << min(width, 63), shape, dtype=np.uint64) \
        | (rng.integers(0, 2, shape, dtype=np.uint64) << np.uint64(width - 1))
    field = np.clip(center + rng.integers(-2, 3, shape), 0, top).astype(np.uint64)
    near = (rng.integers(0, 2, shape, dtype=np.uint64) << np.uint64(width - 1)) \
        | (field << np.uint64(m)) | rng.integers(0, 1 << min(m, 62), shape, dtype=np.uint64)
    ones = (1 << width) - 1
    specials = rng.choice(np.array([0, 1 << (width - 1), 1, (top << m) - 1, top << m,
                                    (top << m) | 1, ones, 1 << m, ones >> 1], np.uint64), shape)
    return np.choose(rng.choice(3, shape, p=mix), [uniform, near, specials])


def _configs():
    """(model, variant, format of a, format of b): every variant, each format with itself and
    one mixed pair where the variant mixes."""
    out = []
    for name, model in MFMA_MODELS.items():
        for v in model.variants:
            pairs = [(f, f) for f in v.inputs] + ([v.inputs[:2]] if len(v.inputs) > 1 else [])
            if len(v.inputs) > 2:
                pairs.append((v.inputs[-1], v.inputs[2]))    # fp4 x fp6
            for fa, fb in pairs:
                out.append(pytest.param(name, v, fa, fb, id=f"{name}-{v.name}-{fa}-{fb}"))
    return out


@pytest.mark.parametrize("model, variant, fa, fb", _configs())
@given(data=st.data())
@settings(max_examples=25)
def test_kernels_match_oracle(model, variant, fa, fb, data):
    """D bits equal the exact oracle's; K spans a partial instruction up to two and a bit."""
    m, n = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
    k = data.draw(st.integers(1, 2 * variant.k + 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    bias = {f: get_format("fp32" if f == "tf32" else f).bias for f in (fa, fb, variant.output)}
    if data.draw(st.booleans()):   # tame: finite, moderate (the register-blocked path)
        ca, cb = (bias[f] + int(rng.integers(-3, 4)) for f in (fa, fb))
        mix = (0.0, 1.0, 0.0)
    else:
        ca, cb = (int(rng.integers(0, 1 << get_format("fp32" if f == "tf32" else f)
                                   .exponent_bits)) for f in (fa, fb))
        mix = data.draw(st.sampled_from([(0.1, 0.9, 0.0), (0.2, 0.78, 0.02), (0.3, 0.5, 0.2)]))
    a = _patterns(rng, fa, (m, k), ca, mix)
    b = _patterns(rng, fb, (k, n), cb, mix)
    a[rng.random(a.shape) < 0.1] = 0
    aligned = bias[variant.output] + ca - bias[fa] + cb - bias[fb]
    c = _patterns(rng, variant.output, (m, n), data.draw(st.sampled_from(
        [aligned, aligned - 26, int(rng.integers(0, 256))])), (0.2, 0.7, 0.1))
    sa = sb = None
    if variant.scaled:
        blocks = -(-k // 32)
        sa = rng.integers(0, 256, (m, blocks)) if mix[0] else 127 + rng.integers(-3, 4, (m, blocks))
        sb = rng.integers(0, 256, (blocks, n)) if mix[0] else 127 + rng.integers(-3, 4, (blocks, n))
    got = _run(variant, a, b, c, fa, fb, sa, sb)
    want = mfma_reference(a.tolist(), b.tolist(), c.tolist(), variant.as_dict(), fa, fb,
                          None if sa is None else sa.tolist(), None if sb is None else sb.tolist())
    assert got.tolist() == want


# ---- directed vectors ---------------------------------------------------------------------------
# Each vector is one output element: a (1, K), b (K, 1) values, c a value (or FP32 bits); the
# expected bits per model, and the AMD models it separates from every NVIDIA preset.

class Bits(int):
    """A bit pattern, not a value."""


def _bits_of(values, fmt):
    """Patterns of exactly representable values (:class:`Bits` are patterns already)."""
    out = []
    for v in values:
        if isinstance(v, Bits):
            out.append(int(v))
            continue
        x = np.array([v], np.float64).astype(np.float32)
        x = x if fmt in ("fp32", "tf32") else x.astype(get_format(fmt).dtype)
        assert float(x[0]) == v or (math.isnan(v) and np.isnan(x[0])), (v, fmt)
        out.append(int(x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.itemsize])[0]))
    return out


def _vector(model, a, b, c, fmt, instruction=None, out_bits=True):
    v = default_variant(model, fmt, fmt, instruction=instruction)
    k = len(a)
    got = _run(v, np.array([_bits_of(a, fmt)], np.uint64), np.array([_bits_of(b, fmt)],
               np.uint64).T, np.array([_bits_of([c], "fp32")], np.uint64), fmt, fmt)
    assert got.shape == (1, 1) and k
    return int(got[0, 0])


def _nvidia(model, a, b, c, fmt):
    """Bits of an NVIDIA preset on the vector, or None if it does not take fmt."""
    try:
        cfg = mpt.get_mma_model(model).config(fmt, fmt)
    except ValueError:
        return None
    del cfg
    x = _array(_bits_of(a, fmt), fmt)[None, :]
    y = _array(_bits_of(b, fmt), fmt)[:, None]
    cc = _array(_bits_of([c], "fp32"), "fp32")[None, :]
    d = mpt.mma(x, y, cc, model=model, in_format="tf32" if fmt == "tf32" else None)
    return int(d.view(np.uint32)[0, 0])


P126 = 2.0**-126
VECTORS = {
    # Products rounded to FP32 (CDNA1): four bf16 products 2^-75(1+2^-7)·2^-75 = 2^-150(1+2^-7),
    # each just above half the smallest subnormal, so each rounds to 2^-149 and the tree gives
    # 4·2^-149 (0x4). CDNA2 flushes each (subnormal) product: +0. CDNA3 keeps them exact:
    # S = 2^-148(1+2^-7), re-aligned to M = -126 exactly, RNE on the 2^-149 grid: 2 units (0x2).
    "product-rounding": dict(
        fmt="bf16", a=[2.0**-75 * (1 + 2**-7)] * 4, b=[2.0**-75] * 4, c=0.0,
        want={"cdna1": 0x4, "cdna2": 0x0, "cdna3": 0x2}, separates=["cdna1", "cdna2"]),
    # The pairwise tree: products [2^24, 1, 1, -2^24]; (2^24 + 1) ties to 2^24, (1 - 2^24) is
    # exact, their sum is 1.0 (0x3F800000); the exact sum 2 is what CDNA3 (24 bits below 2^24
    # keep the 1s) and every NVIDIA preset give; a sequential sum would give 0.
    "pairwise-tree": dict(
        fmt="fp16", a=[2.0**12, 1, 1, -(2.0**12)], b=[2.0**12, 1, 1, 2.0**12], c=0.0,
        want={"cdna1": 0x3F800000, "cdna2": 0x3F800000, "cdna3": 0x40000000},
        separates=["cdna1", "cdna2"]),
    # CDNA2's flush of a subnormal input: fp16 2^-24 · 1 gives 2^-24 (0x33800000) on CDNA1/3, +0 on
    # CDNA2.
    "flush-input": dict(
        fmt="fp16", a=[2.0**-24], b=[1.0], c=0.0,
        want={"cdna1": 0x33800000, "cdna2": 0x0, "cdna3": 0x33800000}, separates=["cdna2"]),
    # CDNA2's flush of C at the instruction's start: C = 2^-130 (FP32 subnormal) plus zero
    # products stays 2^-130 (0x00080000) on CDNA1 and CDNA3, becomes +0 on CDNA2.
    "flush-c": dict(
        fmt="fp16", a=[0.0], b=[0.0], c=2.0**-130,
        want={"cdna1": 0x00080000, "cdna2": 0x0, "cdna3": 0x00080000}, separates=["cdna2"]),
    # CDNA3's truncation: products 1 and 1.75·2^-24 in one group; the small one is truncated to
    # 2^-24 (24 fraction bits below 2^0), 1 + 2^-24 ties to even: 1.0. CDNA1/2 add exactly
    # representable FP32 values and round once: 1 + 1.75·2^-24 -> 1 + 2^-23 (0x3F800001).
    "truncation": dict(
        fmt="fp16", a=[1.0, 1.75 * 2.0**-12], b=[1.0, 2.0**-12], c=0.0,
        want={"cdna1": 0x3F800001, "cdna2": 0x3F800001, "cdna3": 0x3F800000}, separates=[]),
    # CDNA3 re-aligns C rounding toward -inf: c = -2^-30 against products 1 (M = 0):
    # floor(-2^-30·2^24) = -1, so D = 1 - 2^-24 (0x3F7FFFFF). Round-to-nearest (CDNA1/2) and
    # NVIDIA's truncation toward zero give 1.0.
    "c-toward-minus-inf": dict(
        fmt="fp16", a=[1.0], b=[1.0], c=-(2.0**-30),
        want={"cdna1": 0x3F800000, "cdna2": 0x3F800000, "cdna3": 0x3F7FFFFF}, separates=["cdna3"]),
    # ... and only toward -inf: c = +2^-30 floors to 0, D = 1.0 everywhere.
    "c-toward-minus-inf-positive": dict(
        fmt="fp16", a=[1.0], b=[1.0], c=2.0**-30,
        want={"cdna1": 0x3F800000, "cdna2": 0x3F800000, "cdna3": 0x3F800000}, separates=[]),
    # The product sum re-aligned with 31 bits toward -inf: products 2^-24 and 2^-40 (E = -24,
    # both exact at 24 bits below 2^-24) against c = 1: floor((2^24 + 2^8)·2^-17) = 128 units of
    # 2^-31, so 1 + 2^-24 exactly, a tie: 1.0. CDNA1 adds 2^-24 + 2^-40 exactly, then to 1:
    # above the tie, 1 + 2^-23. CDNA2 flushes the fp16 subnormal 2^-20: the tie again, 1.0.
    "sum-toward-minus-inf": dict(
        fmt="fp16", a=[2.0**-12, 2.0**-20], b=[2.0**-12, 2.0**-20], c=1.0,
        want={"cdna1": 0x3F800001, "cdna2": 0x3F800000, "cdna3": 0x3F800000}, separates=[]),
    # A zero has exponent -126 on CDNA3: 0 · 2^127 (bf16) is a product with exponent 1, so C =
    # 0.5 + 2^-24 is re-aligned to 2^1 with 24 bits: floor -> 0.5 (0x3F000000). Elsewhere zero
    # products leave C alone (0x3F000001).
    "zero-exponent": dict(
        fmt="bf16", a=[0.0], b=[2.0**127], c=Bits(0x3F000001),
        want={"cdna1": 0x3F000001, "cdna2": 0x3F000001, "cdna3": 0x3F000000},
        separates=["cdna3"]),
    # A finite product >= 2^128 is Inf on CDNA3 though the exact sum 2^128 - 1.5·2^127 = 2^126
    # is finite (NVIDIA: 0x7E800000); CDNA1/2 round the product to FP32: Inf too.
    "product-2^128": dict(
        fmt="bf16", a=[2.0**127, -(2.0**127)], b=[2.0, 1.5], c=0.0,
        want={"cdna1": 0x7F800000, "cdna2": 0x7F800000, "cdna3": 0x7F800000},
        separates=["cdna1", "cdna2", "cdna3"]),
    # ... of both signs: CDNA3's rule gives 0x7FC00000; CDNA1/2 compute Inf + (-Inf), the
    # default NaN 0xFFC00000; NVIDIA's exact sum is +0.
    "product-2^128-both": dict(
        fmt="bf16", a=[2.0**127, -(2.0**127)], b=[2.0, 2.0], c=0.0,
        want={"cdna1": 0xFFC00000, "cdna2": 0xFFC00000, "cdna3": 0x7FC00000},
        separates=["cdna1", "cdna2", "cdna3"]),
    # No canonical NaN: the fp16 signalling NaN 0x7C01 comes out quiet with its payload on top.
    "nan-payload": dict(
        fmt="fp16", a=[Bits(0x7C01)], b=[1.0], c=0.0,
        want={"cdna1": 0x7FC02000, "cdna2": 0x7FC02000, "cdna3": 0x7FC02000},
        separates=["cdna1", "cdna2", "cdna3"]),
    # Inf·0 makes x86's default NaN, as MMA-Sim gives it.
    "inf-times-zero": dict(
        fmt="fp16", a=[math.inf], b=[0.0], c=0.0,
        want={"cdna1": 0xFFC00000, "cdna2": 0xFFC00000, "cdna3": 0xFFC00000},
        separates=["cdna1", "cdna2", "cdna3"]),
}


@pytest.mark.parametrize("name", list(VECTORS))
@pytest.mark.parametrize("model", ["cdna1", "cdna2", "cdna3"])
def test_directed_vectors(name, model):
    vec = VECTORS[name]
    got = _vector(model, vec["a"], vec["b"], vec["c"], vec["fmt"])
    assert got == vec["want"][model], f"got {got:#x}, want {vec['want'][model]:#x}"


@pytest.mark.parametrize("name", [n for n, v in VECTORS.items() if v["separates"]])
def test_directed_vectors_separate_amd_from_nvidia(name):
    vec = VECTORS[name]
    results = {m: _nvidia(m, vec["a"], vec["b"], vec["c"], vec["fmt"]) for m in NVIDIA}
    results = {m: r for m, r in results.items() if r is not None}
    assert results, "no NVIDIA preset takes this format"
    for amd in vec["separates"]:
        for nvidia, bits in results.items():
            assert bits != vec["want"][amd], f"{nvidia} also gives {bits:#x}"


def test_every_amd_model_is_told_apart():
    """Each pair of CDNA1-3 models differs on some vector, and each is separated from NVIDIA."""
    for x in ("cdna1", "cdna2", "cdna3"):
        assert any(x in v["separates"] for v in VECTORS.values())
        for y in ("cdna1", "cdna2", "cdna3"):
            if x < y:
                assert any(v["want"][x] != v["want"][y] for v in VECTORS.values()), (x, y)


def test_bf16_group_of_two_or_four():
    """The pre-_1k bf16 instructions add pairs, the _1k ones quads: c = 2^24 and products
    [1, 0, 1, 0]. Pairs: 2^24 + 1 ties to 2^24, twice: 0x4B800000. Quads: 1 + 1 = 2 first,
    2^24 + 2 exact: 0x4B800001."""
    a, b, c = [1.0, 0.0, 1.0, 0.0], [1.0] * 4, 2.0**24
    assert _vector("cdna1", a, b, c, "bf16", "v_mfma_f32_32x32x4bf16") == 0x4B800000
    assert _vector("cdna2", a, b, c, "bf16", "v_mfma_f32_32x32x4bf16") == 0x4B800000
    assert _vector("cdna2", a, b, c, "bf16", "v_mfma_f32_32x32x4bf16_1k") == 0x4B800001


def test_cdna3_group_of_four_or_eight():
    """CDNA3 groups min(8, K): products 1 (k=0) and 1.75·2^-24 (k=4). One group of 8 truncates
    the small one to 2^-24: a tie, 1.0. Groups of 4 (K=4 instructions): the second group has
    E = -24, keeps 1.75·2^-24 exactly, adds it to c = 1 with 31 bits (224 units of 2^-31): RNE
    gives 1 + 2^-23."""
    a = [1.0, 0, 0, 0, 1.75 * 2.0**-12, 0, 0, 0]
    b = [1.0, 0, 0, 0, 2.0**-12, 0, 0, 0]
    assert _vector("cdna3", a, b, 0.0, "fp16", "v_mfma_f32_32x32x8_f16") == 0x3F800000
    assert _vector("cdna3", a, b, 0.0, "fp16", "v_mfma_f32_4x4x4_16b_f16") == 0x3F800001


def _fp8(a, b, c, fa="fp8_e4m3fnuz", fb="fp8_e5m2fnuz", model="cdna3"):
    v = default_variant(model, fa, fb)
    d = _run(v, np.array([_bits_of(a, fa)], np.uint64), np.array([_bits_of(b, fb)], np.uint64).T,
             np.array([_bits_of([c], "fp32")], np.uint64), fa, fb)
    return int(d[0, 0])


def test_fp8_even_and_odd_halves():
    """FP8 (e4m3fnuz x e5m2fnuz): products 1 and -2^-10·2^-17 = -2^-27 (both subnormal: exponents
    -7 and -15). In the odd half (k=1) the small product has its own maximum E1 = -22 and is kept,
    then rounded toward -inf to 24 bits below 2^0: -1 unit, D = 1 - 2^-24 (0x3F7FFFFF). In the
    even half with the 1 (k=2) it is truncated toward zero at 24 bits below 2^0: D = 1.0. The
    exact sum rounds to 1.0, and so do Hopper's FP8 (13 bits, toward zero) and CDNA3's f16 rule."""
    small_a, small_b = -(2.0**-10), 2.0**-17
    assert _fp8([1.0, small_a], [1.0, small_b], 0.0) == 0x3F7FFFFF
    assert _fp8([1.0, 0.0, small_a], [1.0, 0.0, small_b], 0.0) == 0x3F800000


def test_fp8_far_c_dropped():
    """FP8 drops a C more than 25 binades below M: c = -2^-30 against a product 1 is dropped
    (1.0), c = -2^-25 is kept and rounded toward -inf to -2^-24: 0x3F7FFFFF. (The f16 rule keeps
    both: 'c-toward-minus-inf'.)"""
    assert _fp8([1.0], [1.0], -(2.0**-30)) == 0x3F800000
    assert _fp8([1.0], [1.0], -(2.0**-25)) == 0x3F7FFFFF


def test_fnuz_nan_and_cdna4_nan():
    """FNUZ's only NaN 0x80 comes out as 0x7FC00001 (MMA-Sim's conversion); OCP e4m3fn's NaN
    0x7F as 0x7FF00000 (its fraction 111 on top); an E8M0 NaN scale as 0x7FC00000."""
    assert _fp8([Bits(0x80)], [1.0], 0.0) == 0x7FC00001
    assert _fp8([Bits(0x7F)], [1.0], 0.0, "fp8_e4m3fn", "fp8_e4m3fn", "cdna4") == 0x7FF00000
    v = default_variant("cdna4", "fp8_e4m3fn", "fp8_e4m3fn", scaled=True)
    ones = np.array([_bits_of([1.0] * 3, "fp8_e4m3fn")], np.uint64)
    d = _run(v, ones, ones.T, np.zeros((1, 1), np.uint64), "fp8_e4m3fn", "fp8_e4m3fn",
             [[0xFF]], [[127]])
    assert int(d[0, 0]) == 0x7FC00000


def test_cdna4_scales_are_exponent_adds():
    """Assumption "cdna3": scales 2^3 and 2^-1 multiply every product of their block by 2^2:
    [1, 1.5] · [1, 1] -> 4·2.5 = 10 (0x41200000); a product pushed past 2^128 by its scales
    (2^127·2^127) is Inf."""
    v = default_variant("cdna4", "fp8_e4m3fn", "fp8_e4m3fn", scaled=True)
    a = np.array([_bits_of([1.0, 1.5], "fp8_e4m3fn")], np.uint64)
    b = np.array([_bits_of([1.0, 1.0], "fp8_e4m3fn")], np.uint64).T
    c = np.zeros((1, 1), np.uint64)
    assert int(_run(v, a, b, c, "fp8_e4m3fn", "fp8_e4m3fn", [[130]], [[126]])[0, 0]) == 0x41200000
    assert int(_run(v, a, b, c, "fp8_e4m3fn", "fp8_e4m3fn", [[254]], [[254]])[0, 0]) == 0x7F800000


# ---- chaining and padding -----------------------------------------------------------------------

def test_padding_turns_negative_zero_positive():
    """bf16 -2^-100 · 2^-60 = -2^-160 rounds (toward -inf at 2^-157, then RNE) to -0 in its group.
    K = 8 on the K=8 instruction: D = -0 (0x80000000). On the K=16 instruction software pads 8
    zeros, whose group adds +0 products to c = -0: +0."""
    a, b = [-(2.0**-100)] + [0.0] * 7, [2.0**-60] + [0.0] * 7
    assert _vector("cdna3", a, b, 0.0, "bf16", "v_mfma_f32_32x32x8_bf16") == 0x80000000
    assert _vector("cdna3", a, b, 0.0, "bf16", "v_mfma_f32_16x16x16_bf16") == 0x00000000


def test_cdna2_flushes_c_at_each_instruction():
    """CDNA2 bf16_1k: c = -1.5·2^-126 plus the product 2^-126 is -2^-127, flushed to -0; then four
    products -2^-140 (each flushed to -0; their tree -0). As one K=8 instruction: -0 + -0 = -0.
    As two K=4 instructions the second starts by flushing C = -0 to +0: +0 + -0 = +0."""
    a = [2.0**-63, 0, 0, 0] + [-(2.0**-70)] * 4
    b = [2.0**-63, 0, 0, 0] + [2.0**-70] * 4
    c = -1.5 * P126
    assert _vector("cdna2", a, b, c, "bf16", "v_mfma_f32_32x32x8bf16_1k") == 0x80000000
    assert _vector("cdna2", a, b, c, "bf16", "v_mfma_f32_32x32x4bf16_1k") == 0x00000000


@pytest.mark.parametrize("model, fmt", [("cdna1", "fp16"), ("cdna2", "bf16"), ("cdna3", "fp16"),
                                        ("cdna3", "tf32"), ("cdna3", "fp8_e4m3fnuz"),
                                        ("cdna3", "fp32"), ("cdna3", "fp64"),
                                        ("cdna4", "fp4_e2m1fn")])
def test_chain_in_pieces_equals_one_chain(model, fmt):
    """A chain over K = 3 instructions and a bit, run in one call or one call per instruction
    (D fed back as C), gives the same bits, and equals the oracle."""
    rng = np.random.default_rng(11)
    v = default_variant(model, fmt, fmt)
    k = 3 * v.k + 5
    bias = get_format("fp32" if fmt == "tf32" else fmt).bias
    a = _patterns(rng, fmt, (2, k), bias, (0.1, 0.9, 0.0))
    b = _patterns(rng, fmt, (k, 3), bias, (0.1, 0.9, 0.0))
    c = _patterns(rng, v.output, (2, 3), get_format(v.output).bias, (0.0, 1.0, 0.0))
    whole = _run(v, a, b, c, fmt, fmt)
    pieces = _run(v, a, b, c, fmt, fmt, steps=range(v.k, k, v.k))
    assert np.array_equal(whole, pieces)
    assert whole.tolist() == mfma_reference(a.tolist(), b.tolist(), c.tolist(), v.as_dict(),
                                            fmt, fmt)


@pytest.mark.parametrize("model, fmt", [("cdna3", "fp16"), ("cdna3", "bf16"), ("cdna3", "tf32"),
                                        ("cdna3", "fp8_e4m3fnuz"), ("cdna4", "fp8_e5m2")])
def test_register_blocked_path_equals_general_path(model, fmt):
    """Moderate finite operands take the packed kernel; the same call with one Inf (FNUZ: NaN)
    in A takes the general one; the other batch elements' bits agree (tile edges, batches)."""
    rng = np.random.default_rng(5)
    v = default_variant(model, fmt, fmt)
    dtype = get_format(fmt).dtype if fmt != "tf32" else np.float32
    for m, k, n in [(37, 70, 45), (9, 16, 70)]:
        a = (rng.standard_normal((2, m, k)) * 4).astype(np.float32).astype(dtype)
        b = rng.standard_normal((1, k, n)).astype(np.float32).astype(dtype)
        c = rng.standard_normal((2, m, n)).astype(np.float32)
        ia, ib = np.arange(2), np.zeros(2, np.int64)
        fast = MFMAOperands(v, a, b, ia, ib, fmt, fmt)
        spoiled_a = a.copy()
        spoiled_a[1, 0, 0] = np.nan if "fnuz" in fmt else np.inf
        slow = MFMAOperands(v, spoiled_a, b, ia, ib, fmt, fmt)
        assert fast.packed and not slow.packed
        results = []
        for ops in (fast, slow):
            acc = ops.new_acc(c)
            ops.chain(acc, 0, k)
            results.append(ops.values(acc)[0].view(np.uint32))
        assert np.array_equal(results[0], results[1])


def test_thread_count_does_not_change_bits():
    import numba
    rng = np.random.default_rng(3)
    outs = []
    for fmt in ("fp16", "fp8_e4m3fnuz"):
        v = default_variant("cdna3", fmt, fmt)
        a = (rng.standard_normal((1, 70, 130)) * 8).astype(np.float32).astype(get_format(fmt).dtype)
        b = rng.standard_normal((1, 130, 150)).astype(np.float32).astype(get_format(fmt).dtype)
        for threads in (1, 2):
            numba.set_num_threads(threads)
            try:
                ops = MFMAOperands(v, a, b, np.zeros(1, np.int64), np.zeros(1, np.int64), fmt, fmt)
                acc = ops.new_acc()
                ops.chain(acc, 0, 130)
                outs.append(ops.values(acc).view(np.uint32))
            finally:
                numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        assert np.array_equal(outs[-2], outs[-1])


# ---- the variant table --------------------------------------------------------------------------

def test_models_aliases_and_evidence():
    for alias, name in [("mi100", "cdna1"), ("MI250X", "cdna2"), ("mi210", "cdna2"),
                        ("mi300x", "cdna3"), ("mi325x", "cdna3"), ("mi355x", "cdna4")]:
        assert get_mfma_model(alias).name == name
    assert [m.evidence for m in MFMA_MODELS.values()] == ["reference model"] * 3 + ["assumption"]
    assert MFMA_MODELS["cdna4"].accumulation == "cdna3"
    with pytest.raises(ValueError, match="valid models: cdna1 \\(mi100\\)"):
        get_mfma_model("mi400")
    with pytest.raises(ValueError, match="does not take inputs \\(fp16, bf16\\)"):
        default_variant("cdna3", "fp16", "bf16")
    with pytest.raises(ValueError, match="accumulation must be one of \\['cdna3'\\]"):
        default_variant("cdna4", "fp8_e4m3fn", "fp8_e4m3fn", accumulation="exact")
    with pytest.raises(ValueError, match="has no assumed accumulation"):
        default_variant("cdna3", "fp16", "fp16", accumulation="cdna3")
    assert default_variant("cdna4", "fp4_e2m1fn", "fp6_e2m3fn", scaled=True,
                           accumulation="cdna3").name == "v_mfma_scale_f32_16x16x128_f8f6f4"
    with pytest.raises(ValueError, match="has no instruction"):
        default_variant("cdna3", "fp16", "fp16", instruction="v_mfma_f32_32x32x8f16")


@pytest.mark.parametrize("model, fmt, instruction, k, group", [
    ("cdna1", "fp16", "v_mfma_f32_16x16x16f16", 16, 4),
    ("cdna1", "bf16", "v_mfma_f32_16x16x8bf16", 8, 2),
    ("cdna2", "bf16", "v_mfma_f32_16x16x16bf16_1k", 16, 4),
    ("cdna2", "fp64", "v_mfma_f64_16x16x4f64", 4, 1),
    ("cdna3", "fp16", "v_mfma_f32_16x16x16_f16", 16, 8),
    ("cdna3", "tf32", "v_mfma_f32_16x16x8_xf32", 8, 4),
    ("cdna3", "fp8_e5m2fnuz", "v_mfma_f32_16x16x32_fp8_fp8", 32, 16),
    ("cdna4", "fp8_e4m3fn", "v_mfma_f32_16x16x32_fp8_fp8", 32, 16),
])
def test_default_variants(model, fmt, instruction, k, group):
    v = default_variant(model, fmt, fmt)
    assert (v.name, v.k, v.group) == (instruction, k, group)
    assert v.flush == (model == "cdna2" and fmt in ("fp16", "bf16"))


# ---- MMA-Sim's own outputs --------------------------------------------------------------------

def test_agrees_with_mmasim_outputs():
    """tests/data/mmasim_mfma.npz holds 4,960 outputs of MMA-Sim's AMD simulator (github
    microsoft/MMA-Sim at c785138, ``mmasim.simulator.amd.mfma``, run on CPU with torch 2.13):
    for CDNA3 f16, bf16 (K=16 and K=4), xf32 (K=8 and K=4), FNUZ fp8 in all four pairings, f32
    and f64, and CDNA1/CDNA2 f32 and CDNA2 f64, the first 4 rows of 5 instructions per variant
    on random bit patterns (moderate, near-cancelling with specials, huge, tiny). Every output
    equals ours bit for bit, except NaNs with several possible sources (two NaN inputs, or a NaN
    input and an Inf that makes a NaN of its own), where IEEE leaves the payload open and
    MMA-Sim's choice follows its host's summation order (``mpt.reference.mfma``'s docstring)."""
    path = pathlib.Path(__file__).parent / "data" / "mmasim_mfma.npz"
    data = np.load(path, allow_pickle=False)
    equal = several = 0
    for v_i, meta in enumerate(data["meta"]):
        arch, q, fa, fb, fo = str(meta).split("|")
        v = default_variant(arch.lower(), fa, fb, instruction="v_mfma_" + q)
        a, b, c, want = (data[f"{v_i}_{x}"] for x in "abcd")
        reps = a.shape[0]
        ops = MFMAOperands(v, _array(a, fa), _array(b, fb), np.arange(reps), np.arange(reps),
                           fa, fb)
        acc = ops.new_acc(_array(c, fo))
        ops.chain(acc, 0, a.shape[2])
        got = ops.values(acc).view(np.uint64 if fo == "fp64" else np.uint32).astype(np.uint64)
        va, vb, vc = decode(_array(a, fa), fa), decode(_array(b, fb), fb), decode(_array(c, fo), fo)
        for r, i, j in zip(*np.nonzero(got != want)):
            inputs = np.concatenate([va[r, i], vb[r, :, j], vc[r, i, j:j + 1]])
            nans, infs = np.isnan(inputs).sum(), np.isinf(inputs).any()
            assert np.isnan(_array(got[r, i, j:j + 1], fo)[0]), (q, r, i, j)
            assert np.isnan(_array(want[r, i, j:j + 1], fo)[0]), (q, r, i, j)
            assert nans >= 2 or (nans == 1 and infs), (q, r, i, j)
            several += 1
        equal += int((got == want).sum())
    assert (equal, several) == (4632, 328)


def test_operands_reject_bad_variants_and_scales():
    from mpt.kernels.mfma_variants import MFMAVariant
    a, b, z = np.ones((1, 2, 4), np.float16), np.ones((1, 4, 2), np.float16), np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="pairwise groups of 2 or 4"):
        MFMAOperands(MFMAVariant(("x",), 8, "pairwise", 8, ("fp16",)), a, b, z, z, "fp16", "fp16")
    with pytest.raises(ValueError, match="k a multiple of the group"):
        MFMAOperands(MFMAVariant(("x",), 6, "fused", 4, ("fp16",)), a, b, z, z, "fp16", "fp16")
    with pytest.raises(ValueError, match="only with a scaled variant"):
        MFMAOperands(default_variant("cdna3", "fp16", "fp16"), a, b, z, z, "fp16", "fp16",
                     np.full((1, 2, 1), 127, np.uint8), np.full((1, 1, 2), 127, np.uint8))
