"""L5: numeric health of a training run — what a cast does to a tensor, gradient magnitude
histograms, lost updates, the loss-scale trajectory and the first non-finite tensor.

**Cast statistics** (:func:`cast_stats`). For an array ``x`` (any float dtype, decoded exactly)
and a target format, one RNE cast ``y = mpt.round(x, fmt)`` (non-saturating) is classified element
by element, exactly (the classes compare exact values, nothing is estimated):

* ``underflow``: ``x`` finite and non-zero, ``y`` is ±0 (flushed);
* ``subnormal``: ``y`` is a non-zero subnormal of the target (``0 < |y| < fmt.min_normal``):
  kept, with fewer significant bits;
* ``overflow``: ``x`` finite, ``y`` is not (±Inf, or NaN for formats without Inf);
* ``nonfinite``: ``x`` itself is ±Inf or NaN.

Fractions are of all ``numel`` elements; :attr:`CastStats.underflow_share` is of the non-zero
finite ones (the share of information a cast destroys).

**Magnitude histograms** (:func:`log2_histogram`): the count of values per binade
``e = floor(log2 |x|)`` — exact (``frexp``), not a floating-point log — the figure of
Micikevicius et al., "Mixed Precision Training" (ICLR 2018, Fig. 3), where the FP16 range
(``2^-24`` … ``2^15``) is drawn over the FP32 activation-gradient histogram of a run.

**Training records**: :func:`lost_update_fraction` sums ``mpt.optim`` copy-down statistics,
:func:`scale_trajectory` reads a recording ``GradScaler``, :func:`first_non_finite` names the
first tensor holding Inf/NaN. Oracle: hand-counted arrays in tests/test_diagnostics.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpt.amp.scaler import non_finite
from mpt.formats import get_format
from mpt.rounding import decode
from mpt.rounding import round as round_format

__all__ = [
    "CastStats", "cast_stats", "tensor_cast_stats", "Log2Histogram", "log2_histogram",
    "lost_update_fraction", "scale_trajectory", "first_non_finite",
]


def _values(x) -> np.ndarray:
    """The exact values of an array (a Tensor's storage, any float format) as float32/float64."""
    x = np.asarray(x if isinstance(x, np.ndarray) else getattr(x, "data", x))
    if x.dtype in (np.float32, np.float64):
        return x
    if x.dtype.kind not in "fV":
        raise TypeError(f"x must hold floating-point values; got dtype {x.dtype}")
    return decode(x)


@dataclass(frozen=True)
class CastStats:
    """Counts of one cast to ``format`` (see the module docstring)."""

    format: str
    numel: int
    nonzero: int          # finite, non-zero inputs
    underflow: int
    subnormal: int
    overflow: int
    nonfinite: int

    def fraction(self, kind: str) -> float:
        """The count of ``kind`` (underflow, subnormal, overflow, nonfinite) over ``numel``
        (0 for an empty array)."""
        if kind not in ("underflow", "subnormal", "overflow", "nonfinite"):
            raise ValueError(f"kind must be underflow, subnormal, overflow or nonfinite; "
                             f"got {kind!r}")
        return getattr(self, kind) / self.numel if self.numel else 0.0

    @property
    def underflow_share(self) -> float:
        """Flushed values over the finite non-zero inputs (0 when there are none)."""
        return self.underflow / self.nonzero if self.nonzero else 0.0

    def __add__(self, other: "CastStats") -> "CastStats":
        if not isinstance(other, CastStats) or other.format != self.format:
            raise TypeError("only CastStats of the same target format add up")
        return CastStats(self.format, *(getattr(self, k) + getattr(other, k) for k in
                                        ("numel", "nonzero", "underflow", "subnormal",
                                         "overflow", "nonfinite")))


def cast_stats(x, fmt) -> CastStats:
    """Classify the RNE cast of every element of ``x`` to ``fmt`` (module docstring)."""
    fmt = get_format(fmt)
    if fmt.kind != "float":
        raise ValueError(f"fmt must be a floating format; got {fmt.name}")
    v = _values(x).reshape(-1)                                                   # (n,)
    finite = np.isfinite(v)
    nonzero = finite & (v != 0)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.abs(decode(round_format(v, fmt), np.float64)).reshape(-1)               # (n,) exact
    y_finite = np.isfinite(y)
    return CastStats(
        fmt.name, int(v.size), int(np.count_nonzero(nonzero)),
        underflow=int(np.count_nonzero(nonzero & (y == 0))),
        subnormal=int(np.count_nonzero(y_finite & (y > 0) & (y < fmt.min_normal))),
        overflow=int(np.count_nonzero(finite & ~y_finite)),
        nonfinite=int(np.count_nonzero(~finite)))


def tensor_cast_stats(named, fmt) -> dict[str, CastStats]:
    """:func:`cast_stats` of each ``(name, array or Tensor)`` pair, keyed by name."""
    return {name: cast_stats(x, fmt) for name, x in named}


@dataclass(frozen=True)
class Log2Histogram:
    """Counts per binade: ``counts[i]`` holds the finite values with ``floor(log2|x|) = lo + i``;
    ``below`` those under ``2^lo`` (non-zero), ``above`` those at or over ``2^(hi+1)``, then the
    zeros and the non-finite values. Histograms with the same range add up."""

    lo: int
    hi: int
    counts: tuple[int, ...]
    below: int
    above: int
    zeros: int
    nonfinite: int

    @property
    def exponents(self) -> range:
        return range(self.lo, self.hi + 1)

    @property
    def total(self) -> int:
        return sum(self.counts) + self.below + self.above + self.zeros + self.nonfinite

    def share_below(self, threshold_exponent: int) -> float:
        """Share of the finite non-zero values below ``2^threshold_exponent`` (e.g. -24: what
        FP16 flushes, up to rounding at the boundary)."""
        if not self.lo <= threshold_exponent <= self.hi + 1:
            raise ValueError(f"threshold_exponent must lie in [{self.lo}, {self.hi + 1}]")
        small = self.below + sum(self.counts[:threshold_exponent - self.lo])
        nonzero = sum(self.counts) + self.below + self.above
        return small / nonzero if nonzero else 0.0

    def __add__(self, other: "Log2Histogram") -> "Log2Histogram":
        if not isinstance(other, Log2Histogram) or (other.lo, other.hi) != (self.lo, self.hi):
            raise TypeError("only Log2Histograms with the same range add up")
        return Log2Histogram(self.lo, self.hi, tuple(a + b for a, b in zip(self.counts,
                                                                          other.counts)),
                             self.below + other.below, self.above + other.above,
                             self.zeros + other.zeros, self.nonfinite + other.nonfinite)

    def to_dict(self) -> dict:
        return {"lo": self.lo, "hi": self.hi, "counts": list(self.counts), "below": self.below,
                "above": self.above, "zeros": self.zeros, "nonfinite": self.nonfinite}


def log2_histogram(x, lo: int = -64, hi: int = 15) -> Log2Histogram:
    """Binade counts of ``x`` (any float dtype) for exponents ``lo..hi`` (see the class)."""
    if not isinstance(lo, int) or not isinstance(hi, int) or lo > hi:
        raise ValueError(f"lo and hi must be ints with lo <= hi; got {lo!r}, {hi!r}")
    v = _values(x).reshape(-1)
    finite = np.isfinite(v)
    mags = np.abs(v[finite & (v != 0)])
    e = np.frexp(mags)[1].astype(np.int64) - 1                # floor(log2 |x|), exact
    inside = e[(e >= lo) & (e <= hi)]
    counts = np.bincount(inside - lo, minlength=hi - lo + 1)
    return Log2Histogram(lo, hi, tuple(int(c) for c in counts), int(np.count_nonzero(e < lo)),
                         int(np.count_nonzero(e > hi)), int(np.count_nonzero(finite & (v == 0))),
                         int(np.count_nonzero(~finite)))


def lost_update_fraction(stats) -> tuple[int, int, float]:
    """``(lost, changed, lost / changed)`` summed over ``optimizer.lost_updates`` (a dict of
    ``mpt.optim.CopyDownStats``): of the elements whose FP32 working copy changed in a step,
    those whose low-precision value did not (0.0 when nothing changed)."""
    lost = sum(s.lost for s in stats.values())
    changed = sum(s.changed for s in stats.values())
    return lost, changed, lost / changed if changed else 0.0


def scale_trajectory(scaler) -> list[dict]:
    """One dict per update of a recording ``GradScaler`` (``record=True``): step, the scale the
    loss was multiplied by, whether the step was skipped and the first overflowing tensor."""
    if getattr(scaler, "records", None) is None:
        raise ValueError("scaler must be a GradScaler created with record=True")
    return [{"step": r.step, "scale": r.scale, "skipped": r.skipped,
             "first_overflow": r.first_overflow} for r in scaler.records]


def first_non_finite(named) -> str | None:
    """The name of the first ``(name, array or Tensor)`` holding an Inf or NaN, else None."""
    return non_finite(named)[1]
