"""Bit comparisons with a peer's casts (ml_dtypes; numpy for fp16) that never pin a peer's bug.

mpt is checked against its own exact oracle (``mpt.reference.rounding``). A peer is a second
opinion, compared bit for bit, except on the input classes on which some release of it is known
to be wrong (:data:`FAULTS`). The installed peer is probed at run time on a few inputs of each
class, against the oracle (never against mpt's kernels): a fault it does not have costs nothing;
a fault it has takes that class out of the peer comparison, and the tests check mpt there against
the oracle instead. No version string is read, so a peer that fixes a fault, or a newer one that
brings it back, is handled the same way.
"""
import functools
from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np

from mpt.formats import get_format
from mpt.reference import rounding as ref

#: mpt's format name -> the peer dtype whose ``astype`` rounds to it (RNE).
DTYPES = {
    "fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2, "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "fp8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz, "e8m0": ml_dtypes.float8_e8m0fnu,
    "fp6_e2m3fn": ml_dtypes.float6_e2m3fn, "fp6_e3m2fn": ml_dtypes.float6_e3m2fn,
    "fp4_e2m1fn": ml_dtypes.float4_e2m1fn,
}
_UINT = {1: np.uint8, 2: np.uint16}


def cast(x, name):
    """The peer's RNE cast of ``x`` (float32 or float64) to format ``name``, as unsigned codes."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.asarray(x).astype(DTYPES[name])
    return y.view(_UINT[y.itemsize])


@dataclass(frozen=True)
class Fault:
    """A way a released peer misrounds: which inputs it affects, and a few of them to probe with.

    ``affects(x, name)`` is the mask of the elements of ``x`` in the class; ``probes(name)`` are
    inputs of the class (their dtype is the one the fault needs) on which a peer with the fault
    disagrees with the oracle.
    """
    what: str
    affects: Callable[[np.ndarray, str], np.ndarray]
    probes: Callable[[str], np.ndarray]


def _e8m0_only(mask):
    """A fault of the e8m0 cast on the finite magnitudes a for which ``mask(a)`` holds."""
    def affects(x, name):
        with np.errstate(invalid="ignore"):  # a signalling NaN's cast raises the invalid flag
            x = np.asarray(x, np.float64)
        a = np.where(np.isfinite(x), np.abs(x), 0.0)
        return mask(a) & (name == "e8m0")
    return affects


def _double_rounding_probes(name):
    """Float64 neighbours of the two ties just above 1 (one after an even, one after an odd
    value): float32 holds each tie, so a cast through float32 lands on it and breaks it the same
    way for both neighbours, which is wrong on one side of each."""
    q = 2.0**-get_format(name).mantissa_bits                    # the grid step above 1
    ties = np.array([1 + q / 2, 1 + 1.5 * q] if q < 1 else [1.5, 3.0])  # e8m0: grid 1, 2, 4
    return np.concatenate([np.nextafter(ties, np.inf), np.nextafter(ties, 0.0)])


def _not_float32(x, name):
    """float64 elements that float32 cannot hold exactly (a cast through float32 rounds them)."""
    x = np.asarray(x)
    if x.dtype != np.float64:
        return np.zeros(x.shape, bool)
    with np.errstate(over="ignore", invalid="ignore"):  # invalid: signalling NaNs
        return np.isfinite(x) & (x.astype(np.float32).astype(np.float64) != x)


#: Faults of released ml_dtypes versions (each fixed in a later release).
FAULTS = [
    Fault("e8m0: float32 subnormals in (2^-127, 1.5 * 2^-127) round up to 2^-126",
          _e8m0_only(lambda a: (a > 2.0**-127) & (a < 1.5 * 2.0**-127)),
          lambda name: np.array([2.0**-127 + 2.0**-149, 1.5 * 2.0**-127 - 2.0**-149], np.float32)),
    Fault("e8m0: a tie 1.5 * 2^k rounds to the even code instead of up to 2^(k+1)",
          _e8m0_only(lambda a: np.frexp(a)[0] == 0.75),
          lambda name: np.array([1.5 * 2.0**-125, 1.5, 1.5 * 2.0**127], np.float32)),
    Fault("float64 input is rounded twice, through float32", _not_float32,
          _double_rounding_probes),
]


def _oracle(x, name):
    return np.array([ref.round_exact(v, name) for v in np.asarray(x, np.float64).tolist()])


@functools.cache
def has_fault(index, name):
    """Whether the installed peer's cast to ``name`` shows ``FAULTS[index]`` on its probes."""
    probes = FAULTS[index].probes(name)
    return bool((cast(probes, name).astype(np.int64) != _oracle(probes, name)).any())


def trusted(x, name):
    """Mask of the elements of ``x`` outside every fault class that the installed peer shows."""
    ok = np.ones(np.shape(x), bool)
    for i, fault in enumerate(FAULTS):
        if has_fault(i, name):
            ok &= ~fault.affects(x, name)
    return ok
