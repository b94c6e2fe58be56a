"""L4: quantization — observers, fake quantization (fixed, learnable, FP8), QAT and the integer-only
model, NF4 and int8 weight storage, and LoRA over any of these bases (``mpt.quant.lora``)."""
from mpt.quant.fake_quant import (FakeQuantize, fake_quantize_fp8,
                                  fake_quantize_learnable_per_tensor_affine,
                                  fake_quantize_per_channel_affine,
                                  fake_quantize_per_tensor_affine, lsq_grad_factor, lsq_init_scale)
from mpt.quant.integer import (DeQuantize, IntConv2d, IntLinear, QTensor, Quantize, convert,
                               quantize_multiplier)
from mpt.quant.observers import (AVERAGING_CONSTANT, EPS, MinMaxObserver,
                                 MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver,
                                 PerChannelMinMaxObserver, calculate_qparams, quant_range)
from mpt.quant.qat import (DeQuantStub, QATConv2d, QATLinear, QConfig, QuantStub,
                           default_qat_qconfig, prepare_qat)
from mpt.quant.storage import (DQ_BLOCKSIZE, NF4_BLOCKSIZE, Int8Weight, NF4Weight, dynamic_map,
                               int8_quantize_per_channel, nf4_decision_points, nf4_dequantize,
                               nf4_quantize, pack_nibbles, unpack_nibbles)

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
    # constants
    "EPS", "AVERAGING_CONSTANT", "DQ_BLOCKSIZE",
]
