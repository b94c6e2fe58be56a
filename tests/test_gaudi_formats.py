"""Gaudi FP8 formats, the output conversion and its LFSR stochastic rounding (mpt.engines.gaudi).

Formats: every Gaudi 2 and Gaudi 3 FP8 format (all 64 biases × 2 kinds × 3 modes), all 256
codes, every rounding mode, against mpt's exact oracle (``mpt.reference.rounding``) and against
ml_dtypes where a dtype is the same format. Conversion: the chip's rules on directed values, the
LFSR comparison against an independent bit-level statement of it.
"""
import math

import ml_dtypes
import numpy as np
import pytest

import mpt
from mpt.engines import gaudi
from mpt.kernels.rounding import decode_bits, decode_spec
from mpt.reference.rounding import decode_value, round_array

MODES = ["nearest_even", "nearest_away", "toward_zero", "up", "down"]


def _gaudi3_formats():
    return [gaudi.fp8_format("gaudi3", k, b, m) for k in ("e4m3", "e5m2") for b in range(64)
            for m in gaudi.FP8_MODES]


ALL_FP8 = [gaudi.fp8_format("gaudi2", "e4m3", b) for b in (3, 7, 11, 15)] + \
    [gaudi.fp8_format("gaudi2", "e5m2")] + _gaudi3_formats()


def _f32_bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _same(x, y):
    """Bitwise equality of float32 arrays, any NaN equal to any NaN."""
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    both_nan = np.isnan(x) & np.isnan(y)
    return bool(np.all((_f32_bits(x) == _f32_bits(y)) | both_nan))


def _code_values(fmt):
    """The oracle's value of each of the 256 codes (float32)."""
    return np.array([decode_value(c, fmt) for c in range(256)], np.float32)


# ---- the formats ------------------------------------------------------------------------------

@pytest.mark.parametrize("chip, kind, bias, mode, fmax", [
    ("gaudi2", "e4m3", 7, "full", 240.0), ("gaudi2", "e4m3", 3, "full", 3840.0),
    ("gaudi2", "e4m3", 15, "full", 0.9375), ("gaudi2", "e5m2", 15, "full", 57344.0),
    ("gaudi3", "e4m3", 7, "none", 480.0), ("gaudi3", "e4m3", 7, "minimal", 448.0),
    ("gaudi3", "e5m2", 0, "none", 1.75 * 2.0**31), ("gaudi3", "e4m3", 63, "full", 1.875 * 2**-49),
])
def test_format_limits(chip, kind, bias, mode, fmax):
    """max: E4M3 at bias 7 is 1.875·2^7 = 240 with Inf (top binade reserved), 1.875·2^8 = 480
    with every code finite, 1.75·2^8 = 448 when only S.1111.111 is NaN; a bias b scales by
    2^(7-b)."""
    fmt = gaudi.fp8_format(chip, kind, bias, mode)
    assert fmt.max == fmax
    assert fmt.bias == bias and fmt.custom and fmt.bits == 8
    assert gaudi.fp8_params(fmt) == (kind, bias, mode)


def test_format_validation():
    with pytest.raises(ValueError, match=r"bias in \(3, 7, 11, 15\)"):
        gaudi.fp8_format("gaudi2", "e4m3", 8)
    with pytest.raises(ValueError, match="mode='full'"):
        gaudi.fp8_format("gaudi2", "e4m3", 7, "minimal")
    with pytest.raises(ValueError, match=r"\(15,\)"):
        gaudi.fp8_format("gaudi2", "e5m2", 14)
    with pytest.raises(ValueError, match="0..63"):
        gaudi.fp8_format("gaudi3", "e4m3", 64)
    with pytest.raises(ValueError, match="0..63"):
        gaudi.fp8_format("gaudi3", "e4m3", -1)
    with pytest.raises(TypeError, match="bias must be an int"):
        gaudi.fp8_format("gaudi3", "e4m3", 7.0)
    with pytest.raises(ValueError, match="kind"):
        gaudi.fp8_format("gaudi3", "e3m4")
    with pytest.raises(ValueError, match="mode"):
        gaudi.fp8_format("gaudi3", "e4m3", 7, "fnuz")
    with pytest.raises(ValueError, match="not a Gaudi FP8 format"):
        gaudi.fp8_params("fp8_e4m3fnuz")
    assert gaudi.fp8_params("fp8_e4m3fn") == ("e4m3", 7, "minimal")
    assert gaudi.fp8_params("fp8_e5m2") == ("e5m2", 15, "full")
    assert gaudi.fp8_format("gaudi2", "e4m3") == gaudi.fp8_format("gaudi3", "e4m3")
    assert len({f.name for f in ALL_FP8}) == 2 * 64 * 3          # Gaudi 2's are among Gaudi 3's


@pytest.mark.parametrize("fmt", ALL_FP8, ids=lambda f: f.name)
def test_codes_decode_exactly(fmt):
    """All 256 codes: mpt's decoder equals the oracle's; each finite value rounds to itself in
    every mode; the values span exactly [min subnormal, max] of the Format."""
    codes = np.arange(256, dtype=np.uint8)
    out = np.empty(256, np.uint32)
    decode_bits(codes, out, decode_spec(fmt, np.float32))
    want = _code_values(fmt)
    assert _same(out.view(np.float32), want)
    finite = want[np.isfinite(want)]
    for mode in MODES:
        assert _same(mpt.round(finite, fmt, mode), finite)
    positive = finite[finite > 0]
    assert positive.min() == fmt.min_subnormal and positive.max() == fmt.max
    nans = int(np.isnan(want).sum())
    assert nans == {"full": 2 * ((1 << fmt.mantissa_bits) - 1), "none": 0, "minimal": 2}[
        gaudi.fp8_params(fmt)[2]]


def _probe_inputs(fmt):
    """Every code's value, the midpoint and quarter points between neighbours, values past max
    and below the smallest subnormal, both signs (float32)."""
    v = np.unique(np.abs(_code_values(fmt)[np.isfinite(_code_values(fmt))]).astype(np.float64))
    lo, hi = v[:-1], v[1:]
    extra = [fmt.max * 2, fmt.max * 1.5, fmt.max + (fmt.max - v[-2]) / 2, fmt.min_subnormal / 4,
             fmt.min_subnormal * 0.75]
    x = np.concatenate([v, (lo + hi) / 2, lo + (hi - lo) / 4, hi - (hi - lo) / 4, extra])
    x = x[x < 2.0**128]
    return np.concatenate([x, -x]).astype(np.float32)                 # exact: short binaries


@pytest.mark.parametrize("fmt", ALL_FP8, ids=lambda f: f.name)
def test_rounding_every_mode_equals_oracle(fmt):
    """mpt.round into each Gaudi format equals the vectorised exact oracle in every mode,
    stochastic rounding with explicit words included, on every rounding boundary."""
    x = _probe_inputs(fmt)
    table = _code_values(fmt)
    for mode in MODES:
        want = table[round_array(x, fmt, mode)]
        assert _same(mpt.round(x, fmt, mode), want), mode
    words = np.random.default_rng(fmt.bias).integers(0, 2**32, x.size, dtype=np.uint32)
    want = table[round_array(x, fmt, "stochastic", words=words)]
    assert _same(mpt.round(x, fmt, "stochastic", random_bits=words), want)


_ML_DTYPES = [
    (gaudi.fp8_format("gaudi2", "e4m3", 7), ml_dtypes.float8_e4m3),
    (gaudi.fp8_format("gaudi3", "e4m3", 7, "minimal"), ml_dtypes.float8_e4m3fn),
    (gaudi.fp8_format("gaudi2", "e5m2", 15), ml_dtypes.float8_e5m2),
]


@pytest.mark.parametrize("fmt, dtype", _ML_DTYPES, ids=lambda x: getattr(x, "name", str(x)))
def test_equal_to_ml_dtypes(fmt, dtype):
    """Gaudi's E4M3 at bias 7 "full" is ml_dtypes' float8_e4m3 (IEEE-like), "minimal" is
    float8_e4m3fn, E5M2 bias 15 is float8_e5m2: same value for every code, and the same RNE
    rounding of every probe (ml_dtypes' float32 cast rounds once)."""
    codes = np.arange(256, dtype=np.uint8)
    assert _same(codes.view(dtype).astype(np.float32), _code_values(fmt))
    x = _probe_inputs(fmt)
    with np.errstate(over="ignore"):
        want = x.astype(dtype).astype(np.float32)
    assert _same(mpt.round(x, fmt), want)


@pytest.mark.parametrize("fmt", [gaudi.fp8_format("gaudi3", "e4m3", 11, "none"),
                                 gaudi.fp8_format("gaudi2", "e4m3", 11)], ids=lambda f: f.name)
def test_bias_11_against_float8_e4m3b11fnuz(fmt):
    """float8_e4m3b11fnuz is E4M3 at bias 11 with no Inf, no -0 and 0x80 its only NaN. Gaudi's
    "none" mode at bias 11 is the same on every other code (max 30 both); Gaudi 2's IEEE-like
    bias 11 agrees below its reserved top binade. RNE rounding of finite probes up to max agrees
    except where fnuz has no -0 (it gives +0)."""
    codes = np.arange(256, dtype=np.uint8)
    fnuz = codes.view(ml_dtypes.float8_e4m3b11fnuz).astype(np.float32)
    mine = _code_values(fmt)
    same = codes != 0x80
    if gaudi.fp8_params(fmt)[2] == "full":
        same &= (codes & 0x78) != 0x78
    assert _same(fnuz[same], mine[same])
    x = _probe_inputs(fmt)
    x = x[np.abs(x) <= fmt.max]
    want = x.astype(ml_dtypes.float8_e4m3b11fnuz).astype(np.float32)
    got = np.asarray(mpt.round(x, fmt), np.float32)
    negative_zero = (got == 0) & np.signbit(got)
    assert _same(got[~negative_zero], want[~negative_zero])
    assert np.all(want[negative_zero] == 0) and not np.signbit(want[negative_zero]).any()


# ---- output conversion -----------------------------------------------------------------------

E4M3 = gaudi.fp8_format("gaudi2", "e4m3")                          # bias 7, IEEE-like, max 240


@pytest.mark.parametrize("mode, pos, neg", [
    ("nearest_even", math.inf, -math.inf), ("nearest_away", math.inf, -math.inf),
    ("toward_zero", 240.0, -240.0), ("up", math.inf, -240.0), ("down", 240.0, -math.inf)])
def test_conversion_overflow_is_ieee(mode, pos, neg):
    """±300 into E4M3 (bias 7, max 240): Inf in the nearest modes; RZ gives ±max; RU gives +Inf
    and -max, RD +max and -Inf -- IEEE 754's rule, which is mpt.round without saturate. With
    the descriptor's clip_fp, ±max in every mode."""
    x = np.array([300.0, -300.0], np.float32)
    assert _same(gaudi.convert(x, E4M3, mode), [pos, neg])
    assert _same(gaudi.convert(x, E4M3, mode, clip=True), [240.0, -240.0])


def test_conversion_overflow_by_rounding():
    """248 is the midpoint of 240 (1.111b·2^7, odd) and 256 (past max): RNE picks the even
    neighbour 256, which overflows: +Inf. 247 rounds to 240."""
    assert _same(gaudi.convert(np.array([248.0, 247.0], np.float32), E4M3), [math.inf, 240.0])


def test_conversion_none_and_minimal_modes():
    """"none" (every code finite, max 480): overflow, Inf and NaN give ±max (NaN: +max, the code
    0x7F). "minimal" (max 448): overflow gives NaN in RNE and max in RZ; Inf gives NaN."""
    none = gaudi.fp8_format("gaudi3", "e4m3", 7, "none")
    x = np.array([1e6, -1e6, np.inf, -np.inf, np.nan], np.float32)
    for mode in ("nearest_even", "toward_zero", "up"):
        assert _same(gaudi.convert(x, none, mode), [480, -480, 480, -480, 480])
    minimal = gaudi.fp8_format("gaudi3", "e4m3", 7, "minimal")
    assert _same(gaudi.convert(x[:3], minimal), [np.nan] * 3)
    assert _same(gaudi.convert(x[:2], minimal, "toward_zero"), [448, -448])


def test_conversion_nan_patterns():
    """bf16 and fp16 converters write 0x7FFF for any NaN; "full" FP8 a positive NaN."""
    x = np.array([np.nan, -np.nan], np.float32)
    assert gaudi.convert(x, "bf16").view(np.uint16).tolist() == [0x7FFF, 0x7FFF]
    assert gaudi.convert(x, "fp16").view(np.uint16).tolist() == [0x7FFF, 0x7FFF]
    out = gaudi.convert(x, E4M3)
    assert np.isnan(out).all() and not np.signbit(out).any()


def _gaudi_sr_bf16(bits, lfsr):
    """The converter's rule, bit by bit: keep the top 16 bits of the FP32 pattern and add one
    iff the 16 discarded bits, left-aligned in 32, are >= the LFSR value (finite inputs)."""
    discarded = (bits & 0xFFFF) << 16
    return (bits >> 16) + (discarded >= lfsr)


def test_stochastic_rule_bf16():
    """x = 1 + 2^-9 (0x3F804000): the discarded bits 0x4000, left-aligned, are 0x40000000, so
    L = 0x40000000 rounds up (0x3F81) and L = 0x40000001 does not (0x3F80); on random inputs
    convert() equals the bit-level rule."""
    x = np.array([1 + 2.0**-9] * 2, np.float32)
    lfsr = np.array([0x40000000, 0x40000001], np.uint32)
    assert gaudi.convert(x, "bf16", "stochastic", lfsr=lfsr).view(np.uint16).tolist() == \
        [0x3F81, 0x3F80]
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 0x7F000000, 5000, dtype=np.uint32)      # finite, no overflow
    lfsr = rng.integers(1, 2**32, 5000, dtype=np.uint32)
    got = gaudi.convert(bits.view(np.float32), "bf16", "stochastic", lfsr=lfsr)
    assert got.view(np.uint16).tolist() == _gaudi_sr_bf16(bits, lfsr).astype(np.uint16).tolist()


def test_stochastic_tiny_values_and_rne_subnormals():
    """E4M3 bias 7: smallest subnormal 2^-9. 1.5·2^-11 is below half of it: the converter's
    tiny-value path gives ±0 whatever L (plain SR would round up with probability 3/8). 2^-10 is
    exactly half: discarded bits 0x80000000, up iff L <= 0x80000000. In
    "stochastic_rne_subnormals", 1.5·2^-9 (1.5 subnormal units, a tie) rounds to nearest even:
    2 units = 2^-8 (SR with L = 0xFFFFFFFF would give 2^-9), while 1.5 + 2^-5 (normal, a quarter
    of the ulp 2^-3 discarded) rounds stochastically: up for L = 1, to 1.625 (RNE: 1.5)."""
    x = np.array([1.5 * 2.0**-11, -1.5 * 2.0**-11, 2.0**-10, 2.0**-10], np.float32)
    lfsr = np.array([1, 1, 0x80000000, 0x80000001], np.uint32)
    assert _same(gaudi.convert(x, E4M3, "stochastic", lfsr=lfsr), [0.0, -0.0, 2.0**-9, 0.0])
    x = np.array([1.5 * 2.0**-9, 1.5 + 2.0**-5], np.float32)
    lfsr = np.array([0xFFFFFFFF, 1], np.uint32)
    assert _same(gaudi.convert(x, E4M3, "stochastic_rne_subnormals", lfsr=lfsr),
                 [2.0**-8, 1.625])


def test_stochastic_counts_equal_the_lfsr_comparison():
    """Over any stream of LFSR words, the number of round-ups of a value whose discarded bits
    (left-aligned) are D is the number of words <= D -- exactly."""
    words, _ = gaudi.lfsr_words(4096, lanes=64)
    x = np.full(words.size, 1 + 2.0**-9 + 2.0**-12, np.float32)    # D = 0x48000000
    up = gaudi.convert(x, "bf16", "stochastic", lfsr=words).view(np.uint16) == 0x3F81
    assert int(up.sum()) == int((words <= 0x48000000).sum())


def test_conversion_arguments():
    x = np.ones(2, np.float32)
    with pytest.raises(ValueError, match="lfsr"):
        gaudi.convert(x, "bf16", "stochastic")
    with pytest.raises(ValueError, match="lfsr"):
        gaudi.convert(x, "bf16", lfsr=np.ones(2, np.uint32))
    with pytest.raises(ValueError, match="non-zero"):
        gaudi.convert(x, "bf16", "stochastic", lfsr=np.zeros(2, np.uint32))
    with pytest.raises(TypeError, match="uint32 array of x's shape"):
        gaudi.convert(x, "bf16", "stochastic", lfsr=np.ones(3, np.uint32))
    with pytest.raises(ValueError, match="mode must be"):
        gaudi.convert(x, "bf16", "stochastic_rne")
    with pytest.raises(TypeError, match="float32"):
        gaudi.convert(x.astype(np.float64), "bf16")
    with pytest.raises(ValueError, match="not a Gaudi FP8 format"):
        gaudi.convert(x, "fp8_e4m3fnuz")


# ---- the LFSR ---------------------------------------------------------------------------------

def test_lfsr_steps_and_lanes():
    """Galois steps of state 1 under 0x80200003: 1 -> 0x80200003 (shifted-out bit 1: xor) ->
    0xC0300002 -> 0x60180001 -> 0xB02C0003. Element i takes lane i % lanes at step i // lanes,
    and the returned states continue every lane."""
    words, states = gaudi.lfsr_words(5, lanes=1, seeds=[1])
    assert words.tolist() == [1, 0x80200003, 0xC0300002, 0x60180001, 0xB02C0003]
    assert states.tolist() == [0x58160001 ^ 0x80200003]            # 0xB02C0003 stepped once
    w, _ = gaudi.lfsr_words(12, lanes=3, seeds=[1, 2, 3])
    for lane, seed in enumerate([1, 2, 3]):
        alone, _ = gaudi.lfsr_words(4, lanes=1, seeds=[seed])
        assert w[lane::3].tolist() == alone.tolist()
    first, states = gaudi.lfsr_words(64, lanes=64)                 # every lane steps once
    rest, _ = gaudi.lfsr_words(64, lanes=64, seeds=states)
    both, _ = gaudi.lfsr_words(128, lanes=64)
    assert np.array_equal(both, np.concatenate([first, rest]))
    assert gaudi.default_lfsr_seeds(4).tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="non-zero"):
        gaudi.lfsr_words(3, lanes=2, seeds=[1, 0])


@pytest.mark.exhaustive
def test_lfsr_full_period_gives_exact_stochastic_expectation():
    """The default polynomial is primitive: from seed 1 the lane visits every non-zero 32-bit
    value once in 2^32 - 1 steps and returns to 1. So over one period a value with discarded
    bits D (left-aligned) rounds up for exactly D of the 2^32 - 1 words: probability D/(2^32-1)
    (D = 0x40000000: exactly 0x40000000 round-ups)."""
    chunk, seen, below = 1 << 24, 0, 0
    states = np.array([1], np.uint32)
    while seen < (1 << 32) - 1:
        n = min(chunk, (1 << 32) - 1 - seen)
        words, states = gaudi.lfsr_words(n, lanes=1, seeds=states)
        below += int(np.count_nonzero(words <= 0x40000000))
        assert seen == 0 or not (words == 1).any()
        seen += n
    assert states.tolist() == [1] and below == 0x40000000


def test_names_resolve_and_the_models_take_the_chip_formats():
    """mpt.get_format finds every Gaudi FP8 name (bias 0..63, no leading zeros); the fp8
    configuration of each model takes every format its chip allows, and no other."""
    fmt = gaudi.fp8_format("gaudi3", "e4m3", 11, "none")
    assert mpt.get_format("gaudi_e4m3_b11_none") == fmt
    assert mpt.get_format("GAUDI_E5M2_B0_MINIMAL") == gaudi.fp8_format("gaudi3", "e5m2", 0,
                                                                        "minimal")
    for bad in ("gaudi_e4m3_b64_full", "gaudi_e4m3_b07_full", "gaudi_e3m4_b7_full"):
        with pytest.raises(ValueError, match="Gaudi FP8"):
            mpt.get_format(bad)
    gaudi2, gaudi3 = mpt.get_mma_model("gaudi2"), mpt.get_mma_model("gaudi3")
    assert gaudi2.config("gaudi_e4m3_b3_full", "gaudi_e4m3_b15_full").param("family") == "fp8"
    assert gaudi2.config("gaudi_e5m2_b15_full", "fp8_e5m2").param("family") == "fp8"
    for refused in ("gaudi_e4m3_b5_full", "fp8_e4m3fn", "gaudi_e4m3_b7_none"):
        with pytest.raises(ValueError, match="does not take inputs"):
            gaudi2.config(refused, refused)
    assert gaudi3.config("fp8_e4m3fn", "gaudi_e5m2_b40_minimal").param("family") == "fp8"
    with pytest.raises(ValueError, match="does not take inputs"):
        gaudi3.config("fp8_e4m3fnuz", "fp8_e4m3fnuz")
