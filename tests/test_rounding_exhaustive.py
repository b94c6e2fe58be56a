"""Exhaustive domains: every fp16/bf16 input to every small format in every mode, every code of
every format decoded; with ``-m exhaustive``, every float32 input against ml_dtypes/numpy, in
chunks that can run on Dask."""
import functools
import os
import time

import ml_dtypes
import numpy as np
import peers
import pytest

import mpt
from mpt.formats import custom_format, get_format
from mpt.kernels.random import random_words
from mpt.reference import rounding as ref
from mpt.tasks import chunks, map_tasks

MODES = ["nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic"]
OPTIONS = [dict(), dict(saturate=True), dict(subnormals=False)]
SMALL = ["fp8_e4m3fn", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz", "e8m0", "fp6_e2m3fn",
         "fp6_e3m2fn", "fp4_e2m1fn", custom_format(3, 2), custom_format(5, 1, has_inf=False),
         custom_format(4, 0, has_inf=False, nan="none")]
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def decode_table(fmt):
    """float64 value of every code of a format (the oracle's), indexed by code."""
    fmt = get_format(fmt)
    return np.array([ref.decode_value(c, fmt) for c in range(1 << fmt.bits)])


@pytest.mark.parametrize("options", [pytest.param(o, id=",".join(o) or "default", marks=(
    () if not o else pytest.mark.exhaustive)) for o in OPTIONS])
@pytest.mark.parametrize("source", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_every_16bit_input_in_every_mode(source, fmt, options):
    """All finite fp16/bf16 inputs (passed in their own dtype: decoded exactly first), every mode,
    against the float64 oracle; the default options by default, saturate and no subnormals with
    ``-m exhaustive`` (each (format, mode, options) compiles its own kernel: the two option sets
    would add 132 compilations to every CI run). NaN/Inf inputs: test_rounding's boundary
    tests."""
    x = np.arange(1 << 16, dtype=np.uint16).view(source)
    x = x[np.isfinite(x.astype(np.float32))]
    exact = x.astype(np.float64)
    words = random_words(2024, 0, x.size)
    table = decode_table(fmt)
    for mode in MODES:
        random = words if mode == "stochastic" else None
        got = mpt.round(x, fmt, mode, random_bits=random, **options)
        want = ref.round_array(exact, fmt, mode, words=random, **options)
        if np.dtype(get_format(fmt).dtype) == np.float32:  # values (signs too) of the codes
            got, want = got.astype(np.float64), table[want]
            same = (got.view(np.uint64) == want.view(np.uint64)) | (np.isnan(got)
                                                                    & np.isnan(want))
        else:
            same = got.view(UINT[got.dtype.itemsize]).astype(np.int64) == want
        assert same.all(), (fmt, mode, options, x[~same][:5])


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2", "fp8_e4m3fnuz",
                                 "fp8_e5m2fnuz", "e8m0", "fp6_e2m3fn", "fp6_e3m2fn",
                                 "fp4_e2m1fn"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_code_decodes_exactly(fmt, dtype):
    f = get_format(fmt)
    codes = np.arange(1 << f.bits, dtype=np.uint16 if f.bits > 8 else np.uint8)
    got = mpt.decode(codes.view(f.dtype), dtype).astype(np.float64)
    want = np.array([ref.decode_value(c, f) for c in range(1 << f.bits)])
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint64), want[~nan].view(np.uint64))  # -0 included
    assert np.array_equal(np.signbit(got[nan]), np.signbit(want[nan]))
    with np.errstate(invalid="ignore"):  # ml_dtypes agrees on every non-NaN code
        theirs = codes.view(f.dtype).astype(dtype).astype(np.float64)
    assert np.array_equal(theirs[~nan].view(np.uint64), want[~nan].view(np.uint64))


# ---- every float32 input (opt-in: pytest -m exhaustive) -------------------------------------
#
# The 2^32 inputs are split into chunks of 2^24 (mpt.tasks.chunks), one task each. By default the
# tasks run serially in the test's process; MPT_SWEEP_WORKERS=N runs them on a local Dask cluster
# of N processes, MPT_SWEEP_SCHEDULER=ADDRESS on an existing one (pip install 'mpt[dask]'; the
# workers import this module and tests/peers.py, so they need the checkout's tests/ on their
# path, as a local cluster has). The result is the same either way: each chunk reports how many
# inputs it checked and how many disagreed.

# float32 input to these formats: no released ml_dtypes is known to misround it (tests/peers.py)
ML = {name: peers.DTYPES[name] for name in ("fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2",
                                            "fp8_e4m3fnuz", "fp8_e5m2fnuz")}
SWEEP_CHUNK = 1 << 24


def chunk_inputs(lo: int, hi: int) -> np.ndarray:
    """The float32 inputs of chunk [lo, hi): the bit patterns lo, lo + 1, ..., hi - 1."""
    return np.arange(lo, hi, dtype=np.uint64).astype(np.uint32).view(np.float32)


def sweep_chunk(fmt: str, bounds: tuple) -> tuple:
    """One task of the sweep: ``(lo, hi, inputs checked, mismatches)`` of mpt's RNE cast against
    ml_dtypes/numpy on chunk ``[lo, hi)`` (NaN compared as NaN: numpy keeps fp16 payloads, mpt
    gives the canonical NaN)."""
    lo, hi = bounds
    x = chunk_inputs(lo, hi)
    assert peers.trusted(x, fmt).all()  # a known fault here needs the oracle (peers.py)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(ML[fmt])
    got = mpt.round(x, fmt)
    differ = np.flatnonzero(got.view(UINT[got.itemsize]) != want.view(UINT[got.itemsize]))
    both_nan = np.isnan(got[differ].astype(np.float32)) & np.isnan(
        want[differ].astype(np.float32))
    return lo, hi, int(x.size), int((~both_nan).sum())


def sweep_where() -> dict:
    """Where the sweep's tasks run: ``map_tasks`` keywords from MPT_SWEEP_WORKERS or
    MPT_SWEEP_SCHEDULER (neither: serially)."""
    workers, scheduler = os.environ.get("MPT_SWEEP_WORKERS"), os.environ.get("MPT_SWEEP_SCHEDULER")
    return {"workers": int(workers) if workers else None, "scheduler": scheduler or None}


def run_sweep(fmt: str, total: int, chunk: int, **where) -> list:
    return map_tasks(functools.partial(sweep_chunk, fmt), chunks(total, chunk), progress=True,
                     desc=f"{fmt} sweep", unit="chunk", **where)


def assert_covers_once(results, total: int) -> None:
    """The chunks came back in order, each checked all its inputs, and together they are
    ``range(total)``, every input once."""
    assert results[0][0] == 0 and results[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(results, results[1:]))
    assert all(n == hi - lo for lo, hi, n, _ in results)
    assert sum(n for _, _, n, _ in results) == total


@pytest.mark.exhaustive
@pytest.mark.parametrize("fmt", ML)
def test_every_float32_rne_equals_ml_dtypes(fmt):
    """All 2^32 float32 patterns: 0 mismatches."""
    start = time.perf_counter()
    results = run_sweep(fmt, 1 << 32, SWEEP_CHUNK, **sweep_where())
    assert_covers_once(results, 1 << 32)
    mismatches = sum(m for *_, m in results)
    print(f"\n{fmt}: 2^32 float32 inputs, {mismatches} mismatches, "
          f"{time.perf_counter() - start:.1f} s (mpt + ml_dtypes + compare)")
    assert mismatches == 0


def narrow_chunk(fmt: str, bounds: tuple) -> tuple:
    """One task: ``(lo, hi, inputs checked, mismatches)`` of autograd's RNE rounding of float32
    (``round_to``: the vectorized narrow_fp16 / narrow_bf16 kernels) against ``mpt.round`` on
    chunk ``[lo, hi)``, NaNs compared as NaN of the same sign."""
    from mpt.autograd.tensor import round_to
    lo, hi = bounds
    x = chunk_inputs(lo, hi)
    got = round_to(x, get_format(fmt)).view(np.uint16)
    with np.errstate(over="ignore", invalid="ignore"):
        want = mpt.round(x, fmt).view(np.uint16)
    nan = np.isnan(x)
    sign_or_nan = (got[nan] & 0x8000) != (want[nan] & 0x8000)
    bad = int((got[~nan] != want[~nan]).sum() + sign_or_nan.sum() +
              (~np.isnan(got[nan].view(get_format(fmt).dtype).astype(np.float32))).sum())
    return lo, hi, int(x.size), bad


@pytest.mark.exhaustive
@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_every_float32_through_autograds_rounding_equals_mpt_round(fmt):
    """All 2^32 float32 patterns through round_to: 0 mismatches."""
    results = map_tasks(functools.partial(narrow_chunk, fmt), chunks(1 << 32, SWEEP_CHUNK),
                        progress=True, desc=f"{fmt} round_to sweep", unit="chunk",
                        **sweep_where())
    assert_covers_once(results, 1 << 32)
    assert sum(m for *_, m in results) == 0


def test_chunk_inputs_are_the_bit_patterns_of_their_range():
    assert np.array_equal(chunk_inputs(5, 9).view(np.uint32), np.arange(5, 9, dtype=np.uint32))
    top = chunk_inputs((1 << 32) - 3, 1 << 32).view(np.uint32)
    assert top.tolist() == [2**32 - 3, 2**32 - 2, 2**32 - 1]


@pytest.mark.parametrize("fmt", ["fp16", "fp8_e4m3fn"])
def test_a_chunked_sweep_covers_every_input_once(fmt):
    """The exhaustive sweep's machinery on the first 2^20 + 7 patterns (+0 and float32
    subnormals), in 17 chunks, the last one of 7: every input checked once, no mismatch."""
    results = run_sweep(fmt, (1 << 20) + 7, 1 << 16)
    assert_covers_once(results, (1 << 20) + 7)
    assert len(results) == 17 and sum(m for *_, m in results) == 0


def test_a_chunked_sweep_on_dask_is_the_serial_one(dask_client):
    serial = run_sweep("bf16", 1 << 20, 1 << 17)
    assert run_sweep("bf16", 1 << 20, 1 << 17, scheduler=dask_client) == serial
    assert_covers_once(serial, 1 << 20)
