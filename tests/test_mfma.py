"""AMD Matrix Cores (the cdna1-cdna4 MMA models): against their exact oracle, directed vectors,
chaining, mpt.gemm's software, and MMA-Sim's own outputs.

Everything runs through the public path (``mpt.mma`` / ``mpt.gemm`` with ``in_format`` and
``variant``), except the test that the register-blocked kernel equals the general one, which
builds the operand class (``mpt.engines.amd.MFMAOperands``) to know which path it took.
Expectations are bit patterns: the property tests compare with ``mpt.reference.mfma`` (exact
rationals) on random patterns with zeros, subnormals, Inf, NaN and extreme exponents; each
directed vector carries its derivation in a comment.
"""
import math
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpt
from mpt.engines.amd import MFMAOperands
from mpt.formats import get_format
from mpt.kernels.mfma import decode
from mpt.reference.mfma import mfma_reference

AMD = ["cdna1", "cdna2", "cdna3", "cdna4"]
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


def _bits(d):
    """The patterns of an FP32/FP64 result as uint64."""
    return d.view(np.uint64 if d.dtype == np.float64 else np.uint32).astype(np.uint64)


def _oracle_variant(cfg, model):
    """A configuration as ``mpt.reference.mfma``'s dict, under the model's assumptions."""
    rule = cfg.param("rule")
    if rule == "fused_fp8" and "accumulation" in [a.name for a in model.assumptions] and \
            model.choice("accumulation") == "cdna3_fp8_single_group":
        rule = "fused"
    return {"rule": rule, "k": cfg.block, "group": cfg.param("group"),
            "flush": cfg.param("flush"), "out": cfg.outputs[0][0],
            "nan": model.choice("several_nans")}


def _run(model, cfg, a, b, c, fa, fb, scale_a=None, scale_b=None, fn=mpt.mma, **kw):
    """D bits of ``fn`` (mpt.mma or mpt.gemm) for (..., M, K), (..., K, N), (..., M, N) bit
    patterns on the configuration ``cfg`` of ``model``."""
    sa = None if scale_a is None else np.asarray(scale_a, np.uint8)
    sb = None if scale_b is None else np.asarray(scale_b, np.uint8)
    out = cfg.outputs[0][0]
    d = fn(_array(a, fa), _array(b, fb), _array(c, out), model=model, in_format=(fa, fb),
           variant=cfg.variant, scale_a=sa, scale_b=sb, out_format=out, **kw)
    return _bits(d)


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
    """(model, configuration, format of a, format of b): every variant of every AMD model, each
    format with itself and one mixed pair where the variant mixes."""
    out = []
    for name in AMD:
        for cfg in mpt.get_mma_model(name).configs:
            fmts = cfg.inputs
            pairs = [(f, f) for f in fmts] + ([fmts[:2]] if len(fmts) > 1 else [])
            if len(fmts) > 2:
                pairs.append((fmts[-1], fmts[2]))    # fp4 x fp6
            for fa, fb in pairs:
                out.append(pytest.param(name, cfg, fa, fb, id=f"{name}-{cfg.variant}-{fa}-{fb}"))
    return out


def _configured(name, data):
    """The model with its assumed rules drawn: several_nans, and cdna4's accumulation."""
    model = mpt.get_mma_model(name)
    return model.configure(**{a.name: data.draw(st.sampled_from(a.choices), label=a.name)
                              for a in model.assumptions})


@pytest.mark.parametrize("name, cfg, fa, fb", _configs())
@given(data=st.data())
@settings(max_examples=25)
def test_mma_matches_oracle(name, cfg, fa, fb, data):
    """D bits equal the exact oracle's, under every choice of the assumed rules; K spans a
    partial instruction up to two and a bit."""
    model = _configured(name, data)
    m, n = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
    k = data.draw(st.integers(1, 2 * cfg.block + 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    out = cfg.outputs[0][0]
    bias = {f: get_format("fp32" if f == "tf32" else f).bias for f in (fa, fb, out)}
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
    aligned = bias[out] + ca - bias[fa] + cb - bias[fb]
    c = _patterns(rng, out, (m, n), data.draw(st.sampled_from(
        [aligned, aligned - 26, int(rng.integers(0, 256))])), (0.2, 0.7, 0.1))
    sa = sb = None
    if cfg.param("scale_block"):
        blocks = -(-k // 32)
        sa = rng.integers(0, 256, (m, blocks)) if mix[0] else 127 + rng.integers(-3, 4, (m, blocks))
        sb = rng.integers(0, 256, (blocks, n)) if mix[0] else 127 + rng.integers(-3, 4, (blocks, n))
    got = _run(model, cfg, a, b, c, fa, fb, sa, sb)
    want = mfma_reference(a.tolist(), b.tolist(), c.tolist(), _oracle_variant(cfg, model), fa, fb,
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


def _vector(model, a, b, c, fa, fb=None, variant=None, scale_a=None, scale_b=None):
    """D bits of one output element (the model's default variant unless one is named)."""
    fb = fb or fa
    model = mpt.get_mma_model(model)
    cfg = model.config(fa, fb, variant, scaled=scale_a is not None)
    got = _run(model, cfg, np.array([_bits_of(a, fa)], np.uint64),
               np.array([_bits_of(b, fb)], np.uint64).T,
               np.array([_bits_of([c], "fp32")], np.uint64), fa, fb,
               None if scale_a is None else [scale_a], None if scale_b is None else
               [[s] for s in scale_b])
    return int(got[0, 0])


def _nvidia(model, a, b, c, fmt):
    """Bits of an NVIDIA preset on the vector, or None if it does not take fmt."""
    try:
        mpt.get_mma_model(model).config(fmt, fmt)
    except ValueError:
        return None
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
    # CDNA2's flush of a subnormal input: fp16 2^-24 · 1 gives 2^-24 (0x33800000) on CDNA1/3, +0
    # on CDNA2.
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
    # No canonical NaN: the fp16 signalling NaN 0x7C01 comes out quiet with its payload on top
    # (NVIDIA writes its canonical 0x7FFFFFFF).
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
@pytest.mark.parametrize("model", ["cdna1", "cdna2", "cdna3", "cdna4"])
def test_directed_vectors(name, model):
    """Exact bits per model; CDNA4 computes fp16/bf16 as CDNA3 (its assumed accumulation)."""
    vec = VECTORS[name]
    want = vec["want"]["cdna3" if model == "cdna4" else model]
    got = _vector(model, vec["a"], vec["b"], vec["c"], vec["fmt"])
    assert got == want, f"got {got:#x}, want {want:#x}"


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
    """Each pair of CDNA1-3 models differs on some vector, and each is separated from every
    NVIDIA preset by one."""
    for x in ("cdna1", "cdna2", "cdna3"):
        assert any(x in v["separates"] for v in VECTORS.values())
        for y in ("cdna1", "cdna2", "cdna3"):
            if x < y:
                assert any(v["want"][x] != v["want"][y] for v in VECTORS.values()), (x, y)


def test_bf16_group_of_two_or_four():
    """The original bf16 instructions add pairs, the _1k ones quads: c = 2^24 and products
    [1, 0, 1, 0]. Pairs: 2^24 + 1 ties to 2^24, twice: 0x4B800000. Quads: 1 + 1 = 2 first,
    2^24 + 2 exact: 0x4B800001. CDNA1 has only pairs; CDNA2's default is a _1k instruction."""
    a, b, c = [1.0, 0.0, 1.0, 0.0], [1.0] * 4, 2.0**24
    assert _vector("cdna1", a, b, c, "bf16") == 0x4B800000
    assert _vector("cdna2", a, b, c, "bf16", variant="v_mfma_f32_32x32x4bf16") == 0x4B800000
    assert _vector("cdna2", a, b, c, "bf16") == 0x4B800001


def test_cdna3_group_of_four_or_eight():
    """CDNA3 groups min(8, K): products 1 (k=0) and 1.75·2^-24 (k=4). One group of 8 truncates
    the small one to 2^-24: a tie, 1.0. Groups of 4 (K=4 instructions): the second group has
    E = -24, keeps 1.75·2^-24 exactly, adds it to c = 1 with 31 bits (224 units of 2^-31): RNE
    gives 1 + 2^-23."""
    a = [1.0, 0, 0, 0, 1.75 * 2.0**-12, 0, 0, 0]
    b = [1.0, 0, 0, 0, 2.0**-12, 0, 0, 0]
    assert _vector("cdna3", a, b, 0.0, "fp16") == 0x3F800000
    assert _vector("cdna3", a, b, 0.0, "fp16", variant="v_mfma_f32_32x32x4_2b_f16") == 0x3F800001


def test_fp8_even_and_odd_halves():
    """FP8 (e4m3fnuz x e5m2fnuz): products 1 and -2^-10·2^-17 = -2^-27 (both subnormal: exponents
    -7 and -15). In the odd half (k=1) the small product has its own maximum E1 = -22 and is kept,
    then rounded toward -inf to 24 bits below 2^0: -1 unit, D = 1 - 2^-24 (0x3F7FFFFF). In the
    even half with the 1 (k=2) it is truncated toward zero at 24 bits below 2^0: D = 1.0. The
    exact sum rounds to 1.0, and so do Hopper's FP8 (13 bits, toward zero) and CDNA3's f16 rule."""
    fnuz = ("fp8_e4m3fnuz", "fp8_e5m2fnuz")
    small_a, small_b = -(2.0**-10), 2.0**-17
    assert _vector("cdna3", [1.0, small_a], [1.0, small_b], 0.0, *fnuz) == 0x3F7FFFFF
    assert _vector("cdna3", [1.0, 0.0, small_a], [1.0, 0.0, small_b], 0.0, *fnuz) == 0x3F800000


def test_fp8_far_c_dropped():
    """FP8 drops a C more than 25 binades below M: c = -2^-30 against a product 1 is dropped
    (1.0), c = -2^-25 is kept and rounded toward -inf to -2^-24: 0x3F7FFFFF. (The f16 rule keeps
    both: 'c-toward-minus-inf'.)"""
    assert _vector("cdna3", [1.0], [1.0], -(2.0**-30), "fp8_e4m3fnuz") == 0x3F800000
    assert _vector("cdna3", [1.0], [1.0], -(2.0**-25), "fp8_e4m3fnuz") == 0x3F7FFFFF


def test_cdna4_accumulation_is_a_parameter():
    """The assumed rule ``accumulation``: OCP e4m3 products 1 and -2^-9·2^-9 = -2^-18 at k = 0
    and k = 1. "cdna3" (halves): the odd half keeps -2^-18 and rounds it toward -inf to 24 bits
    below 2^0 (exact), D = 1 - 2^-18 (0x3F7FFFC0) as CDNA3's FNUZ rule gives; the far C =
    -2^-30 is dropped. "cdna3_fp8_single_group": one group truncates -2^-18 at 24 bits below 2^0
    (exact too) and keeps C = -2^-30, which floors to -2^-24: 1 - 2^-18 - 2^-24 (0x3F7FFFBF)."""
    a, b = [1.0, -(2.0**-9)], [1.0, 2.0**-9]
    assert _vector("cdna4", a, b, -(2.0**-30), "fp8_e4m3fn") == 0x3F7FFFC0
    assert _vector("cdna3", a, b, -(2.0**-30), "fp8_e4m3fnuz") == 0x3F7FFFC0
    single = mpt.get_mma_model("cdna4").configure(accumulation="cdna3_fp8_single_group")
    assert _vector(single, a, b, -(2.0**-30), "fp8_e4m3fn") == 0x3F7FFFBF
    assert mpt.get_mma_model("mi355x").choice("accumulation") == "cdna3"


def test_several_nans_is_a_parameter():
    """Two NaN inputs, fp16 0x7C01 at k = 0 and 0x7C02 at k = 1: "first" gives the payload of
    a_0 (0x7FC02000), "last" that of a_1 (0x7FC04000); a NaN c comes first of all."""
    a, b = [Bits(0x7C01), Bits(0x7C02)], [1.0, 1.0]
    for model in ("cdna1", "cdna2", "cdna3"):
        last = mpt.get_mma_model(model).configure(several_nans="last")
        assert _vector(model, a, b, 0.0, "fp16") == 0x7FC02000
        assert _vector(last, a, b, 0.0, "fp16") == 0x7FC04000
        assert _vector(model, a, b, Bits(0x7F800123), "fp16") == 0x7FC00123
        assert _vector(last, a, b, Bits(0x7F800123), "fp16") == 0x7FC04000
    with pytest.raises(ValueError, match="several_nans must be one of 'first', 'last'"):
        mpt.get_mma_model("cdna3").configure(several_nans="middle")


def test_fnuz_nan_and_cdna4_nan():
    """FNUZ's only NaN 0x80 comes out as 0x7FC00001 (MMA-Sim's conversion); OCP e4m3fn's NaN
    0x7F as 0x7FF00000 (its fraction 111 on top); an E8M0 NaN scale as 0x7FC00000."""
    assert _vector("cdna3", [Bits(0x80)], [1.0], 0.0, "fp8_e4m3fnuz") == 0x7FC00001
    assert _vector("cdna4", [Bits(0x7F)], [1.0], 0.0, "fp8_e4m3fn") == 0x7FF00000
    assert _vector("cdna4", [1.0] * 3, [1.0] * 3, 0.0, "fp8_e4m3fn", scale_a=[0xFF],
                   scale_b=[127]) == 0x7FC00000


def test_cdna4_scales_are_exponent_adds():
    """Assumption "cdna3": scales 2^3 and 2^-1 multiply every product of their block by 2^2:
    [1, 1.5] · [1, 1] -> 4·2.5 = 10 (0x41200000); a product pushed past 2^128 by its scales
    (2^127·2^127) is Inf. The scales select the v_mfma_scale instruction."""
    a, b = [1.0, 1.5], [1.0, 1.0]
    assert _vector("cdna4", a, b, 0.0, "fp8_e4m3fn", scale_a=[130], scale_b=[126]) == 0x41200000
    assert _vector("cdna4", a, b, 0.0, "fp8_e4m3fn", scale_a=[254], scale_b=[254]) == 0x7F800000
    model = mpt.get_mma_model("cdna4")
    assert model.config("fp4_e2m1fn", "fp6_e2m3fn", scaled=True).variant == \
        "v_mfma_scale_f32_32x32x64_f8f6f4"


# ---- chaining, padding and the software around the instructions ----------------------------------

def test_padding_turns_negative_zero_positive():
    """bf16 -2^-100 · 2^-60 = -2^-160 rounds (toward -inf at 2^-157, then RNE) to -0 in its group.
    K = 8 on the K=8 instruction: D = -0 (0x80000000). On the K=16 instruction software pads 8
    zeros, whose group adds +0 products to c = -0: +0."""
    a, b = [-(2.0**-100)] + [0.0] * 7, [2.0**-60] + [0.0] * 7
    assert _vector("cdna3", a, b, 0.0, "bf16") == 0x80000000
    assert _vector("cdna3", a, b, 0.0, "bf16", variant="v_mfma_f32_16x16x16_bf16") == 0x00000000


def test_cdna2_flushes_c_at_each_instruction():
    """CDNA2 bf16_1k: c = -1.5·2^-126 plus the product 2^-126 is -2^-127, flushed to -0; then four
    products -2^-140 (each flushed to -0; their tree -0). As one K=8 instruction: -0 + -0 = -0.
    As two K=4 instructions the second starts by flushing C = -0 to +0: +0 + -0 = +0."""
    a = [2.0**-63, 0, 0, 0] + [-(2.0**-70)] * 4
    b = [2.0**-63, 0, 0, 0] + [2.0**-70] * 4
    c = -1.5 * P126
    assert _vector("cdna2", a, b, c, "bf16") == 0x80000000
    assert _vector("cdna2", a, b, c, "bf16", variant="v_mfma_f32_32x32x4bf16_1k") == 0x00000000


CHAINS = [("cdna1", "fp16"), ("cdna2", "bf16"), ("cdna3", "fp16"), ("cdna3", "tf32"),
          ("cdna3", "fp8_e4m3fnuz"), ("cdna3", "fp32"), ("cdna3", "fp64"), ("cdna4", "fp4_e2m1fn")]


def _chain_inputs(model, fmt, seed=11):
    rng = np.random.default_rng(seed)
    cfg = mpt.get_mma_model(model).config(fmt, fmt)
    k = 3 * cfg.block + 5
    bias = get_format("fp32" if fmt == "tf32" else fmt).bias
    out = cfg.outputs[0][0]
    a = _patterns(rng, fmt, (2, k), bias, (0.1, 0.9, 0.0))
    b = _patterns(rng, fmt, (k, 3), bias, (0.1, 0.9, 0.0))
    c = _patterns(rng, out, (2, 3), get_format(out).bias, (0.0, 1.0, 0.0))
    return cfg, a, b, c


@pytest.mark.parametrize("model, fmt", CHAINS)
def test_chain_in_pieces_equals_one_chain(model, fmt):
    """K = 3 instructions and a bit: one mpt.mma call, or one call per instruction with D fed
    back as C, give the same bits, and equal the oracle."""
    cfg, a, b, c = _chain_inputs(model, fmt)
    m = mpt.get_mma_model(model)
    whole = _run(m, cfg, a, b, c, fmt, fmt)
    d = c
    for k0 in range(0, a.shape[1], cfg.block):
        d = _run(m, cfg, a[:, k0:k0 + cfg.block], b[k0:k0 + cfg.block], d, fmt, fmt)
    assert np.array_equal(whole, d)
    assert whole.tolist() == mfma_reference(a.tolist(), b.tolist(), c.tolist(),
                                            _oracle_variant(cfg, m), fmt, fmt)


@pytest.mark.parametrize("model, fmt", CHAINS)
def test_gemm_split_k_is_chunks_of_whole_instructions(model, fmt):
    """mpt.gemm with split_k=2: chunks of ceil(K/2) rounded up to the instruction's K, each an
    mma chain from +0 (c in the first), added in chunk order in the accumulator's format."""
    cfg, a, b, c = _chain_inputs(model, fmt, seed=12)
    m = mpt.get_mma_model(model)
    step = -(-(-(-a.shape[1] // 2)) // cfg.block) * cfg.block
    assert step % cfg.block == 0
    zero = np.zeros_like(c)
    first = _array(_run(m, cfg, a[:, :step], b[:step], c, fmt, fmt), cfg.outputs[0][0])
    second = _array(_run(m, cfg, a[:, step:], b[step:], zero, fmt, fmt), cfg.outputs[0][0])
    with np.errstate(invalid="ignore", over="ignore"):
        want = _bits(first + second)
    assert np.array_equal(_run(m, cfg, a, b, c, fmt, fmt, fn=mpt.gemm, split_k=2), want)
    assert np.array_equal(_run(m, cfg, a, b, c, fmt, fmt, fn=mpt.gemm),
                          _run(m, cfg, a, b, c, fmt, fmt))


def test_gemm_promotion_on_fnuz_fp8():
    """promote_every must be a multiple of the instruction's K (16 for the default CDNA3 fp8
    instruction); with 32, each 32 products run from +0 and are fused into an FP32 register."""
    rng = np.random.default_rng(3)
    x = mpt.round(rng.standard_normal((3, 96)).astype(np.float32), "fp8_e4m3fnuz")
    y = mpt.round(rng.standard_normal((96, 4)).astype(np.float32), "fp8_e4m3fnuz")
    with pytest.raises(ValueError, match="promote_every must be a multiple of the model's block "
                                         "of 16"):
        mpt.gemm(x, y, model="cdna3", promote_every=8)
    register = np.full((3, 4), -0.0, np.float32)
    for g in range(0, 96, 32):
        part = mpt.mma(x[:, g:g + 32], y[g:g + 32], model="cdna3")
        register = part + register                   # fma(1, partial, register): one RNE add
    assert np.array_equal(mpt.gemm(x, y, model="cdna3", promote_every=32).view(np.uint32),
                          register.view(np.uint32))


def test_fp64_outputs_and_gemm():
    """f64 instructions output FP64 (float64, c of float64); gemm accumulates in FP64 and refuses
    FP32 outputs, promotion and software scales there."""
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((3, 9)), rng.standard_normal((9, 2))
    d = mpt.mma(a, b, model="cdna3")
    assert d.dtype == np.float64
    ref = mfma_reference(_bits(a).tolist(), _bits(b).tolist(), [[0] * 2] * 3,
                         _oracle_variant(mpt.get_mma_model("cdna3").config("fp64", "fp64"),
                                         mpt.get_mma_model("cdna3")), "fp64", "fp64")
    assert _bits(d).tolist() == ref
    assert np.array_equal(mpt.gemm(a, b, model="mi250x").view(np.uint64), d.view(np.uint64))
    halves = mpt.mma(a[:, :8], b[:8], model="cdna3") + mpt.mma(a[:, 8:], b[8:], model="cdna3")
    assert np.array_equal(mpt.gemm(a, b, model="cdna3", split_k=2).view(np.uint64),
                          halves.view(np.uint64))
    with pytest.raises(ValueError, match="an FP64 accumulator .* takes out_format 'fp64'"):
        mpt.gemm(a, b, model="cdna3", out_format="fp32")
    with pytest.raises(ValueError, match="no promote_every or software scales"):
        mpt.gemm(a, b, model="cdna3", scale_a=2.0)
    with pytest.raises(TypeError, match="c must be float64 for fp64 output"):
        mpt.mma(a, b, np.zeros((3, 2), np.float32), model="cdna3")


def test_block_scales_through_gemm():
    """E8M0 block scales reach the instruction (v_mfma_scale) through mpt.gemm's
    block_scale_a/block_scale_b too, split-K included; float32 scale_a/scale_b stay software
    scales on the unscaled instruction; bad shapes and mixed kinds are refused by name."""
    rng = np.random.default_rng(6)
    a = mpt.round(rng.standard_normal((2, 100)).astype(np.float32), "fp4_e2m1fn")
    b = mpt.round(rng.standard_normal((100, 3)).astype(np.float32), "fp6_e2m3fn")
    sa = rng.integers(120, 135, (2, 4)).astype(np.uint8)
    sb = rng.integers(120, 135, (4, 3)).astype(np.uint8)
    d = mpt.mma(a, b, model="cdna4", scale_a=sa, scale_b=sb)
    assert np.array_equal(mpt.gemm(a, b, model="cdna4", block_scale_a=sa,
                                   block_scale_b=sb).view(np.uint32), d.view(np.uint32))
    unscaled = mpt.mma(a, b, model="cdna4")
    assert not np.array_equal(d.view(np.uint32), unscaled.view(np.uint32))
    e8m0 = get_format("e8m0").dtype
    assert np.array_equal(mpt.mma(a, b, model="cdna4", scale_a=sa.view(e8m0),
                                  scale_b=sb.view(e8m0)).view(np.uint32), d.view(np.uint32))
    soft = mpt.gemm(a, b, model="cdna4", scale_a=2.0, scale_b=0.5)
    assert np.array_equal(soft.view(np.uint32), unscaled.view(np.uint32))   # alpha = 1 exactly
    with pytest.raises(ValueError, match=r"scale_a must have shape \(2, 4\)"):
        mpt.mma(a, b, model="cdna4", scale_a=sa[:, :3], scale_b=sb)
    with pytest.raises(TypeError, match="block scales go in block_scale_a"):
        mpt.gemm(a, b, model="cdna4", scale_a=sa.view(e8m0), scale_b=np.float32(1))
    with pytest.raises(ValueError, match="model 'cdna3' takes no block scales"):
        mpt.mma(a.astype(np.float16), b.astype(np.float16), model="cdna3", scale_a=sa,
                scale_b=sb)


def test_register_blocked_path_equals_general_path():
    """Moderate finite operands take the packed kernel; the same call with one Inf (FNUZ: NaN)
    in A takes the general one; the other batch elements' bits agree (tile edges, batches)."""
    rng = np.random.default_rng(5)
    for model, fmt in [("cdna3", "fp16"), ("cdna3", "bf16"), ("cdna3", "tf32"),
                       ("cdna3", "fp8_e4m3fnuz"), ("cdna4", "fp8_e5m2")]:
        m_ = mpt.get_mma_model(model)
        cfg = m_.config(fmt, fmt)
        dtype = get_format(fmt).dtype if fmt != "tf32" else np.float32
        for m, k, n in [(37, 70, 45), (9, 16, 70)]:
            a = (rng.standard_normal((2, m, k)) * 4).astype(np.float32).astype(dtype)
            b = rng.standard_normal((1, k, n)).astype(np.float32).astype(dtype)
            c = rng.standard_normal((2, m, n)).astype(np.float32)
            spoiled = a.copy()
            spoiled[1, 0, 0] = np.nan if "fnuz" in fmt else np.inf
            results = []
            for x in (a, spoiled):
                ops = MFMAOperands(m_, cfg, x, b, (fmt, fmt), "fp32", (2,))
                assert bool(ops.rows) == (x is a)
                acc = ops.new_acc(c)
                ops.chain(acc, 0, k)
                results.append(ops.values(acc)[0].view(np.uint32))
            assert np.array_equal(results[0], results[1])
            assert np.array_equal(results[0], mpt.mma(a, b, c, model=model, in_format=fmt)[0]
                                  .view(np.uint32))


def test_thread_count_does_not_change_bits():
    import numba
    rng = np.random.default_rng(3)
    for fmt in ("fp16", "fp8_e4m3fnuz", "bf16"):
        dtype = get_format(fmt).dtype
        a = (rng.standard_normal((70, 130)) * 8).astype(np.float32).astype(dtype)
        b = rng.standard_normal((130, 150)).astype(np.float32).astype(dtype)
        a[0, 0] = np.nan if "fnuz" in fmt else np.inf          # the general kernel as well
        outs = []
        for threads in (1, 2):
            numba.set_num_threads(threads)
            try:
                model = "cdna2" if fmt == "bf16" else "cdna3"
                outs.append(mpt.mma(a, b, model=model).view(np.uint32))
                outs.append(mpt.mma(a[1:], b, model=model).view(np.uint32))
            finally:
                numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        assert np.array_equal(outs[0], outs[2]) and np.array_equal(outs[1], outs[3])


# ---- the models as data -----------------------------------------------------------------------

def test_models_aliases_and_evidence():
    for alias, name in [("mi100", "cdna1"), ("MI250X", "cdna2"), ("mi210", "cdna2"),
                        ("mi300x", "cdna3"), ("mi325x", "cdna3"), ("mi355x", "cdna4")]:
        assert mpt.get_mma_model(alias).name == name
    assert [mpt.get_mma_model(m).evidence for m in AMD] == ["reference model"] * 3 + ["assumption"]
    assert [a.name for a in mpt.get_mma_model("cdna4").assumptions] == ["several_nans",
                                                                        "accumulation"]
    assert all(a.name == "several_nans" for m in AMD[:3]
               for a in mpt.get_mma_model(m).assumptions)
    with pytest.raises(ValueError, match="does not take inputs \\(fp16, bf16\\)"):
        mpt.mma(np.ones((1, 8), np.float16), np.ones((8, 1), get_format("bf16").dtype),
                model="cdna3")
    with pytest.raises(ValueError, match="model 'cdna3' has no assumption 'accumulation'"):
        mpt.get_mma_model("cdna3").configure(accumulation="cdna3")
    with pytest.raises(ValueError, match="variant must be one of"):
        mpt.mma(np.ones((1, 8), np.float16), np.ones((8, 1), np.float16), model="cdna3",
                variant="v_mfma_f32_32x32x8f16")
    assert "tf32" not in mpt.get_mma_model("cdna4").input_formats   # gfx950 dropped xf32


@pytest.mark.parametrize("model, fa, fb, variant, k, group", [
    ("cdna1", "fp16", "fp16", "v_mfma_f32_32x32x8f16", 8, 4),
    ("cdna1", "bf16", "bf16", "v_mfma_f32_32x32x4bf16", 4, 2),
    ("cdna1", "fp32", "fp32", "v_mfma_f32_32x32x2f32", 2, 1),
    ("cdna2", "bf16", "bf16", "v_mfma_f32_32x32x8bf16_1k", 8, 4),
    ("cdna2", "fp64", "fp64", "v_mfma_f64_16x16x4f64", 4, 1),
    ("cdna3", "fp16", "fp16", "v_mfma_f32_32x32x8_f16", 8, 8),
    ("cdna3", "tf32", "tf32", "v_mfma_f32_32x32x4_xf32", 4, 4),
    ("cdna3", "fp8_e5m2fnuz", "fp8_e4m3fnuz", "v_mfma_f32_32x32x16_fp8_fp8", 16, 16),
    ("cdna4", "fp16", "fp16", "v_mfma_f32_32x32x16_f16", 16, 8),
    ("cdna4", "fp8_e4m3fn", "fp8_e4m3fn", "v_mfma_f32_32x32x16_fp8_fp8", 16, 16),
    ("cdna4", "fp4_e2m1fn", "fp4_e2m1fn", "v_mfma_f32_32x32x64_f8f6f4", 64, 16),
])
def test_default_variants(model, fa, fb, variant, k, group):
    """The default: Triton's AMD backend's pick for a tile of at least 32x32 (mpt.engines.amd)."""
    cfg = mpt.get_mma_model(model).config(fa, fb)
    assert (cfg.variant, cfg.block, cfg.param("group")) == (variant, k, group)
    assert cfg.param("flush") == (model == "cdna2" and fa in ("fp16", "bf16"))


def test_bad_configurations_are_refused():
    from mpt.engines.model import MMAConfig, MMAModel

    def model(**params):
        p = {"rule": "pairwise", "group": 4, "flush": False, **params}
        return MMAModel("x", "mfma", "", (MMAConfig(("fp16",), "x", 8, None,
                                                    (("fp32", "rne_fp32", None),),
                                                    params=tuple(p.items())),))
    with pytest.raises(ValueError, match="pairwise groups of 2 or 4"):
        model(group=8)
    with pytest.raises(ValueError, match="rule of an MFMA model must be one of"):
        model(rule="tree")
    with pytest.raises(ValueError, match="scale_block must be 32"):
        model(scale_block=32)
    assert model().config("fp16", "fp16").block == 8


# ---- MMA-Sim's own outputs --------------------------------------------------------------------

def test_agrees_with_mmasim_outputs():
    """tests/data/mmasim_mfma.npz holds 4,960 outputs of MMA-Sim's AMD simulator (github
    microsoft/MMA-Sim at c785138, ``mmasim.simulator.amd.mfma``, run on CPU with torch 2.13):
    for CDNA3 f16, bf16 (K=16 and K=4), xf32 (K=8 and K=4), FNUZ fp8 in all four pairings, f32
    and f64, and CDNA1/CDNA2 f32 and CDNA2 f64, the first 4 rows of 5 instructions per variant
    on random bit patterns (moderate, near-cancelling with specials, huge, tiny). Every output
    equals mpt.mma's bit for bit, except NaNs with several possible sources (two NaN inputs, or a
    NaN input and an Inf that makes a NaN of its own), where IEEE leaves the payload open and
    MMA-Sim's choice follows its host's summation order (the assumption ``several_nans``)."""
    path = pathlib.Path(__file__).parent / "data" / "mmasim_mfma.npz"
    data = np.load(path, allow_pickle=False)
    equal = several = 0
    for v_i, meta in enumerate(data["meta"]):
        arch, q, fa, fb, fo = str(meta).split("|")
        model = mpt.get_mma_model(arch.lower())
        cfg, = [c for c in model.configs if "v_mfma_" + q in c.instruction.split(", ")]
        a, b, c, want = (data[f"{v_i}_{x}"] for x in "abcd")
        got = _run(model, cfg, a, b, c, fa, fb)
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
