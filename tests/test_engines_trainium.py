"""mpt.engines.trainium: cFP8 formats, the FP32 PSUM tiling of the matrix engine (the MMA model
``trainium``), the compiler's auto-cast (``trainium_autocast``) and stochastic rounding.

Oracles: ``mpt.reference.trainium`` (the PSUM tiling rule on exact rationals),
``mpt.reference.rounding`` (formats from their definition) and ml_dtypes where a dtype matches.
"""
import ml_dtypes
import numpy as np
import pytest

import mpt
from mpt.engines.trainium import CFP8_LAYOUTS, CFP8_SPECIALS, PASS_ORDERS, cfp8_format
from mpt.reference.rounding import decode_value, round_exact
from mpt.reference.trainium import trainium_matmul_reference

CANONICAL_NAN = 0x7FFFFFFF
MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down")
#: cFP8 formats with an ml_dtypes twin: (layout, specials) -> dtype
ML_DTYPES = {("e5m2", "ieee"): ml_dtypes.float8_e5m2, ("e4m3", "ieee"): ml_dtypes.float8_e4m3,
             ("e3m4", "ieee"): ml_dtypes.float8_e3m4, ("e4m3", "fn"): ml_dtypes.float8_e4m3fn}
ALL_CFP8 = [(layout, specials) for layout in CFP8_LAYOUTS for specials in CFP8_SPECIALS]


def trainium_matmul(a, b, c=None, *, in_format, pass_order="sequential_fma", **options):
    """``mpt.mma`` on the trainium model with the pass order chosen (its public path)."""
    model = mpt.get_mma_model("trainium").configure(pass_order=pass_order)
    return mpt.mma(a, b, c, model=model, in_format=in_format, **options)


def _bits(x):
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32).copy()
    bits[np.isnan(x)] = CANONICAL_NAN
    return bits


# ---- cFP8 formats: all 256 codes ----------------------------------------------------------------

def _code_values(fmt):
    """The value of each of the 256 codes, from the format's definition (the oracle)."""
    return np.array([decode_value(code, fmt) for code in range(256)], np.float64)


@pytest.mark.parametrize("layout, specials", ALL_CFP8)
def test_cfp8_codes_decode_as_ml_dtypes_and_round_to_themselves(layout, specials):
    """Every code's value (oracle) equals ml_dtypes' where a dtype matches; every value rounds to
    itself in every mode; Inf/NaN exist exactly as ``specials`` says."""
    fmt = cfp8_format(layout, specials=specials)
    values = _code_values(fmt)
    if (layout, specials) in ML_DTYPES:
        theirs = np.arange(256, dtype=np.uint8).view(ML_DTYPES[layout, specials])
        np.testing.assert_array_equal(values, theirs.astype(np.float64))
    assert np.isinf(values).sum() == (2 if specials == "ieee" else 0)
    assert np.isnan(values).sum() == {"ieee": 2 * (2 ** fmt.mantissa_bits - 1), "fn": 2,
                                      "none": 0}[specials]
    assert np.nanmax(values[np.isfinite(values)]) == fmt.max
    x = values.astype(np.float32)
    for mode in MODES:
        np.testing.assert_array_equal(_bits(mpt.round(x, fmt, mode)), _bits(x))


def _probes(fmt):
    """float32 inputs that exercise every rounding decision of fmt: each finite code, the
    points 1/4, 1/2, 3/4 of the way to the next code, beyond max, below the smallest
    subnormal, both signs, ±0, ±Inf and NaN."""
    values = _code_values(fmt)
    pos = np.unique(values[np.isfinite(values) & (values >= 0)])             # ascending, from 0
    gaps = np.diff(pos)
    between = (pos[:-1, None] + gaps[:, None] * np.array([0.25, 0.5, 0.75])).ravel()
    top = fmt.max + gaps[-1] * np.array([0.25, 0.5, 0.75, 1.0, 1.5]) if gaps.size else []
    tiny = fmt.min_subnormal * np.array([0.25, 0.5, 0.75])
    mags = np.concatenate([pos, between, top, tiny, [np.inf]])
    return np.concatenate([mags, -mags, [np.nan]]).astype(np.float32)   # all exact in float32


@pytest.mark.parametrize("layout, specials", ALL_CFP8)
@pytest.mark.parametrize("saturate", [False, True])
def test_cfp8_rounding_exhaustive_against_oracle(layout, specials, saturate):
    """Every rounding decision of the 256-code table, in every mode (and SR with fixed words),
    equals the oracle's round_exact."""
    fmt = cfp8_format(layout, specials=specials)
    x = _probes(fmt)
    words = np.array([0, 2**31 - 1, 2**31, 2**32 - 1], np.uint32)
    for mode in MODES + ("stochastic",):
        for word in (words if mode == "stochastic" else [None]):
            kw = {} if word is None else {"random_bits": np.full(x.shape, word, np.uint32)}
            got = mpt.round(x, fmt, mode, saturate=saturate, **kw)
            want = [decode_value(round_exact(float(v), fmt, mode, saturate=saturate,
                                             word=None if word is None else int(word)), fmt)
                    for v in x]
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{mode} {word}")


@pytest.mark.parametrize("layout, specials", list(ML_DTYPES))
def test_cfp8_round_to_nearest_matches_ml_dtypes(layout, specials):
    fmt = cfp8_format(layout, specials=specials)
    x = _probes(fmt)
    theirs = x.astype(ML_DTYPES[layout, specials]).astype(np.float32)
    np.testing.assert_array_equal(_bits(mpt.round(x, fmt)), _bits(theirs))


def test_cfp8_format_parameters():
    assert cfp8_format("e4m3").max == 240.0 and cfp8_format("e4m3", specials="fn").max == 448.0
    assert cfp8_format("e4m3", specials="none").max == 480.0
    assert (cfp8_format("e5m2").max, cfp8_format("e3m4").max) == (57344.0, 15.5)
    biased = cfp8_format("e4m3", bias=11)
    assert (biased.name, biased.max) == ("cfp8_e4m3_bias11", 15.0)
    with pytest.raises(ValueError, match="layout"):
        cfp8_format("e2m5")
    with pytest.raises(ValueError, match="specials"):
        cfp8_format("e4m3", specials="fnuz")


# ---- the matrix engine: FP32 PSUM, K in passes of 128 -------------------------------------------

def _operands(rng, fmt, shape):
    """Values of fmt over a wide exponent range (both signs, some zeros), in fmt's dtype."""
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-12, 12, shape)
    x[rng.random(shape) < 0.05] = 0.0
    fmt = mpt.get_format(fmt)
    y = mpt.round(x.astype(np.float32), fmt, saturate=True)
    return y


FORMATS = ["bf16", "fp16", "fp32", "tf32", cfp8_format("e4m3"), cfp8_format("e5m2"),
           cfp8_format("e3m4", specials="fn")]


@pytest.mark.parametrize("k", [128, 129, 256, 300])
@pytest.mark.parametrize("pass_order", list(PASS_ORDERS))
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: str(f))
def test_psum_tiling_matches_oracle(k, pass_order, fmt):
    """K = 128 (one pass), 129 (a pass of one product), 256, 300 (a short last pass), with and
    without an initial PSUM value: equal to the oracle bit for bit."""
    rng = np.random.default_rng(k)
    a, b = _operands(rng, fmt, (2, k)), _operands(rng, fmt, (k, 3))
    c = rng.standard_normal((2, 3)).astype(np.float32)
    values = [mpt.decode(x) if x.dtype != np.float32 else x for x in (a, b)]
    for cc in (None, c):
        got = trainium_matmul(a, b, cc, in_format=fmt, pass_order=pass_order)
        want = trainium_matmul_reference(values[0].tolist(), values[1].tolist(),
                                         None if cc is None else cc.tolist(),
                                         pass_order=pass_order)
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_psum_adds_a_rounded_pass():
    """K = 129: pass 1 sums to −1 exactly (a_0·b_0 = −1, then zeros); pass 2 is the single
    product (1 + 2^-23)(1 + 2^-22) = 1 + 3·2^-23 + 2^-45, rounded to FP32 on its own
    (1 + 3·2^-23) before PSUM adds it: −1 + 1 + 3·2^-23 = 3·2^-23 (0x34C00000). One FMA chain over
    all of K (a CPU) fuses the last product with −1: 3·2^-23 + 2^-45 (0x34C00001)."""
    a = np.zeros((1, 129), np.float32)
    b = np.zeros((129, 1), np.float32)
    a[0, 0], b[0, 0] = -1.0, 1.0
    a[0, 128], b[128, 0] = 1 + 2.0**-23, 1 + 2.0**-22
    tiled = trainium_matmul(a, b, in_format="fp32")
    fused = mpt.gemm(a, b, model="ieee_fma")
    assert (int(_bits(tiled)[0, 0]), int(_bits(fused)[0, 0])) == (0x34C00000, 0x34C00001)


@pytest.mark.parametrize("a, b, want", [
    # 1 + 2^-30 − 1: FP32 chains lose 2^-30 at the second step; the exact pass keeps it
    ([1.0, 2.0**-30, -1.0], [1.0, 1.0, 1.0],
     {"sequential_fma": 0x00000000, "sequential_mul_add": 0x00000000, "exact": 0x30800000}),
    # −1 + (1 + 2^-23)(1 + 2^-22): the FMA keeps 2^-45 (3·2^-23 + 2^-45 is exact); rounding the
    # product first (1 + 3·2^-23) loses it
    ([-1.0, 1 + 2.0**-23], [1.0, 1 + 2.0**-22],
     {"sequential_fma": 0x34C00001, "sequential_mul_add": 0x34C00000, "exact": 0x34C00001}),
])
def test_pass_orders_differ(a, b, want):
    a, b = np.array([a], np.float32), np.array([b], np.float32).T.copy()
    got = {p: int(_bits(trainium_matmul(a, b, in_format="fp32", pass_order=p))[0, 0])
           for p in PASS_ORDERS}
    assert got == want


def test_tile_k_smaller_passes():
    """tile_k < 128 (a kernel that contracts fewer rows per nc_matmul) follows the same rule."""
    rng = np.random.default_rng(9)
    a, b = _operands(rng, "bf16", (2, 70)), _operands(rng, "bf16", (70, 2))
    got = trainium_matmul(a, b, in_format="bf16", tile_k=32)
    want = trainium_matmul_reference(mpt.decode(a).tolist(), mpt.decode(b).tolist(), tile_k=32)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_mixed_input_formats_and_batches():
    rng = np.random.default_rng(10)
    e4m3, e5m2 = cfp8_format("e4m3"), cfp8_format("e5m2")
    a, b = _operands(rng, e4m3, (2, 3, 150)), _operands(rng, e5m2, (150, 4))
    got = trainium_matmul(a, b, in_format=(e4m3, e5m2))
    for z in range(2):
        want = trainium_matmul_reference(a[z].tolist(), b.tolist())
        np.testing.assert_array_equal(_bits(got[z]), _bits(want))


def test_specials_through_the_passes():
    """Inf·0 in pass 2 makes NaN; +Inf from pass 1 survives finite passes; +Inf + −Inf is NaN."""
    a = np.zeros((3, 130), np.float32)
    b = np.ones((130, 1), np.float32)
    a[0, 129] = np.inf
    b[129, 0] = 0.0                       # row 0: Inf·0 in the second pass
    a[1, 0] = np.inf                      # row 1: +Inf in pass 1, finite pass 2
    a[2, 0], a[2, 129] = np.inf, -np.inf  # row 2: −Inf·0 in pass 2 (then, with b = 1: Inf − Inf)
    got = _bits(trainium_matmul(a, b, in_format="fp32"))
    b2 = b.copy()
    b2[129, 0] = 1.0
    got2 = _bits(trainium_matmul(a[2:], b2, in_format="fp32"))
    assert got.ravel().tolist() == [CANONICAL_NAN, 0x7F800000, CANONICAL_NAN]
    assert got2.ravel().tolist() == [CANONICAL_NAN]


def test_bad_matmul_arguments():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="pass_order must be one of"):
        trainium_matmul(x, x.T, in_format="fp32", pass_order="pairwise")
    with pytest.raises(ValueError, match="tile_k"):
        trainium_matmul(x, x.T, in_format="fp32", tile_k=256)
    with pytest.raises(TypeError, match="bf16"):
        trainium_matmul(x, x.T, in_format="bf16")
    with pytest.raises(ValueError, match="not cfp8_e4m3 numbers"):
        trainium_matmul(x * 1.1, x.T, in_format=cfp8_format("e4m3"))
    with pytest.raises(TypeError, match="c must be float32"):
        trainium_matmul(x, x.T, np.zeros((2, 2)), in_format="fp32")
    with pytest.raises(TypeError, match="auto_cast_type is an option of trainium_autocast"):
        trainium_matmul(x, x.T, in_format="fp32", auto_cast_type="bf16")


def test_tf32_operands_drop_their_low_bits():
    """fp32 arrays read as tf32 keep their top 19 bits, as every mpt model reads tf32: 1 +
    2^-11 + 2^-20 becomes 1 (the MME would round it; Neuron does not say, so mpt keeps its
    convention)."""
    a = np.array([[1 + 2.0**-11 + 2.0**-20]], np.float32)
    assert float(trainium_matmul(a, np.ones((1, 1), np.float32), in_format="tf32")[0, 0]) == 1.0


def test_cfp8_names_resolve_and_every_flavour_is_accepted():
    """mpt.get_format finds every cFP8 name; the cFP8 configuration takes every flavour (the
    specials are a labelled parameter of the format, not of the engine) and mixes layouts."""
    for layout in CFP8_LAYOUTS:
        for specials in CFP8_SPECIALS:
            fmt = cfp8_format(layout, specials=specials)
            assert mpt.get_format(fmt.name) == fmt
    assert mpt.get_format("cfp8_e4m3_bias11") == cfp8_format("e4m3", bias=11)
    with pytest.raises(ValueError, match="Trainium cFP8"):
        mpt.get_format("cfp8_e4m3_bias7")           # the default bias has no suffix
    model = mpt.get_mma_model("trainium")
    assert model.config("cfp8_e3m4_none", "cfp8_e5m2_bias13").inputs[0] == "cfp8_e5m2"


# ---- stochastic rounding and auto-cast -----------------------------------------------------------

def test_documented_quick_test_fp16_accumulation():
    """Neuron's rounding-modes page: a = fp16 1024, then 2048 times a = a + 0.5. Under RNE every
    sum 1024.5 is a tie that goes back to 1024; under SR the increments survive on average: the
    expected result is 2048 (Neuron's page shows 2056). Philox SR (the trn targets' labelled
    source) with this seed gives 2066: a sum of 2048 steps of ±0.5 noise (±1 at 2048 and above)
    has a standard deviation near 32, so 2048 ± 6·32 bounds any seed."""
    def run(stochastic):
        a = np.float16(1024.0)
        for i in range(2048):
            total = np.float32(a) + np.float32(0.5)                  # exact in FP32
            a = mpt.round(total, "fp16", "stochastic", seed=7, stream=i) if stochastic \
                else mpt.round(total, "fp16")
        return float(a)
    assert run(False) == 1024.0
    sr = run(True)
    assert sr == 2066.0
    assert abs(sr - 2048) < 6 * 32


def _autocast(a, b, c=None, *, result="fp32", pass_order="sequential_fma", **options):
    model = mpt.get_mma_model("trainium_autocast").configure(auto_cast_result=result,
                                                             pass_order=pass_order)
    return mpt.gemm(a, b, c, model=model, **options)


@pytest.mark.parametrize("pass_order", list(PASS_ORDERS))
def test_auto_cast_matmult_casts_operands_and_accumulates_in_fp32(pass_order):
    """--auto-cast matmult: fp32 operands RNE to bf16, then the engine (FP32 PSUM); the result is
    FP32 (default) or, under the assumption "cast", rounded to bf16 too. mpt.mma refuses it: it
    is the compiler's software."""
    rng = np.random.default_rng(12)
    a = rng.standard_normal((3, 200)).astype(np.float32)
    b = rng.standard_normal((200, 2)).astype(np.float32)
    want = trainium_matmul(mpt.round(a, "bf16"), mpt.round(b, "bf16"), in_format="bf16",
                           pass_order=pass_order)
    np.testing.assert_array_equal(_bits(_autocast(a, b, pass_order=pass_order)), _bits(want))
    cast = _autocast(a, b, result="cast", pass_order=pass_order)
    np.testing.assert_array_equal(_bits(cast), _bits(mpt.decode(mpt.round(want, "bf16"))))
    with pytest.raises(ValueError, match="call mpt.gemm"):
        mpt.mma(a, b, model="trainium_autocast")


@pytest.mark.parametrize("auto_cast_type, fmt", [
    ("fp16", "fp16"), ("tf32", "tf32"), ("fp8_e4m3", cfp8_format("e4m3"))])
def test_auto_cast_types(auto_cast_type, fmt):
    rng = np.random.default_rng(13)
    a = rng.standard_normal((2, 140)).astype(np.float32)
    b = rng.standard_normal((140, 2)).astype(np.float32)
    want = trainium_matmul(mpt.round(a, fmt), mpt.round(b, fmt), in_format=fmt)
    got = _autocast(a, b, auto_cast_type=auto_cast_type)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_bad_auto_cast_arguments():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="auto_cast_type"):
        _autocast(x, x.T, auto_cast_type="int8")
    with pytest.raises(ValueError, match="auto_cast_result must be one of"):
        _autocast(x, x.T, result="bf16")
    with pytest.raises(ValueError, match="does not take inputs"):
        _autocast(x.astype(np.float16), x.T.astype(np.float16))


def test_empty_k_and_negative_zero_products():
    """K = 0 gives C or +0; products that are all -0 give +0 (a pass from +0 never makes -0, so
    the first pass writing PSUM equals PSUM starting at +0)."""
    a, b = np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32)
    assert not _bits(trainium_matmul(a, b, in_format="fp32")).any()
    neg = np.full((1, 130), -0.0, np.float32)
    for pass_order in PASS_ORDERS:
        d = trainium_matmul(neg, np.ones((130, 1), np.float32), in_format="fp32",
                            pass_order=pass_order)
        assert int(_bits(d)[0, 0]) == 0
