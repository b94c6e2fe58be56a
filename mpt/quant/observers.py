"""L4: observers and quantization parameters (``torch.ao.quantization.observer``, PyTorch 2.x,
float32 arithmetic).

* :class:`MinMaxObserver`: running ``min``/``max`` of everything seen;
* :class:`MovingAverageMinMaxObserver`: the first batch sets them, then
  ``min = fl32(min + fl32(c·fl32(cur − min)))`` with ``c = fl32(0.01)`` (same for max);
* per-channel variants (``ch_axis``, default 0) do the same per slice.

``calculate_qparams`` (PyTorch's ``_calculate_qparams``) with ``min⁻ = min(min, 0)``, ``max⁺ =
max(max, 0)``, ``eps = 2^-23`` (float32 eps) and float32 operations:

* affine: ``s = max(fl32(fl32(max⁺ − min⁻) / (qmax − qmin)), eps)``, ``z = clamp(qmin −
  rne(fl32(min⁻/s)), qmin, qmax)``;
* symmetric: ``s = max(fl32(max(−min⁻, max⁺) / ((qmax − qmin)/2)), eps)`` (127.5 for qint8), ``z``
  = 0 for int8, 128 for uint8 (the floor of the range midpoint for a custom range);
* nothing observed yet: ``(1.0, 0)``.

Ranges (``calculate_qmin_qmax``): int8 ``[-128, 127]`` (reduce_range ``[-64, 63]``), uint8
``[0, 255]`` (reduce_range ``[0, 127]``); custom ``quant_min``/``quant_max`` must contain 0, span at
most 256 codes, and reduce_range halves both (floor division).

PyTorch's version-1 QAT qconfig uses ``FusedMovingAvgObsFakeQuantize``, whose C++ qparams routine
(``ChooseQuantizationParams``) computes in double with a nudged zero point; mpt implements the
Python observers (version 0, ``FakeQuantize``), whose formulas above are the documented ones.
"""
from __future__ import annotations

import numpy as np

from mpt._checks import check_bool, check_finite, check_int, check_real
from mpt.autograd.tensor import Tensor
from mpt.formats import get_format

__all__ = ["quant_range", "calculate_qparams", "MinMaxObserver", "MovingAverageMinMaxObserver",
           "PerChannelMinMaxObserver", "MovingAveragePerChannelMinMaxObserver", "EPS",
           "AVERAGING_CONSTANT", "SCHEMES"]

EPS = 2.0**-23          # torch.finfo(torch.float32).eps, the floor of every scale
AVERAGING_CONSTANT = 0.01
SCHEMES = ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
           "per_channel_symmetric")


def _int_dtype(dtype) -> str:
    fmt = get_format(dtype)
    if fmt.name not in ("int8", "uint8"):
        raise ValueError(f"dtype must be 'qint8'/'int8' or 'quint8'/'uint8'; got {dtype!r}")
    return fmt.name


def quant_range(dtype="quint8", reduce_range: bool = False, quant_min=None, quant_max=None):
    """``(quant_min, quant_max)`` as PyTorch's ``calculate_qmin_qmax`` (module docstring)."""
    name = _int_dtype(dtype)
    reduce_range = check_bool("reduce_range", reduce_range)
    if (quant_min is None) != (quant_max is None):
        raise ValueError("quant_min and quant_max must be given together")
    quant_min = check_int("quant_min", quant_min, optional=True)
    quant_max = check_int("quant_max", quant_max, optional=True)
    if quant_min is None:
        lo, hi = (-128, 127) if name == "int8" else (0, 255)
        return (lo // 2, hi // 2) if reduce_range else (lo, hi)
    if not quant_min <= 0 <= quant_max or quant_min == quant_max:
        raise ValueError(f"[quant_min, quant_max] must contain 0 and be non-empty; got "
                         f"[{quant_min}, {quant_max}]")
    if quant_max - quant_min + 1 > 256:
        raise ValueError(f"an 8-bit range holds at most 256 codes; got [{quant_min}, {quant_max}]")
    return (quant_min // 2, quant_max // 2) if reduce_range else (int(quant_min), int(quant_max))


def calculate_qparams(min_val, max_val, quant_min: int, quant_max: int, symmetric: bool,
                      dtype="quint8", custom_range: bool = False, eps: float = EPS):
    """``(scale float32 (C,), zero_point int32 (C,))`` from running ``min_val``/``max_val``
    (float32 arrays of one shape; PyTorch's ``_calculate_qparams``, module docstring).

    Oracle: ``mpt.reference.qparams_reference``; tests/test_quant.py also checks hand-derived
    values.
    """
    lo = np.atleast_1d(np.asarray(min_val, np.float32))
    hi = np.atleast_1d(np.asarray(max_val, np.float32))
    if lo.size == 0 or (np.isposinf(lo) & np.isneginf(hi)).all():
        return np.ones(max(lo.size, 1), np.float32), np.zeros(max(lo.size, 1), np.int32)
    check_finite("min_val", lo)
    check_finite("max_val", hi)
    if (lo > hi).any():
        raise ValueError(f"min_val must be <= max_val; got {min_val} and {max_val}")
    lo, hi = np.minimum(lo, np.float32(0)), np.maximum(hi, np.float32(0))
    eps32 = np.float32(eps)
    if symmetric:
        amax = np.maximum(-lo, hi)
        scale = np.maximum(amax / np.float32((quant_max - quant_min) / 2), eps32)
        zp = 0
        if _int_dtype(dtype) == "uint8":
            zp = (quant_min + quant_max) // 2 if custom_range else 128
        return scale, np.full(scale.shape, zp, np.int32)
    scale = np.maximum((hi - lo) / np.float32(quant_max - quant_min), eps32)
    zp = quant_min - np.rint(lo / scale).astype(np.int64)
    return scale, np.clip(zp, quant_min, quant_max).astype(np.int32)


def _observed(x) -> np.ndarray:
    """float32 values of an observed Tensor or array (``x.to(torch.float32)``)."""
    data = x.data if isinstance(x, Tensor) else np.asarray(x)
    return data if data.dtype == np.float32 else data.astype(np.float32)


class MinMaxObserver:
    """Running min/max of every tensor seen (per tensor); qparams by :func:`calculate_qparams`.

    ``dtype`` 'quint8' or 'qint8'; ``qscheme`` 'per_tensor_affine' or 'per_tensor_symmetric';
    ``reduce_range`` and a custom ``quant_min``/``quant_max`` as :func:`quant_range`. Calling the
    observer on a Tensor (or array) records it and returns it unchanged.
    """

    per_channel = False

    def __init__(self, dtype="quint8", qscheme="per_tensor_affine", reduce_range=False,
                 quant_min=None, quant_max=None, eps: float = EPS):
        if qscheme not in SCHEMES or qscheme.startswith("per_channel") != self.per_channel:
            kind = "per_channel" if self.per_channel else "per_tensor"
            raise ValueError(f"qscheme must be '{kind}_affine' or '{kind}_symmetric'; got "
                             f"{qscheme!r}")
        self.dtype = _int_dtype(dtype)
        self.qscheme = qscheme
        self.reduce_range = check_bool("reduce_range", reduce_range)
        self.custom_range = quant_min is not None
        self.quant_min, self.quant_max = quant_range(dtype, reduce_range, quant_min, quant_max)
        self.eps = float(np.float32(check_real("eps", eps, gt=0)))
        self.reset()

    def reset(self) -> None:
        self.min_val = np.array(np.inf, np.float32)
        self.max_val = np.array(-np.inf, np.float32)

    @property
    def symmetric(self) -> bool:
        return self.qscheme.endswith("symmetric")

    def _current(self, x: np.ndarray):
        return np.min(x), np.max(x)

    def _update(self, cur_min, cur_max) -> None:
        self.min_val = np.minimum(cur_min, self.min_val)
        self.max_val = np.maximum(cur_max, self.max_val)

    def __call__(self, x):
        """Record ``x`` (which must be finite: a NaN or Inf would make every later qparam NaN
        or Inf) and return it unchanged."""
        values = check_finite(f"{type(self).__name__} input x", _observed(x))
        if values.size:
            self._update(*self._current(values))
        return x

    def calculate_qparams(self):
        """``(scale float32 (C,), zero_point int32 (C,))``; C = 1 per tensor."""
        return calculate_qparams(self.min_val, self.max_val, self.quant_min, self.quant_max,
                                 self.symmetric, self.dtype, self.custom_range, self.eps)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(min_val={self.min_val}, max_val={self.max_val}, "
                f"[{self.quant_min}, {self.quant_max}], {self.qscheme})")


def _moving_average(old, cur, c: np.float32):
    """``old + c·(cur − old)``, every operation in float32."""
    return old + c * (cur - old)


class MovingAverageMinMaxObserver(MinMaxObserver):
    """The first batch sets min/max, later ones move them by ``averaging_constant`` (0.01):
    ``min = fl32(min + fl32(c·fl32(cur − min)))``, ``c = fl32(averaging_constant)``."""

    def __init__(self, averaging_constant: float = AVERAGING_CONSTANT, **kwargs):
        self.averaging_constant = np.float32(check_real("averaging_constant", averaging_constant,
                                                        gt=0, max=1))
        super().__init__(**kwargs)

    def _update(self, cur_min, cur_max) -> None:
        if np.isposinf(self.min_val).all() and np.isneginf(self.max_val).all():
            self.min_val, self.max_val = np.asarray(cur_min), np.asarray(cur_max)
            return
        self.min_val = _moving_average(self.min_val, cur_min, self.averaging_constant)
        self.max_val = _moving_average(self.max_val, cur_max, self.averaging_constant)


class PerChannelMinMaxObserver(MinMaxObserver):
    """Running min/max per slice along ``ch_axis`` (qscheme 'per_channel_affine' or
    'per_channel_symmetric')."""

    per_channel = True

    def __init__(self, ch_axis: int = 0, dtype="quint8", qscheme="per_channel_affine", **kwargs):
        self.ch_axis = check_int("ch_axis", ch_axis)
        super().__init__(dtype=dtype, qscheme=qscheme, **kwargs)

    def reset(self) -> None:
        self.min_val = np.empty(0, np.float32)
        self.max_val = np.empty(0, np.float32)

    def _current(self, x: np.ndarray):
        if not -x.ndim <= self.ch_axis < x.ndim:
            raise ValueError(f"ch_axis {self.ch_axis} is out of range for an input of shape "
                             f"{x.shape}")
        rows = np.moveaxis(x, self.ch_axis, 0).reshape(x.shape[self.ch_axis], -1)  # (C, rest)
        return rows.min(axis=1), rows.max(axis=1)

    def _update(self, cur_min, cur_max) -> None:
        if self.min_val.size == 0:
            self.min_val, self.max_val = cur_min, cur_max
        else:
            MinMaxObserver._update(self, cur_min, cur_max)


class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    """Per-channel moving average of min/max (``averaging_constant`` 0.01)."""

    def __init__(self, averaging_constant: float = AVERAGING_CONSTANT, **kwargs):
        self.averaging_constant = np.float32(check_real("averaging_constant", averaging_constant,
                                                        gt=0, max=1))
        super().__init__(**kwargs)

    def _update(self, cur_min, cur_max) -> None:
        if self.min_val.size == 0:
            self.min_val, self.max_val = cur_min, cur_max
            return
        self.min_val = _moving_average(self.min_val, cur_min, self.averaging_constant)
        self.max_val = _moving_average(self.max_val, cur_max, self.averaging_constant)


