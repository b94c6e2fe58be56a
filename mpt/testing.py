"""L5: bit- and ULP-level assertions for tests, yours and mpt's own.

``assert_bits_equal`` is the default assertion of the project: two arrays are equal when their bit
patterns are. When a tolerance is right, ``assert_ulp_close`` measures it in units in the last place
of the format, counted on the format's own grid (so a tf32 or custom format stored in float32 is
measured in *its* ULPs, not float32's).

ULP distance, precisely: every value of a format gets an integer *grid index*, its signed count of
representable magnitudes above zero (+0 and −0 share index 0, Inf is one past the largest finite
value). The distance of a and b is ``|index(a) − index(b)|``; two NaNs are 0 apart, a NaN and a
number are :data:`ULP_INF` apart.
"""
from __future__ import annotations

import numpy as np

from mpt._checks import check_int
from mpt.formats import UNSIGNED, Format, get_format

__all__ = ["ULP_INF", "as_bits", "ulp_distance", "assert_bits_equal", "assert_ulp_close"]

#: Distance reported between a NaN and a non-NaN (the largest uint64).
ULP_INF = np.iinfo(np.uint64).max



def _format_of(x: np.ndarray, fmt) -> Format:
    if fmt is not None:
        fmt = get_format(fmt)
        if np.dtype(fmt.dtype) != x.dtype:
            raise TypeError(f"array of dtype {x.dtype} does not store format {fmt.name} "
                            f"(expected dtype {np.dtype(fmt.dtype)})")
        return fmt
    return get_format(x.dtype)


def as_bits(x, fmt=None) -> np.ndarray:
    """The bit patterns of ``x`` as unsigned integers of the storage width (sub-byte formats
    masked). ``x``: an array or scalar of a format's storage dtype, an unsigned array (returned
    as it is), or a Tensor (anything with an ndarray ``.data`` and a ``.format``, whose format is
    then used)."""
    if fmt is None and hasattr(x, "format") and isinstance(getattr(x, "data", None), np.ndarray):
        x, fmt = x.data, x.format
    x = np.asarray(x)
    if fmt is None and x.dtype.kind == "u" and x.dtype.itemsize in UNSIGNED:
        return x  # already bit patterns (codes, random words)
    fmt = _format_of(x, fmt)
    bits = (x if x.flags.c_contiguous else x.copy()).view(UNSIGNED[x.dtype.itemsize])
    if fmt.bits < 8 * x.dtype.itemsize and not fmt.custom and fmt.name != "tf32":
        bits = bits & np.array((1 << fmt.bits) - 1, dtype=bits.dtype)
    return bits


def _is_nan(x: np.ndarray, fmt: Format) -> np.ndarray:
    if fmt.kind == "int":
        return np.zeros(x.shape, dtype=bool)
    with np.errstate(invalid="ignore"):  # ml_dtypes warns when it casts a NaN pattern
        return np.isnan(x.astype(np.float64) if x.dtype.itemsize < 4 else x)


def _grid_index(x: np.ndarray, fmt: Format) -> np.ndarray:
    """Signed grid index (int64) of every non-NaN element of ``x`` in format ``fmt``."""
    if fmt.kind == "int":
        return x.astype(np.int64)
    if fmt.custom or fmt.name == "tf32":
        return _value_grid_index(x.astype(np.float64), fmt)
    bits = as_bits(x, fmt).astype(np.uint64)
    if not fmt.signed:  # e8m0: no sign bit, patterns ordered like magnitudes
        return bits.astype(np.int64)
    sign = np.uint64(1 << (fmt.bits - 1))
    magnitude = (bits & (sign - np.uint64(1))).astype(np.int64)  # ordered like |x| (IEEE layout)
    return np.where((bits & sign) != 0, -magnitude, magnitude)


def _value_grid_index(v: np.ndarray, fmt: Format) -> np.ndarray:
    """Grid index from exact float64 values: subnormal steps of min_subnormal, then 2^m per
    binade."""
    a = np.abs(v)
    steps = 1 << fmt.mantissa_bits
    with np.errstate(invalid="ignore", over="ignore"):
        mant, exp = np.frexp(np.where(np.isinf(a), 0.0, a))  # a = mant·2^exp, mant in [0.5, 1)
        e = exp.astype(np.int64) - 1                           # a = (2·mant)·2^e
        normal = steps * (e - fmt.emin + 1) + ((2 * mant - 1) * steps).astype(np.int64)
        sub = (a / fmt.min_subnormal).astype(np.int64)
        index = np.where(a < fmt.min_normal, sub, normal)
        beyond_max = steps * (fmt.emax - fmt.emin + 2)       # Inf: one past the largest finite
        index = np.where(np.isinf(a), beyond_max, index)
    return np.where(np.signbit(v), -index, index)


def ulp_distance(a, b, fmt=None) -> np.ndarray:
    """Elementwise distance in ULPs of the format of ``a`` and ``b`` (uint64 array).

    ``a`` and ``b`` must have the same dtype and broadcastable shapes. ``fmt`` names the format when
    the dtype does not (tf32 and custom formats are stored as float32). NaN vs NaN is 0, NaN vs a
    number is :data:`ULP_INF`.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype; got {a.dtype} and {b.dtype}")
    fmt = _format_of(a, fmt)
    a, b = np.broadcast_arrays(a, b)
    ia, ib = _grid_index(a, fmt), _grid_index(b, fmt)
    # |ia − ib| can reach 2^64 − 2 for fp64: subtract in uint64 (wraps exactly modulo 2^64).
    ua, ub = ia.view(np.uint64), ib.view(np.uint64)
    dist = np.where(ia >= ib, ua - ub, ub - ua)
    nan_a, nan_b = _is_nan(a, fmt), _is_nan(b, fmt)
    dist = np.where(nan_a | nan_b, ULP_INF, dist)
    return np.where(nan_a & nan_b, np.uint64(0), dist).astype(np.uint64)


def _describe_first(actual, desired, bad: np.ndarray, fmt: Format, header: str) -> str:
    flat = int(np.flatnonzero(bad)[0])
    index = np.unravel_index(flat, bad.shape) if bad.ndim else ()
    width = 2 * actual.dtype.itemsize
    abits, dbits = as_bits(actual, fmt), as_bits(desired, fmt)
    dist = ulp_distance(actual[index], desired[index], fmt)
    dist_text = "inf (NaN vs number)" if dist == ULP_INF else str(int(dist))
    return (
        f"{header}: {int(bad.sum())} of {bad.size} elements differ "
        f"(format {fmt.name}); first at index {tuple(int(i) for i in index)}: "
        f"actual 0x{int(abits[index]):0{width}x} ({actual[index]!r}), "
        f"desired 0x{int(dbits[index]):0{width}x} ({desired[index]!r}), "
        f"{dist_text} ULP apart"
    )


def _check_pair(actual, desired, fmt):
    actual, desired = np.asarray(actual), np.asarray(desired)
    if actual.dtype != desired.dtype:
        raise AssertionError(f"dtypes differ: actual {actual.dtype}, desired {desired.dtype}")
    if actual.shape != desired.shape:
        raise AssertionError(f"shapes differ: actual {actual.shape}, desired {desired.shape}")
    return actual, desired, _format_of(actual, fmt)


def assert_bits_equal(actual, desired, fmt=None, *, err_msg: str = "") -> None:
    """Assert that two arrays of one dtype and shape hold identical bit patterns.

    Strict: −0 differs from +0 and NaN payloads must match. On failure the message gives how many
    elements differ, the first index, both bit patterns in hex and their ULP distance.
    """
    actual, desired, fmt = _check_pair(actual, desired, fmt)
    bad = as_bits(actual, fmt) != as_bits(desired, fmt)
    if bad.any():
        raise AssertionError(_describe_first(actual, desired, bad, fmt, err_msg or "bits differ"))


def assert_ulp_close(actual, desired, fmt=None, max_ulp: int = 0, *, err_msg: str = "") -> None:
    """Assert ``ulp_distance(actual, desired) <= max_ulp`` elementwise (NaN matches any NaN).

    ``max_ulp`` should come from an error bound you can state (e.g. "one rounding of a correctly
    rounded operation is at most 1/2 ULP, two of them at most 1 ULP").
    """
    max_ulp = check_int("max_ulp", max_ulp, min=0)
    actual, desired, fmt = _check_pair(actual, desired, fmt)
    dist = ulp_distance(actual, desired, fmt)
    bad = dist > np.uint64(max_ulp)
    if bad.any():
        worst = int(dist.max())
        header = err_msg or (f"more than {max_ulp} ULP apart "
                             f"(worst {'inf' if worst == ULP_INF else worst})")
        raise AssertionError(_describe_first(actual, desired, bad, fmt, header))
