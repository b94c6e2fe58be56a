"""L4: quantization — observers, fake quantization (fixed, learnable, FP8), QAT and the integer-only
model, NF4 and int8 weight storage (docs/techniques.md §3–4).

**Fake quantization** follows PyTorch's CPU kernels bit for bit (``mpt.kernels.quant``): float32
reciprocal of the scale, ``rne(x·inv)`` in float32, the zero point added in float32, clamp, the
straight-through mask on the unclamped value, float32 dequantization. Inputs may be fp32, fp16 or
bf16 (decoded exactly to float32; the float32 result is rounded RNE to the input's format, as
PyTorch stores ``scalar_t``); scales are float32 (rounded once from a Python float, as PyTorch's
``double → float`` argument conversion does) and zero points ints.

**Observers** (``torch.ao.quantization.observer``, PyTorch 2.x, float32 arithmetic):

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

**NF4** (QLoRA): blocks of 64 share a float32 absmax; codes index the 16 levels of
``get_format("nf4")``; two codes per byte, the first in the high nibble (bitsandbytes' order).
Double quantization stores the absmax values as 8-bit codes of bitsandbytes' signed dynamic map
(blocks of 256, after subtracting their mean) — 8/64 + 32/(64·256) = 0.127 bits per parameter
instead of 0.5.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

import mpt.functional as F
from mpt import nn
from mpt._checks import check_array, check_bool, check_finite, check_int, check_real
from mpt.formats import get_format
from mpt.fp8 import check_scale
from mpt.function import Function
from mpt.kernels import quant as K
from mpt.rounding import round as round_format
from mpt.tensor import Tensor, opmath, round_to

__all__ = [
    # observers and qparams
    "quant_range", "calculate_qparams", "MinMaxObserver", "MovingAverageMinMaxObserver",
    "PerChannelMinMaxObserver", "MovingAveragePerChannelMinMaxObserver",
    # differentiable fake quantization
    "fake_quantize_per_tensor_affine", "fake_quantize_per_channel_affine",
    "fake_quantize_learnable_per_tensor_affine", "lsq_init_scale", "lsq_grad_factor",
    "fake_quantize_fp8",
    # codebooks and weight storage
    "NF4_BLOCKSIZE", "nf4_decision_points", "dynamic_map", "pack_nibbles", "unpack_nibbles",
    "NF4Weight", "nf4_quantize", "nf4_dequantize", "Int8Weight", "int8_quantize_per_channel",
    # modules and the QAT workflow
    "FakeQuantize", "QConfig", "default_qat_qconfig", "QuantStub", "DeQuantStub", "QATLinear",
    "QATConv2d", "prepare_qat", "QTensor", "IntLinear", "IntConv2d", "Quantize", "DeQuantize",
    "convert",
    # integer requantization
    "quantize_multiplier",
]

EPS = 2.0**-23          # torch.finfo(torch.float32).eps, the floor of every scale
AVERAGING_CONSTANT = 0.01
NF4_BLOCKSIZE = 64
DQ_BLOCKSIZE = 256
quantize_multiplier = K.quantize_multiplier

_SCHEMES = ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
            "per_channel_symmetric")


# ---- ranges and qparams --------------------------------------------------------------------------
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

    Oracle: ``mpt.reference.qparams_reference``; tests/test_quant.py also checks hand-derived values.
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
        if qscheme not in _SCHEMES or qscheme.startswith("per_channel") != self.per_channel:
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


# ---- differentiable fake quantization ------------------------------------------------------------
_FQ_FORMATS = ("fp32", "fp16", "bf16")


def _fq_input(x: np.ndarray) -> np.ndarray:
    fmt = get_format(x.dtype)
    if fmt.name not in _FQ_FORMATS:
        raise TypeError(f"fake quantization takes fp32, fp16 or bf16 tensors; got {fmt.name}")
    return opmath(x)


class _FakeQuantize(Function):
    """Affine fake quantization (per tensor when ``axis`` is None); backward ``dy·mask``."""

    @staticmethod
    def forward(ctx, x, scale, zero_point, axis, quant_min, quant_max):
        x32 = _fq_input(x)
        if axis is None:
            y, mask, _ = K.fake_quant_per_tensor(x32, scale, zero_point, quant_min, quant_max)
        else:
            y, mask, _ = K.fake_quant_per_channel(x32, scale, zero_point, axis, quant_min,
                                                  quant_max)
        ctx.save_for_backward(mask)
        return round_to(y, get_format(x.dtype))

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved
        return opmath(g) * mask, None, None, None, None, None


def _scale32(scale) -> np.ndarray:
    s = np.asarray(scale.data if isinstance(scale, Tensor) else scale)
    return s.astype(np.float32)


def _zero_points(zero_point) -> np.ndarray:
    z = np.asarray(zero_point.data if isinstance(zero_point, Tensor) else zero_point)
    if z.dtype.kind not in "iu":
        raise TypeError(f"zero_point must be integers; got {z.dtype}")
    return z.astype(np.int64)


def fake_quantize_per_tensor_affine(x: Tensor, scale, zero_point, quant_min: int,
                                    quant_max: int) -> Tensor:
    """PyTorch's ``torch.fake_quantize_per_tensor_affine`` (module docstring), differentiable
    with the straight-through estimator ``dx = dy·(qmin <= qf <= qmax)``. ``scale`` is rounded to
    float32 once; output in ``x``'s format."""
    return _FakeQuantize.apply(x, _scale32(scale).reshape(()), int(_zero_points(zero_point)
                                                                    .reshape(())),
                               None, quant_min, quant_max)


def fake_quantize_per_channel_affine(x: Tensor, scale, zero_point, axis: int, quant_min: int,
                                     quant_max: int) -> Tensor:
    """PyTorch's ``torch.fake_quantize_per_channel_affine`` (int zero points), one scale and
    zero point per slice along ``axis``; straight-through gradient as the per-tensor op."""
    return _FakeQuantize.apply(x, _scale32(scale).ravel(), _zero_points(zero_point).ravel(), axis,
                               quant_min, quant_max)


class _LearnableFakeQuantize(Function):
    @staticmethod
    def forward(ctx, x, scale, zero_point, quant_min, quant_max, grad_factor):
        if x.dtype != np.float32 or scale.dtype != np.float32 or zero_point.dtype != np.float32:
            raise TypeError("learnable fake quantization takes fp32 x, scale and zero_point "
                            "(as PyTorch's kernel)")
        zf = K.forward_zero_point(zero_point.reshape(()), quant_min, quant_max)
        y, _, _ = K.fake_quant_per_tensor(x, scale.reshape(()), zf, quant_min, quant_max)
        ctx.save_for_backward(x, scale, zero_point)
        ctx.args = (quant_min, quant_max, grad_factor, scale.shape, zero_point.shape)
        return y

    @staticmethod
    def backward(ctx, g):
        x, scale, zero_point = ctx.saved
        quant_min, quant_max, grad_factor, s_shape, z_shape = ctx.args
        dx, ds, dz, _, _ = K.fake_quant_learnable_grad(x, opmath(g), scale.reshape(()),
                                                       zero_point.reshape(()), quant_min,
                                                       quant_max, grad_factor)
        return dx, np.full(s_shape, ds), np.full(z_shape, dz), None, None, None


def fake_quantize_learnable_per_tensor_affine(x: Tensor, scale: Tensor, zero_point: Tensor,
                                              quant_min: int, quant_max: int,
                                              grad_factor: float = 1.0) -> Tensor:
    """PyTorch's ``torch._fake_quantize_learnable_per_tensor_affine`` (LSQ, Esser et al. 2020)
    with a learnable float32 ``scale`` and ``zero_point`` (one-element fp32 Tensors).

    Forward: fake quantization with ``z = trunc(clamp(rne(zero_point)))``. Backward (PyTorch's
    formulas, ``mpt.kernels.quant``): ``dx = dy`` inside the range else 0; ``dscale = Σ dy·(xfq −
    x)/s`` inside, ``Σ dy·(qmin − z)`` below, ``Σ dy·(qmax − z)`` above; ``dzero_point = Σ −dy·s``
    outside; each term times ``grad_factor`` (LSQ's ``g = 1/√(numel·qmax)``, :func:`lsq_grad_factor`).
    The sums are float64 sequential sums rounded once to float32 (PyTorch: a float32 ``sum``).
    """
    return _LearnableFakeQuantize.apply(x, scale, zero_point, quant_min, quant_max, grad_factor)


def lsq_grad_factor(numel: int, quant_max: int) -> float:
    """LSQ's gradient scale ``g = 1/√(numel · Q_P)`` (Esser et al. 2020, §2.2)."""
    return 1.0 / math.sqrt(check_int("numel", numel, min=1) * check_int("quant_max", quant_max,
                                                                        min=1))


def lsq_init_scale(x, quant_max: int) -> np.float32:
    """LSQ's initial step size ``s = 2·mean|x| / √Q_P`` (float64, rounded once to float32)."""
    quant_max = check_int("quant_max", quant_max, min=1)
    values = np.abs(np.asarray(x.data if isinstance(x, Tensor) else x, np.float64))
    if values.size == 0:
        raise ValueError("x must have at least one element (its mean |x| sets the scale)")
    return np.float32(2.0 * math.fsum(values.ravel()) / values.size / math.sqrt(quant_max))


class _FakeQuantizeFP8(Function):
    @staticmethod
    def forward(ctx, x, fmt, scale):
        s = np.float32(scale)
        with np.errstate(over="ignore", invalid="ignore"):
            t = _fq_input(x) * s                                         # float32 product
            y = opmath(round_format(t, fmt, saturate=True)) * (np.float32(1) / s)
            mask = np.abs(t) <= np.float32(fmt.max)                      # NaN: False
        ctx.save_for_backward(mask)
        return round_to(y, get_format(x.dtype))

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved
        return opmath(g) * mask, None, None


def fake_quantize_fp8(x: Tensor, format="e4m3", scale=1.0) -> Tensor:
    """FP8 fake quantization with a per-tensor scale (Transformer Engine's convention: the scale
    multiplies): ``y = fl32(q · fl32(1/s))``, ``q = round(fl32(x·s), format, RNE, saturate=True)``
    (overflow and ±Inf clamp to ±max; NaN stays NaN). Straight-through gradient masked where
    ``|x·s| > max`` (the saturated elements), as the integer fake quantizers mask their clamp.
    ``format``: any FP8 format (``e4m3``, ``e5m2``, fnuz variants); ``scale`` a positive float
    (rounded to float32, whose reciprocal must be finite: :func:`mpt.fp8.check_scale`). Output in
    ``x``'s format."""
    fmt = get_format(format)
    if fmt.kind != "float" or fmt.bits != 8:
        raise ValueError(f"format must be an FP8 format; got {fmt.name}")
    return _FakeQuantizeFP8.apply(x, fmt, check_scale("scale", scale))


# ---- codebooks: NF4 and the 8-bit dynamic map ----------------------------------------------------
def _midpoints(levels: np.ndarray) -> np.ndarray:
    """Exact float64 midpoints of adjacent float32 levels (25 significant bits at most)."""
    lv = levels.astype(np.float64)
    return (lv[:-1] + lv[1:]) / 2


def nf4_decision_points(rule: str = "nearest") -> np.ndarray:
    """The 15 float64 thresholds ``m_k``: code = #{k : x > m_k}.

    ``"nearest"``: exact midpoints — the nearest level, an exact tie to the lower level.
    ``"bitsandbytes"``: the midpoints rounded to float32, as bitsandbytes' decision tree compares
    against float32 constants; it differs from "nearest" only for the six float32 inputs equal to
    a midpoint that rounded up (there it picks the lower level, 2^-25 relatively farther).
    """
    mids = _midpoints(np.array(get_format("nf4").levels, np.float32))
    if rule == "nearest":
        return mids
    if rule == "bitsandbytes":
        return mids.astype(np.float32).astype(np.float64)
    raise ValueError(f"rule must be 'nearest' or 'bitsandbytes'; got {rule!r}")


def dynamic_map() -> np.ndarray:
    """bitsandbytes' signed 8-bit dynamic map (``create_dynamic_map(signed=True)``), 256 sorted
    float32 values: for i = 0..6 the 2^i midpoints of ``linspace(0.1, 1, 2^i + 1)`` times
    ``10^(i−6)``, both signs, plus 0 and 1.0 (no −1). Built in float64, rounded once to float32
    (bitsandbytes builds it with float32 ``torch.linspace``: a value may differ in its last bit).
    Largest half-gap: 0.9/128 = 0.00703125 (the top decade, and −1 against −0.99296875).
    """
    values = [0.0, 1.0]
    for i in range(7):
        bounds = np.linspace(0.1, 1.0, 2**i + 1)
        means = 10.0 ** (i - 6) * (bounds[:-1] + bounds[1:]) / 2
        values += list(means) + list(-means)
    return np.sort(np.array(values, np.float64)).astype(np.float32)


def _int_codes(name: str, values, bits: int) -> np.ndarray:
    """``values`` (integers in [0, 2^bits)) as a flat uint8 array; a float, bool or out-of-range
    value is refused, never truncated."""
    arr = np.asarray(values)
    top = (1 << bits) - 1
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers in [0, {top}]; got dtype {arr.dtype}")
    if arr.size and not 0 <= arr.min() <= arr.max() <= top:
        raise ValueError(f"{name} must be integers in [0, {top}] ({bits}-bit); got values in "
                         f"[{arr.min()}, {arr.max()}]")
    return arr.astype(np.uint8).ravel()


def pack_nibbles(codes) -> np.ndarray:
    """uint8 bytes holding two 4-bit codes each, the first in the high nibble (a trailing odd code
    gets a zero low nibble). ``codes``: integers in [0, 15]."""
    codes = _int_codes("codes", codes, 4)
    padded = np.zeros(codes.size + codes.size % 2, np.uint8)
    padded[:codes.size] = codes
    return (padded[0::2] << np.uint8(4)) | padded[1::2]


def unpack_nibbles(packed, n: int) -> np.ndarray:
    """The first ``n`` 4-bit codes of :func:`pack_nibbles` bytes (integers in [0, 255])."""
    packed = _int_codes("packed", packed, 8)
    n = check_int("n", n, min=0, max=2 * packed.size)
    return np.stack([packed >> np.uint8(4), packed & np.uint8(15)], axis=1).ravel()[:n]


@dataclass(frozen=True)
class NF4Weight:
    """A tensor stored in NF4: packed codes, one float32 absmax per block of 64 — or, with double
    quantization, the absmax as dynamic-map codes with one float32 scale per 256 of them plus
    their float32 mean (``absmax_offset``)."""

    packed: np.ndarray                     # (ceil(n/2),) uint8
    shape: tuple
    blocksize: int
    absmax: np.ndarray | None              # (nblocks,) float32, without double quantization
    absmax_codes: np.ndarray | None = None  # (nblocks,) uint8 dynamic-map codes
    absmax_scale: np.ndarray | None = None  # (ceil(nblocks/256),) float32
    absmax_offset: np.float32 | None = None

    def __post_init__(self):
        """Check that every field has the dtype and size the kernels index (``nblocks =
        ceil(n/blocksize)``, n the product of ``shape``), and that the absmax values are finite
        and >= 0: a mismatch would read outside the arrays."""
        if not isinstance(self.shape, (tuple, list)):
            raise TypeError(f"shape must be a tuple of non-negative ints; got "
                            f"{type(self.shape).__name__}")
        shape = tuple(check_int(f"shape[{i}]", d, min=0) for i, d in enumerate(self.shape))
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "blocksize", check_int("blocksize", self.blocksize, min=1))
        n = math.prod(shape)
        nblocks = -(-n // self.blocksize)
        check_array("packed", self.packed, np.uint8, shape=(-(-n // 2),))
        if self.absmax_codes is None:
            if self.absmax_scale is not None or self.absmax_offset is not None:
                raise ValueError("absmax_scale and absmax_offset belong to double quantization: "
                                 "give absmax_codes too (and absmax=None)")
            _check_absmax("absmax", self.absmax, nblocks)
            return
        if self.absmax is not None:
            raise ValueError("give absmax or, with double quantization, absmax_codes; not both")
        check_array("absmax_codes", self.absmax_codes, np.uint8, shape=(nblocks,))
        _check_absmax("absmax_scale", self.absmax_scale, -(-nblocks // DQ_BLOCKSIZE))
        offset = check_real("absmax_offset", self.absmax_offset)
        if float(np.float32(offset)) != offset:
            raise ValueError(f"absmax_offset must be a float32 value; got {self.absmax_offset!r}")
        object.__setattr__(self, "absmax_offset", np.float32(offset))

    @property
    def double_quant(self) -> bool:
        return self.absmax_codes is not None

    def block_absmax(self) -> np.ndarray:
        """The float32 absmax used to dequantize (decoded from double quantization if used):
        ``fl32(fl32(code·scale) + offset)``."""
        if not self.double_quant:
            return self.absmax
        centered = K.blockwise_decode(self.absmax_codes, dynamic_map(), self.absmax_scale,
                                      DQ_BLOCKSIZE)
        return centered + self.absmax_offset

    @property
    def nbytes(self) -> int:
        parts = (self.packed, self.absmax, self.absmax_codes, self.absmax_scale)
        return sum(p.nbytes for p in parts if p is not None) + (4 if self.double_quant else 0)


def _check_absmax(name: str, value, size: int) -> None:
    check_array(name, value, np.float32, shape=(size,))
    if not (check_finite(name, value) >= 0).all():
        raise ValueError(f"{name} must be >= 0 (a block's largest magnitude); got a negative "
                         "value")


def nf4_quantize(x, blocksize: int = NF4_BLOCKSIZE, double_quant: bool = False,
                 rule: str = "nearest") -> NF4Weight:
    """NF4 of a finite float32 array (flattened in C order): per block ``absmax = max|x|``,
    ``code = nearest level of fl32(x·fl32(1/absmax))`` (:func:`nf4_decision_points`), packed.

    ``double_quant``: ``offset = fl32(mean(absmax))`` (float64 ``fsum``), the centered
    ``fl32(absmax − offset)`` quantized with :func:`dynamic_map` in blocks of 256 the same way.
    The decoded absmax then satisfies (tests/test_nf4.py) ``|absmax' − absmax| <= A2·(0.00703125
    + 2^-20) + 2^-24·|absmax'|``, A2 the block's max |absmax − offset|. Oracle:
    ``mpt.reference.blockwise_absmax_reference``.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"x must be float32 (decode fp16/bf16 first); got {x.dtype}")
    codes, absmax = K.blockwise_absmax_encode(x.ravel(), blocksize, nf4_decision_points(rule))
    packed = pack_nibbles(codes)
    if not double_quant:
        return NF4Weight(packed, x.shape, blocksize, absmax)
    offset = np.float32(math.fsum(absmax.astype(np.float64)) / absmax.size)
    dcodes, dscale = K.blockwise_absmax_encode(absmax - offset, DQ_BLOCKSIZE,
                                               _midpoints(dynamic_map()))
    return NF4Weight(packed, x.shape, blocksize, None, dcodes, dscale, offset)


def nf4_dequantize(w: NF4Weight) -> np.ndarray:
    """float32 ``fl32(level[code] · absmax[block])`` in the stored shape."""
    n = int(np.prod(w.shape, dtype=np.int64))
    codes = unpack_nibbles(w.packed, n)
    levels = np.array(get_format("nf4").levels, np.float32)
    return K.blockwise_decode(codes, levels, w.block_absmax(), w.blocksize).reshape(w.shape)


# ---- int8 per-channel weight storage -------------------------------------------------------------
@dataclass(frozen=True)
class Int8Weight:
    """Symmetric per-channel int8 weights: ``codes`` (int8, the weight's shape) and one float32
    ``scale`` per slice along ``axis``; value ``fl32(code · scale)``."""

    codes: np.ndarray
    scale: np.ndarray
    axis: int = 0

    def __post_init__(self):
        """int8 ``codes`` of at least one dimension, ``axis`` one of them (stored normalised to
        ``[0, ndim)``), one finite float32 ``scale`` > 0 per slice along it."""
        codes = check_array("codes", self.codes, np.int8)
        if codes.ndim == 0:
            raise ValueError("codes must have at least one dimension (the channel axis)")
        axis = check_int("axis", self.axis, min=-codes.ndim, max=codes.ndim - 1) % codes.ndim
        object.__setattr__(self, "axis", axis)
        scale = check_array("scale", self.scale, np.float32, shape=(codes.shape[axis],))
        if not (check_finite("scale", scale) > 0).all():
            raise ValueError("scale must be > 0 in every channel")

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes

    def dequantize(self) -> np.ndarray:
        shape = [1] * self.codes.ndim
        shape[self.axis] = self.scale.size
        # |code| <= 128 < 2^24: fl32(code·scale) equals the fake-quant kernel's double product
        return self.codes.astype(np.float32) * self.scale.reshape(shape)


def int8_quantize_per_channel(w, axis: int = 0) -> Int8Weight:
    """int8 codes of float32 ``w`` with PyTorch's per-channel symmetric qint8 qparams
    (``s = max(amax/127.5, 2^-23)``, z = 0) and its fake-quant arithmetic; ``dequantize()`` equals
    ``fake_quantize_per_channel_affine`` of ``w`` bit for bit."""
    w = np.asarray(w)
    if w.dtype != np.float32:
        raise TypeError(f"w must be float32; got {w.dtype}")
    if w.ndim == 0:
        raise ValueError("w must have at least one dimension (the channel axis)")
    axis = check_int("axis", axis, min=-w.ndim, max=w.ndim - 1)
    obs = PerChannelMinMaxObserver(ch_axis=axis, dtype="qint8", qscheme="per_channel_symmetric")
    obs(w)
    scale, zp = obs.calculate_qparams()
    _, _, codes = K.fake_quant_per_channel(w, scale, zp, axis, obs.quant_min, obs.quant_max)
    return Int8Weight(codes.astype(np.int8), scale, axis % w.ndim)


# ---- the FakeQuantize module ---------------------------------------------------------------------
class FakeQuantize(nn.Module):
    """PyTorch's ``FakeQuantize`` (version 0): observe, update ``scale``/``zero_point``, fake
    quantize — each step switchable (:meth:`enable_observer`, :meth:`enable_fake_quant`).

    ``FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=None, quant_max=None,
    **observer_kwargs)``; ``scale`` (float32 (C,)) and ``zero_point`` (int32 (C,)) start at 1 and 0.
    The observer sees the float32 values of the input (no gradient); fake quantization is
    :func:`fake_quantize_per_tensor_affine` or, for a per-channel observer, per channel along its
    ``ch_axis``.
    """

    def __init__(self, observer=MovingAverageMinMaxObserver, quant_min=None, quant_max=None,
                 **observer_kwargs):
        super().__init__()
        self.activation_post_process = observer(quant_min=quant_min, quant_max=quant_max,
                                                **observer_kwargs)
        self.quant_min = self.activation_post_process.quant_min
        self.quant_max = self.activation_post_process.quant_max
        self.scale = np.ones(1, np.float32)
        self.zero_point = np.zeros(1, np.int32)
        self.observer_enabled = True
        self.fake_quant_enabled = True

    @property
    def per_channel(self) -> bool:
        return self.activation_post_process.per_channel

    def enable_observer(self, enabled: bool = True) -> "FakeQuantize":
        self.observer_enabled = bool(enabled)
        return self

    def disable_observer(self) -> "FakeQuantize":
        return self.enable_observer(False)

    def enable_fake_quant(self, enabled: bool = True) -> "FakeQuantize":
        self.fake_quant_enabled = bool(enabled)
        return self

    def disable_fake_quant(self) -> "FakeQuantize":
        return self.enable_fake_quant(False)

    def calculate_qparams(self):
        return self.activation_post_process.calculate_qparams()

    def forward(self, x: Tensor) -> Tensor:
        if self.observer_enabled:
            self.activation_post_process(x)
            self.scale, self.zero_point = self.calculate_qparams()
        if not self.fake_quant_enabled:
            return x
        if self.per_channel:
            return fake_quantize_per_channel_affine(x, self.scale, self.zero_point,
                                                    self.activation_post_process.ch_axis,
                                                    self.quant_min, self.quant_max)
        return fake_quantize_per_tensor_affine(x, self.scale, self.zero_point, self.quant_min,
                                               self.quant_max)

    def codes(self, x) -> np.ndarray:
        """The clamped integer codes of float32 ``x`` under the current qparams (int32)."""
        values = _observed(x)
        if self.per_channel:
            return K.fake_quant_per_channel(values, self.scale, self.zero_point,
                                            self.activation_post_process.ch_axis, self.quant_min,
                                            self.quant_max)[2]
        return K.fake_quant_per_tensor(values, self.scale[0], int(self.zero_point[0]),
                                       self.quant_min, self.quant_max)[2]

    def extra_repr(self) -> str:
        return (f"[{self.quant_min}, {self.quant_max}], scale={self.scale}, "
                f"zero_point={self.zero_point}, observer={self.observer_enabled}, "
                f"fake_quant={self.fake_quant_enabled}")


# ---- QAT: configuration, stubs, QAT layers -------------------------------------------------------
@dataclass(frozen=True)
class QConfig:
    """Factories of the activation and weight :class:`FakeQuantize` of a QAT layer."""

    activation: Callable[[], FakeQuantize]
    weight: Callable[[], FakeQuantize]


def default_qat_qconfig(backend: str = "fbgemm") -> QConfig:
    """PyTorch's default QAT qconfig: activations quint8 with ``reduce_range`` ([0, 127],
    MovingAverageMinMax, affine); weights qint8 [-128, 127] symmetric — per channel (axis 0,
    MovingAveragePerChannelMinMax) for ``"fbgemm"``/``"x86"`` (PyTorch's default backend), per
    tensor (MovingAverageMinMax) for ``"qnnpack"``/``"default"`` (``torch.ao.quantization
    .default_qat_qconfig``)."""
    activation = partial(FakeQuantize, observer=MovingAverageMinMaxObserver, quant_min=0,
                         quant_max=255, reduce_range=True, dtype="quint8")
    if backend in ("fbgemm", "x86"):
        weight = partial(FakeQuantize, observer=MovingAveragePerChannelMinMaxObserver,
                         quant_min=-128, quant_max=127, dtype="qint8",
                         qscheme="per_channel_symmetric", ch_axis=0)
    elif backend in ("qnnpack", "default"):
        weight = partial(FakeQuantize, observer=MovingAverageMinMaxObserver, quant_min=-128,
                         quant_max=127, dtype="qint8", qscheme="per_tensor_symmetric")
    else:
        raise ValueError(f"backend must be 'fbgemm', 'x86', 'qnnpack' or 'default'; got {backend!r}")
    return QConfig(activation, weight)


class QuantStub(nn.Module):
    """Marks where float inputs enter the quantized part: identity until :func:`prepare_qat`
    gives it an activation fake quantizer, then :func:`convert` makes it :class:`Quantize`."""

    def __init__(self):
        super().__init__()
        self.activation_post_process = None

    def forward(self, x):
        return x if self.activation_post_process is None else self.activation_post_process(x)


class DeQuantStub(nn.Module):
    """Marks where the quantized part returns float values (identity in float and QAT models)."""

    def forward(self, x):
        return x


class _QATLayer(nn.Module):
    """A float layer with fake-quantized weight and output (PyTorch's ``nn.qat`` modules); the
    input is already fake quantized by whatever produced it (a QuantStub or a QAT layer).
    ``relu=True`` fuses a ReLU before the output fake quantizer (``LinearReLU``/``ConvReLU2d``)."""

    def __init__(self, layer, qconfig: QConfig, relu: bool):
        super().__init__()
        self.weight = layer.weight
        self.bias = layer.bias
        self.relu = bool(relu)
        self.weight_fake_quant = qconfig.weight()
        self.activation_post_process = qconfig.activation()

    def _op(self, x, w):
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        y = self._op(x, self.weight_fake_quant(self.weight))
        return self.activation_post_process(F.relu(y) if self.relu else y)


class QATLinear(_QATLayer):
    """:class:`_QATLayer` over ``F.linear`` (weight (out, in), per-channel axis 0)."""

    def _op(self, x, w):
        return F.linear(x, w, self.bias)


class QATConv2d(_QATLayer):
    """:class:`_QATLayer` over ``F.conv2d`` (stride, padding, dilation of the wrapped conv)."""

    def __init__(self, conv, qconfig: QConfig, relu: bool):
        super().__init__(conv, qconfig, relu)
        self.stride, self.padding, self.dilation = conv.stride, conv.padding, conv.dilation
        if getattr(conv, "groups", 1) != 1:
            raise ValueError("QAT conv2d supports groups=1 only")

    def _op(self, x, w):
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation)


def prepare_qat(model: nn.Module, qconfig: QConfig | None = None, fuse_relu=()) -> nn.Module:
    """Swap every ``nn.Linear``/``nn.Conv2d`` of ``model`` (in place, recursively) for a
    :class:`QATLinear`/:class:`QATConv2d` sharing its parameters, and give every
    :class:`QuantStub` an activation fake quantizer. ``fuse_relu`` names (dotted) the layers
    followed by a ReLU that the model applies itself: their QAT layer applies it before the
    output fake quantizer and the model's own ReLU then sees non-negative values (a no-op).
    Default qconfig: :func:`default_qat_qconfig` ("fbgemm"). Returns ``model``.
    """
    qconfig = qconfig or default_qat_qconfig()
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, QuantStub):
                child.activation_post_process = qconfig.activation()
            elif type(child) is nn.Linear:
                _replace(module, child_name, QATLinear(child, qconfig, full in fuse_relu))
            elif type(child) is nn.Conv2d:
                _replace(module, child_name, QATConv2d(child, qconfig, full in fuse_relu))
    return model


def _replace(parent: nn.Module, name: str, child: nn.Module) -> None:
    """Swap a registered child keeping its position (``Sequential`` runs children in order)."""
    parent._modules[name] = child
    object.__setattr__(parent, name, child)


# ---- the integer-only model ----------------------------------------------------------------------
@dataclass(frozen=True)
class QTensor:
    """An integer tensor with its affine qparams: value ``scale·(q − zero_point)``."""

    q: np.ndarray               # uint8 or int8 codes
    scale: np.float32
    zero_point: int

    def __post_init__(self):
        """``q`` an int8 or uint8 array, ``scale`` a finite float32 value > 0 (stored as
        ``np.float32``), ``zero_point`` an int within ``q``'s dtype."""
        if not isinstance(self.q, np.ndarray) or self.q.dtype not in (np.int8, np.uint8):
            got = f"dtype {self.q.dtype}" if isinstance(self.q, np.ndarray) else \
                type(self.q).__name__
            raise TypeError(f"q must be an int8 or uint8 ndarray; got {got}")
        scale = check_real("scale", self.scale, gt=0)
        if float(np.float32(scale)) != scale:
            raise ValueError(f"scale must be a float32 value; got {self.scale!r}")
        object.__setattr__(self, "scale", np.float32(scale))
        info = np.iinfo(self.q.dtype)
        object.__setattr__(self, "zero_point", check_int("zero_point", self.zero_point,
                                                         min=int(info.min), max=int(info.max)))

    @property
    def shape(self) -> tuple:
        return self.q.shape

    def dequantize(self) -> np.ndarray:
        """float32 ``fl32(fl32(q − z)·scale)`` (the fake-quant dequantization)."""
        return (self.q.astype(np.float32) - np.float32(self.zero_point)) * self.scale


def _code_dtype(qmin: int, qmax: int):
    return np.uint8 if qmin >= 0 and qmax <= 255 else np.int8


class Quantize(nn.Module):
    """float → :class:`QTensor` with frozen qparams (what a QuantStub becomes)."""

    def __init__(self, fq: FakeQuantize):
        super().__init__()
        self.scale, self.zero_point = np.float32(fq.scale[0]), int(fq.zero_point[0])
        self.quant_min, self.quant_max = fq.quant_min, fq.quant_max

    def forward(self, x) -> QTensor:
        codes = K.fake_quant_per_tensor(_observed(x), self.scale, self.zero_point,
                                        self.quant_min, self.quant_max)[2]
        return QTensor(codes.astype(_code_dtype(self.quant_min, self.quant_max)), self.scale,
                       self.zero_point)


class DeQuantize(nn.Module):
    """:class:`QTensor` → float32 Tensor (``QTensor.dequantize``)."""

    def forward(self, x: QTensor) -> Tensor:
        return Tensor(x.dequantize())


class _IntLayer(nn.Module):
    """Integer-only layer: int8 weights (symmetric, per channel or per tensor), int32 bias
    ``rne(b / (Sx·Sw))`` (float64), int32 accumulation of ``(qx − zx)·qw``, gemmlowp
    requantization with ``M_c = Sx·Sw_c/So`` (float64, one rounding) → ``(M0, shift)``, plus
    ``zo``, clamped (and at ``zo`` below when a ReLU was fused)."""

    def __init__(self, qat: _QATLayer):
        super().__init__()
        wfq, out = qat.weight_fake_quant, qat.activation_post_process
        if wfq.zero_point.any():
            raise ValueError("integer layers need symmetric weights (zero point 0)")
        self.weight_codes = wfq.codes(qat.weight).astype(np.int8)             # (O, ...)
        channels = self.weight_codes.shape[0]
        self.weight_scale = np.broadcast_to(wfq.scale, channels).astype(np.float32)
        self.bias = None if qat.bias is None else _observed(qat.bias).astype(np.float64)
        self.out_scale, self.out_zero_point = np.float32(out.scale[0]), int(out.zero_point[0])
        self.quant_min, self.quant_max = out.quant_min, out.quant_max
        if qat.relu:
            self.quant_min = max(self.quant_min, self.out_zero_point)

    def requant_params(self, in_scale):
        """``(bias_q int64 (O,) or None, M0 (O,), shift (O,))`` for an input scale."""
        prod = np.float64(in_scale) * self.weight_scale.astype(np.float64)   # exact
        bias_q = None if self.bias is None else np.rint(self.bias / prod).astype(np.int64)
        mults = [K.quantize_multiplier(m) for m in prod / np.float64(self.out_scale)]
        return bias_q, np.array([m for m, _ in mults]), np.array([s for _, s in mults])

    def _accumulate(self, x: QTensor) -> np.ndarray:
        raise NotImplementedError

    def forward(self, x: QTensor) -> QTensor:
        acc = self._accumulate(x)                                              # int32, channel last
        bias_q, m0, shift = self.requant_params(x.scale)
        if bias_q is not None:
            acc = (acc.astype(np.int64) + bias_q).astype(np.int32)             # |acc| < 2^31 checked
        q = K.requantize(acc, m0, shift, self.out_zero_point, self.quant_min, self.quant_max)
        return QTensor(q.astype(_code_dtype(self.quant_min, self.quant_max)), self.out_scale,
                       self.out_zero_point)


class IntLinear(_IntLayer):
    """Integer-only ``linear`` (input (..., in) codes)."""

    def _accumulate(self, x: QTensor) -> np.ndarray:
        rows = x.q.reshape(-1, x.shape[-1])                                    # (M, in)
        acc = K.int_matmul(rows, x.zero_point, self.weight_codes, 0)           # (M, out)
        return acc.reshape(*x.shape[:-1], -1)


class IntConv2d(_IntLayer):
    """Integer-only ``conv2d`` (groups 1): im2col of the input codes (padding with ``zx``, so
    padded taps contribute 0), then :func:`mpt.kernels.quant.int_matmul`."""

    def __init__(self, qat: QATConv2d):
        super().__init__(qat)
        self.stride, self.padding, self.dilation = (_pair(v) for v in
                                                    (qat.stride, qat.padding, qat.dilation))

    def _accumulate(self, x: QTensor) -> np.ndarray:
        n, c, h, w = x.shape
        o, _, kh, kw = self.weight_codes.shape
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.padding, self.dilation
        padded = np.pad(x.q, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=x.zero_point)
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        iy = (np.arange(oh) * sh)[:, None] + np.arange(kh) * dh                # (oh, kh)
        ix = (np.arange(ow) * sw)[:, None] + np.arange(kw) * dw                # (ow, kw)
        cols = padded[:, :, iy[:, None, :, None], ix[None, :, None, :]]        # (N, C, oh, ow, kh, kw)
        cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)
        acc = K.int_matmul(np.ascontiguousarray(cols), x.zero_point,
                           self.weight_codes.reshape(o, -1), 0)                # (N·oh·ow, O)
        return acc.reshape(n, oh, ow, o)

    def forward(self, x: QTensor) -> QTensor:
        out = super().forward(x)                                               # (N, oh, ow, O)
        return QTensor(np.ascontiguousarray(out.q.transpose(0, 3, 1, 2)), out.scale,
                       out.zero_point)


def _pair(v) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (int(v), int(v))


def convert(model: nn.Module) -> nn.Module:
    """Replace (in place) QuantStub → :class:`Quantize`, DeQuantStub → :class:`DeQuantize`,
    QATLinear → :class:`IntLinear`, QATConv2d → :class:`IntConv2d` with the qparams the fake
    quantizers hold now. Returns ``model``.

    Exactness (tests/test_requant.py): per output element let ``r = acc·M`` (exact) be the
    integer layer's ideal output code before rounding. The fake-quant model's pre-rounding value
    differs from ``r`` by at most ``δ + ε_f`` — ``δ`` the exact difference between the float
    model's ideal sum ``Σ x_fq·w_fq + b`` and ``Sx·Sw·acc`` (dequantization roundings of
    ``x_fq``/``w_fq`` and the bias rounding, over ``So``), ``ε_f`` its float32 GEMM, bias and
    reciprocal roundings — and the integer pipeline's by at most ``ε_i = 2^-(n+1) + |acc|·|M0·2^(shift−31)
    − M|`` (SRDHM's rounding, the multiplier's). Where ``r`` is farther than both from every
    half-integer, the int8 output equals the fake-quant model's code exactly; elsewhere (near
    ties, where fake quant rounds half to even and gemmlowp half away) they differ by at most 1.
    """
    for _, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, QuantStub):
                if child.activation_post_process is None:
                    raise ValueError("convert: run prepare_qat (and calibrate) first")
                _replace(module, child_name, Quantize(child.activation_post_process))
            elif isinstance(child, DeQuantStub):
                _replace(module, child_name, DeQuantize())
            elif isinstance(child, QATConv2d):
                _replace(module, child_name, IntConv2d(child))
            elif isinstance(child, QATLinear):
                _replace(module, child_name, IntLinear(child))
    return model
