"""mpt.testing: ULP distances on each format's grid and the assertion messages."""
import ml_dtypes
import numpy as np
import pytest

from mpt.formats import FORMATS, custom_format
from mpt.testing import ULP_INF, as_bits, assert_bits_equal, assert_ulp_close, ulp_distance


def _all_finite_sorted(fmt):
    """Every non-NaN value of an 8/16-bit format once (one zero), sorted ascending."""
    n = 1 << (8 * np.dtype(fmt.dtype).itemsize)
    values = np.arange(n, dtype=np.uint64).astype(f"u{np.dtype(fmt.dtype).itemsize}")
    values = values.view(fmt.dtype)
    with np.errstate(invalid="ignore"):  # ml_dtypes warns when it casts a NaN pattern
        as64 = values.astype(np.float64)
    keep = ~np.isnan(as64) & ~((as64 == 0) & np.signbit(as64))
    values, as64 = values[keep], as64[keep]
    if fmt.bits < 8 * np.dtype(fmt.dtype).itemsize:  # sub-byte: drop duplicate encodings
        _, first = np.unique(as64, return_index=True)
        values, as64 = values[first], as64[first]
    return values[np.argsort(as64, kind="stable")]


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2", "fp8_e4m3fnuz",
                                  "fp8_e5m2fnuz", "e8m0", "fp6_e2m3fn", "fp4_e2m1fn"])
def test_neighbours_are_one_ulp_apart(name):
    fmt = FORMATS[name]
    v = _all_finite_sorted(fmt)
    assert np.all(ulp_distance(v[1:], v[:-1]) == 1)
    assert ulp_distance(v[-1:], v[:1])[0] == len(v) - 1


def test_signed_zeros_are_zero_apart_and_nan_rules():
    z = np.array([0.0, -0.0, np.nan, np.nan, 1.0], dtype=np.float16)
    w = np.array([-0.0, 0.0, -np.nan, 2.0, np.nan], dtype=np.float16)
    assert ulp_distance(z, w).tolist() == [0, 0, 0, ULP_INF, ULP_INF]


def test_custom_grid_equals_native_grid():
    """A custom e5m10 format stored in float32 is measured on fp16's grid: both paths agree."""
    v = _all_finite_sorted(FORMATS["fp16"])
    rng = np.random.default_rng(0)
    a, b = v[rng.integers(0, len(v), 5000)], v[rng.integers(0, len(v), 5000)]
    native = ulp_distance(a, b)
    custom = ulp_distance(a.astype(np.float32), b.astype(np.float32), custom_format(5, 10))
    np.testing.assert_array_equal(native, custom)


def test_tf32_ulps_and_fp64_extremes():
    one = np.float32(1.0)
    next_tf32 = np.float32(1.0 + 2.0**-10)
    assert ulp_distance(one, next_tf32, "tf32") == 1
    assert ulp_distance(one, next_tf32) == 2**13  # the same pair on the fp32 grid
    big = np.array([np.finfo(np.float64).max]), np.array([-np.finfo(np.float64).max])
    assert int(ulp_distance(*big)[0]) == 2 * (0x7FEFFFFFFFFFFFFF)  # exact beyond int64


def test_as_bits_masks_sub_byte_formats():
    x = np.array([-1.0], np.float32).astype(ml_dtypes.float4_e2m1fn)
    assert as_bits(x).tolist() == [0b1010]


def test_assert_bits_equal_reports_first_difference():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    b = a.copy()
    b[1, 0] = np.nextafter(np.float32(3.0), np.float32(4.0))
    assert_bits_equal(a, a.copy())
    with pytest.raises(AssertionError) as info:
        assert_bits_equal(a, b)
    text = str(info.value)
    assert "1 of 4 elements differ" in text and "(1, 0)" in text
    assert "0x40400000" in text and "0x40400001" in text and "1 ULP apart" in text


def test_assert_bits_equal_is_strict_about_zero_sign_and_dtype():
    with pytest.raises(AssertionError, match="elements differ"):
        assert_bits_equal(np.array([0.0]), np.array([-0.0]))
    with pytest.raises(AssertionError, match="dtypes differ"):
        assert_bits_equal(np.zeros(2, np.float32), np.zeros(2, np.float64))
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_bits_equal(np.zeros(2), np.zeros(3))


def test_assert_ulp_close():
    a = np.array([1.0, 2.0, np.nan], np.float16)
    b = np.array([1.0 + 2**-10, 2.0, np.nan], np.float16)
    assert_ulp_close(a, b, max_ulp=1)
    with pytest.raises(AssertionError, match=r"more than 0 ULP apart \(worst 1\)"):
        assert_ulp_close(a, b, max_ulp=0)
    with pytest.raises(ValueError, match="max_ulp must be a non-negative int"):
        assert_ulp_close(a, b, max_ulp=-1)
    with pytest.raises(TypeError, match="does not store format fp16"):
        ulp_distance(np.zeros(2, np.float32), np.zeros(2, np.float32), "fp16")
