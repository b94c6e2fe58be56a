"""The MMA models gaudi2 / gaudi3 (``mpt.mma(..., model="gaudi3")``): the Gaudi matrix engine
(MME), rule by rule, and its oracle.

Directed vectors assert one rule of Habana's MME reference model each; the comment above each
derives the expected bits. Every expectation is asserted for both the Numba kernels (``mpt.mma``)
and the exact-rational oracle (``mpt.reference.mme``); each was also reproduced by Habana's
reference code compiled outside the repository (see docs/gaudi.md). The property tests compare
the kernels with the oracle bit for bit on random bit patterns: zeros of both signs, subnormals,
Inf, NaN, extreme exponent spreads, and C of every magnitude.
"""
from functools import lru_cache

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpt
from mpt.engines import gaudi
from mpt.reference.mme import mme_dot_reference, mme_reference
from mpt.reference.rounding import decode_value

FLT_MAX = float.fromhex("0x1.fffffep127")
INF, NAN = float("inf"), float("nan")
E5M2 = gaudi.fp8_format("gaudi2", "e5m2")                     # IEEE-like, bias 15
E4M3 = gaudi.fp8_format("gaudi2", "e4m3")                     # IEEE-like, bias 7, max 240
_DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "tf32": np.float32, "fp32": np.float32}


def _array(values, fmt, shape):
    """Operand array of ``fmt`` (a family name or an FP8 Format) holding exactly ``values``."""
    x = np.array(values, np.float64).reshape(shape)
    y = x.astype(np.float32)
    if fmt in _DTYPES:
        y = y.astype(_DTYPES[fmt])
    back = np.asarray(y, np.float64)
    assert np.array_equal(back, x, equal_nan=True), f"{values} not exact in {fmt}"
    return y


def _fp32_bits(x: float) -> int:
    return int(np.float32(x).view(np.uint32))


def _dot(chip, fmt, a, b, c=0.0):
    """Bits of the one output of a (1, K)·(K, 1) + c, from the kernels and from the oracle
    (asserted equal to each other)."""
    k = len(a)
    cc = None if c is None else np.full((1, 1), c, np.float32)
    d = mpt.mma(_array(a, fmt, (1, k)), _array(b, fmt, (k, 1)), cc, model=chip, in_format=fmt)
    got = int(d.view(np.uint32)[0, 0])
    want = mme_dot_reference([float(v) for v in a], [float(v) for v in b],
                             0.0 if c is None else float(np.float32(c)), chip=chip, fmt=fmt)
    assert got == (0x7FFFFFFF if want != want else _fp32_bits(want)), "kernel != oracle"
    return got


# ---- the K walk: trees of W products from k = 0 ----------------------------------------------

# P = 2^s and u = 2^(s-24): P + u is a tie for RNE-FP32 (u is half of P's ulp 2^(s-23)) and is
# truncated to P by RZ; P + 2u = P·(1 + 2^-23) is exact. bf16/fp16/tf32/fp32: s = 24
# (2^12 · 2^12, u = 1 · 1); fp8 E4M3 (bias 7, max 240): s = 14 (2^7 · 2^7, u = 2^-5 · 2^-5).
_WIDTH_CASES = [(chip, fam) for chip in gaudi.CHIPS for fam in ("bf16", "fp16", "tf32", "fp32")] \
    + [("gaudi2", E4M3), ("gaudi3", E4M3)]


def _family(fmt):
    return fmt if isinstance(fmt, str) else "fp8"


@pytest.mark.parametrize("chip, fmt", _WIDTH_CASES, ids=lambda x: str(x))
def test_tree_boundary(chip, fmt):
    """K is cut into trees of W = the chip's width from k = 0. P at k = 0, a u at k = W - 1 and
    one at k = W (W = 1: k = 1, 2): every u meets P in a tree of its own, P + u rounds to P (RNE:
    the tie goes to P's even significand; RZ truncates), twice: P. Both u in the second tree
    (k = W, W + 1) are summed exactly with C = P first: P + 2u = P·(1 + 2^-23)."""
    w = gaudi.mme_config(chip, _family(fmt)).width
    s = 14 if _family(fmt) == "fp8" else 24
    big, small = 2.0 ** (s / 2), 2.0 ** ((s - 24) / 2)
    k = 2 * w + 2
    a, b = [0.0] * k, [0.0] * k
    a[0] = b[0] = big
    straddle = (w - 1, w) if w > 1 else (1, 2)
    for i in straddle:
        a[i] = b[i] = small
    assert _dot(chip, fmt, a, b) == _fp32_bits(2.0 ** s)
    if w > 1:
        a, b = [0.0] * k, [0.0] * k
        a[0] = b[0] = big
        a[w] = b[w] = a[w + 1] = b[w + 1] = small
        assert _dot(chip, fmt, a, b) == _fp32_bits(2.0 ** s * (1 + 2.0 ** -23))


def test_tree_widths():
    """The reference's tree widths (``c_fma_tree_addr_width``) and alignments."""
    got = {(c.chip, c.family): (c.width, c.fraction_bits) for c in gaudi.MME_CONFIGS.values()}
    assert got == {
        ("gaudi2", "fp8"): (16, 24), ("gaudi2", "fp16"): (8, 46), ("gaudi2", "bf16"): (8, 46),
        ("gaudi2", "tf32"): (4, 46), ("gaudi2", "fp32"): (2, 46), ("gaudi3", "fp8"): (8, 24),
        ("gaudi3", "bf16"): (8, 24), ("gaudi3", "fp16"): (2, 24), ("gaudi3", "tf32"): (2, 24),
        ("gaudi3", "fp32"): (1, 24)}


# ---- alignment: 46 bits (Gaudi 2) vs 24 bits (Gaudi 3, Gaudi 2 fp8) ---------------------------

def test_gaudi2_keeps_46_bits_below_the_largest_product():
    """Gaudi 2 bf16: products 1·1 and 2^-20·2^-26 = 2^-46, C = -1 (added exactly): the anchor is
    2^0 and 46 fraction bits are kept, so 2^-46 survives and the result is 2^-46 (0x28800000);
    2^-20·2^-27 = 2^-47 is truncated away: 1 - 1 = +0."""
    assert _dot("gaudi2", "bf16", [1, 2.0**-20], [1, 2.0**-26], -1.0) == 0x28800000
    assert _dot("gaudi2", "bf16", [1, 2.0**-20], [1, 2.0**-27], -1.0) == 0x00000000


@pytest.mark.parametrize("chip, fmt", [("gaudi3", "bf16"), ("gaudi2", E5M2)], ids=str)
def test_24_bits_below_the_anchor(chip, fmt):
    """Gaudi 3 (and Gaudi 2 fp8): 24 fraction bits. 1·1 + 2^-12·2^-12 - 1: the anchor is 2^0,
    q = 2^-24: 2^-24 survives (0x33800000); 2^-12·2^-13 = 2^-25 is truncated: +0. (E5M2 bias 15
    holds 2^-13 as a normal number.)"""
    assert _dot(chip, fmt, [1, 2.0**-12], [1, 2.0**-12], -1.0) == 0x33800000
    assert _dot(chip, fmt, [1, 2.0**-12], [1, 2.0**-13], -1.0) == 0x00000000


def test_gaudi2_fp8_anchor_is_not_normalised():
    """Gaudi 2 fp8: a product's exponent is e_a + e_b, not its own: 1.5·1.5 = 2.25 anchors at
    2^0 (not 2^1), so q = 2^-24 and 2^-12·2^-12 = 2^-24 survives; C = -2.25 is exact: 2^-24."""
    assert _dot("gaudi2", E5M2, [1.5, 2.0**-12], [1.5, 2.0**-12], -2.25) == 0x33800000


def test_gaudi2_bf16_anchor_is_normalised():
    """Gaudi 2 bf16/fp16/tf32: a product's exponent is its own: 1.5·1.5 = 2.25 anchors at 2^1,
    q = 2^-45, so 2^-23·2^-23 = 2^-46 is truncated away (C = -2.25 exact): +0, while
    2^-22·2^-23 = 2^-45 survives (0x29000000). (With e_a + e_b, as fp8, 2^-46 would survive.)"""
    assert _dot("gaudi2", "bf16", [1.5, 2.0**-23], [1.5, 2.0**-23], -2.25) == 0x00000000
    assert _dot("gaudi2", "bf16", [1.5, 2.0**-22], [1.5, 2.0**-23], -2.25) == 0x29000000


# ---- rounding: RNE (Gaudi 2) vs RZ (Gaudi 3), overflow ------------------------------------

@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_rne_vs_rz(sign):
    """C = ±1 plus ±1.5·2^-24 (bf16 1.5 · 2^-24). Gaudi 2 adds exactly and rounds to nearest:
    1 + 1.5·2^-24 lies above the midpoint 1 + 2^-24, so ±(1 + 2^-23) (0x3F800001 | sign).
    Gaudi 3 truncates the product to q = 2^-24 (anchor 2^0 from C) and rounds toward zero:
    1 + 2^-24 -> ±1 (0x3F800000 | sign)."""
    s = 0x80000000 if sign < 0 else 0
    assert _dot("gaudi2", "bf16", [sign * 1.5], [2.0**-24], sign) == 0x3F800001 | s
    assert _dot("gaudi3", "bf16", [sign * 1.5], [2.0**-24], sign) == 0x3F800000 | s


def test_overflow():
    """C = FLT_MAX = (2^24 - 1)·2^104. Gaudi 3 (RZ): + 2^103 lies in [FLT_MAX, 2^128): FLT_MAX;
    + 2^104 reaches 2^128: +Inf although RZ never rounds up. Gaudi 2 (RNE): + 2^103 is the
    midpoint of FLT_MAX and 2^128 and FLT_MAX's significand is odd: +Inf; + 2^102: FLT_MAX."""
    assert _dot("gaudi3", "bf16", [2.0**52], [2.0**51], FLT_MAX) == 0x7F7FFFFF
    assert _dot("gaudi3", "bf16", [2.0**52], [2.0**52], FLT_MAX) == 0x7F800000
    assert _dot("gaudi3", "bf16", [2.0**127, 2.0**127], [1, 1]) == 0x7F800000
    assert _dot("gaudi2", "bf16", [2.0**52], [2.0**51], FLT_MAX) == 0x7F800000
    assert _dot("gaudi2", "bf16", [2.0**51], [2.0**51], FLT_MAX) == 0x7F7FFFFF


# ---- Gaudi 3: the 9-term step (8 products + C), C truncated, anchor floor ----------------------

def test_gaudi3_nine_term_step():
    """Gaudi 3 bf16 sums 8 products and C in one step: C = 1 and 8 × 2^-12·2^-12: anchor 2^0,
    q = 2^-24, every product is one unit: 1 + 8·2^-24 = 1 + 2^-21 (0x3F800004). Gaudi 3 fp32
    takes one product per tree, so each 1 + 2^-24 is truncated back to 1 (0x3F800000)."""
    assert _dot("gaudi3", "bf16", [2.0**-12] * 8, [2.0**-12] * 8, 1.0) == 0x3F800004
    assert _dot("gaudi3", "fp32", [2.0**-12] * 8, [2.0**-12] * 8, 1.0) == 0x3F800000


def test_gaudi3_truncates_c_with_the_products():
    """2·1 + C with C = -1.5·2^-23: the anchor is 2^1, q = 2^-23. Gaudi 3 truncates C toward zero
    to -2^-23: 2 - 2^-23 (0x3FFFFFFF), exact. Gaudi 2 adds C exactly: 2 - 1.5·2^-23 is the
    midpoint of 2 - 2^-22 and 2 - 2^-23; ties to the even significand: 0x3FFFFFFE."""
    c = -1.5 * 2.0**-23
    assert _dot("gaudi3", "bf16", [2.0], [1.0], c) == 0x3FFFFFFF
    assert _dot("gaudi2", "bf16", [2.0], [1.0], c) == 0x3FFFFFFE


def test_gaudi3_anchor_floor():
    """The accumulator's lowest bit sits at 2^-156 (anchor floor 2^-132). Products 255·2^-86 ·
    255·2^-79 = 65025·2^-165 and 7·2^-83 · 73·2^-82 = 511·2^-165 sum to 2^16·2^-165 = 2^-149,
    the smallest subnormal. Their anchor would be 2^-151, but the floor makes q = 2^-156:
    trunc(65025/512) = 127 and trunc(511/512) = 0 units, 127·2^-156 < 2^-149: RZ gives +0."""
    a = [255 * 2.0**-86, 7 * 2.0**-83]
    b = [255 * 2.0**-79, 73 * 2.0**-82]
    assert _dot("gaudi3", "bf16", a, b) == 0x00000000
    assert _dot("gaudi3", "bf16", a[:1] + [0.0], b[:1] + [0.0]) == 0x00000000   # 0.99·2^-149


# ---- partial products, each truncated on its own ---------------------------------------------

def test_gaudi2_fp32_partial_products():
    """Gaudi 2 fp32 builds a·b from 4 partial products of a 12 + 12-bit significand split. With
    1·1, C = -1 (anchor 2^0, q = 2^-46) and a = (1 + 2^-23)·2^-11, b = (1 + 2^-23)·2^-13: hi·hi
    = 2^-24 is kept; hi·lo and lo·hi are 2^-47 each, truncated alone to 0; lo·lo = 2^-70: 0. The
    result is 2^-24 (0x33800000); truncating the whole product would keep 2·2^-47 (0x33800002)."""
    a = [1.0, (1 + 2.0**-23) * 2.0**-11]
    b = [1.0, (1 + 2.0**-23) * 2.0**-13]
    assert _dot("gaudi2", "fp32", a, b, -1.0) == 0x33800000


@pytest.mark.parametrize("fmt", ["fp16", "tf32"])
def test_gaudi3_fp16_tf32_partial_products(fmt):
    """Gaudi 3 fp16/tf32 split each 11-bit significand into 3 + 8 bits. C = 2^15 and -2^7·2^8
    cancel and make the anchor 2^15, q = 2^-9. (1 + 2^-10)^2: hi·hi = 1 is kept, hi·lo = lo·hi
    = 2^-10 are each truncated to 0, lo·lo = 2^-20 too: 1.0 (0x3F800000). The whole product
    1 + 2^-9 + 2^-20 truncated once would keep 2^-9 (0x3F800400)."""
    x = 1 + 2.0**-10
    assert _dot("gaudi3", fmt, [x, -2.0**7], [x, 2.0**8], 2.0**15) == 0x3F800000


def test_gaudi3_fp32_byte_partial_products():
    """Gaudi 3 fp32: 8 byte-wise partial products (lo·lo dropped), each truncated. a = 1 + 2^-3 +
    2^-21 (bytes 0x90, 0x00, 0x04), b = 1 + 2^-4 + 2^-22 (0x88, 0x00, 0x02), C = -1: anchor 2^0,
    q = 2^-24. hi·hi = 1 + 2^-3 + 2^-4 + 2^-7 exact; the byte cross products 0x90·0x02·2^-30
    = 4.5 q and 0x04·0x88·2^-30 = 8.5 q are truncated to 4 q and 8 q: the result is 2^-3 + 2^-4
    + 2^-7 + 12·2^-24 = 0x1.90006p-3; whole-product truncation would keep 13 q (0x1.90006 8p-3)."""
    a, b = [1 + 2.0**-3 + 2.0**-21], [1 + 2.0**-4 + 2.0**-22]
    assert _dot("gaudi3", "fp32", a, b, -1.0) == _fp32_bits(float.fromhex("0x1.90006p-3"))


# ---- subnormals, signed zeros, specials --------------------------------------------------------

def test_gaudi2_flushes_bf16_subnormals():
    """bf16 0x0001 = 2^-133 times 2^100: Gaudi 2 flushes the operand: +0; Gaudi 3 keeps it:
    2^-33 (0x2F000000). Inf times that subnormal: Gaudi 2 sees Inf·0: NaN; Gaudi 3: +Inf."""
    tiny = 2.0**-133
    assert _dot("gaudi2", "bf16", [tiny], [2.0**100]) == 0x00000000
    assert _dot("gaudi3", "bf16", [tiny], [2.0**100]) == 0x2F000000
    assert _dot("gaudi2", "bf16", [INF], [tiny]) == 0x7FFFFFFF
    assert _dot("gaudi3", "bf16", [INF], [tiny]) == 0x7F800000


def test_gaudi2_keeps_fp16_subnormals_and_flushes_c_and_results():
    """fp16 subnormal 2^-24 survives on Gaudi 2 (0x33800000). A subnormal C (2^-149) is flushed:
    +0 (Gaudi 3 keeps it: 0x00000001). A subnormal result 2^-126 - 2^-63·2^-64 = 2^-127 is
    flushed by Gaudi 2 (+0) and kept by Gaudi 3 (0x00400000)."""
    assert _dot("gaudi2", "fp16", [2.0**-24], [1.0]) == 0x33800000
    assert _dot("gaudi2", "bf16", [0.0], [0.0], 2.0**-149) == 0x00000000
    assert _dot("gaudi3", "bf16", [0.0], [0.0], 2.0**-149) == 0x00000001
    assert _dot("gaudi2", "bf16", [-2.0**-63], [2.0**-64], 2.0**-126) == 0x00000000
    assert _dot("gaudi3", "bf16", [-2.0**-63], [2.0**-64], 2.0**-126) == 0x00400000


@pytest.mark.parametrize("chip", gaudi.CHIPS)
def test_zero_is_plus_zero(chip):
    """-0·1 + (-0) is -0 in IEEE arithmetic; Gaudi 2's final RNE "+ 0" and Gaudi 3's +0 rule
    make it +0. So does an exact cancellation 1·1 + (-1)."""
    assert _dot(chip, "bf16", [-0.0], [1.0], -0.0) == 0x00000000
    assert _dot(chip, "bf16", [1.0], [1.0], -1.0) == 0x00000000


def test_empty_k():
    """K = 0: no tree runs, D = C; Gaudi 2 still adds its final +0 (RNE), so -0 becomes +0."""
    c = np.full((1, 1), -0.0, np.float32)
    a, b = np.zeros((1, 0), ml_dtypes.bfloat16), np.zeros((0, 1), ml_dtypes.bfloat16)
    assert mpt.mma(a, b, c, model="gaudi2").view(np.uint32)[0, 0] == 0x00000000
    assert mpt.mma(a, b, c, model="gaudi3").view(np.uint32)[0, 0] == 0x80000000


@pytest.mark.parametrize("chip", gaudi.CHIPS)
@pytest.mark.parametrize("a, b, c, want", [
    ([NAN, 1.0], [1.0, 1.0], 0.0, 0x7FFFFFFF),       # a NaN operand: the canonical NaN
    ([INF, 1.0], [0.0, 1.0], 0.0, 0x7FFFFFFF),       # Inf·0
    ([INF, INF], [1.0, -1.0], 0.0, 0x7FFFFFFF),      # +Inf + -Inf
    ([INF, 1.0], [-1.0, 1.0], 0.0, 0xFF800000),      # -Inf + finite
    ([1.0], [1.0], INF, 0x7F800000),                 # Inf C
    ([INF], [-1.0], INF, 0x7FFFFFFF),                # Inf C + -Inf product
])
def test_specials(chip, a, b, c, want):
    assert _dot(chip, "bf16", a, b, c) == want


@pytest.mark.parametrize("chip", gaudi.CHIPS)
def test_tf32_operands_round_to_nearest_even(chip):
    """The MME rounds fp32 operands to tf32 with RNE (not truncation): 1 + 2^-11 + 2^-12 ->
    1 + 2^-10 (0x3F802000); the tie 1 + 2^-11 -> 1 (even)."""
    assert _dot(chip, "tf32", [1 + 2.0**-11 + 2.0**-12], [1.0]) == 0x3F802000
    assert _dot(chip, "tf32", [1 + 2.0**-11], [1.0]) == 0x3F800000


def test_gaudi3_fp8_modes_and_mixing():
    """Gaudi 3 mixes E4M3 (bias 7, mode "none": 480 is finite) with E5M2 (bias 15): 480·2 = 960.
    Gaudi 2 refuses mixed kinds."""
    e4m3 = gaudi.fp8_format("gaudi3", "e4m3", 7, "none")
    a = np.array([[480.0]], np.float32)
    b = np.array([[2.0]], np.float32)
    d = mpt.mma(a, b, model="gaudi3", in_format=(e4m3, E5M2))
    assert d.view(np.uint32)[0, 0] == _fp32_bits(960.0)
    with pytest.raises(ValueError, match="does not mix"):
        mpt.mma(np.ones((1, 1), np.float32), b, model="gaudi2", in_format=(E4M3, E5M2))


# ---- arguments ---------------------------------------------------------------------------------

def test_bad_arguments():
    a = np.ones((2, 3), ml_dtypes.bfloat16)
    b = np.ones((3, 2), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="unknown MMA model 'gaudi4'"):
        mpt.mma(a, b, model="gaudi4")
    with pytest.raises(ValueError, match="disagree on K"):
        mpt.mma(a, b[:2], model="gaudi2")
    with pytest.raises(ValueError, match="out_format must be one of 'fp32'"):
        mpt.mma(a, b, np.zeros((2, 2), np.float16), model="gaudi2")
    with pytest.raises(TypeError, match="must hold fp16"):
        mpt.mma(a, b, model="gaudi2", in_format="fp16")
    with pytest.raises(ValueError, match="not gaudi_e4m3_b7_full numbers"):
        mpt.mma(np.full((1, 1), 1.1, np.float32), np.ones((1, 1), np.float32), model="gaudi2",
                  in_format=E4M3)
    with pytest.raises(ValueError, match="does not take inputs"):
        mpt.mma(np.ones((1, 1), np.float32), np.ones((1, 1), np.float32), model="gaudi2",
                  in_format=gaudi.fp8_format("gaudi3", "e4m3", 8))


def test_batches_broadcast():
    """A broadcast batched call equals the products computed one by one."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 1, 5, 19)).astype(np.float32).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((2, 19, 4)).astype(np.float32).astype(ml_dtypes.bfloat16)
    c = rng.standard_normal((4,)).astype(np.float32)
    for chip in gaudi.CHIPS:
        d = mpt.mma(a, b, c, model=chip)
        assert d.shape == (3, 2, 5, 4)
        for i in range(3):
            for j in range(2):
                one = mpt.mma(a[i, 0], b[j], np.broadcast_to(c, (5, 4)), model=chip)
                assert np.array_equal(d[i, j].view(np.uint32), one.view(np.uint32))


# ---- kernels == oracle on random bit patterns ---------------------------------------------------

@lru_cache(maxsize=None)
def _fp8_table(fmt):
    return np.array([decode_value(c, fmt) for c in range(256)], np.float32)


def _layout(fmt):
    """(exponent bits, mantissa bits, code bits) of an operand format's codes."""
    return {"bf16": (8, 7, 16), "fp16": (5, 10, 16), "tf32": (8, 23, 32),
            "fp32": (8, 23, 32)}.get(fmt, (None, None, 8)) if isinstance(fmt, str) \
        else (fmt.exponent_bits, fmt.mantissa_bits, 8)


def _codes(rng, fmt, shape, centre, spread):
    """Random codes: a quarter uniform bits (specials, subnormals, zeros, extreme exponents),
    the rest with exponents within ``spread`` of ``centre`` and short or full significands."""
    e, m, nbits = _layout(fmt)
    n = int(np.prod(shape))
    sign = rng.integers(0, 2, n)
    field = np.clip(centre + rng.integers(-spread, spread + 1, n), 0, (1 << e) - 1)
    frac = rng.integers(0, 1 << m, n) & ~((1 << rng.integers(0, m + 1, n)) - 1)
    codes = (sign << (nbits - 1)) | (field << m) | frac
    uniform = rng.random(n) < 0.25
    codes[uniform] = rng.integers(0, 1 << nbits, int(uniform.sum()))
    codes[rng.random(n) < 0.1] &= 1 << (nbits - 1)                       # ±0
    return codes.reshape(shape)


def _operand(codes, fmt):
    if isinstance(fmt, str):
        return codes.astype({16: np.uint16, 32: np.uint32}[_layout(fmt)[2]]).view(_DTYPES[fmt])
    return _fp8_table(fmt)[codes]


def _property_formats():
    out = [(chip, fam, fam) for chip in gaudi.CHIPS for fam in ("bf16", "fp16", "tf32", "fp32")]
    out += [("gaudi2", gaudi.fp8_format("gaudi2", "e4m3", b), None) for b in (3, 7, 11, 15)]
    out += [("gaudi2", E5M2, None)]
    out += [("gaudi3", gaudi.fp8_format("gaudi3", k, b, m), None)
            for k, b, m in [("e4m3", 7, "full"), ("e4m3", 7, "none"), ("e4m3", 7, "minimal"),
                            ("e5m2", 15, "full"), ("e4m3", 0, "none"), ("e5m2", 63, "minimal")]]
    return [pytest.param(chip, f, id=f"{chip}-{name or f.name}") for chip, f, name in out]


@pytest.mark.parametrize("chip, fmt", _property_formats())
@given(data=st.data())
@settings(max_examples=40)
def test_kernels_equal_oracle(chip, fmt, data):
    """mme == mme_reference bit for bit; K spans several trees and a partial last one; C is
    uniform FP32 bits (every magnitude, subnormals, Inf, NaN) or near the products."""
    fb = fmt
    if not isinstance(fmt, str) and chip == "gaudi3" and data.draw(st.booleans()):
        kind = "e5m2" if fmt.exponent_bits == 4 else "e4m3"               # mix the kinds
        fb = gaudi.fp8_format("gaudi3", kind, data.draw(st.integers(0, 63)),
                              data.draw(st.sampled_from(list(gaudi.FP8_MODES))))
    width = gaudi.mme_config(chip, _family(fmt)).width
    m, n = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    k = data.draw(st.integers(0, 3 * width + 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    spread = data.draw(st.sampled_from([0, 2, 8, 40]))
    ea, eb = _layout(fmt)[0], _layout(fb)[0]
    a = _codes(rng, fmt, (m, k), int(rng.integers(0, 1 << ea)), spread)
    b = _codes(rng, fb, (k, n), int(rng.integers(0, 1 << eb)), spread)
    c = _codes(rng, "fp32", (m, n), int(rng.integers(0, 256)), spread).astype(np.uint32)
    with_c = data.draw(st.booleans())
    d = mpt.mma(_operand(a, fmt), _operand(b, fb), c.view(np.float32) if with_c else None,
                  model=chip, in_format=(fmt, fb))
    want = mme_reference(a.tolist(), b.tolist(), c.tolist() if with_c else None, chip=chip,
                         fmt=(fmt, fb), n=n)
    assert d.view(np.uint32).tolist() == want


def test_thread_count_does_not_change_bits():
    """One thread per output row: the bits are the same on 1 and 2 threads."""
    import numba
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((2, 40, 70)) * 8).astype(np.float32).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((70, 50)).astype(np.float32).astype(ml_dtypes.bfloat16)
    for chip in gaudi.CHIPS:
        results = []
        for threads in (1, 2):
            numba.set_num_threads(threads)
            try:
                results.append(mpt.mma(a, b, model=chip).view(np.uint32))
            finally:
                numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        assert np.array_equal(results[0], results[1])


def test_docs_examples():
    """The pycon examples of docs/gaudi.md run and print what the page says."""
    import doctest
    import pathlib
    import re
    page = pathlib.Path(__file__).resolve().parents[1] / "docs" / "gaudi.md"
    examples = "".join(re.findall(r"```pycon\n(.*?)```", page.read_text(), re.S))
    test = doctest.DocTestParser().get_doctest(examples, {}, page.name, str(page), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


@pytest.mark.parametrize("fmt, f, half", [("bf16", 45, 60), ("fp16", 40, 14), ("tf32", 45, 60),
                                          (E4M3, 23, 6)])
def test_gaudi2_takes_fewer_alignment_bits_like_its_oracle(fmt, f, half):
    """A Gaudi 2 configuration with F below the MME's (the fault ``mpt characterize`` injects)
    computes what the oracle computes with that F; Gaudi 3's kernel has F fixed, and F above the
    MME's is refused. Each tree: ±2^(2·half) cancel, and the other products lie around F bits
    below them, where the alignment decides what is kept."""
    from dataclasses import replace
    base = mpt.get_mma_model("gaudi2")
    name = fmt if isinstance(fmt, str) else fmt.name
    cfg = base.config(name, name)
    model = replace(base, name="gaudi2-f", aliases=(), configs=tuple(
        replace(c, fraction_bits=f) if c is cfg else c for c in base.configs))
    rng = np.random.default_rng(f)
    changed = 0
    for _ in range(20):
        k = cfg.block
        shift = rng.integers(-3, 4, k - 2) + 2 * half - f               # product exponents
        ea = shift // 2
        a = np.concatenate([[2.0**half, -(2.0**half)],
                            np.ldexp(rng.integers(1, 8, k - 2), ea) * rng.choice((-1, 1), k - 2)])
        b = np.concatenate([[2.0**half] * 2, np.ldexp(rng.integers(1, 8, k - 2), shift - ea)])
        c = float(rng.choice((0.0, 2.0**(2 * half - f))))
        d = mpt.mma(_array(a, fmt, (1, k)), _array(b, fmt, (k, 1)), np.full((1, 1), c, np.float32),
                    model=model, in_format=fmt)
        want = mme_dot_reference(a.tolist(), b.tolist(), c, chip="gaudi2", fmt=fmt,
                                 fraction_bits=f)
        assert int(d.view(np.uint32)[0, 0]) == _fp32_bits(want)
        changed += want != mme_dot_reference(a.tolist(), b.tolist(), c, chip="gaudi2", fmt=fmt)
    assert changed                      # the vectors tell F from the MME's own
    with pytest.raises(ValueError, match="fraction_bits"):
        replace(base, configs=(replace(cfg, fraction_bits=cfg.fraction_bits + 1),))
    g3 = mpt.get_mma_model("gaudi3")
    with pytest.raises(ValueError, match="fraction_bits"):
        replace(g3, configs=(replace(g3.configs[0], fraction_bits=23),))
