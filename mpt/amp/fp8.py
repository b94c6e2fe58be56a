"""L4: FP8 scaling — Transformer Engine's delayed scaling, current scaling, and OCP MX blocks.

**Quantize / dequantize** (docs/amp.md §4). A scaled FP8 tensor is an :class:`Fp8Array`: codes
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

from mpt._checks import check_array, check_bool, check_int, check_real
from mpt.autograd.tensor import opmath
from mpt.formats import Format, get_format
from mpt.microscaling import quantize_mx
from mpt.rounding import round as round_format

__all__ = [
    "DelayedScaling", "DelayedScalingState", "Fp8Array", "quantize", "current_scale",
    "quantize_current", "MXArray", "mx_quantize", "FP8_FORMATS", "FP8_FLAVOURS", "check_scale",
]

_F32 = np.float32
_FLT_MAX = _F32(float.fromhex("0x1.fffffep+127"))
#: TE's fp8_format names → (forward format, backward format).
FP8_FORMATS = {"HYBRID": ("fp8_e4m3fn", "fp8_e5m2"), "E4M3": ("fp8_e4m3fn", "fp8_e4m3fn"),
               "E5M2": ("fp8_e5m2", "fp8_e5m2")}
#: Hardware flavours of the FP8 formats: OCP (NVIDIA, CDNA4) or FNUZ (AMD MI300: bias 8/16, one
#: NaN code 0x80, no Inf, no −0; composable_kernel's float8.hpp).
FP8_FLAVOURS = {"ocp": {}, "fnuz": {"fp8_e4m3fn": "fp8_e4m3fnuz", "fp8_e5m2": "fp8_e5m2fnuz"}}
_MX_BLOCK = 32
_E8M0 = get_format("e8m0")


def _as_f32(x) -> np.ndarray:
    x = getattr(x, "data", x)
    x = np.asarray(x)
    if x.dtype == np.float64:
        raise TypeError("x must be float32 or narrower (fp64 input would be rounded twice)")
    return opmath(x) if x.dtype.kind in "fV" else x.astype(np.float32)


def _fp8_format(fmt, name="fmt") -> Format:
    fmt = get_format(fmt)
    if fmt.kind != "float" or fmt.bits != 8:
        raise ValueError(f"{name} must be an FP8 format; got {fmt.name}")
    return fmt


def check_scale(name: str, scale) -> np.float32:
    """A multiplying scale as float32: a finite real > 0 whose float32 value and reciprocal are
    finite and non-zero (else ``scale_inv`` would be Inf or the codes all zero)."""
    value = check_real(name, scale, gt=0)
    with np.errstate(over="ignore", divide="ignore"):
        s = _F32(value)
        inv = _F32(1) / s
    if not (0 < s < np.inf and inv < np.inf):
        raise ValueError(f"{name} must lie in (2^-128, FLT_MAX] once rounded to float32 (so "
                         f"that it and its float32 reciprocal are finite and non-zero); got "
                         f"{scale!r}")
    return s


def _amax(x: np.ndarray) -> np.float32:
    """max|x| in float32 (NaN if any NaN; 0 for an empty array)."""
    return _F32(np.max(np.abs(x))) if x.size else _F32(0)


@dataclass(frozen=True)
class Fp8Array:
    """FP8 codes with the float32 ``scale_inv`` that maps them back to real values."""

    data: np.ndarray          # dtype: the FP8 format's ml_dtypes dtype
    scale_inv: np.float32
    format: Format

    def __post_init__(self):
        """``format`` an FP8 format (a name is looked up), ``data`` an array of its dtype,
        ``scale_inv`` a finite float32 value > 0 (stored as ``np.float32``)."""
        fmt = _fp8_format(self.format, "format")
        object.__setattr__(self, "format", fmt)
        check_array("data", self.data, fmt.dtype)
        inv = check_real("scale_inv", self.scale_inv, gt=0)
        if float(_F32(inv)) != inv:
            raise ValueError(f"scale_inv must be a float32 value; got {self.scale_inv!r}")
        object.__setattr__(self, "scale_inv", _F32(inv))

    def dequantize(self) -> np.ndarray:
        """``f32(float(q) · scale_inv)``, a float32 array."""
        with np.errstate(over="ignore"):
            return self.data.astype(np.float32) * self.scale_inv


def quantize(x, fmt, scale) -> Fp8Array:
    """``round_fmt(f32(x · scale))`` RNE saturating, with ``scale_inv = f32(1/scale)``.

    ``fmt``: an FP8 format; ``scale``: a real > 0, rounded to float32, whose float32 value and
    reciprocal are finite and non-zero (a zero, negative, NaN or Inf scale is refused)."""
    fmt = _fp8_format(fmt)
    scale = check_scale("scale", scale)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = _as_f32(x) * scale                                    # rounded to float32 once
        scale_inv = _F32(1) / scale
    return Fp8Array(round_format(scaled, fmt, "nearest_even", saturate=True), scale_inv, fmt)


def _scale_from_amax(amax, fmt_max, margin) -> np.float32:
    """``f32(f32(fmt_max / amax) / 2^margin)``, FLT_MAX when that is infinite (amax finite > 0)."""
    with np.errstate(over="ignore"):
        scale = (_F32(fmt_max) / _F32(amax)) / _F32(2.0 ** margin)
    return _FLT_MAX if np.isinf(scale) else scale


@dataclass(frozen=True)
class DelayedScaling:
    """Transformer Engine's delayed-scaling recipe (defaults as TE's). ``flavour`` picks the
    hardware's FP8 encodings (:data:`FP8_FLAVOURS`): ``"fnuz"`` on AMD MI300."""

    margin: int = 0
    fp8_format: str = "HYBRID"
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    flavour: str = "ocp"

    def __post_init__(self):
        if self.flavour not in FP8_FLAVOURS:
            raise ValueError(f"flavour must be one of {sorted(FP8_FLAVOURS)}; got {self.flavour!r}")
        if self.fp8_format not in FP8_FORMATS:
            raise ValueError(f"fp8_format must be one of {sorted(FP8_FORMATS)}; "
                             f"got {self.fp8_format!r}")
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError("amax_compute_algo must be 'max' or 'most_recent'; got "
                             f"{self.amax_compute_algo!r}")
        object.__setattr__(self, "amax_history_len",
                           check_int("amax_history_len", self.amax_history_len, min=1))
        object.__setattr__(self, "margin", check_int("margin", self.margin, min=0))

    def format_for(self, role: str):
        """The FP8 format of a role: ``"forward"`` (activations, weights) or ``"backward"``."""
        if role not in ("forward", "backward"):
            raise ValueError(f"role must be 'forward' or 'backward'; got {role!r}")
        name = FP8_FORMATS[self.fp8_format][role == "backward"]
        return get_format(FP8_FLAVOURS[self.flavour].get(name, name))

    def state(self, role: str = "forward") -> "DelayedScalingState":
        """A fresh per-tensor state for a tensor of ``role``."""
        return DelayedScalingState(self.format_for(role), self)


class DelayedScalingState:
    """Per-tensor delayed-scaling state: float32 ``scale`` and ``amax_history``."""

    def __init__(self, fmt, recipe: DelayedScaling = DelayedScaling()):
        self.format = _fp8_format(fmt)
        if not isinstance(recipe, DelayedScaling):
            raise TypeError(f"recipe must be an mpt.fp8.DelayedScaling; got "
                            f"{type(recipe).__name__}")
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
        """Restore what :meth:`state_dict` saved: the same format, a float32 ``amax_history`` of
        this recipe's length and a ``scale`` that :func:`quantize` accepts; checked first."""
        if not isinstance(state, dict) or {"format", "scale", "amax_history"} - set(state):
            raise ValueError("state must be a dict with 'format', 'scale' and 'amax_history'; "
                             f"got {sorted(state) if isinstance(state, dict) else type(state)}")
        if get_format(state["format"]) != self.format:
            raise ValueError(f"state_dict is for format {state['format']}, this state holds "
                             f"{self.format.name}")
        history = np.asarray(state["amax_history"])
        if history.dtype != np.float32 or history.shape != self.amax_history.shape:
            raise ValueError(f"amax_history must be float32 of shape {self.amax_history.shape}; "
                             f"got {history.dtype} {history.shape}")
        scale = np.asarray(state["scale"])
        if scale.dtype != np.float32 or scale.size != 1:
            raise ValueError(f"scale must be one float32 value; got {scale.dtype} {scale.shape}")
        self.scale = check_scale("scale", float(scale.reshape(())))
        self.amax_history = history.copy()


def current_scale(x, fmt, *, margin=0, power_of_2=False, epsilon=0.0) -> np.float32:
    """Current scaling (TE ``Float8CurrentScaling``): ``f32(fmt_max / max(amax, epsilon))``
    divided by 2^margin, from this tensor's own amax; FLT_MAX if infinite; 1.0 when the amax is
    0 or non-finite. ``power_of_2`` rounds the scale down to a power of two (exact)."""
    fmt = _fp8_format(fmt)
    margin = check_int("margin", margin, min=0)
    power_of_2 = check_bool("power_of_2", power_of_2)
    amax = max(_amax(_as_f32(x)), _F32(check_real("epsilon", epsilon, min=0)))
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
def _mx_format(fmt, name="fmt") -> Format:
    fmt = get_format(fmt)
    if fmt.kind != "float" or fmt.bits > 8 or not fmt.signed:
        raise ValueError(f"{name} must be an MX element format (fp8/fp6/fp4); got {fmt.name}")
    return fmt


@dataclass(frozen=True)
class MXArray:
    """OCP MX data: element codes (same shape as the input) and one E8M0 scale per block of 32
    along the last axis (shape ``(..., ceil(n / 32))``)."""

    data: np.ndarray
    scales: np.ndarray        # dtype ml_dtypes.float8_e8m0fnu
    format: Format

    def __post_init__(self):
        """``format`` an MX element format, ``data`` an array of its dtype with at least one
        dimension, ``scales`` E8M0 of shape ``data.shape[:-1] + (ceil(n/32),)``."""
        fmt = _mx_format(self.format, "format")
        object.__setattr__(self, "format", fmt)
        data = check_array("data", self.data, fmt.dtype)
        if data.ndim == 0:
            raise ValueError("data must have at least one dimension (blocks run along the last "
                             "axis)")
        check_array("scales", self.scales, _E8M0.dtype,
                    shape=data.shape[:-1] + (-(-data.shape[-1] // _MX_BLOCK),))

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
    fmt = _mx_format(fmt)
    x = _as_f32(x)
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension (blocks run along the last axis)")
    q = quantize_mx(x, fmt, axis=-1, block=_MX_BLOCK, scale_rule="ocp")
    return MXArray(q.codes, q.scales, fmt)
