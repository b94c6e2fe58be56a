"""Blackwell's block-scaled MMA (``mpt.mma``/``mpt.gemm`` with the block-scaled variants of the
blackwell and rtx_blackwell presets, mpt.engines.blockscaled) against the exact-rational oracle,
bit for bit, under both zero rules; directed vectors whose expected bits come from MMA-Sim.

How MMA-Sim (github microsoft/MMA-Sim, commit c785138, run with torch 2.13 outside this
repository) was compared: 9 instruction configurations (tcgen05 kind::mxf8f6f4 e4m3·e4m3,
e5m2·e4m3, e5m2·e5m2 with UE8M0; kind::mxf4nvf4 UE8M0 block32 and block16, UE4M3 block16; RTX
Blackwell mma.block_scale m16n8k32 e4m3·e5m2 and m16n8k64 UE4M3 block32 / UE8M0 block16),
195,840 random outputs in two seeded runs (random element bytes, narrow-exponent blocks, scale
codes near the bias, spread, and at the extremes 0x00/0x01/0xFC..0xFE, NaN scales and
elements, zero/negative/subnormal UE4M3 scales, accumulators around the products' magnitude,
zero, subnormal and NaN): 0 mismatches with ``zero_rule="mma_sim"``; 16 of the first 97,920
differ under ``"mpt"``. The directed vectors below were run through MMA-Sim's
``dotadd_with_block_scale`` the same way.
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpt
from mpt.engines.blockscaled import KINDS, SCALE_FORMATS, ZERO_RULE
from mpt.formats import get_format
from mpt.kernels.fma import fma_array
from mpt.microscaling import quantize_mx, quantize_nvfp4
from mpt.reference.microscaling import block_scaled_dot_reference
from mpt.testing import assert_bits_equal

E8M0, UE4M3 = ml_dtypes.float8_e8m0fnu, ml_dtypes.float8_e4m3fn
NAN = float("nan")
INF = float("inf")


def encode(values, fmt):
    """Exact encoding of representable values (the scales and elements of the vectors)."""
    return mpt.round(np.asarray(values, np.float64), fmt)


def model_with(name, rule):
    return mpt.get_mma_model(name).configure(zero_rule=rule)


def run_one(kind, a, b, c, sa, sb, *, fmt="fp8_e4m3fn", scale="ue8m0", block=32, rule="mpt",
            arch="blackwell"):
    """D of one output: a, b: K values; sa, sb: K/block scale values (the block follows)."""
    sfmt = SCALE_FORMATS[scale]
    av, bv = encode(a, fmt)[None, :], encode(b, fmt)[:, None]
    assert len(a) == block * len(sa)
    d = mpt.mma(av, bv, np.array([[c]], np.float32), model=model_with(arch, rule), variant=kind,
                scale_a=encode(sa, sfmt)[None, :], scale_b=encode(sb, sfmt)[:, None])
    return int(d.view(np.uint32)[0, 0])


E4, E5, F4 = "fp8_e4m3fn", "fp8_e5m2", "fp4_e2m1fn"
MX8 = dict(kind="mxf8f6f4")
NV = dict(kind="mxf4nvf4", fmt=F4, scale="ue4m3", block=16)
MX16 = dict(kind="mxf4nvf4", fmt=F4, block=16)
MX32 = dict(kind="mxf4nvf4", fmt=F4, block=32)

# (id, operands, MMA-Sim's bits, mpt-rule bits when they differ)
DIRECTED = [
    ("D1 extreme E8M0 codes", dict(MX8, a=[1.0] * 32, b=[1.0] * 32, c=0.0, sa=[2.0**-127],
                                   sb=[2.0**127]), 0x42000000, None),
    ("D2 overflow to Inf", dict(MX8, a=[448.0] * 32, b=[448.0] * 32, c=0.0, sa=[2.0**127],
                                sb=[2.0**127]), 0x7F800000, None),
    ("D3 NaN scale", dict(MX8, a=[1.0] * 32, b=[1.0] * 32, c=1.0, sa=[NAN], sb=[1.0]),
     0x7FFFFFFF, None),
    ("D4 zero products anchor high", dict(MX8, a=[0.0] * 32, b=[1.0] * 32, c=1.0,
                                          sa=[2.0**127], sb=[2.0**127]), 0x00000000, 0x3F800000),
    ("D5 underflow sign", dict(MX8, a=[2.0**-9] + [0.0] * 31, b=[-(2.0**-9)] + [0.0] * 31, c=0.0,
                               sa=[2.0**-70], sb=[2.0**-70]), 0x00000000, 0x80000000),
    ("D6 NVFP4 maximum", dict(NV, a=[6.0] * 64, b=[6.0] * 64, c=0.0, sa=[448.0] * 4,
                              sb=[448.0] * 4), 0x4DDC8000, None),
    ("D7 UE4M3 sign bits ignored", dict(NV, a=[0.5, -1.5, 3.0, 6.0] * 16,
                                        b=[1.0, 2.0, -0.5, 4.0] * 16, c=0.25,
                                        sa=[-1.0, 2.0, -0.5, 1.5], sb=[1.25, -3.0, 0.75, 2.0**-9]),
     0x44189F00, None),
    ("D7p the same, positive", dict(NV, a=[0.5, -1.5, 3.0, 6.0] * 16, b=[1.0, 2.0, -0.5, 4.0] * 16,
                                    c=0.25, sa=[1.0, 2.0, 0.5, 1.5], sb=[1.25, 3.0, 0.75, 2.0**-9]),
     0x44189F00, None),
    ("D8 zero and subnormal UE4M3", dict(NV, a=[1.0] * 64, b=[0.5] * 64, c=2.0**-140,
                                         sa=[0.0, 2.0**-9, 1.0, 1.0], sb=[1.0, 2.0**-9, 0.0, 0.0]),
     0x38000000, None),
    ("D9 F=35 truncation", dict(MX16, a=[1.5, 0.5, 3.0, -0.5] * 16, b=[1.0, 1.5, 0.5, 0.5] * 16,
                                c=0.0, sa=[2.0**20, 1.0, 1.0, 1.0], sb=[2.0**20, 1.0, 1.0, 1.0]),
     0x55600000, None),
    ("D10 NaN accumulator", dict(NV, a=[1.0] * 64, b=[1.0] * 64, c=NAN, sa=[1.0] * 4,
                                 sb=[1.0] * 4), 0x7FFFFFFF, None),
    ("D11 block32 extremes", dict(MX32, a=[6.0, 0.5] * 32, b=[4.0, -1.0] * 32, c=1.5,
                                  sa=[2.0**-127, 2.0**127], sb=[2.0**127, 2.0**-127]),
     0x443C6000, None),
    ("D12 e5m2 Inf", dict(MX8, fmt=E5, a=[INF] + [1.0] * 31, b=[2.0] + [1.0] * 31, c=0.0,
                          sa=[1.0], sb=[1.0]), 0x7F800000, None),
    ("D13 e5m2 Inf times 0", dict(MX8, fmt=E5, a=[INF] + [1.0] * 31, b=[0.0] + [1.0] * 31, c=0.0,
                                  sa=[1.0], sb=[1.0]), 0x7FFFFFFF, None),
    ("D14 group overflow", dict(MX16, a=[6.0] * 64, b=[6.0] * 64, c=0.0, sa=[2.0**127] * 4,
                                sb=[2.0**127] * 4), 0x7F800000, None),
    ("D15 RZ of c", dict(NV, a=[1.0] * 64, b=[1.0] * 64, c=-(1 + 2.0**-23) * 2.0**-20,
                         sa=[2.0**-9] * 4, sb=[2.0**-9] * 4), 0x397EFFFF, None),
]


@pytest.mark.parametrize("name, case, mma_sim, mpt_rule", DIRECTED, ids=[d[0] for d in DIRECTED])
def test_directed_vectors_match_mma_sim(name, case, mma_sim, mpt_rule):
    case = dict(case)
    kind = case.pop("kind")
    args = [case.pop(k) for k in ("a", "b", "c", "sa", "sb")]
    assert run_one(kind, *args, rule="mma_sim", **case) == mma_sim
    assert run_one(kind, *args, rule="mpt", **case) == (mma_sim if mpt_rule is None else mpt_rule)


# ---- random operands against the oracle ----------------------------------------------------------
def _scaled_variants():
    """(model, variant, scale format, block, element formats) of every block-scaled
    configuration of the presets (all element formats of a variant, FP6 included)."""
    out = {}
    for name in ("blackwell", "rtx_blackwell"):
        model = mpt.get_mma_model(name)
        for cfg in model.configs:
            if model.scaled(cfg):
                for sfmt, block in cfg.param("scales"):
                    key = (name, cfg.variant, sfmt, block)
                    out[key] = tuple(dict.fromkeys(out.get(key, ()) + cfg.inputs))
    return [k + (v,) for k, v in out.items()]


CONFIGS = _scaled_variants()


def test_the_presets_have_the_instructions_of_the_isa():
    """tcgen05 (Blackwell) and mma.sync (RTX Blackwell) kinds, scale formats and blocks (PTX ISA,
    MMA-Sim's isa tables); the FP6 elements are labelled assumptions."""
    combos = {(m, v, s, b) for m, v, s, b, _ in CONFIGS}
    assert combos == {
        ("blackwell", "mxf8f6f4", "ue8m0", 32), ("blackwell", "mxf4", "ue8m0", 32),
        ("blackwell", "mxf4nvf4", "ue8m0", 32), ("blackwell", "mxf4nvf4", "ue8m0", 16),
        ("blackwell", "mxf4nvf4", "ue4m3", 16),
        ("rtx_blackwell", "mxf8f6f4", "ue8m0", 32), ("rtx_blackwell", "mxf4", "ue8m0", 32),
        ("rtx_blackwell", "mxf4nvf4", "ue8m0", 32), ("rtx_blackwell", "mxf4nvf4", "ue8m0", 16),
        ("rtx_blackwell", "mxf4nvf4", "ue4m3", 32), ("rtx_blackwell", "mxf4nvf4", "ue4m3", 16)}
    bw = mpt.get_mma_model("blackwell")
    assert bw.config("fp8_e4m3fn", "fp4_e2m1fn", "mxf8f6f4").evidence == "reference model"
    assert bw.config("fp8_e4m3fn", "fp6_e3m2fn", "mxf8f6f4").evidence == "assumption"
    assert ZERO_RULE in bw.assumptions and bw.choice("zero_rule") == "mpt"


def random_case(rng, elements, scale, block, m, k, n):
    """Element codes, scale codes and c with the edge cases the issue names: NaN scales, UE4M3
    sign bits, zero blocks, all-subnormal blocks, the extreme E8M0 codes."""
    fa, fb = rng.choice(elements, 2)
    ops = []
    for fmt, shape in ((fa, (m, k)), (fb, (k, n))):
        f = get_format(fmt)
        codes = rng.integers(0, 1 << f.bits, shape).astype(np.uint8)
        if rng.random() < 0.5:                                # no NaN/Inf elements
            vals = codes.view(f.dtype).astype(np.float32)
            codes[~np.isfinite(vals)] &= 0x1 if f.bits == 8 else 0xFF
        if rng.random() < 0.3:                                # a zero block
            codes[..., :block] = 0
        if rng.random() < 0.3 and f.bits == 8:                # an all-subnormal block
            codes[..., -block:] &= 0x83 if fmt == E4 else 0x81
        ops.append(codes.view(f.dtype))
    sfmt = get_format("e8m0" if scale == "ue8m0" else "fp8_e4m3fn")
    scales = []
    for shape in ((m, k // block), (k // block, n)):
        if scale == "ue8m0":
            s = (127 + rng.integers(-15, 16, shape)).astype(np.uint8)
            pick = rng.random(shape)
            s[pick < 0.1] = rng.choice(np.array([0x00, 0x01, 0xFD, 0xFE, 0xFF], np.uint8),
                                       (pick < 0.1).sum())
        else:
            s = rng.integers(0, 256, shape).astype(np.uint8)  # signs, zeros, subnormals, NaN
            if rng.random() < 0.7:
                s[(s & 0x7F) == 0x7F] = 0x38
        scales.append(s.view(sfmt.dtype))
    c = (rng.standard_normal((m, n)) * np.exp2(rng.integers(-30, 30, (m, n)))).astype(np.float32)
    c[rng.random((m, n)) < 0.2] = 0.0
    c[rng.random((m, n)) < 0.05] = np.float32(2.0**-140)
    return ops[0], ops[1], scales[0], scales[1], c


@settings(max_examples=60)
@given(seed=st.integers(0, 2**32 - 1), config=st.sampled_from(CONFIGS),
       rule=st.sampled_from(ZERO_RULE.choices), instructions=st.integers(1, 2),
       m=st.integers(1, 3), n=st.integers(1, 3))
def test_block_scaled_mma_equals_oracle(seed, config, rule, instructions, m, n):
    arch, kind, scale, block, elements = config
    rng = np.random.default_rng(seed)
    k = KINDS[kind][0] * instructions
    a, b, sa, sb, c = random_case(rng, elements, scale, block, m, k, n)
    d = mpt.mma(a, b, c, model=model_with(arch, rule), variant=kind, scale_a=sa, scale_b=sb)
    assert_oracle(d, a, b, sa, sb, c, kind, block, scale, rule)


def assert_oracle(d, a, b, sa, sb, c, kind, block, scale, rule="mpt", rows=None, cols=None):
    av, bv = a.astype(np.float64), b.astype(np.float64)
    sav, sbv = sa.astype(np.float64), sb.astype(np.float64)
    for i in rows or range(d.shape[0]):
        for j in cols or range(d.shape[1]):
            want = block_scaled_dot_reference(
                av[i].tolist(), bv[:, j].tolist(), sav[i].tolist(), sbv[:, j].tolist(),
                float(c[i, j]),
                kind=kind, block=block, a_format=get_format(a.dtype).name,
                b_format=get_format(b.dtype).name, scale_format=SCALE_FORMATS[scale],
                zero_rule=rule)
            if np.isnan(want):
                assert d.view(np.uint32)[i, j] == 0x7FFFFFFF, (i, j)
            else:
                assert np.float32(want).view(np.uint32) == d[i, j].view(np.uint32), (i, j)


def test_unit_scales_reduce_to_the_blackwell_f8f6f4_preset():
    """With every E8M0 scale 1 (0x7F), kind::mxf8f6f4 is the f8f6f4 block model of mpt.mma; the
    variant is the only block-scaled one for FP8 inputs, so the scales select it."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 5, 96)).astype(ml_dtypes.float8_e4m3fn)
    b = (rng.standard_normal((96, 7)) * 8).astype(ml_dtypes.float8_e5m2)
    c = rng.standard_normal((2, 5, 7)).astype(np.float32)
    ones_a = np.full((2, 5, 3), 0x7F, np.uint8).view(E8M0)
    ones_b = np.full((3, 7), 0x7F, np.uint8).view(E8M0)
    d = mpt.mma(a, b, c, model="blackwell", scale_a=ones_a, scale_b=ones_b)
    assert_bits_equal(d, mpt.mma(a, b, c, model="blackwell"))


def test_batches_broadcast_with_their_scales():
    rng = np.random.default_rng(5)
    elements = ("fp4_e2m1fn",)
    a, b, sa, sb, c = random_case(rng, elements, "ue4m3", 16, 4, 64, 3)
    a3 = np.stack([a, a[::-1]])                                   # (2, 4, 64)
    sa3 = np.stack([sa, sa[::-1]])
    kw = dict(model="blackwell", variant="mxf4nvf4")
    d = mpt.mma(a3, b, c, scale_a=sa3, scale_b=sb, **kw)
    assert d.shape == (2, 4, 3)
    assert_bits_equal(d[1], mpt.mma(a[::-1].copy(), b, c, scale_a=sa[::-1].copy(), scale_b=sb,
                                    **kw))


@pytest.mark.parametrize("variant, scale, block", [("mxf4nvf4", "ue4m3", 16),
                                                   ("mxf4", "ue8m0", 32),
                                                   ("mxf8f6f4", "ue8m0", 32)])
def test_a_partial_last_instruction_is_zero_filled(variant, scale, block):
    """K = 32 on a K = 64 instruction (or 48 on K = 32): the missing k are zero elements with
    scale code 0x00, as TMA's out-of-bounds fill gives; the oracle agrees."""
    rng = np.random.default_rng(8)
    fmt = ml_dtypes.float4_e2m1fn if variant != "mxf8f6f4" else ml_dtypes.float8_e4m3fn
    k = 32 if variant != "mxf8f6f4" else 64
    a, b, sa, sb, c = random_case(rng, (get_format(fmt).name,), scale, block, 3, k + 32, 2)
    a, b = a[:, :k].copy(), b[:k].copy()
    sa, sb = sa[:, :k // block].copy(), sb[:k // block].copy()
    padded = [np.concatenate([x, np.zeros_like(x)], axis=ax) for x, ax in
              ((a, 1), (b, 0), (sa, 1), (sb, 0))]
    kw = dict(model="blackwell", variant=variant)
    d = mpt.mma(a, b, c, scale_a=sa, scale_b=sb, **kw)
    assert_bits_equal(d, mpt.mma(padded[0], padded[1], c, scale_a=padded[2], scale_b=padded[3],
                                 **kw))
    assert_oracle(d, a, b, sa, sb, c, variant, block, scale)


def test_gemm_chains_block_scaled_instructions_and_applies_software_scales():
    """gemm with the instruction's block scales: split-K chunks are MMA chains added in FP32,
    promotion fuses each partial with an FMA, and a float32 per-tensor scale multiplies the
    result (NVFP4's S_dec·S_dec) — each step composed by hand from mpt.mma."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((6, 256)) * 3).astype(np.float32)
    w = rng.standard_normal((256, 5)).astype(np.float32)
    qa, qb = quantize_nvfp4(x), quantize_nvfp4(w, axis=0)
    kw = dict(model="b200", variant="mxf4nvf4")

    def mma(lo, hi, c=None):
        return mpt.mma(qa.codes[:, lo:hi], qb.codes[lo:hi], c,
                       scale_a=qa.scales[:, lo // 16:hi // 16],
                       scale_b=qb.scales[lo // 16:hi // 16], **kw)

    hw = dict(block_scale_a=qa.scales, block_scale_b=qb.scales, **kw)
    assert_bits_equal(mpt.gemm(qa.codes, qb.codes, **hw), mma(0, 256))
    assert_bits_equal(mpt.gemm(qa.codes, qb.codes, split_k=2, **hw), mma(0, 128) + mma(128, 256))
    register = fma_array(np.float32(1), mma(0, 128), np.full((6, 5), -0.0, np.float32))
    register = fma_array(np.float32(1), mma(128, 256), register)
    assert_bits_equal(mpt.gemm(qa.codes, qb.codes, promote_every=128, **hw), register)
    alpha = np.float32(qa.tensor_scale * qb.tensor_scale)
    want = fma_array(alpha, mma(0, 256), np.float32(-0.0))
    assert_bits_equal(mpt.gemm(qa.codes, qb.codes, scale_a=qa.tensor_scale,
                               scale_b=qb.tensor_scale, **hw), want)
    exact = qa.decode() @ qb.decode()                           # float64: near, not equal
    assert np.abs(want - exact).max() <= 2.0**-20 * np.abs(exact).max() * 256


def test_errors():
    a = np.zeros((2, 64), ml_dtypes.float4_e2m1fn)
    b = np.zeros((64, 3), ml_dtypes.float4_e2m1fn)
    sa, sb = np.zeros((2, 4), UE4M3), np.zeros((4, 3), UE4M3)
    kw = dict(model="blackwell", variant="mxf4nvf4")
    with pytest.raises(ValueError, match=r"3 block-scaled variants .* \('mxf8f6f4', 'mxf4', "
                                         r"'mxf4nvf4'\)"):
        mpt.mma(a, b, model="blackwell", scale_a=sa, scale_b=sb)
    with pytest.raises(ValueError, match="variant must be one of"):
        mpt.mma(a, b, model="blackwell", variant="mxf6", scale_a=sa, scale_b=sb)
    with pytest.raises(ValueError, match="takes scales .*ue8m0/32; got ue4m3"):
        mpt.mma(a, b, model="blackwell", variant="mxf4", scale_a=sa, scale_b=sb)
    with pytest.raises(ValueError, match="takes scales .*got ue4m3 codes with scale_a of shape "
                                         r"\(2, 2\)"):
        mpt.mma(a, b, scale_a=np.zeros((2, 2), UE4M3), scale_b=np.zeros((2, 3), UE4M3), **kw)
    with pytest.raises(ValueError, match="variant must be one of 'default', 'mxf8f6f4' for "
                                         r"model 'blackwell' with \(fp8_e4m3fn, fp4_e2m1fn\)"):
        mpt.mma(a.astype(ml_dtypes.float8_e4m3fn), b, scale_a=sa, scale_b=sb, **kw)
    with pytest.raises(ValueError, match="scale_b must have shape"):
        mpt.mma(a, b, scale_a=sa, scale_b=sb[:, :2], **kw)
    with pytest.raises(TypeError, match="both hold UE8M0"):
        mpt.mma(a, b, scale_a=sa, scale_b=sb.view(np.uint8), **kw)
    with pytest.raises(ValueError, match="needs both scale_a and scale_b"):
        mpt.mma(a, b, scale_a=sa, **kw)
    with pytest.raises(ValueError, match="needs both scale_a and scale_b"):
        mpt.mma(a, b, **kw)
    with pytest.raises(TypeError, match="c must be float32"):
        mpt.mma(a, b, np.zeros((2, 3)), scale_a=sa, scale_b=sb, **kw)
    with pytest.raises(ValueError, match="zero_rule must be one of 'mpt', 'mma_sim'"):
        mpt.get_mma_model("blackwell").configure(zero_rule="ieee")
    with pytest.raises(TypeError, match="scale_a is a float32 dequantisation scale; the "
                                        "instruction's float8_e4m3fn block scales go in "
                                        "block_scale_a"):
        mpt.gemm(a, b, scale_a=sa, scale_b=sb, **kw)
    with pytest.raises(ValueError, match="takes no block scales"):
        mpt.mma(a.astype(np.float16), b.astype(np.float16), model="hopper", scale_a=sa,
                scale_b=sb)


def test_register_path_equals_oracle():
    """Quantized normal data meets the register kernel's conditions (checked on the folded
    values, element × scale): its bits are the oracle's, tile padding and int32 partial sums
    of 16 included (M, N not multiples of the tiles)."""
    from mpt.engines.block import packable
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((20, 96)) * np.exp2(rng.integers(-6, 6, (20, 96)))).astype(np.float32)
    w = (rng.standard_normal((96, 37)) * 4).astype(np.float32)
    qa, qb = quantize_mx(x, "e4m3"), quantize_mx(w, "e5m2", axis=0)
    assert packable(qa.decode(), qb.decode())
    c = rng.standard_normal((20, 37)).astype(np.float32)
    d = mpt.mma(qa.codes, qb.codes, c, model="blackwell", scale_a=qa.scales, scale_b=qb.scales)
    assert_oracle(d, qa.codes, qb.codes, qa.scales, qb.scales, c, "mxf8f6f4", 32, "ue8m0",
                  rows=range(0, 20, 3), cols=range(0, 37, 4))
