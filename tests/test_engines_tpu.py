"""The MMA model tpu: one MXU pass (``mpt.mma``) and XLA's bf16 pass algorithms of an f32 dot
(DotAlgorithmPreset; ``mpt.gemm(..., model="tpu", algorithm=...)``).

The oracle is ``mpt.reference.tpu`` (the algorithms spelled out from XLA's source on exact
rationals, inner pass = sequential exact FMA); directed cases pin what each step does to the
bits. JAX on a CPU ignores these algorithms, so it is no oracle.
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpt
from mpt.engines.tpu import ALGORITHMS, CONVERSIONS, PRECISIONS, TRITON_BLOCK_K, tpu_to_bf16
from mpt.reference.tpu import bf16_convert, tpu_gemm_reference

CANONICAL_NAN = 0x7FFFFFFF


def _f32(bits):
    return np.array(bits, np.uint32).view(np.float32)


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def tpu(a, b, c=None, **options):
    """An f32 dot on the TPU model: ``tpu(...)`` (its only public path)."""
    return mpt.gemm(a, b, c, model="tpu", **options)


def _oracle_bits(values):
    """The oracle's floats as f32 bits, NaN written as mpt's canonical NaN."""
    x = np.array(values, np.float32).reshape(np.shape(values))
    bits = x.view(np.uint32).copy()
    bits[np.isnan(x)] = CANONICAL_NAN
    return bits


# f32 bit patterns: specials, subnormals, values whose low 16 bits matter, anything at all
_SPECIALS = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC12345,
             0x00000001, 0x807FFFFF, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x3F800000, 0x3F808000]


@st.composite
def f32_bits(draw):
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.sampled_from(_SPECIALS))
    if kind == 1:
        return draw(st.integers(0, 2**32 - 1))                        # anything
    if kind == 2:                                                     # subnormal
        return draw(st.integers(0, 1)) << 31 | draw(st.integers(1, 2**23 - 1))
    sign = draw(st.integers(0, 1)) << 31                              # moderate: low bits matter
    exponent = draw(st.integers(127 - 20, 127 + 20)) << 23
    return sign | exponent | draw(st.integers(0, 2**23 - 1))


def _matrix(draw, rows, cols):
    return np.array(draw(st.lists(f32_bits(), min_size=rows * cols, max_size=rows * cols)),
                    np.uint32).reshape(rows, cols)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("decomposition", ["xla", "triton"])
@given(data=st.data())
@settings(max_examples=60)
def test_matches_oracle(algorithm, decomposition, data):
    """Every algorithm, decomposition and conversion rule equals the oracle bit for bit, over
    inputs with NaN (payloads included), Inf, subnormals and significant low bits; triton with
    several K-tiles (block_k 1..3) and the default."""
    conversion = data.draw(st.sampled_from(CONVERSIONS))
    m, k, n = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 7)), data.draw(
        st.integers(1, 2))
    a, b = _matrix(data.draw, m, k), _matrix(data.draw, k, n)
    c = _matrix(data.draw, m, n).view(np.float32) if data.draw(st.booleans()) else None
    kwargs = {}
    if decomposition == "triton":
        kwargs["block_k"] = data.draw(st.sampled_from([1, 2, 3, TRITON_BLOCK_K]))
    got = tpu(a.view(np.float32), b.view(np.float32), c, algorithm=algorithm,
              decomposition=decomposition, conversion=conversion, **kwargs)
    want = tpu_gemm_reference(a.tolist(), b.tolist(), None if c is None else c.tolist(),
                              algorithm=algorithm, decomposition=decomposition,
                              conversion=conversion, **kwargs)
    np.testing.assert_array_equal(_bits(got), _oracle_bits(want).reshape(m, n))


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("decomposition", ["xla", "triton"])
def test_empty_k_gives_c(algorithm, decomposition):
    """K = 0: no products; D = c (or +0)."""
    a, b = np.ones((2, 0), np.float32), np.ones((0, 3), np.float32)
    c = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    np.testing.assert_array_equal(_bits(tpu(a, b, c, algorithm=algorithm,
                                                 decomposition=decomposition)), _bits(c))
    assert not _bits(tpu(a, b, algorithm=algorithm, decomposition=decomposition)).any()


# ---- X3 and X6 against a plain FP32 GEMM and each other ------------------------------------------

@pytest.mark.parametrize("decomposition", ["xla", "triton"])
def test_x3_x6_and_fp32_all_differ(decomposition):
    """a = b = 1 + 2^-12 + 2^-23, K = 1; exactly a·b = 1 + 2^-11 + 2^-22 + 2^-24 + 2^-35 + 2^-46.

    * FP32 (one FMA): the tail 2^-24 + 2^-35 + 2^-46 is just over half an ulp (2^-23): rounds up
      to 1 + 2^-11 + 2^-22 + 2^-23 = 0x3F801003 (the correctly rounded product).
    * X6: hi = 1, mid = 2^-12, lo = 2^-23 (both splits agree: every piece is exact). The six
      passes keep everything but ml, lm, ll (2^-35, 2^-35, 2^-46): the low sum is 2^-11 + 2^-22 +
      2^-24 exactly, and + hh = 1 leaves a tie (2^-24 = half an ulp) that goes to even:
      1 + 2^-11 + 2^-22 = 0x3F801002.
    * X3: hi = 1, lo = bf16(2^-12 + 2^-23) = 2^-12 (bf16 keeps 8 bits): lh + hl = 2^-11, result
      1 + 2^-11 = 0x3F801000.
    X9 keeps the dropped terms and equals FP32 here.
    """
    a = np.array([[1 + 2.0**-12 + 2.0**-23]], np.float32)
    got = {alg: int(_bits(tpu(a, a, algorithm=alg, decomposition=decomposition))[0, 0])
           for alg in ("F32_F32_F32", "BF16_BF16_F32_X3", "BF16_BF16_F32_X6", "BF16_BF16_F32_X9")}
    assert got == {"F32_F32_F32": 0x3F801003, "BF16_BF16_F32_X3": 0x3F801000,
                   "BF16_BF16_F32_X6": 0x3F801002, "BF16_BF16_F32_X9": 0x3F801003}
    plain = mpt.gemm(a, a, model="ieee_fma")                    # a plain FP32 GEMM
    assert int(_bits(plain)[0, 0]) == 0x3F801003


def test_xla_x6_sums_mm_then_hl_then_lh():
    """The rewriter's X6 sum is ((((mm + hl) + lh) + hm) + mh): the order decides a tie.

    Eight terms shape the passes exactly (pieces are the same in both splits): with
    u = 1 + 2^-20, v = 1 + 2^-21, w = 1 + 2^-9 + 2^-17 (hi 1, mid 2^-9, lo 2^-17),
    a = [u, −1, u, 1, 1, −1, −w, 1 + 2^-9], b = [v, v, −1, 1, w, 1 + 2^-9, 1, 1] give
    mm = 2^-20·2^-21 = 2^-41, hl = +2^-17, lh = −2^-17, and hm = mh = hh = 0 (every chain exact).
    Exactly, a·b = 2^-41.
    * xla: mm + hl = 2^-17 + 2^-41 is a tie (half an ulp of 2^-17) that goes to even, 2^-17;
      + lh = 0; the rest adds zeros: +0. (Summing lh before hl would give (2^-41 − 2^-17) + 2^-17
      = 2^-41: −(2^-17 − 2^-41) is exact below 2^-17.)
    * triton: the chain mm, lh, hl makes 2^-41 − 2^-17 (exact) then 2^-41; but the mh chain then
      adds −2^-9, which absorbs 2^-41, and +2^-9: +0 as well.
    * a plain FP32 GEMM loses 2^-41 in the first FMA: +0.
    """
    u, v, w, x = 1 + 2.0**-20, 1 + 2.0**-21, 1 + 2.0**-9 + 2.0**-17, 1 + 2.0**-9
    a = np.array([[u, -1, u, 1, 1, -1, -w, x]], np.float32)
    b = np.array([[v, v, -1, 1, w, x, 1, 1]], np.float32).T.copy()
    for decomposition in ("xla", "triton"):
        got = tpu(a, b, algorithm="BF16_BF16_F32_X6", decomposition=decomposition)
        assert int(_bits(got)[0, 0]) == 0
    # the ordering that would keep 2^-41, spelled out on the same passes
    mm, hl, lh = np.float32(2.0**-41), np.float32(2.0**-17), np.float32(-2.0**-17)
    assert ((mm + hl) + lh, (mm + lh) + hl) == (0.0, 2.0**-41)


def test_triton_chains_hi_hi_into_the_low_accumulator():
    """X3, a = [1, −2^-12], b = [−4097, −4097]: exactly −4096 + 2^-12 (an f32: 0xC57FFFFF).

    Pieces (both splits): 4097 = 4096 + 1, so hi_b = −4096, lo_b = −1; a is bf16 (lo_a = 0).
    Passes: lh = 0, hl = −1 + 2^-12, hh = −4096 + 1 = −4095 (all exact).
    * xla sums whole passes: (lh + hl) + hh = −4096 + 2^-12 exactly: 0xC57FFFFF.
    * triton chains hh's products into the low accumulator one FMA at a time:
      fma(1, −4096, −1 + 2^-12) = −4097 + 2^-12, a tie between 4097 and 4097 − 2^-11 that goes
      to even, −4097; then fma(−2^-12, −4096, −4097) = −4096: 0xC5800000.
    """
    a, b, want_xla, want_triton = _TRITON_CASE
    xla = tpu(a, b, algorithm="BF16_BF16_F32_X3", decomposition="xla")
    triton = tpu(a, b, algorithm="BF16_BF16_F32_X3", decomposition="triton")
    assert (int(_bits(xla)[0, 0]), int(_bits(triton)[0, 0])) == (want_xla, want_triton)


_TRITON_CASE = (np.array([[1.0, -2.0**-12]], np.float32),
                np.array([[-4097.0], [-4097.0]], np.float32), 0xC57FFFFF, 0xC5800000)


# Inputs found by search: swapping two adjacent passes of the source's X6 lists, or rounding the
# Triton TF32x3 split to nearest-even instead of away (ties), changes these results; random
# inputs almost never do. They pin those details against the oracle.
SENSITIVE_CASES = [
    ("BF16_BF16_F32_X6", "xla", [0.0019607841968536377, 1.0019607543945312, 1.0000009536743164],
     [0.0019607841968536377, -1.0000009536743164, 1.0019607543945312]),
    ("BF16_BF16_F32_X6", "xla", [0.0019607841968536377, 0.000244140625, 1.0019569396972656,
                                 -4097.0], [-0.000244140625, -1.0019607543945312, -1.0,
                                            0.0019607841968536377]),
    ("BF16_BF16_F32_X6", "triton", [1.0019569396972656, 0.0019607841968536377],
     [1.0, 1.0019607543945312]),
    ("BF16_BF16_F32_X6", "triton", [-0.000244140625, -4097.0], [-1.0019607543945312, 1.001953125]),
    ("TF32_TF32_F32_X3", "triton", [0.00048828125, 1049088.0, -8193.0],
     [1.00146484375, -1.0, 1049088.0]),
]


@pytest.mark.parametrize("algorithm, decomposition, a, b", SENSITIVE_CASES)
def test_order_and_tie_sensitive_cases_match_oracle(algorithm, decomposition, a, b):
    a = np.array([a], np.float32)
    b = np.array([b], np.float32).T.copy()
    got = tpu(a, b, algorithm=algorithm, decomposition=decomposition)
    want = tpu_gemm_reference(a.view(np.uint32).tolist(), b.view(np.uint32).tolist(),
                              algorithm=algorithm, decomposition=decomposition)
    np.testing.assert_array_equal(_bits(got), _oracle_bits(want))


# ---- NaN and Inf: the NaN -> 0 step --------------------------------------------------------------

MULTI_PASS = ["BF16_BF16_F32_X3", "BF16_BF16_F32_X6", "BF16_BF16_F32_X9", "TF32_TF32_F32_X3"]


@pytest.mark.parametrize("algorithm", MULTI_PASS)
@pytest.mark.parametrize("decomposition", ["xla", "triton"])
@pytest.mark.parametrize("x", [1.0, 1 + 2.0**-8])
def test_inf_operand_low_passes_nan_zeroed(algorithm, decomposition, x):
    """x·Inf = +Inf, although the low passes are NaN: b = Inf splits into hi = Inf and
    lo = conv(Inf − Inf) = NaN, so hl = x_hi·NaN = NaN (and for x = 1, lh = 0·Inf = NaN; for
    x = 1 + 2^-8, lh = 2^-8·Inf = Inf), the low sum is NaN, the NaN step makes it +0, and
    + hh = Inf. Without the step the result is NaN (the XLA source's comment, b/115844437), which
    is what TF32_TF32_F32_X3 gives on the Triton path: Triton's F32DotTC TF32x3 rewrite has no
    NaN step."""
    a, b = np.array([[x]], np.float32), np.array([[np.inf]], np.float32)
    with np.errstate(invalid="ignore"):
        lo_b = tpu_to_bf16(np.float32(np.inf) - np.float32(np.inf))
    assert np.isnan(np.float32(lo_b))                            # the low piece of Inf
    got = tpu(a, b, algorithm=algorithm, decomposition=decomposition)
    no_nan_step = (algorithm, decomposition) == ("TF32_TF32_F32_X3", "triton")
    assert int(_bits(got)[0, 0]) == (CANONICAL_NAN if no_nan_step else 0x7F800000)


def test_overflowing_low_sum_inf_kept_by_xla_zeroed_by_triton_tile():
    """The two NaN steps differ on Inf: the rewriter's select(inf >= |s|, s, 0) keeps it,
    Triton's ZeroNaNs select(inf > |s|, s, 0) zeroes it.

    a = [H + L, −H] × 1024 with H = 2^63, L = 2^54 (hi = H, lo = L in both splits), b = 2^64 for
    every k (bf16: lo = 0). Exactly, Σ a·b = 1024·L·2^64 = 2^128: overflows, the answer is +Inf.
    * xla (X3): dot(lo, hi) = 1024 terms of 2^118 -> 2^128 -> +Inf; dot(hi, lo) = 0; the low sum
      +Inf is kept; dot(hi, hi) = H·2^64 − H·2^64 ... = 0; result +Inf.
    * triton, one tile (block_k = K): the chained low passes reach +Inf, ZeroNaNs makes it +0,
      the hh pass adds 0: result +0.
    * triton, default 32-deep tiles: each tile's low chain is 16·2^118 = 2^122 (finite); the
      overflow happens in the outer f32 adds: +Inf.
    """
    k = 2048
    a = np.tile(np.array([2.0**63 + 2.0**54, -2.0**63], np.float32), k // 2)[None, :]
    b = np.full((k, 1), 2.0**64, np.float32)
    xla = tpu(a, b, algorithm="BF16_BF16_F32_X3", decomposition="xla")
    one_tile = tpu(a, b, algorithm="BF16_BF16_F32_X3", decomposition="triton", block_k=k)
    tiled = tpu(a, b, algorithm="BF16_BF16_F32_X3", decomposition="triton")
    assert (int(_bits(xla)[0, 0]), int(_bits(one_tile)[0, 0]), int(_bits(tiled)[0, 0])) == \
        (0x7F800000, 0x00000000, 0x7F800000)
    want = tpu_gemm_reference(a.view(np.uint32).tolist(), b.view(np.uint32).tolist(),
                              algorithm="BF16_BF16_F32_X3", decomposition="triton", block_k=k)
    assert want == [[0.0]]


@pytest.mark.parametrize("algorithm", ["BF16_BF16_F32_X3", "BF16_BF16_F32_X6", "BF16_BF16_F32_X9"])
def test_nan_payload_in_low_bits_truncates_to_inf(algorithm):
    """A NaN whose payload lies only in the low 16 bits (0x7F800001) becomes +Inf under the
    rewriter's truncation (hi = 0x7F800000); its lo = bf16(NaN − Inf) is NaN, the low sum is
    zeroed, and hi·1 = +Inf. The Triton split rounds (RNE keeps NaN): NaN."""
    a, b = _f32([[0x7F800001]]), np.array([[1.0]], np.float32)
    assert int(_bits(tpu(a, b, algorithm=algorithm, decomposition="xla"))[0, 0]) == 0x7F800000
    assert int(_bits(tpu(a, b, algorithm=algorithm, decomposition="triton"))[0, 0]) == \
        CANONICAL_NAN


@pytest.mark.parametrize("decomposition", ["xla", "triton"])
def test_nan_from_the_hi_pass_is_not_zeroed(decomposition):
    """Inf·0 in the hi·hi pass, which comes after the NaN step: NaN."""
    a, b = np.array([[np.inf]], np.float32), np.array([[0.0]], np.float32)
    got = tpu(a, b, algorithm="BF16_BF16_F32_X6", decomposition=decomposition)
    assert int(_bits(got)[0, 0]) == CANONICAL_NAN


# ---- conversions ---------------------------------------------------------------------------------

def test_tpu_to_bf16_rules():
    """RNE with ties to even, overflow to Inf, NaN/Inf kept, subnormals flushed with their sign;
    the flush side is the labelled assumption (0x007FFFFF rounds up to 2^-126, or is flushed)."""
    x = _f32([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF800000, 0x00000001, 0x807F0000, 0x007FFFFF,
              0x00800000])
    result = tpu_to_bf16(x).view(np.uint16)
    daz = tpu_to_bf16(x, flush="input").view(np.uint16)
    assert result.tolist() == [0x3F80, 0x3F82, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0080, 0x0080]
    assert daz.tolist() == [0x3F80, 0x3F82, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0000, 0x0080]
    assert np.isnan(np.float32(tpu_to_bf16(np.float32(np.nan))))
    with pytest.raises(ValueError, match="flush"):
        tpu_to_bf16(x, flush="output")


@given(bits=f32_bits(), flush=st.sampled_from(["result", "input"]))
@settings(max_examples=300)
def test_tpu_to_bf16_matches_oracle(bits, flush):
    """tpu_to_bf16 against the oracle's conversion from the format's definition."""
    got = tpu_to_bf16(_f32(bits), flush=flush).astype(np.float32)
    want = bf16_convert(float(_f32(bits)), "tpu" if flush == "result" else "tpu_daz")
    assert int(_oracle_bits(got)) == int(_oracle_bits(want))


def test_conversion_rule_changes_a_subnormal_operand():
    """a = 2^-130 (an f32 subnormal), b = 2^10: one bf16 pass gives 2^-120 with IEEE conversion,
    0 when the TPU flushes the subnormal."""
    a, b = np.array([[2.0**-130]], np.float32), np.array([[2.0**10]], np.float32)
    ieee = tpu(a, b, conversion="ieee")
    flushed = tpu(a, b, conversion="tpu")
    assert (float(ieee[0, 0]), int(_bits(flushed)[0, 0])) == (2.0**-120, 0)


# ---- the front end -------------------------------------------------------------------------------

@pytest.mark.parametrize("precision, algorithm", list(PRECISIONS.items()))
def test_precision_names_the_pass_count(precision, algorithm):
    """default / high / highest = 1 / 3 / 6 bf16 passes, as JAX has it on a TPU."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((3, 40), np.float32), rng.standard_normal((40, 2), np.float32)
    np.testing.assert_array_equal(_bits(tpu(a, b, precision=precision)),
                                  _bits(tpu(a, b, algorithm=algorithm)))
    passes = int(algorithm.rsplit("_X", 1)[1]) if "_X" in algorithm else 1
    assert passes == {"default": 1, "high": 3, "highest": 6}[precision]


def test_default_is_one_bf16_pass_of_ieee_fma():
    """The default: BF16_BF16_F32, operands converted by the TPU rule, one FP32 FMA chain."""
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((4, 33), np.float32), rng.standard_normal((33, 3), np.float32)
    want = mpt.gemm(tpu_to_bf16(a), tpu_to_bf16(b), model="ieee_fma")
    np.testing.assert_array_equal(_bits(tpu(a, b)), _bits(want))


@pytest.mark.parametrize("inner", ["exact", "ieee_mul_add", "hopper", "ampere"])
def test_inner_pass_is_any_mma_model(inner):
    """The inner pass runs mpt.gemm with the named model: X3 (xla) = the source's sum of three
    such dots of the pieces."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((3, 24), np.float32), rng.standard_normal((24, 2), np.float32)
    hi_a = (a.view(np.uint32) & 0xFFFF0000).view(np.float32)
    hi_b = (b.view(np.uint32) & 0xFFFF0000).view(np.float32)
    pieces = [tpu_to_bf16(x) for x in (hi_a, a - hi_a, hi_b, b - hi_b)]
    ha, la, hb, lb = pieces

    def dot(x, y):
        return mpt.gemm(x, y, model=inner)
    low = dot(la, hb) + dot(ha, lb)
    want = np.where(np.isnan(low), np.float32(0), low) + dot(ha, hb)
    got = tpu(a, b, algorithm="BF16_BF16_F32_X3", inner=inner)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_batch_dimensions_broadcast():
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((2, 3, 5), np.float32), rng.standard_normal((5, 4), np.float32)
    got = tpu(a, b, algorithm="BF16_BF16_F32_X6", decomposition="triton", block_k=2)
    for z in range(2):
        np.testing.assert_array_equal(_bits(got[z]), _bits(tpu(
            a[z], b, algorithm="BF16_BF16_F32_X6", decomposition="triton", block_k=2)))


def test_mma_is_one_mxu_pass_of_bf16_operands():
    """mpt.mma on bf16 operands runs one MXU pass, the inner model from C (the inner model
    chosen per call or with configure). Without C it equals the f32 dot of the same values at
    the default precision (their bf16 conversion is exact); with C it does not in general: the
    rewriter's dot adds C after the pass, one f32 add (here it differs by one ulp)."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((2, 6)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((6, 2)).astype(ml_dtypes.bfloat16)
    c = rng.standard_normal((2, 2)).astype(np.float32)
    mxu = mpt.mma(a, b, c, model="tpu")
    np.testing.assert_array_equal(_bits(mxu), _bits(mpt.mma(a, b, c, model="ieee_fma")))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    np.testing.assert_array_equal(_bits(mpt.mma(a, b, model="tpu")), _bits(tpu(a32, b32)))
    assert not np.array_equal(_bits(mxu), _bits(tpu(a32, b32, c)))
    exact = mpt.mma(a, b, c, model="exact")
    np.testing.assert_array_equal(_bits(mpt.mma(a, b, c, model="tpu", inner="exact")), _bits(exact))
    configured = mpt.get_mma_model("tpu").configure(inner="exact")
    np.testing.assert_array_equal(_bits(mpt.mma(a, b, c, model=configured)), _bits(exact))


def test_f32_dot_is_software_mma_refuses_it():
    """The pass algorithm composes MXU passes in software: mpt.mma takes bf16 operands only,
    and the algorithm options belong to fp32 inputs."""
    a = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="call mpt.gemm"):
        mpt.mma(a, a.T.copy(), model="tpu")
    h = a.astype(ml_dtypes.bfloat16)
    with pytest.raises(TypeError, match="algorithm: options of an f32 dot"):
        mpt.mma(h, h.T.copy(), model="tpu", algorithm="BF16_BF16_F32_X3")


def test_assumptions_are_configurable_defaults():
    """decomposition, inner and conversion are Assumptions of the model (choices listed, the
    first the default); configure changes what a call without the option runs."""
    model = mpt.get_mma_model("tpu")
    assert {a.name: a.choices[:3] for a in model.assumptions} == {
        "inner": ("ieee_fma", "ieee_mul_add", "exact"), "decomposition": ("xla", "triton"),
        "conversion": ("tpu", "tpu_daz", "ieee")}
    a, b, _, _ = _TRITON_CASE
    triton = model.configure(decomposition="triton")
    np.testing.assert_array_equal(_bits(mpt.gemm(a, b, model=triton, precision="high")),
                                  _bits(tpu(a, b, precision="high", decomposition="triton")))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"algorithm": "BF16_BF16_F32_X3", "precision": "high"}, ValueError, "not both"),
    ({"precision": "medium"}, ValueError, "precision"),
    ({"algorithm": "BF16_X3"}, ValueError, "algorithm"),
    ({"decomposition": "cublas"}, ValueError, "decomposition"),
    ({"conversion": "rz"}, ValueError, "conversion"),
    ({"block_k": 16}, ValueError, "block_k"),
    ({"decomposition": "triton", "block_k": 0}, ValueError, "block_k"),
    ({"algorithm": "F32_F32_F32", "inner": "hopper"}, ValueError, "fp32"),
])
def test_bad_arguments(kwargs, error, match):
    a = np.ones((2, 3), np.float32)
    with pytest.raises(error, match=match):
        tpu(a, a.T.copy(), **kwargs)


def test_bad_operands():
    a = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="a has dtype int32"):
        tpu(np.ones((2, 3), np.int32), a.T.copy())
    with pytest.raises(TypeError, match="c must be float32"):
        tpu(a, a.T.copy(), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="shape"):
        tpu(np.ones(3, np.float32), a.T.copy())
