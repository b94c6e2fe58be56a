"""The format table against ml_dtypes' finfo/iinfo, the spec's format table, and its errors."""
import ml_dtypes
import numpy as np
import pytest

import mpt
from mpt.formats import FORMATS, RoundingMode, custom_format, get_format, rounding_mode

FLOATS_WITH_FINFO = [f for f in FORMATS.values() if f.kind == "float" and f.name != "tf32"]
INTS = [f for f in FORMATS.values() if f.kind == "int"]


@pytest.mark.parametrize("fmt", FLOATS_WITH_FINFO, ids=lambda f: f.name)
def test_float_fields_match_finfo(fmt):
    fi = ml_dtypes.finfo(fmt.dtype)
    assert fmt.exponent_bits == fi.nexp
    assert fmt.mantissa_bits == fi.nmant
    assert fmt.max == float(fi.max)
    assert fmt.min_normal == float(fi.smallest_normal)
    assert fmt.min_subnormal == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)
    assert fmt.emin == fi.minexp
    assert fmt.emax == fi.maxexp - 1
    assert fmt.bits == fi.bits or fmt.bits < 8  # fp6/fp4 live in a byte
    # Inf exists exactly where ml_dtypes can hold one.
    with np.errstate(over="ignore", invalid="ignore"):
        stored = np.array(np.inf, dtype=np.float32).astype(fmt.dtype).astype(np.float64)
    assert np.isinf(stored) == fmt.has_inf


@pytest.mark.parametrize("fmt", INTS, ids=lambda f: f.name)
def test_int_fields_match_iinfo(fmt):
    ii = ml_dtypes.iinfo(fmt.dtype)
    assert (fmt.lowest, fmt.max) == (float(ii.min), float(ii.max))
    assert fmt.bits == ii.bits


def test_spec_table():
    """The format table of docs/techniques.md §6, written as exact powers of two."""
    expect = {
        "fp32": (8, 127, 23, float.fromhex("0x1.fffffep127"), 2.0**-126, 2.0**-149),
        "tf32": (8, 127, 10, float.fromhex("0x1.ffcp127"), 2.0**-126, 2.0**-136),
        "fp16": (5, 15, 10, 65504.0, 2.0**-14, 2.0**-24),
        "bf16": (8, 127, 7, float.fromhex("0x1.fep127"), 2.0**-126, 2.0**-133),
        "fp8_e4m3fn": (4, 7, 3, 448.0, 2.0**-6, 2.0**-9),
        "fp8_e5m2": (5, 15, 2, 57344.0, 2.0**-14, 2.0**-16),
        "e8m0": (8, 127, 0, 2.0**127, 2.0**-127, 2.0**-127),
    }
    for name, (e, bias, m, mx, mn, ms) in expect.items():
        f = get_format(name)
        assert (f.exponent_bits, f.bias, f.mantissa_bits, f.max, f.min_normal, f.min_subnormal) \
            == (e, bias, m, mx, mn, ms), name
    assert get_format("fp8_e4m3fn").nan == "fn" and not get_format("fp8_e4m3fn").has_inf
    assert get_format("e8m0").nan == "e8m0" and not get_format("e8m0").has_zero


@pytest.mark.parametrize("alias,name", [
    ("fp16", "fp16"), ("float16", "fp16"), ("half", "fp16"), ("HALF", "fp16"),
    ("bf16", "bf16"), ("bfloat16", "bf16"), ("e4m3", "fp8_e4m3fn"), ("fp8_e4m3fn", "fp8_e4m3fn"),
    ("e5m2", "fp8_e5m2"), ("float8_e5m2fnuz", "fp8_e5m2fnuz"), ("tensorfloat32", "tf32"),
    ("float32", "fp32"), ("f64", "fp64"), ("mx_scale", "e8m0"), ("fp4", "fp4_e2m1fn"),
])
def test_aliases(alias, name):
    assert get_format(alias) is FORMATS[name]


def test_lookup_by_dtype_and_passthrough():
    assert get_format(np.float16) is FORMATS["fp16"]
    assert get_format(ml_dtypes.bfloat16) is FORMATS["bf16"]
    assert get_format(np.dtype(np.float32)) is FORMATS["fp32"]  # float32 storage means fp32
    assert get_format(FORMATS["tf32"]) is FORMATS["tf32"]
    assert mpt.get_format is get_format


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown format 'fp12'.*fp16 \(float16/half/f16\)"):
        get_format("fp12")
    with pytest.raises(ValueError, match="no mpt format stores dtype int32"):
        get_format(np.int32)
    with pytest.raises(TypeError, match="format must be"):
        get_format(3.5)


def test_custom_format_fields():
    f = custom_format(5, 10)  # IEEE half built by hand
    ref = FORMATS["fp16"]
    for field in ("exponent_bits", "mantissa_bits", "bias", "max", "min_normal", "min_subnormal",
                  "eps", "emin", "emax", "has_inf"):
        assert getattr(f, field) == getattr(ref, field), field
    assert f.custom and f.dtype == np.float32 and f.name == "e5m10"
    g = custom_format(4, 3, has_inf=False)  # OCP e4m3 layout
    assert (g.max, g.nan, g.bias) == (448.0, "fn", 7)
    u = custom_format(5, 2, has_inf=False, nan="fnuz")
    assert (u.bias, u.max, u.negative_zero) == (16, 57344.0, False)
    full = custom_format(8, 23)
    assert (full.max, full.min_subnormal) == (FORMATS["fp32"].max, 2.0**-149)


@pytest.mark.parametrize("kwargs,match", [
    (dict(exponent_bits=9, mantissa_bits=3), "exponent_bits must be in"),
    (dict(exponent_bits=4, mantissa_bits=24), "mantissa_bits must be in"),
    (dict(exponent_bits=4.0, mantissa_bits=3), "exponent_bits must be an int"),
    (dict(exponent_bits=4, mantissa_bits=3, nan="weird"), "nan must be one of"),
    (dict(exponent_bits=4, mantissa_bits=3, has_inf=True, nan="fn"), "contradicts"),
    (dict(exponent_bits=8, mantissa_bits=23, bias=100), "outside float32"),
])
def test_custom_format_errors(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        custom_format(**kwargs)


def test_formats_are_frozen():
    with pytest.raises(Exception):
        FORMATS["fp16"].bias = 3


def test_rounding_mode_parse():
    assert rounding_mode("stochastic") is RoundingMode.STOCHASTIC
    assert rounding_mode(RoundingMode.UP) is RoundingMode.UP
    with pytest.raises(ValueError, match="mode must be one of 'nearest_even'"):
        rounding_mode("nearest")


def test_nf4_codebook():
    """docs/techniques.md §4: 16 levels, sorted, from −1 to 1 with an exact 0, each a float32
    number."""
    nf4 = get_format("nf4")
    levels = np.array(nf4.levels)
    assert nf4.kind == "codebook" and nf4.bits == 4 and len(levels) == 16
    assert np.all(np.diff(levels) > 0) and (levels[0], levels[7], levels[15]) == (-1.0, 0.0, 1.0)
    assert np.array_equal(levels.astype(np.float32).astype(np.float64), levels)
    assert (nf4.max, nf4.lowest) == (1.0, -1.0)
