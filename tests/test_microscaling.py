"""Block-scaled quantizers (mpt.microscaling) against the exact-rational oracles, bit for bit:
every MX element format and scale rule, NVFP4 and its rule variants, 1x16 / 1x32 / 16x16 blocks,
round-to-nearest and both stochastic modes; exact decoding; the exact expectation of stochastic
rounding over its random words; the 16x16 weight tiles seen from both axes; the random Hadamard
transform (orthogonality, oracle, products preserved)."""
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpt import microscaling as ms
from mpt.formats import get_format
from mpt.kernels.random import random_words
from mpt.reference import microscaling as ref
from mpt.reference.mma import block_dot_reference
from mpt.reference.rounding import decode_value, round_exact

_SPECIALS = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x80000000, 0x00000001,
                      0x007FFFFF, 0x7F7FFFFF], np.uint32)


def make_matrix(seed, rows, cols, specials):
    """Float32 test data: blocks whose values share a random binade range (so scales,
    rounding and saturation all matter), zeros, subnormals and, optionally, Inf/NaN."""
    rng = np.random.default_rng(seed)
    base = rng.integers(-150, 116, (rows, 1))
    spread = rng.integers(0, 12, (rows, 1))
    e = base + rng.integers(0, 1 + spread.max(), (rows, cols)) % (spread + 1)
    frac = rng.integers(0, 1 << 23, (rows, cols))
    x = np.ldexp(1.0 + frac / 2.0**23, e) * np.where(rng.random((rows, cols)) < 0.5, -1, 1)
    x = x.astype(np.float32)                                  # tiny ones round to subnormals
    x[rng.random((rows, cols)) < 0.1] = 0.0
    if specials:
        pick = rng.random((rows, cols)) < 0.05
        x[pick] = rng.choice(_SPECIALS, pick.sum()).view(np.float32)
    return x


def words_for(mode, seed, shape):
    if mode == "nearest_even":
        return None
    return random_words(seed, 7, int(np.prod(shape))).reshape(shape)


def code_bits(arr):
    a = np.ascontiguousarray(arr)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a


blocks = st.sampled_from([(1, 32), (1, 16), (16, 16)])
modes = st.sampled_from(ms.MODES)


@settings(max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), fmt=st.sampled_from(ms.MX_ELEMENT_FORMATS),
       rule=st.sampled_from(ms.SCALE_RULES), block=blocks, mode=modes,
       rows=st.integers(1, 18), cols=st.integers(1, 40), specials=st.booleans())
def test_quantize_mx_equals_oracle(seed, fmt, rule, block, mode, rows, cols, specials):
    x = make_matrix(seed, rows, cols, specials)
    w = words_for(mode, seed, x.shape)
    q = ms.quantize_mx(x, fmt, block=block, scale_rule=rule, mode=mode, random_bits=w)
    oracle_words = None if w is None else w.tolist()
    codes, scales = ref.quantize_mx_reference(x.tolist(), fmt, block=block, rule=rule, mode=mode,
                                              words=oracle_words)
    f = get_format(fmt)
    want = np.array(codes, np.int64).astype(np.int8 if f.kind == "int" else np.uint8)
    assert np.array_equal(code_bits(q.codes).view(want.dtype), want)
    assert np.array_equal(q.scales.view(np.uint8), np.array(scales, np.uint8))


@settings(max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), rule=st.sampled_from(ms.NVFP4_SCALE_RULES),
       block=st.sampled_from([(1, 16), (16, 16)]), mode=modes, rows=st.integers(1, 18),
       cols=st.integers(1, 40), specials=st.booleans(), own_amax=st.booleans())
def test_quantize_nvfp4_equals_oracle(seed, rule, block, mode, rows, cols, specials, own_amax):
    x = make_matrix(seed, rows, cols, specials)
    w = words_for(mode, seed, x.shape)
    amax = np.float32(np.ldexp(1.0, (seed % 40) - 20)) if own_amax else None
    q = ms.quantize_nvfp4(x, block=block, scale_rule=rule, mode=mode, random_bits=w,
                          global_amax=amax)
    codes, scales, s_dec, a = ref.quantize_nvfp4_reference(
        x.tolist(), block=block, rule=rule, mode=mode, words=None if w is None else w.tolist(),
        global_amax=None if amax is None else float(amax))
    assert np.array_equal(q.codes.view(np.uint8), np.array(codes, np.uint8))
    assert np.array_equal(q.scales.view(np.uint8), np.array(scales, np.uint8))
    assert q.tensor_scale == s_dec and q.amax == a


def test_scale_rules_at_their_edges():
    """Hand-checked codes: TE rounds the exponent up (amax 500 in e4m3: X = 2, element 256),
    OCP floors it (X = 1, element saturates to 448), Trainium doubles OCP's scale."""
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 500.0
    te = ms.quantize_mx(x, "e4m3", scale_rule="te")
    ocp = ms.quantize_mx(x, "e4m3", scale_rule="ocp")
    trn = ms.quantize_mx(x, "e4m3", scale_rule="trainium")
    assert te.scales.view(np.uint8)[0, 0] == 128 and te.decode()[0, 0] == 512.0
    assert ocp.scales.view(np.uint8)[0, 0] == 127 and ocp.decode()[0, 0] == 448.0
    assert trn.scales.view(np.uint8)[0, 0] == 128
    # TE specials: amax 0 -> 0x00; Inf -> 0xFE (element saturates); NaN is ignored in the amax
    # and its element becomes 0x7F
    x = np.zeros((3, 32), np.float32)
    x[1, 3], x[2, 5], x[2, 6] = np.inf, np.nan, 3.0
    q = ms.quantize_mx(x, "e4m3", scale_rule="te")
    assert list(q.scales.view(np.uint8)[:, 0]) == [0x00, 0xFE, 127 + math.ceil(math.log2(3 / 448))]
    assert q.codes.view(np.uint8)[1, 3] == 0x7E and q.codes.view(np.uint8)[2, 5] == 0x7F
    # OCP: a non-finite block gets the NaN scale, an all-zero block 2^-127
    q = ms.quantize_mx(x, "e4m3", scale_rule="ocp")
    assert list(q.scales.view(np.uint8)[:, 0]) == [0x00, 0xFF, 0xFF]
    # the clamps: 2^-140 (a float32 subnormal amax) in e4m3; FLT_MAX in MXINT8 (emax 0), where
    # OCP gives 2^127 exactly, Trainium's 2^128 clamps and TE's satfinite keeps 0xFE
    x = np.zeros((2, 32), np.float32)
    x[0, 0], x[1, 0] = np.float32(2.0**-140), np.finfo(np.float32).max
    for rule in ms.SCALE_RULES:
        assert ms.quantize_mx(x, "e4m3", scale_rule=rule).scales.view(np.uint8)[0, 0] == 0
        assert ms.quantize_mx(x, "int8", scale_rule=rule).scales.view(np.uint8)[1, 0] == 0xFE


def test_nvfp4_global_scale_and_specials():
    assert ms.nvfp4_global_scale(np.float32(0)) == 1 and ms.nvfp4_global_scale(np.inf) == 1
    assert ms.nvfp4_global_scale(np.float32(2688)) == 1
    assert ms.nvfp4_global_scale(np.float32(2.0**-149)) == np.finfo(np.float32).max
    x = np.array([[np.nan, -0.0, 1e-30, -np.inf] + [1.0] * 12], np.float32)
    q = ms.quantize_nvfp4(x)
    codes = q.codes.view(np.uint8)[0]
    assert codes[0] == 0x07 and codes[1] == 0x08            # NaN -> +6, -0 stays -0
    assert codes[3] == 0x0F                                  # -Inf saturates to -6
    assert q.amax == np.inf and q.tensor_scale == 1


@pytest.mark.parametrize("amax, block_amax, differs", [
    (1.0, 0.0026506695430725813, "te_v2.8"),            # found by a search near E4M3 ties
    (1234.5, 3.2722511291503906, "te_v2.8_rowwise"),
])
def test_nvfp4_scale_rules_differ_at_e4m3_ties(amax, block_amax, differs):
    """TE's three formulas of the block scale land on both sides of an E4M3 tie here: each rule
    equals the oracle, and the named variant differs from the current rule by one code."""
    x = np.zeros((1, 16), np.float32)
    x[0, 0] = block_amax
    got = {}
    for rule in ms.NVFP4_SCALE_RULES:
        q = ms.quantize_nvfp4(x, scale_rule=rule, global_amax=np.float32(amax))
        _, scales, _, _ = ref.quantize_nvfp4_reference(x.tolist(), block=(1, 16), rule=rule,
                                                       global_amax=float(np.float32(amax)))
        got[rule] = int(q.scales.view(np.uint8)[0, 0])
        assert got[rule] == scales[0][0], rule
    assert abs(got["te"] - got[differs]) == 1


# ---- decode --------------------------------------------------------------------------------------
@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), fmt=st.sampled_from(ms.MX_ELEMENT_FORMATS), block=blocks,
       rule=st.sampled_from(["ocp", "trainium"]))
def test_decode_of_representable_values_is_the_identity(seed, fmt, block, rule):
    """x = element · 2^e quantizes back to itself when each block's largest element sits in the
    binade that sets the scale to 2^e: emax_elem for OCP, one below for Trainium (whose scale is
    twice OCP's), with the other elements below the binade after it."""
    rng = np.random.default_rng(seed)
    f = get_format(fmt)
    n_codes = 1 << f.bits
    table = np.array([decode_value(c, f) for c in range(n_codes)])
    if f.kind == "int":                                   # MXINT8: code · 2^-6; ±127 only
        table = np.where(table == -128, np.nan, table * 2.0**-6)
    finite = np.flatnonzero(np.isfinite(table))
    rows, cols = block[0] * 2, block[1] * 2
    e = rng.integers(-100, 100, (2, 2))
    level = f.emax - (rule == "trainium") if f.kind == "float" else -(rule == "trainium")
    mag = np.abs(table[finite])
    below = finite[mag < 2.0**(level + 1)]
    codes = rng.choice(below, (rows, cols))
    top = finite[(mag >= 2.0**level) & (mag < 2.0**(level + 1))]
    scale_e = np.repeat(np.repeat(e, block[0], 0), block[1], 1)
    for bi in range(2):
        for bj in range(2):                                   # the block maximum sets e
            codes[bi * block[0], bj * block[1]] = rng.choice(top)
    x = (table[codes] * np.exp2(scale_e.astype(np.float64))).astype(np.float32)
    q = ms.quantize_mx(x, fmt, block=block, scale_rule=rule)
    assert np.array_equal(q.decode(), x.astype(np.float64))


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), block=st.sampled_from([(1, 16), (16, 16)]))
def test_nvfp4_decode_is_the_exact_product(seed, block):
    x = make_matrix(seed, 16, 32, specials=False)
    q = ms.quantize_nvfp4(x, block=block)
    d = q.decode()
    e2m1 = q.codes.astype(np.float64)
    s = np.repeat(np.repeat(q.scales.astype(np.float64), block[0], 0), block[1], 1)
    for i, j in [(0, 0), (3, 17), (15, 31)]:
        want = Fraction(e2m1[i, j]) * Fraction(s[i, j]) * Fraction(float(q.tensor_scale))
        assert Fraction(d[i, j]) == want


# ---- layout --------------------------------------------------------------------------------------
@settings(max_examples=20)
@given(seed=st.integers(0, 2**32 - 1), mode=modes)
def test_16x16_tiles_are_the_same_seen_from_either_axis(seed, mode):
    """What makes the forward (W) and backward (Wᵀ) GEMMs see one quantized weight."""
    w = make_matrix(seed, 40, 24, specials=False)
    bits = words_for(mode, seed, w.shape)
    kw = lambda b: {} if b is None else {"random_bits": np.ascontiguousarray(b)}  # noqa: E731
    for quantize in (lambda x, **k: ms.quantize_nvfp4(x, block=(16, 16), mode=mode, **k),
                     lambda x, **k: ms.quantize_mx(x, "e4m3", block=(16, 16), mode=mode, **k)):
        q = quantize(w, **kw(bits))
        qt = quantize(w.T, **kw(None if bits is None else bits.T))
        assert np.array_equal(q.codes.view(np.uint8), qt.codes.T.view(np.uint8))
        assert np.array_equal(q.scales.view(np.uint8), qt.scales.T.view(np.uint8))
        qa = quantize(w, axis=-2, **kw(bits))                   # same tiles, either axis
        assert np.array_equal(q.codes.view(np.uint8), qa.codes.view(np.uint8))


def test_axis_moves_blocks_and_words_together():
    x = make_matrix(5, 3, 64, specials=False).reshape(3, 2, 32)
    words = random_words(3, 0, x.size).reshape(x.shape)
    for mode in ("nearest_even", "stochastic"):
        w = None if mode == "nearest_even" else words
        a = ms.quantize_mx(x, "e2m1", axis=1, block=(1, 16), mode=mode,
                           random_bits=None if w is None else w)
        b = ms.quantize_mx(np.ascontiguousarray(np.moveaxis(x, 1, -1)), "e2m1", block=(1, 16),
                           mode=mode, random_bits=None if w is None
                           else np.ascontiguousarray(np.moveaxis(w, 1, -1)))
        assert a.scales.shape == (3, 1, 32) and a.axis == 1
        assert np.array_equal(a.codes.view(np.uint8), np.moveaxis(b.codes, -1, 1).view(np.uint8))
    seeded = ms.quantize_nvfp4(x.reshape(3, 64), mode="stochastic", seed=3)
    explicit = ms.quantize_nvfp4(x.reshape(3, 64), mode="stochastic",
                                 random_bits=random_words(3, 0, 192).reshape(3, 64))
    assert np.array_equal(seeded.codes.view(np.uint8), explicit.codes.view(np.uint8))


# ---- stochastic rounding: exact expectation over the words ---------------------------------------
@pytest.mark.parametrize("mode, rbits", [("stochastic_8bit", 8), ("stochastic", 12)])
def test_stochastic_rounding_mean_over_all_words_is_exact(mode, rbits):
    """Every row is the same NVFP4 block rounded with one word; over all 2^rbits top-bit patterns
    the mean of the decoded elements is lo + q·floor(frac·2^rbits)/2^rbits exactly, where
    [lo, lo + q] brackets the scaled value and frac is its position: x itself when the scaled
    value has at most rbits discarded bits, within q·2^-rbits below it otherwise."""
    rng = np.random.default_rng(1)
    block = (rng.standard_normal(16) * 2).astype(np.float32)
    block[0] = 11.0
    n = 1 << rbits
    x = np.tile(block, (n, 1))                                          # (n, 16)
    words = (np.arange(n, dtype=np.uint64) << np.uint64(32 - rbits)).astype(np.uint32)
    q = ms.quantize_nvfp4(x, mode=mode, random_bits=np.repeat(words[:, None], 16, 1))
    mean = [sum(Fraction(v) for v in col) / n for col in q.decode().T]
    rne = ms.quantize_nvfp4(x[:1])                          # the scale does not depend on mode
    s = rne.scales.astype(np.float32)[0, 0]
    inv = np.minimum(np.float32(1) / (s * rne.tensor_scale), np.finfo(np.float32).max)
    step = Fraction(float(s)) * Fraction(float(rne.tensor_scale))
    for j, xj in enumerate(block):
        y = abs(Fraction(float(xj * inv)))                   # the float32 product
        grid = Fraction(1, 2) if y < 2 else Fraction(1) if y < 4 else Fraction(2)
        lo = (y // grid) * grid
        want = min(lo + grid * Fraction(math.floor((y - lo) / grid * n), n), Fraction(6))
        assert abs(mean[j]) == want * step, j


# ---- the random Hadamard transform ---------------------------------------------------------------
def test_rht_matrix_is_tes_and_orthogonal():
    te_signs = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]   # TE's reference
    h = np.array([[(-1) ** bin(i & j).count("1") for j in range(16)] for i in range(16)])
    assert np.array_equal(ms.rht_matrix(), np.diag(te_signs) @ h / 4.0)
    assert ms.rht_is_orthogonal()
    q = ms.rht_matrix()
    gram = [[sum(Fraction(q[i, k]) * Fraction(q[j, k]) for k in range(16)) for j in range(16)]
            for i in range(16)]
    assert gram == [[int(i == j) for j in range(16)] for i in range(16)]


@settings(max_examples=20)
@given(seed=st.integers(0, 2**32 - 1))
def test_hadamard_transform_equals_the_block_model_oracle(seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((2, 32)) * np.exp2(rng.integers(-30, 30, (2, 32)))).astype(
        ml_dtypes.bfloat16)
    x[0, 3] = 0
    y = ms.hadamard_transform(x)
    q = ms.rht_matrix()
    for r in range(2):
        for g in range(2):
            row = [float(v) for v in x[r, 16 * g:16 * g + 16].astype(np.float32)]
            for j in range(16):
                d = block_dot_reference(row, list(q[:, j]), 0.0, a_format="bf16",
                                        b_format="bf16", block=16, fraction_bits=25, e_zero=-133,
                                        rounding="rz_fp32")
                want = round_exact(d, "bf16")
                assert y[r, 16 * g + j].view(np.uint16) == want, (r, g, j)


def test_hadamard_transform_on_both_operands_preserves_the_product():
    """(x·Q)·(w·Q) = x·w for orthogonal Q; with each transformed element y = ŷ(1 + δ) + η,
    |δ| <= 2^-8 (RNE to bf16) and |η| <= 2^-21·max|x| (the FP32 block: 16 truncations below
    2^(E-25) plus one RZ, E <= log2(max|x|) - 2, then bf16 of that), Cauchy-Schwarz gives
    |Σ y_x y_w − Σ x w| <= Σ (|ε_x||ŷ_w| + |ŷ_x||ε_w| + |ε_x||ε_w|) with |ε| <= 2^-8|ŷ| + η·1.004.
    The bound is computed from the exact ŷ (float64 is exact here: values span < 2^40)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 64)) * np.exp2(rng.integers(-8, 8, (8, 64)))).astype(
        ml_dtypes.bfloat16)
    w = (rng.standard_normal((8, 64)) * np.exp2(rng.integers(-8, 8, (8, 64)))).astype(
        ml_dtypes.bfloat16)
    q = ms.rht_matrix()
    yx, yw = (ms.hadamard_transform(v).astype(np.float64) for v in (x, w))
    for r in range(8):
        xr, wr = x[r].astype(np.float64), w[r].astype(np.float64)
        hx = (xr.reshape(4, 16) @ q).ravel()                  # exact in float64
        hw = (wr.reshape(4, 16) @ q).ravel()
        eta_x, eta_w = 2.0**-21 * np.abs(xr).max(), 2.0**-21 * np.abs(wr).max()
        ex = np.abs(yx[r] - hx)
        ew = np.abs(yw[r] - hw)
        assert (ex <= 2.0**-8 * np.abs(hx) + 1.004 * eta_x).all()
        assert (ew <= 2.0**-8 * np.abs(hw) + 1.004 * eta_w).all()
        exact = sum(Fraction(a) * Fraction(b) for a, b in zip(xr, wr))
        got = sum(Fraction(a) * Fraction(b) for a, b in zip(yx[r], yw[r]))
        bound = sum(Fraction(a) * Fraction(b) for a, b in zip(
            2.0**-8 * np.abs(hx) + 1.004 * eta_x, np.abs(hw)))
        bound += sum(Fraction(a) * Fraction(b) for a, b in zip(
            np.abs(hx), 2.0**-8 * np.abs(hw) + 1.004 * eta_w))
        bound += sum(Fraction(a) * Fraction(b) for a, b in zip(
            2.0**-8 * np.abs(hx) + 1.004 * eta_x, 2.0**-8 * np.abs(hw) + 1.004 * eta_w))
        assert abs(got - exact) <= bound
        assert got != exact or r > 100                        # the rounding is visible


# ---- errors --------------------------------------------------------------------------------------
def test_errors():
    x = np.ones((2, 32), np.float32)
    with pytest.raises(ValueError, match="MX element format"):
        ms.quantize_mx(x, "bf16")
    with pytest.raises(ValueError, match="scale_rule"):
        ms.quantize_mx(x, "e4m3", scale_rule="floor")
    with pytest.raises(ValueError, match="block"):
        ms.quantize_mx(x, "e4m3", block=8)
    with pytest.raises(ValueError, match="axis"):
        ms.quantize_mx(x, "e4m3", axis=2)
    with pytest.raises(ValueError, match="2-D block"):
        ms.quantize_mx(np.ones((2, 2, 32), np.float32), "e4m3", block=(16, 16), axis=0)
    with pytest.raises(TypeError, match="float32"):
        ms.quantize_nvfp4(x.astype(np.float64))
    with pytest.raises(ValueError, match="1x16"):
        ms.quantize_nvfp4(x, block=32)
    with pytest.raises(ValueError, match="exactly one"):
        ms.quantize_nvfp4(x, mode="stochastic")
    with pytest.raises(ValueError, match="only used"):
        ms.quantize_nvfp4(x, seed=1)
    with pytest.raises(ValueError, match="mode"):
        ms.quantize_nvfp4(x, mode="up")
    q = ms.quantize_nvfp4(x)
    with pytest.raises(ValueError, match="scales must have shape"):
        ms.BlockScaledArray(q.codes, q.scales[:, :0], q.element_format, q.scale_format, q.block,
                            q.axis, q.tensor_scale)
    with pytest.raises(TypeError, match="codes"):
        ms.BlockScaledArray(q.codes.view(np.uint8), q.scales, q.element_format, q.scale_format,
                            q.block, q.axis, q.tensor_scale)
    with pytest.raises(ValueError, match="tensor_scale"):
        ms.BlockScaledArray(q.codes, q.scales, q.element_format, q.scale_format, q.block, q.axis,
                            np.float32(0))
    with pytest.raises(TypeError, match="bfloat16"):
        ms.hadamard_transform(x)
    with pytest.raises(ValueError, match="multiple of 16"):
        ms.hadamard_transform(np.ones(8, ml_dtypes.bfloat16))
