"""L4: FP8 scaling — Transformer Engine's delayed scaling, current scaling, and OCP MX blocks.

**Quantize / dequantize** (specs/amp.md §4). A scaled FP8 tensor is an :class:`Fp8Array`: codes
``q = round_fmt(f32(x · scale))`` (the product rounded to float32 first, as TE's cast kernels
compute it, then round to nearest even into the FP8 format, *saturating*: out-of-range values and
±Inf become ±max, NaN stays NaN) and ``scale_inv = f32(1 / scale)``; ``dequantize`` is
``f32(float(q) · scale_inv)``. Inputs are decoded exactly to float32 first.

**Delayed scaling** (``DelayedScaling``, TE's recipe: ``margin=0, amax_history_len=1024,
amax_compute_algo="max"``, HYBRID = E4M3 forward, E5M2 gradients). A :class:`DelayedScalingState`
per tensor holds ``scale`` (float32, 1.0 at first) and ``amax_history`` (float32 zeros):

    quantize(x): history[0] = max(history[0], max|x|); q = round_fmt(f32(x·scale)) (saturating)
    update():    amax = max(history) ("max") or history[0] ("most_recent")
                 history = roll(history, −1); history[0] = 0
                 scale = f32(f32(fmt_max / amax) / 2^margin)  if amax is finite and > 0
                         (an infinite result becomes FLT_MAX), else scale is unchanged

A NaN amax propagates through ``max`` (it stays in the history, and the scale frozen, until it
rolls out). **Current scaling** (:func:`current_scale`) uses the amax of the tensor being cast,
optionally rounded down to a power of two. **MX** (OCP Microscaling v1.0): blocks of 32 elements
along the last axis share an E8M0 scale ``X = 2^(floor(log2 amax) − emax_elem)`` (clamped to
[2^-127, 2^127]; NaN when the block holds Inf/NaN; 2^-127 for an all-zero block) and the elements
``round_fmt(x / X)`` saturate: :func:`mpt.microscaling.quantize_mx` with the OCP rule, which
also has the other element formats, scale rules, block shapes and NVFP4.

Oracle: ``mpt.reference.delayed_scaling_reference`` and ``mx_scale_exponent_reference``
(tests/test_fp8.py). State is plain numpy/scalars: ``state_dict`` / ``load_state_dict``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mpt.formats import Format, get_format
from mpt.microscaling import quantize_mx
from mpt.rounding import round as _round
from mpt.tensor import opmath

__all__ = [
    "DelayedScaling", "DelayedScalingState", "Fp8Array", "quantize", "current_scale",
    "quantize_current", "MXArray", "mx_quantize", "FP8_FORMATS",
]

_F32 = np.float32
_FLT_MAX = _F32(float.fromhex("0x1.fffffep+127"))
#: TE's fp8_format names → (forward format, backward format).
FP8_FORMATS = {"HYBRID": ("fp8_e4m3fn", "fp8_e5m2"), "E4M3": ("fp8_e4m3fn", "fp8_e4m3fn"),
               "E5M2": ("fp8_e5m2", "fp8_e5m2")}
_MX_BLOCK = 32


def _as_f32(x) -> np.ndarray:
    x = getattr(x, "data", x)
    x = np.asarray(x)
    if x.dtype == np.float64:
        raise TypeError("x must be float32 or narrower (fp64 input would be rounded twice)")
    return opmath(x) if x.dtype.kind in "fV" else x.astype(np.float32)


def _amax(x: np.ndarray) -> np.float32:
    """max|x| in float32 (NaN if any NaN; 0 for an empty array)."""
    return _F32(np.max(np.abs(x))) if x.size else _F32(0)


@dataclass(frozen=True)
class Fp8Array:
    """FP8 codes with the float32 ``scale_inv`` that maps them back to real values."""

    data: np.ndarray          # dtype: the FP8 format's ml_dtypes dtype
    scale_inv: np.float32
    format: Format

    def dequantize(self) -> np.ndarray:
        """``f32(float(q) · scale_inv)``, a float32 array."""
        with np.errstate(over="ignore"):
            return self.data.astype(np.float32) * self.scale_inv


def quantize(x, fmt, scale) -> Fp8Array:
    """``round_fmt(f32(x · scale))`` RNE saturating, with ``scale_inv = f32(1/scale)``."""
    fmt = get_format(fmt)
    scale = _F32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = _as_f32(x) * scale                                    # rounded to float32 once
        scale_inv = _F32(1) / scale
    return Fp8Array(_round(scaled, fmt, "nearest_even", saturate=True), scale_inv, fmt)


def _scale_from_amax(amax, fmt_max, margin) -> np.float32:
    """``f32(f32(fmt_max / amax) / 2^margin)``, FLT_MAX when that is infinite (amax finite > 0)."""
    with np.errstate(over="ignore"):
        scale = (_F32(fmt_max) / _F32(amax)) / _F32(2.0 ** margin)
    return _FLT_MAX if np.isinf(scale) else scale


@dataclass(frozen=True)
class DelayedScaling:
    """Transformer Engine's delayed-scaling recipe (defaults as TE's)."""

    margin: int = 0
    fp8_format: str = "HYBRID"
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"

    def __post_init__(self):
        if self.fp8_format not in FP8_FORMATS:
            raise ValueError(f"fp8_format must be one of {sorted(FP8_FORMATS)}; "
                             f"got {self.fp8_format!r}")
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError("amax_compute_algo must be 'max' or 'most_recent'; got "
                             f"{self.amax_compute_algo!r}")
        if not isinstance(self.amax_history_len, int) or self.amax_history_len < 1:
            raise ValueError(f"amax_history_len must be an int >= 1; got "
                             f"{self.amax_history_len!r}")
        if not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"margin must be an int >= 0; got {self.margin!r}")

    def format_for(self, role: str):
        """The FP8 format of a role: ``"forward"`` (activations, weights) or ``"backward"``."""
        if role not in ("forward", "backward"):
            raise ValueError(f"role must be 'forward' or 'backward'; got {role!r}")
        return get_format(FP8_FORMATS[self.fp8_format][role == "backward"])

    def state(self, role: str = "forward") -> "DelayedScalingState":
        """A fresh per-tensor state for a tensor of ``role``."""
        return DelayedScalingState(self.format_for(role), self)


class DelayedScalingState:
    """Per-tensor delayed-scaling state: float32 ``scale`` and ``amax_history``."""

    def __init__(self, fmt, recipe: DelayedScaling = DelayedScaling()):
        self.format = get_format(fmt)
        if self.format.kind != "float" or self.format.bits != 8:
            raise ValueError(f"fmt must be an FP8 format; got {self.format.name}")
        self.recipe = recipe
        self.scale = _F32(1)
        self.amax_history = np.zeros(recipe.amax_history_len, np.float32)

    @property
    def scale_inv(self) -> np.float32:
        return _F32(1) / self.scale

    def observe(self, x) -> None:
        """Record max|x| in history[0] (what :meth:`quantize` does before casting)."""
        self.amax_history[0] = np.maximum(self.amax_history[0], _amax(_as_f32(x)))  # NaN stays

    def quantize(self, x) -> Fp8Array:
        """Record max|x| in history[0], then quantize with the current (delayed) scale."""
        x = _as_f32(x)
        self.observe(x)
        return quantize(x, self.format, self.scale)

    def update(self) -> np.float32:
        """End of step: new scale from the history (see the module docstring); returns it."""
        h = self.amax_history
        amax = np.max(h) if self.recipe.amax_compute_algo == "max" else h[0]
        self.amax_history = np.roll(h, -1)
        self.amax_history[0] = 0
        if np.isfinite(amax) and amax > 0:
            self.scale = _scale_from_amax(amax, self.format.max, self.recipe.margin)
        return self.scale

    def state_dict(self) -> dict:
        return {"format": self.format.name, "scale": _F32(self.scale).reshape(()).copy(),
                "amax_history": self.amax_history.copy()}

    def load_state_dict(self, state: dict) -> None:
        if get_format(state["format"]) != self.format:
            raise ValueError(f"state_dict is for format {state['format']}, this state holds "
                             f"{self.format.name}")
        history = np.asarray(state["amax_history"])
        if history.dtype != np.float32 or history.shape != self.amax_history.shape:
            raise ValueError(f"amax_history must be float32 of shape {self.amax_history.shape}; "
                             f"got {history.dtype} {history.shape}")
        self.scale = _F32(np.asarray(state["scale"], np.float32))
        self.amax_history = history.copy()


def current_scale(x, fmt, *, margin=0, power_of_2=False, epsilon=0.0) -> np.float32:
    """Current scaling (TE ``Float8CurrentScaling``): ``f32(fmt_max / max(amax, epsilon))``
    divided by 2^margin, from this tensor's own amax; FLT_MAX if infinite; 1.0 when the amax is
    0 or non-finite. ``power_of_2`` rounds the scale down to a power of two (exact)."""
    fmt = get_format(fmt)
    amax = max(_amax(_as_f32(x)), _F32(epsilon))
    if not (np.isfinite(amax) and amax > 0):
        return _F32(1)
    scale = _scale_from_amax(amax, fmt.max, margin)
    if power_of_2:
        scale = _F32(2.0 ** (math.frexp(float(scale))[1] - 1))        # 2^floor(log2 scale)
    return scale


def quantize_current(x, fmt, **options) -> Fp8Array:
    """:func:`quantize` with :func:`current_scale` (options: margin, power_of_2, epsilon)."""
    return quantize(x, fmt, current_scale(x, fmt, **options))


# ---- MX block scaling ---------------------------------------------------------------------------
@dataclass(frozen=True)
class MXArray:
    """OCP MX data: element codes (same shape as the input) and one E8M0 scale per block of 32
    along the last axis (shape ``(..., ceil(n / 32))``)."""

    data: np.ndarray
    scales: np.ndarray        # dtype ml_dtypes.float8_e8m0fnu
    format: Format

    def dequantize(self) -> np.ndarray:
        """``float(q) · X`` per element, float32 (exact: X is a power of two, no overflow of the
        product for the MX element formats' ranges; NaN scale → NaN block)."""
        x = self.data.astype(np.float32).astype(np.float64)
        scale = np.repeat(self.scales.astype(np.float64), _MX_BLOCK, axis=-1)[..., :x.shape[-1]]
        with np.errstate(over="ignore", invalid="ignore"):
            return (x * scale).astype(np.float32)


def mx_quantize(x, fmt) -> MXArray:
    """Quantize to OCP MX with element format ``fmt`` (fp8 e4m3/e5m2, fp6, fp4), blocks of 32
    along the last axis: ``mpt.microscaling.quantize_mx`` with the OCP rule and RNE."""
    fmt = get_format(fmt)
    if fmt.kind != "float" or fmt.bits > 8 or not fmt.signed:
        raise ValueError(f"fmt must be an MX element format (fp8/fp6/fp4); got {fmt.name}")
    x = _as_f32(x)
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension (blocks run along the last axis)")
    q = quantize_mx(x, fmt, axis=-1, block=_MX_BLOCK, scale_rule="ocp")
    return MXArray(q.codes, q.scales, fmt)
