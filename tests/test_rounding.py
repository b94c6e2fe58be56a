"""mpt.round: bit equality with the exact oracle (every mode) and with ml_dtypes/numpy (RNE, where
the installed peer is right: tests/peers.py)."""
import math
import subprocess
import sys

import ml_dtypes
import numpy as np
import peers
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from peers import DTYPES as ML

import mpt
from mpt.formats import custom_format, get_format
from mpt.kernels import rounding as K
from mpt.kernels.random import random_words
from mpt.reference import rounding as ref
from mpt.rounding import SPECIALISE_MIN
from mpt.testing import as_bits as bits

CUSTOM = [custom_format(3, 2), custom_format(4, 1, has_inf=False), custom_format(5, 0),
          custom_format(8, 2, bias=140), custom_format(6, 4, has_inf=False, nan="fnuz")]
ALL = [*ML, "fp32", "tf32", *CUSTOM, "int8", "uint8", "int4"]
MODES = ["nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic"]
OPTIONS = [dict(), dict(saturate=True), dict(subnormals=False)]
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
NANS32 = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FA00000, 0x7FFFFFFF, 0xFFFFFFFF]


def f32(words):
    return np.array(words, np.uint64).astype(np.uint32).view(np.float32)


def f64(words):
    return np.array(words, np.uint64).view(np.float64)


def assert_same_codes(got, want, fmt, x):
    """Equal codes; for formats stored as float32 compare the oracle code's exact value."""
    fmt = get_format(fmt)
    if fmt.kind == "float" and np.dtype(fmt.dtype) == np.float32 and fmt.name != "fp32":
        want_v = np.array([ref.decode_value(c, fmt) for c in want], np.float64)
        got = np.asarray(got, np.float64)
        same = (bits(got) == bits(want_v)) | (np.isnan(got) & np.isnan(want_v)
                                              & (np.signbit(got) == np.signbit(want_v)))
    else:
        got = bits(got).astype(np.int64) if fmt.kind == "float" else np.asarray(got, np.int64)
        same = got == np.asarray(want, np.int64)
    if not same.all():
        i = int(np.flatnonzero(~same)[0])
        raise AssertionError(f"{(~same).sum()} differ for {fmt.name}; first x={x[i]!r} "
                             f"({hex(int(bits(x)[i]))}): got {got[i]!r}, oracle {want[i]!r}")


def oracle(x, fmt, mode, words=None, **options):
    """Oracle codes of every element of x (exact rationals, one by one)."""
    return [ref.round_exact(v, fmt, mode, word=None if words is None else int(w), **options)
            for v, w in zip(x.tolist(), words if words is not None else [None] * x.size)]


def check_against_oracle(x, fmt, mode, words, options):
    """mpt.round == the exact oracle on every element of x (NaN left out where it is an error)."""
    fmt = get_format(fmt)
    if fmt.kind == "int" or (fmt.nan == "ieee" and fmt.mantissa_bits == 0):
        keep = ~np.isnan(x)  # no NaN code there: an error (tested below)
        x, words = x[keep], words[keep]
    stochastic = mode == "stochastic"
    got = mpt.round(x, fmt, mode, random_bits=words if stochastic else None, **options)
    assert_same_codes(got, oracle(x, fmt, mode, words if stochastic else None, **options), fmt, x)


def assert_ml_equal(x, name):
    """RNE == the peer's astype bit for bit where the installed peer is right (peers.trusted), ==
    the oracle where it has a known fault; NaN results both NaN, ours the canonical NaN."""
    got = mpt.round(x, name)
    assert got.dtype == np.dtype(ML[name])
    ok = peers.trusted(x, name)
    assert_same_codes(got[~ok], oracle(x[~ok], name, "nearest_even"), name, x[~ok])
    x, want, got = x[ok], peers.cast(x[ok], name), got[ok]
    nan = np.isnan(want.view(ML[name]).astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    assert np.array_equal(bits(got)[~nan], want[~nan]), name
    canonical = [ref.nan_code(name, bool(s)) for s in np.signbit(x[nan])]
    assert np.array_equal(bits(got)[nan], np.array(canonical, bits(got).dtype))


def boundary_values(name, dtype):
    """Every value of ``name``, every midpoint between neighbours (ties, including the one above
    max), one ulp of ``dtype`` on each side of them, both signs, and the specials."""
    fmt = get_format(name)
    values = np.array([ref.decode_value(c, fmt) for c in range(1 << fmt.bits)])
    values = np.unique(np.abs(values[np.isfinite(values)]))
    top = fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits)              # the next binade's start
    grid = np.concatenate([values, [top, 2 * top]])
    points = np.concatenate([grid, (grid[:-1] + grid[1:]) / 2, [fmt.min_subnormal / 2]])
    with np.errstate(over="ignore"):
        points = points.astype(dtype)
    points = points[np.isfinite(points)]
    near = [points, np.nextafter(points, dtype(np.inf)), np.nextafter(points, dtype(0))]
    finfo = np.finfo(dtype)
    special = np.array([0, np.inf, finfo.max, finfo.smallest_subnormal, finfo.tiny], dtype)
    both = np.concatenate(near + [special])
    nans = f32(NANS32) if dtype == np.float32 else f64([0x7FF8 << 48, 0xFFF8 << 48,
                                                         0x7FF0 << 48 | 1])
    return np.concatenate([both, -both, nans.astype(dtype)])


@pytest.mark.parametrize("name", ML)
def test_rne_equals_ml_dtypes_on_boundaries(name):
    assert_ml_equal(boundary_values(name, np.float32), name)


@pytest.mark.parametrize("name", ML)
def test_every_mode_equals_oracle_on_boundaries(name):
    x = boundary_values(name, np.float32)
    finite = x[np.isfinite(x)]
    words = random_words(3, 0, finite.size)
    for mode in MODES:
        for options in OPTIONS:
            got = mpt.round(finite, name, mode, random_bits=words if mode == "stochastic" else None,
                            **options)
            want = ref.round_array(finite, name, mode,
                                   words=words if mode == "stochastic" else None, **options)
            assert_same_codes(got, want, name, finite)
            special = x[~np.isfinite(x)]
            check_against_oracle(special, name, mode, np.zeros(special.size, np.uint32), options)


@pytest.mark.parametrize("name", ["fp16", "fp8_e4m3fn", "fp8_e5m2", "bf16"])
def test_float64_input_rounds_once(name):
    """float64 input is rounded directly (never through float32): equal to the oracle, on inputs
    where rounding through float32 would differ (ties +- one float64 ulp), and to the peer's
    float64 cast where that is right (some ml_dtypes releases round through float32)."""
    x = boundary_values(name, np.float64)
    finite = x[np.isfinite(x)]
    got = mpt.round(finite, name)
    assert_same_codes(got, ref.round_array(finite, name), name, finite)
    with np.errstate(over="ignore"):
        twice = mpt.round(finite.astype(np.float32), name)
    assert (bits(got) != bits(twice)).any()  # the data holds double-rounding cases
    assert_ml_equal(x, name)


def test_fp32_from_float64_equals_numpy():
    x = boundary_values("bf16", np.float64)  # binades of the float32 range, ties of bf16
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.concatenate([x, np.nextafter(x.astype(np.float32).astype(np.float64), np.inf)])
        want = x.astype(np.float32)
    got = mpt.round(x, "fp32")
    nan = np.isnan(want)
    assert np.array_equal(bits(got)[~nan], bits(want)[~nan])
    assert np.isnan(got[nan]).all()


float32_words = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=24)
float64_words = st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=24)
# Each example below runs every format in every mode against the Fraction oracle (~2500 exact
# roundings): fewer examples keep the suite's time sane; the exhaustive fp16/bf16 domains in
# test_rounding_exhaustive.py cover the same rules on every input.
heavy = settings(max_examples=40)


@given(float32_words)
def test_rne_equals_ml_dtypes_float32_patterns(words):
    x = f32(words)
    for name in ML:
        assert_ml_equal(x, name)


@heavy
@given(float32_words, st.sampled_from(OPTIONS), st.integers(0, 2**32 - 1))
def test_every_mode_equals_oracle_float32(words, options, seed):
    x = f32(words)
    random = random_words(seed, 0, x.size)
    for fmt in ALL:
        for mode in MODES:
            check_against_oracle(x, fmt, mode, random, options)


@heavy
@given(float64_words, st.sampled_from(OPTIONS), st.integers(0, 2**32 - 1))
def test_every_mode_equals_oracle_float64(words, options, seed):
    x = f64(words)
    random = random_words(seed, 1, x.size)
    for fmt in ALL:
        for mode in MODES:
            check_against_oracle(x, fmt, mode, random, options)


moderate = st.floats(-1e6, 1e6, width=32, allow_subnormal=True)


@heavy
@given(st.lists(moderate, min_size=1, max_size=32), st.integers(0, 2**64 - 1))
def test_directed_modes_bracket_x(values, seed):
    """Within the range (|x| <= max): down <= x <= up, every mode gives down or up (x itself
    when representable), toward_zero never grows |x| (beyond the range too). e8m0 is left out:
    it has no zero, so down cannot go below 2^-127."""
    x = np.array(values, np.float32)
    x64 = x.astype(np.float64)
    for fmt in [f for f in ALL if f != "e8m0" and get_format(f).kind == "float"]:
        value = {m: mpt.decode(mpt.round(x, fmt, m, **({"seed": seed} if m == "stochastic"
                                                        else {})), np.float64)
                 for m in MODES}
        assert (np.abs(value["toward_zero"]) <= np.abs(x64)).all()
        inside = np.abs(x64) <= get_format(fmt).max
        up, down = value["up"][inside], value["down"][inside]
        assert (down <= x64[inside]).all() and (x64[inside] <= up).all()
        for m in MODES:
            v = value[m][inside]
            assert ((v == down) | (v == up)).all(), (fmt, m)
        exact = up == down
        assert (up[exact] == x64[inside][exact]).all()


def test_integer_formats_clamp_and_reject_nan():
    x = np.array([-300.0, -128.5, -2.5, -0.5, 0.5, 2.5, 7.5, 127.5, 1e30, np.inf, -np.inf],
                 np.float32)
    assert mpt.round(x, "int8").tolist() == [-128, -128, -2, 0, 0, 2, 8, 127, 127, 127, -128]
    assert mpt.round(x, "uint8").tolist() == [0, 0, 0, 0, 0, 2, 8, 128, 255, 255, 0]
    assert mpt.round(x, "int4", "toward_zero").astype(np.int8).tolist() == \
        [-8, -8, -2, 0, 0, 2, 7, 7, 7, 7, -8]
    with pytest.raises(ValueError, match="x contains NaN"):
        mpt.round(np.array([1.0, np.nan]), "int8")


def test_overflow_rules():
    big = np.array([1e6, -1e6, np.inf, -np.inf], np.float32)
    modes = {m: bits(mpt.round(big, "fp16", m)).tolist() for m in MODES[:5]}
    assert modes["nearest_even"] == modes["nearest_away"] == [0x7C00, 0xFC00, 0x7C00, 0xFC00]
    assert modes["toward_zero"] == [0x7BFF, 0xFBFF, 0x7C00, 0xFC00]
    assert modes["up"] == [0x7C00, 0xFBFF, 0x7C00, 0xFC00]
    assert modes["down"] == [0x7BFF, 0xFC00, 0x7C00, 0xFC00]
    assert bits(mpt.round(big, "fp16", saturate=True)).tolist() == [0x7BFF, 0xFBFF] * 2
    assert bits(mpt.round(big, "e4m3")).tolist() == [0x7F, 0xFF, 0x7F, 0xFF]   # NaN, no Inf
    assert bits(mpt.round(big, "e4m3", saturate=True)).tolist() == [0x7E, 0xFE] * 2
    assert bits(mpt.round(big, "e4m3fnuz")).tolist() == [0x80] * 4
    assert bits(mpt.round(big, "fp4_e2m1fn")).tolist() == [0x7, 0xF] * 2     # saturates
    huge = np.array([3.4e38, -3.4e38, np.inf, 2.0**127], np.float32)  # e8m0 max is 2^127
    assert bits(mpt.round(huge, "e8m0")).tolist() == [0xFF, 0xFF, 0xFF, 0xFE]
    assert bits(mpt.round(huge, "e8m0", "toward_zero")).tolist() == [0xFE, 0xFF, 0xFF, 0xFE]
    assert bits(mpt.round(huge, "e8m0", saturate=True)).tolist() == [0xFE, 0xFF, 0xFE, 0xFE]


def test_subnormals_false_flushes_after_rounding():
    tiny = np.float32(2.0**-24)  # fp16 min subnormal
    x = np.array([tiny, -tiny, 0.75 * 2.0**-14, 2.0**-14 - 2.0**-26, 2.0**-14], np.float32)
    got = bits(mpt.round(x, "fp16", subnormals=False)).tolist()
    assert got == [0x0000, 0x8000, 0x0000, 0x0400, 0x0400]  # rounds to min normal: kept
    assert bits(mpt.round(np.float32(-1e-30), "e4m3fnuz", "down", subnormals=False)) == 0


def test_fp64_target():
    x = np.array([2.0**-1074, -2.0**-1030, 1.5, np.inf, -np.inf], np.float64)
    assert np.array_equal(mpt.round(x, "fp64"), x)
    flushed = mpt.round(x, "fp64", subnormals=False, saturate=True)
    assert bits(flushed).tolist() == bits(np.array([0.0, -0.0, 1.5, np.finfo(np.float64).max,
                                                    -np.finfo(np.float64).max])).tolist()


def test_inputs_scalars_and_format_dtypes():
    assert mpt.round(1.1, "bf16") == ml_dtypes.bfloat16(1.1015625)  # 0x3F8D, exact
    assert mpt.round(np.float32(1.1), "fp16").dtype == np.float16
    assert np.shape(mpt.round(np.float64(3.0), "e4m3")) == ()
    x16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(bits(mpt.round(x16, "e4m3")),
                              bits(mpt.round(x16.astype(np.float32), "e4m3")))
    grid = np.arange(24, dtype=np.float32).reshape(2, 3, 4)  # shapes are kept
    assert mpt.round(grid, "tf32").shape == (2, 3, 4)


@pytest.mark.parametrize("name, mode", [("fp16", "nearest_even"), ("fp8_e5m2", "up"),
                                        ("bf16", "stochastic")])
def test_specialised_kernels_equal_generic(name, mode):
    """Arrays of SPECIALISE_MIN elements run kernels compiled for their format: same bits."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, SPECIALISE_MIN, dtype=np.uint64).astype(np.uint32).view(np.float32)
    fmt = get_format(name)
    sp = K.round_spec(fmt, np.float32)
    want = np.empty(x.size, bits(np.zeros(1, fmt.dtype)).dtype)
    if mode == "stochastic":
        K.round_bits_philox(bits(x), want, sp, (np.uint64(5), np.uint64(0)),
                            (np.uint64(0), np.uint64(0)))
        got = mpt.round(x, fmt, mode, seed=5)
    else:
        K.round_bits(bits(x), want, sp, K.MODE_CODES[mode])
        got = mpt.round(x, fmt, mode)
    assert np.array_equal(bits(got), want)


_CACHE_KEY = """
import hashlib
import numpy as np
from numba.core.serialize import dumps
from mpt.formats import get_format
from mpt.kernels import rounding as K
sp = K.round_spec(get_format("fp8_e4m3fn"), np.float32)
dp = K.decode_spec(get_format("fp6_e2m3fn"))
for mode, spec in ((K.MODE_CODES["nearest_even"], None), (K.SR, dp)):
    for driver in K.specialised(sp, mode, spec):
        cells = tuple(c.cell_contents for c in driver.py_func.__closure__)
        print(hashlib.sha256(dumps(cells)).hexdigest())
"""


def test_specialised_drivers_hit_numbas_disk_cache_in_a_new_process():
    """Numba keys the disk cache of a closure on the pickle of what it closes over: the
    specialised drivers' pickles must be the same in every process (a captured jitted function
    carries a per-process id, and every process then compiles again)."""
    runs = [subprocess.run([sys.executable, "-c", _CACHE_KEY], capture_output=True, text=True,
                           check=True).stdout.split() for _ in range(2)]
    assert len(runs[0]) == 4 and runs[0] == runs[1]


@pytest.mark.parametrize("call, error, match", [
    (lambda: mpt.round(np.ones(3), "fp7"), ValueError, "unknown format"),
    (lambda: mpt.round(np.ones(3), "nf4"), ValueError, "fmt nf4"),
    (lambda: mpt.round(np.ones(3, np.int32), "fp16"), TypeError, "x must be"),
    (lambda: mpt.round(3, "fp16"), TypeError, "x must be"),
    (lambda: mpt.round(np.ones(3), "fp16", "nearest"), ValueError, "mode must be"),
    (lambda: mpt.round(np.ones(3), "fp16", "stochastic"), ValueError, "seed"),
    (lambda: mpt.round(np.ones(3), "fp16", seed=1), ValueError, "seed"),
    (lambda: mpt.round(np.ones(3), "fp16", random_bits=np.ones(3, np.uint32)), ValueError,
     "random_bits"),
    (lambda: mpt.round(np.ones(3), "fp16", "stochastic", random_bits=np.ones(4, np.uint32)),
     ValueError, "random_bits"),
    (lambda: mpt.round(np.ones(3), "fp16", "stochastic", random_bits=np.ones(3, np.int64)),
     TypeError, "random_bits"),
    (lambda: mpt.round(np.ones(3), "fp16", "stochastic", seed=1, random_bits=np.ones(3, np.uint32)),
     ValueError, "exactly one"),
    (lambda: mpt.round(np.ones(3), "fp16", "stochastic", seed=-1), ValueError, "seed"),
    (lambda: mpt.round(np.array([np.nan]), custom_format(5, 0)), ValueError, "x contains NaN"),
    (lambda: mpt.decode(np.ones(3, np.int64)), TypeError, "x must be"),
    (lambda: mpt.decode(np.ones(3, np.float16), np.int8), ValueError, "dtype"),
])
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_nan_has_no_payload_and_keeps_its_sign():
    x = f32(NANS32)
    got = bits(mpt.round(x, "fp16"))
    assert got.tolist() == [0x7E00, 0xFE00, 0x7E00, 0xFE00, 0x7E00, 0x7E00, 0xFE00]
    assert all(math.isnan(v) for v in mpt.round(x, custom_format(4, 3)).tolist())
