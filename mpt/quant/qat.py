"""L4: quantization-aware training — the QAT configuration, stubs, QAT layers and
``prepare_qat`` (PyTorch's eager-mode workflow)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import mpt.functional as F
from mpt import nn
from mpt.autograd.tensor import Tensor
from mpt.quant.fake_quant import FakeQuantize
from mpt.quant.observers import MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver

__all__ = ["QConfig", "default_qat_qconfig", "QuantStub", "DeQuantStub", "QATLinear", "QATConv2d",
           "prepare_qat"]


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
        raise ValueError("backend must be 'fbgemm', 'x86', 'qnnpack' or 'default'; "
                         f"got {backend!r}")
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


def prepare_qat(network: nn.Module, qconfig: QConfig | None = None, fuse_relu=()) -> nn.Module:
    """Swap every ``nn.Linear``/``nn.Conv2d`` of ``network`` (in place, recursively) for a
    :class:`QATLinear`/:class:`QATConv2d` sharing its parameters, and give every
    :class:`QuantStub` an activation fake quantizer. ``fuse_relu`` names (dotted) the layers
    followed by a ReLU that the network applies itself: their QAT layer applies it before the
    output fake quantizer and the network's own ReLU then sees non-negative values (a no-op).
    Default qconfig: :func:`default_qat_qconfig` ("fbgemm"). Returns ``network``.
    """
    qconfig = qconfig or default_qat_qconfig()
    for name, module in list(network.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, QuantStub):
                child.activation_post_process = qconfig.activation()
            elif type(child) is nn.Linear:
                _replace(module, child_name, QATLinear(child, qconfig, full in fuse_relu))
            elif type(child) is nn.Conv2d:
                _replace(module, child_name, QATConv2d(child, qconfig, full in fuse_relu))
    return network


def _replace(parent: nn.Module, name: str, child: nn.Module) -> None:
    """Swap a registered child keeping its position (``Sequential`` runs children in order)."""
    parent._modules[name] = child
    object.__setattr__(parent, name, child)


