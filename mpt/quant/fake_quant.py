"""L4: differentiable fake quantization — fixed, learnable (LSQ) and FP8 — and the
``FakeQuantize`` module (an observer plus the op).

Fake quantization follows PyTorch's CPU kernels bit for bit (``mpt.kernels.quant``): float32
reciprocal of the scale, ``rne(x·inv)`` in float32, the zero point added in float32, clamp, the
straight-through mask on the unclamped value, float32 dequantization. Inputs may be fp32, fp16 or
bf16 (decoded exactly to float32; the float32 result is rounded RNE to the input's format, as
PyTorch stores ``scalar_t``); scales are float32 (rounded once from a Python float, as PyTorch's
``double → float`` argument conversion does) and zero points ints. Oracle:
``mpt.reference.quant``; with torch installed, ``torch.fake_quantize_*`` themselves.
"""
from __future__ import annotations

import math

import numpy as np

from mpt import nn
from mpt._checks import check_int
from mpt.amp.fp8 import check_scale
from mpt.autograd.function import Function
from mpt.autograd.tensor import Tensor, opmath, round_to
from mpt.formats import get_format
from mpt.kernels import quant as K
from mpt.quant.observers import MovingAverageMinMaxObserver, _observed
from mpt.rounding import round as round_format

__all__ = ["fake_quantize_per_tensor_affine", "fake_quantize_per_channel_affine",
           "fake_quantize_learnable_per_tensor_affine", "lsq_init_scale", "lsq_grad_factor",
           "fake_quantize_fp8", "FakeQuantize"]


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
    outside; each term times ``grad_factor`` (LSQ's ``g = 1/√(numel·qmax)``,
    :func:`lsq_grad_factor`). The sums are float64 sequential sums rounded once to float32
    (PyTorch: a float32 ``sum``).
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


