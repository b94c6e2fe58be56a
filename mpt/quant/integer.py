"""L4: the integer-only network (Jacob et al. 2018) — ``convert`` turns a QAT network into int8
layers with int32 accumulation and gemmlowp's fixed-point requantization."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpt import nn
from mpt._checks import check_int, check_real
from mpt.autograd.tensor import Tensor
from mpt.kernels import quant as K
from mpt.quant.fake_quant import FakeQuantize
from mpt.quant.observers import _observed
from mpt.quant.qat import DeQuantStub, QATConv2d, QATLinear, QuantStub, _QATLayer, _replace

__all__ = ["QTensor", "IntLinear", "IntConv2d", "Quantize", "DeQuantize", "convert",
           "quantize_multiplier"]

quantize_multiplier = K.quantize_multiplier


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
            acc = (acc.astype(np.int64) + bias_q).astype(np.int32)            # |acc| < 2^31 checked
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
        cols = padded[:, :, iy[:, None, :, None], ix[None, :, None, :]]     # (N, C, oh, ow, kh, kw)
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


def convert(network: nn.Module) -> nn.Module:
    """Replace (in place) QuantStub → :class:`Quantize`, DeQuantStub → :class:`DeQuantize`,
    QATLinear → :class:`IntLinear`, QATConv2d → :class:`IntConv2d` with the qparams the fake
    quantizers hold now. Returns ``network``.

    Exactness (tests/test_requant.py): per output element let ``r = acc·M`` (exact) be the
    integer layer's ideal output code before rounding. The fake-quant network's pre-rounding value
    differs from ``r`` by at most ``δ + ε_f`` — ``δ`` the exact difference between the float
    network's ideal sum ``Σ x_fq·w_fq + b`` and ``Sx·Sw·acc`` (dequantization roundings of
    ``x_fq``/``w_fq`` and the bias rounding, over ``So``), ``ε_f`` its float32 GEMM, bias and
    reciprocal roundings — and the integer pipeline's by at most
    ``ε_i = 2^-(n+1) + |acc|·|M0·2^(shift−31) − M|`` (SRDHM's rounding, the multiplier's). Where
    ``r`` is farther than both from every half-integer, the int8 output equals the fake-quant
    network's code exactly; elsewhere (near ties, where fake quant rounds half to even and gemmlowp
    half away) they differ by at most 1.
    """
    for _, module in list(network.named_modules()):
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
    return network
