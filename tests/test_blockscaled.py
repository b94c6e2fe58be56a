"""Blackwell's block-scaled MMA (mpt.engines.blockscaled) against the exact-rational oracle, bit
for bit, under both zero rules; directed vectors whose expected bits come from MMA-Sim.

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
from mpt.engines import blockscaled as bs
from mpt.formats import get_format
from mpt.reference.microscaling import block_scaled_dot_reference

E8M0, UE4M3 = ml_dtypes.float8_e8m0fnu, ml_dtypes.float8_e4m3fn
NAN = float("nan")
INF = float("inf")


def encode(values, fmt):
    """Exact encoding of representable values (the scales and elements of the vectors)."""
    return mpt.round(np.asarray(values, np.float64), fmt)


def run_one(kind, a, b, c, sa, sb, *, fmt="fp8_e4m3fn", scale="ue8m0", block=32, rule="mpt",
            arch="blackwell"):
    """D of one output: a, b: K values; sa, sb: K/block scale values."""
    sfmt = "e8m0" if scale == "ue8m0" else "fp8_e4m3fn"
    av, bv = encode(a, fmt)[None, :], encode(b, fmt)[:, None]
    d = bs.block_scaled_mma(av, bv, encode(sa, sfmt)[None, :], encode(sb, sfmt)[:, None],
                            np.array([[c]], np.float32), kind=kind, scale_format=scale,
                            block=block, arch=arch, zero_rule=rule)
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
CONFIGS = [(arch, kind, scale, block) for arch, combos in bs.ARCHS.items()
           for kind, scale, block in combos]


def random_case(rng, kind, scale, block, m, k, n):
    """Element codes, scale codes and c with the edge cases the issue names: NaN scales, UE4M3
    sign bits, zero blocks, all-subnormal blocks, the extreme E8M0 codes."""
    spec = bs.KINDS[kind]
    fa, fb = rng.choice(spec.elements, 2)
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
       rule=st.sampled_from(bs.ZERO_RULES), instructions=st.integers(1, 2),
       m=st.integers(1, 3), n=st.integers(1, 3))
def test_block_scaled_mma_equals_oracle(seed, config, rule, instructions, m, n):
    arch, kind, scale, block = config
    rng = np.random.default_rng(seed)
    k = bs.KINDS[kind].k * instructions
    a, b, sa, sb, c = random_case(rng, kind, scale, block, m, k, n)
    d = bs.block_scaled_mma(a, b, sa, sb, c, kind=kind, scale_format=scale, block=block,
                            arch=arch, zero_rule=rule)
    av, bv = a.astype(np.float64), b.astype(np.float64)
    sav, sbv = sa.astype(np.float64), sb.astype(np.float64)
    for i in range(m):
        for j in range(n):
            want = block_scaled_dot_reference(
                list(av[i]), list(bv[:, j]), list(sav[i]), list(sbv[:, j]), float(c[i, j]),
                kind=kind, block=block, a_format=get_format(a.dtype).name,
                b_format=get_format(b.dtype).name,
                scale_format="e8m0" if scale == "ue8m0" else "fp8_e4m3fn", zero_rule=rule)
            got = d[i, j]
            if np.isnan(want):
                assert d.view(np.uint32)[i, j] == 0x7FFFFFFF
            else:
                assert np.float32(want).view(np.uint32) == got.view(np.uint32), (i, j)


def test_unit_scales_reduce_to_the_blackwell_f8f6f4_preset():
    """With every E8M0 scale 1 (0x7F), kind::mxf8f6f4 is the f8f6f4 block model of mpt.mma."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 5, 96)).astype(ml_dtypes.float8_e4m3fn)
    b = (rng.standard_normal((96, 7)) * 8).astype(ml_dtypes.float8_e5m2)
    c = rng.standard_normal((2, 5, 7)).astype(np.float32)
    ones_a = np.full((2, 5, 3), 0x7F, np.uint8).view(E8M0)
    ones_b = np.full((3, 7), 0x7F, np.uint8).view(E8M0)
    d = bs.block_scaled_mma(a, b, ones_a, ones_b, c, kind="mxf8f6f4", scale_format="ue8m0",
                            block=32)
    assert np.array_equal(d.view(np.uint32), mpt.mma(a, b, c, model="blackwell").view(np.uint32))


def test_batches_broadcast_with_their_scales():
    rng = np.random.default_rng(5)
    a, b, sa, sb, c = random_case(rng, "mxf4nvf4", "ue4m3", 16, 4, 64, 3)
    a3 = np.stack([a, a[::-1]])                                   # (2, 4, 64)
    sa3 = np.stack([sa, sa[::-1]])
    kw = dict(kind="mxf4nvf4", scale_format="ue4m3", block=16)
    d = bs.block_scaled_mma(a3, b, sa3, sb, c, **kw)
    assert d.shape == (2, 4, 3)
    assert np.array_equal(d[1].view(np.uint32),
                          bs.block_scaled_mma(a[::-1].copy(), b, sa[::-1].copy(), sb, c, **kw)
                          .view(np.uint32))


def test_errors():
    a = np.zeros((2, 64), ml_dtypes.float4_e2m1fn)
    b = np.zeros((64, 3), ml_dtypes.float4_e2m1fn)
    sa, sb = np.zeros((2, 4), UE4M3), np.zeros((4, 3), UE4M3)
    kw = dict(kind="mxf4nvf4", scale_format="ue4m3", block=16)
    with pytest.raises(ValueError, match="kind"):
        bs.block_scaled_mma(a, b, sa, sb, kind="mxf6", scale_format="ue4m3", block=16)
    with pytest.raises(ValueError, match="has no kind"):
        bs.block_scaled_mma(a, b, sa, sb, kind="mxf4", scale_format="ue4m3", block=16)
    with pytest.raises(ValueError, match="has no kind"):
        bs.block_scaled_mma(a, b, np.zeros((2, 2), UE4M3), np.zeros((2, 3), UE4M3),
                            kind="mxf4nvf4", scale_format="ue4m3", block=32)
    with pytest.raises(TypeError, match="a must hold"):
        bs.block_scaled_mma(a.astype(ml_dtypes.float8_e4m3fn), b, sa, sb, **kw)
    with pytest.raises(ValueError, match="multiple of 64"):
        bs.block_scaled_mma(a[:, :32], b[:32], sa[:, :2], sb[:2], **kw)
    with pytest.raises(ValueError, match="scale_a must have shape"):
        bs.block_scaled_mma(a, b, sa[:, :2], sb, **kw)
    with pytest.raises(TypeError, match="scale_b must be"):
        bs.block_scaled_mma(a, b, sa, sb.view(np.uint8), **kw)
    with pytest.raises(TypeError, match="c must be"):
        bs.block_scaled_mma(a, b, sa, sb, np.zeros((2, 3)), **kw)
    with pytest.raises(ValueError, match="zero_rule"):
        bs.block_scaled_mma(a, b, sa, sb, zero_rule="ieee", **kw)


def test_register_path_equals_oracle():
    """Quantized normal data meets the register kernel's conditions (checked): its bits are the
    oracle's, tile padding and int32 partial sums included (M, N not multiples of the tiles)."""
    from mpt.microscaling import quantize_mx
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((20, 96)) * np.exp2(rng.integers(-6, 6, (20, 96)))).astype(np.float32)
    w = (rng.standard_normal((96, 37)) * 4).astype(np.float32)
    qa, qb = quantize_mx(x, "e4m3"), quantize_mx(w, "e5m2", axis=0)
    av = qa.codes.astype(np.float32)
    sav = qa.scales.astype(np.float64)
    assert bs._packable(av, qb.codes.astype(np.float32), sav, qb.scales.astype(np.float64))
    c = rng.standard_normal((20, 37)).astype(np.float32)
    d = bs.block_scaled_mma(qa.codes, qb.codes, qa.scales, qb.scales, c, kind="mxf8f6f4",
                            scale_format="ue8m0", block=32)
    a64, b64 = qa.codes.astype(np.float64), qb.codes.astype(np.float64)
    sb64 = qb.scales.astype(np.float64)
    for i in range(0, 20, 3):
        for j in range(0, 37, 4):
            want = block_scaled_dot_reference(
                list(a64[i]), list(b64[:, j]), list(sav[i]), list(sb64[:, j]), float(c[i, j]),
                kind="mxf8f6f4", block=32, a_format="fp8_e4m3fn", b_format="fp8_e5m2",
                scale_format="e8m0")
            assert np.float32(want).view(np.uint32) == d[i, j].view(np.uint32), (i, j)
