"""Bad input is refused with a clear error (issue 11): one row per hole found by probing the
public entry points, each asserting the exact exception type and a message that names the
argument and the expectation. Inputs that PyTorch answers with a result instead of an error
(an empty softmax, attention without keys, a variance with correction >= n, Linear(0, n), a NumPy
learning rate) have exact assertions of their own below, against PyTorch's documented behaviour
written out (torch itself is not a test dependency)."""
import json
import math
import os
import pathlib
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt import amp, fp8, lora, nn, optim, planning
from mpt import quant as Q
from mpt._checks import check_bool, check_finite, check_int, check_real
from mpt.amp.linear import Fp8Linear
from mpt.cli import main
from mpt.kernels import quant as KQ
from mpt.testing import as_bits as _bits
from mpt.train.trainer import TrainConfig, Trainer, learning_rate

NAN, INF = math.nan, math.inf
F32 = np.ones(4, np.float32)


def _p():
    return nn.Parameter(np.ones(3, np.float32))


P = _p()


def _sgd(**kw):
    return optim.SGD([_p()], **{"lr": 0.1, **kw})


def _adam(**kw):
    return optim.Adam([_p()], **kw)


def _scaler_update(new_scale):
    s = amp.GradScaler()
    s.scale(mpt.tensor(np.ones(1, np.float32)))
    s.update(new_scale=new_scale)


def _scaler_load(**changes):
    s = amp.GradScaler()
    state = {**s.state_dict(), **changes}
    s.load_state_dict({k: v for k, v in state.items() if v is not None})


def _nf4(packed=None, shape=(8,), blocksize=4, absmax=None, **dq):
    packed = np.zeros(4, np.uint8) if packed is None else packed
    absmax = np.ones(2, np.float32) if absmax is None and not dq else absmax
    return Q.NF4Weight(packed, shape, blocksize, absmax, **dq)


def _fp8_array(data=None, scale_inv=1.0, fmt="fp8_e4m3fn"):
    data = np.zeros(3, ml_dtypes.float8_e4m3fn) if data is None else data
    return fp8.Fp8Array(data, scale_inv, fmt)


def _add_twice():
    opt = optim.SGD([P], lr=0.1)
    opt.add_param_group({"params": [P]})


def _state_load(scale):
    s = fp8.DelayedScaling().state()
    state = s.state_dict()
    state["scale"] = np.array(scale, np.float32)
    s.load_state_dict(state)


def _tiny_trainer():
    return Trainer(nn.GPT(8, 8, 1, 2, 4), "fp32")


def _mma_config(**changes):
    args = dict(inputs=("fp16",), instruction="test", block=4, fraction_bits=23,
                outputs=(("fp32", "rz_fp32", -132),))
    return mpt.MMAConfig(**{**args, **changes})


def _block_model(**changes):
    """A block model with one configuration: its kind checks the parameters when it is built."""
    return mpt.MMAModel("m", "block", "", (_mma_config(**changes),))


BAD = [
    # ---- containers handed to kernels (NF4 crashed: nf4_dequantize read far out of bounds) ----
    ("nf4-crash", lambda: Q.NF4Weight(np.zeros(1 << 25, np.uint8), (1 << 26,), 1,
                                      np.ones(1, np.float32)),
     ValueError, r"absmax must have shape \(67108864,\); got \(1,\)"),
    ("nf4-packed-size", lambda: _nf4(packed=np.zeros(3, np.uint8)), ValueError,
     r"packed must have shape \(4,\)"),
    ("nf4-packed-dtype", lambda: _nf4(packed=np.zeros(4, np.int64)), TypeError,
     "packed must be a uint8 ndarray; got dtype int64"),
    ("nf4-blocksize-0", lambda: _nf4(blocksize=0), ValueError, "blocksize must be a positive int"),
    ("nf4-blocksize-float", lambda: _nf4(blocksize=4.0), TypeError,
     "blocksize must be a positive int; got float"),
    ("nf4-shape-negative", lambda: _nf4(shape=(-8,)), ValueError,
     r"shape\[0\] must be a non-negative int"),
    ("nf4-absmax-nan", lambda: _nf4(absmax=np.array([1, NAN], np.float32)), ValueError,
     "absmax must hold only finite values"),
    ("nf4-absmax-negative", lambda: _nf4(absmax=np.array([1, -1], np.float32)), ValueError,
     "absmax must be >= 0"),
    ("nf4-both-absmaxes", lambda: _nf4(absmax=np.ones(2, np.float32),
                                       absmax_codes=np.zeros(2, np.uint8)), ValueError,
     "give absmax or, with double quantization, absmax_codes; not both"),
    ("nf4-dq-codes-size", lambda: _nf4(absmax_codes=np.zeros(3, np.uint8),
                                       absmax_scale=np.ones(1, np.float32),
                                       absmax_offset=np.float32(0)), ValueError,
     r"absmax_codes must have shape \(2,\)"),
    ("nf4-dq-offset-not-float32", lambda: _nf4(absmax_codes=np.zeros(2, np.uint8),
                                               absmax_scale=np.ones(1, np.float32),
                                               absmax_offset=0.1), ValueError,
     "absmax_offset must be a float32 value"),
    ("decode-kernel-codes", lambda: KQ.blockwise_decode(np.array([16], np.uint8),
                                                        np.ones(16, np.float32),
                                                        np.ones(1, np.float32), 64), ValueError,
     "codes must index the 16 levels; got code 16"),
    ("decode-kernel-absmax", lambda: KQ.blockwise_decode(np.zeros(130, np.uint8),
                                                         np.ones(16, np.float32),
                                                         np.ones(2, np.float32), 64), ValueError,
     r"absmax must hold one value per block of 64 of the 130 codes \(3\); got 2"),
    ("int8-scale-size", lambda: Q.Int8Weight(np.zeros((2, 3), np.int8), np.ones(3, np.float32)),
     ValueError, r"scale must have shape \(2,\)"),
    ("int8-codes-dtype", lambda: Q.Int8Weight(np.zeros((2, 3)), np.ones(2, np.float32)),
     TypeError, "codes must be a int8 ndarray"),
    ("int8-axis", lambda: Q.Int8Weight(np.zeros((2, 3), np.int8), np.ones(2, np.float32), 2),
     ValueError, r"axis must be an int in \[-2, 1\]; got 2"),
    ("int8-scale-zero", lambda: Q.Int8Weight(np.zeros((2, 3), np.int8),
                                             np.array([1, 0], np.float32)), ValueError,
     "scale must be > 0 in every channel"),
    ("qtensor-dtype", lambda: Q.QTensor(np.zeros(3, np.float32), np.float32(1), 0), TypeError,
     "q must be an int8 or uint8 ndarray; got dtype float32"),
    ("qtensor-scale", lambda: Q.QTensor(np.zeros(3, np.uint8), 0.0, 0), ValueError,
     "scale must be a finite real number > 0; got 0.0"),
    ("qtensor-zero-point", lambda: Q.QTensor(np.zeros(3, np.uint8), np.float32(1), 300),
     ValueError, r"zero_point must be an int in \[0, 255\]; got 300"),
    ("fp8array-dtype", lambda: _fp8_array(data=np.zeros(3, np.float32)), TypeError,
     "data must be a float8_e4m3fn ndarray; got dtype float32"),
    ("fp8array-format", lambda: _fp8_array(fmt="fp16"), ValueError,
     "format must be an FP8 format; got fp16"),
    ("fp8array-scale-inv", lambda: _fp8_array(scale_inv=INF), ValueError,
     "scale_inv must be a finite real number > 0; got inf"),
    ("mxarray-scales", lambda: fp8.MXArray(np.zeros((2, 40), ml_dtypes.float8_e4m3fn),
                                           np.zeros((2, 1), ml_dtypes.float8_e8m0fnu),
                                           mpt.get_format("fp8_e4m3fn")), ValueError,
     r"scales must have shape \(2, 2\); got \(2, 1\)"),
    ("mma-config-block-0", lambda: _mma_config(block=0), ValueError,
     r"block must be None or a positive int; got 0"),
    ("mma-block-model-block", lambda: _block_model(block=64), ValueError,
     r"block must be an int in \[1, 32\]; got 64"),
    ("mma-block-model-fraction-bits", lambda: _block_model(fraction_bits=40), ValueError,
     r"fraction_bits must be an int in \[0, 25\]; got 40"),
    ("mma-block-model-e-zero", lambda: _block_model(outputs=(("fp32", "rz_fp32", -100),)),
     ValueError, r"e_zero of output fp32 must be an int in \[-300, -127\]"),
    ("fp8linear-split", lambda: Fp8Linear(nn.Linear(4, 4), split_accumulator=(1, 0, 0)),
     TypeError, r"split_accumulator\[0\] must be a bool"),
    ("fp8linear-model", lambda: Fp8Linear(nn.Linear(4, 4), model="pentium"), ValueError,
     "unknown MMA model 'pentium'"),
    ("mma-model-kind", lambda: mpt.MMAModel("m", "blocky", "", (_mma_config(),)), ValueError,
     "no operand class for MMA arithmetic kind 'blocky'; known kinds: block"),
    ("mma-unknown-option", lambda: mpt.mma(np.ones((2, 16), np.float16),
                                           np.ones((16, 2), np.float16), model="hopper",
                                           algorithm="BF16_BF16_F32"), TypeError,
     "model 'hopper' takes no option algorithm; its options: none"),
    ("mma-scales-unsupported", lambda: mpt.mma(np.ones((2, 16), np.float16),
                                               np.ones((16, 2), np.float16), model="hopper",
                                               scale_a=np.ones((2, 1), np.float32)), ValueError,
     "model 'hopper' takes no block scales"),
    ("mma-e8m0-scale-shape", lambda: mpt.mma(np.ones((2, 64), ml_dtypes.float4_e2m1fn),
                                             np.ones((64, 2), ml_dtypes.float4_e2m1fn),
                                             model="cdna4", scale_a=np.full((2, 1), 127, np.uint8),
                                             scale_b=np.full((2, 2), 127, np.uint8)), ValueError,
     r"scale_a must have shape \(2, 2\) \(one E8M0 scale per 32 k\); got \(2, 1\)"),
    ("gemm-e8m0-as-software-scale", lambda: mpt.gemm(
        np.ones((2, 64), ml_dtypes.float4_e2m1fn), np.ones((64, 2), ml_dtypes.float4_e2m1fn),
        model="cdna4", scale_a=np.ones((2, 2), ml_dtypes.float8_e8m0fnu), scale_b=np.float32(1)),
     TypeError, "scale_a is a float32 dequantisation scale; the instruction's float8_e8m0fnu "
                "block scales go in block_scale_a"),
    ("gemm-fp64-out", lambda: mpt.gemm(np.ones((2, 4)), np.ones((4, 2)), model="cdna3",
                                       out_format="bf16"), ValueError,
     "an FP64 accumulator \\(f64 instructions\\) takes out_format 'fp64'"),
    ("mma-amd-assumption", lambda: mpt.get_mma_model("mi300x").configure(several_nans="any"),
     ValueError, "several_nans must be one of 'first', 'last' for model 'cdna3'; got 'any'"),
    # ---- optimizers --------------------------------------------------------------------------
    ("sgd-lr-nan", lambda: _sgd(lr=NAN), ValueError, "lr must be a finite real number >= 0"),
    ("sgd-lr-inf", lambda: _sgd(lr=INF), ValueError, "lr must be a finite real number >= 0"),
    ("sgd-lr-negative", lambda: _sgd(lr=-0.1), ValueError, "lr must be a finite real number >= 0"),
    ("sgd-lr-bool", lambda: _sgd(lr=True), TypeError, "lr must be a finite real number >= 0; "
                                                      "got bool"),
    ("sgd-lr-str", lambda: _sgd(lr="0.1"), TypeError, "lr must be a finite real number"),
    ("sgd-momentum-nan", lambda: _sgd(momentum=NAN), ValueError,
     "momentum must be a finite real number >= 0; got nan"),
    ("sgd-momentum-negative", lambda: _sgd(momentum=-0.9), ValueError,
     "momentum must be a finite real number >= 0"),
    ("sgd-dampening-inf", lambda: _sgd(dampening=INF), ValueError,
     "dampening must be a finite real number; got inf"),
    ("sgd-weight-decay-nan", lambda: _sgd(weight_decay=NAN), ValueError,
     "weight_decay must be a finite real number >= 0"),
    ("sgd-nesterov-str", lambda: _sgd(momentum=0.9, nesterov="yes"), TypeError,
     "nesterov must be a bool"),
    ("adam-eps-nan", lambda: _adam(eps=NAN), ValueError, "eps must be a finite real number >= 0"),
    ("adam-eps-negative", lambda: _adam(eps=-1e-8), ValueError,
     "eps must be a finite real number >= 0"),
    ("adam-betas-float", lambda: _adam(betas=0.9), TypeError,
     r"betas must be a pair \(beta1, beta2\) of real numbers in \[0, 1\); got float 0.9"),
    ("adam-betas-one", lambda: _adam(betas=(0.9, 1.0)), ValueError,
     r"betas\[1\] must be a finite real number in \[0, 1\); got 1.0"),
    ("adam-betas-nan", lambda: _adam(betas=(NAN, 0.999)), ValueError,
     r"betas\[0\] must be a finite real number in \[0, 1\)"),
    ("adamw-weight-decay-inf", lambda: optim.AdamW([_p()], weight_decay=INF), ValueError,
     "weight_decay must be a finite real number >= 0"),
    ("param-twice-in-a-group", lambda: optim.SGD([P, P], lr=0.1), ValueError,
     r"params: parameter 1 of the group is listed twice"),
    ("param-in-two-groups", lambda: optim.SGD([{"params": [P]}, {"params": [P]}], lr=0.1),
     ValueError, "params: some parameters appear in more than one parameter group"),
    ("add-param-group-twice", _add_twice, ValueError,
     "params: some parameters appear in more than one parameter group"),
    ("optimizer-seed", lambda: _sgd(seed=-1), ValueError, r"seed must be an int in \[0, 2\*\*64"),
    ("step-inv-scale-nan", lambda: _sgd().step(inv_scale=NAN), ValueError,
     "inv_scale must be None or a real number > 0; got nan"),
    ("clip-max-norm-nan", lambda: optim.clip_grad_norm_([P], NAN), ValueError,
     "max_norm must be a real number >= 0; got nan"),
    ("clip-max-norm-negative", lambda: optim.clip_grad_norm_([P], -1.0), ValueError,
     "max_norm must be a real number >= 0"),
    # ---- loss scaling ------------------------------------------------------------------------
    ("scaler-init-inf", lambda: amp.GradScaler(init_scale=INF), ValueError,
     "init_scale must be a finite real number > 0; got inf"),
    ("scaler-init-nan", lambda: amp.GradScaler(init_scale=NAN), ValueError,
     "init_scale must be a finite real number > 0; got nan"),
    ("scaler-init-zero", lambda: amp.GradScaler(init_scale=0.0), ValueError,
     "init_scale must be a finite real number > 0"),
    ("scaler-init-float32-overflow", lambda: amp.GradScaler(init_scale=1e39), ValueError,
     "init_scale must round to a finite non-zero float32"),
    ("scaler-growth-factor", lambda: amp.GradScaler(growth_factor=1.0), ValueError,
     "growth_factor must be a finite real number > 1; got 1.0"),
    ("scaler-backoff-factor", lambda: amp.GradScaler(backoff_factor=1.0), ValueError,
     r"backoff_factor must be a finite real number in \(0, 1\); got 1.0"),
    ("scaler-growth-interval-float", lambda: amp.GradScaler(growth_interval=2.5), TypeError,
     r"growth_interval must be an int in \[1, 2\*\*31 - 1\]; got float"),
    ("scaler-growth-interval-zero", lambda: amp.GradScaler(growth_interval=0), ValueError,
     r"growth_interval must be an int in \[1, 2\*\*31 - 1\]; got 0"),
    ("scaler-min-above-max", lambda: amp.GradScaler(min_scale=4.0, max_scale=2.0), ValueError,
     "min_scale 4.0 exceeds max_scale 2.0"),
    ("scaler-min-scale-nan", lambda: amp.GradScaler(min_scale=NAN), ValueError,
     "min_scale must be None or a finite real number > 0"),
    ("scaler-enabled", lambda: amp.GradScaler(enabled="yes"), TypeError, "enabled must be a bool"),
    ("static-scale-inf", lambda: amp.StaticLossScale(INF), ValueError,
     "scale must be a finite real number > 0; got inf"),
    ("static-scale-negative", lambda: amp.StaticLossScale(-8.0), ValueError,
     "scale must be a finite real number > 0; got -8.0"),
    ("update-new-scale-negative", lambda: _scaler_update(-1.0), ValueError,
     "new_scale must be a finite real number > 0; got -1.0"),
    ("update-new-scale-nan", lambda: _scaler_update(NAN), ValueError,
     "new_scale must be a finite real number > 0; got nan"),
    ("update-new-scale-str", lambda: _scaler_update("2"), TypeError,
     "new_scale must be a finite real number > 0; got str"),
    ("scaler-load-scale", lambda: _scaler_load(scale=-1.0), ValueError,
     r"state_dict\['scale'\] must be a finite real number > 0; got -1.0"),
    ("scaler-load-growth-factor", lambda: _scaler_load(growth_factor=0.5), ValueError,
     r"state_dict\['growth_factor'\] must be a finite real number > 1"),
    ("scaler-load-tracker", lambda: _scaler_load(_growth_tracker=2000), ValueError,
     r"state_dict\['_growth_tracker'\] must be an int in \[0, 1999\]; got 2000"),
    ("scaler-load-missing", lambda: amp.GradScaler().load_state_dict({"scale": 1.0}), ValueError,
     "state_dict lacks 'growth_factor', 'backoff_factor', 'growth_interval', '_growth_tracker'"),
    # ---- observers and FP8 scales ------------------------------------------------------------
    ("observer-nan", lambda: Q.MinMaxObserver()(np.array([NAN, 1], np.float32)), ValueError,
     "MinMaxObserver input x must hold only finite values; got 1 NaN and 0 Inf of 2 elements"),
    ("observer-inf", lambda: Q.MovingAverageMinMaxObserver()(np.array([INF, 1], np.float32)),
     ValueError, "MovingAverageMinMaxObserver input x must hold only finite values; got 0 NaN "
                 "and 1 Inf"),
    ("observer-per-channel-nan", lambda: Q.PerChannelMinMaxObserver()(
        np.array([[NAN, 1]], np.float32)), ValueError,
     "PerChannelMinMaxObserver input x must hold only finite values"),
    ("qparams-nan", lambda: Q.calculate_qparams(NAN, 1.0, 0, 255, False), ValueError,
     "min_val must hold only finite values"),
    ("observer-eps", lambda: Q.MinMaxObserver(eps=0.0), ValueError,
     "eps must be a finite real number > 0"),
    ("fp8-scale-zero", lambda: fp8.quantize(F32, "e4m3", 0.0), ValueError,
     "scale must be a finite real number > 0; got 0.0"),
    ("fp8-scale-negative", lambda: fp8.quantize(F32, "e4m3", -1.0), ValueError,
     "scale must be a finite real number > 0"),
    ("fp8-scale-nan", lambda: fp8.quantize(F32, "e4m3", NAN), ValueError,
     "scale must be a finite real number > 0; got nan"),
    ("fp8-scale-inf", lambda: fp8.quantize(F32, "e4m3", INF), ValueError,
     "scale must be a finite real number > 0; got inf"),
    ("fp8-scale-reciprocal-overflows", lambda: fp8.quantize(F32, "e4m3", 1e-40), ValueError,
     r"scale must lie in \(2\^-128, FLT_MAX\] once rounded to float32"),
    ("fp8-scale-bool", lambda: fp8.quantize(F32, "e4m3", True), TypeError,
     "scale must be a finite real number > 0; got bool"),
    ("fp8-quantize-format", lambda: fp8.quantize(F32, "fp16", 1.0), ValueError,
     "fmt must be an FP8 format; got fp16"),
    ("fake-quantize-fp8-scale", lambda: Q.fake_quantize_fp8(mpt.tensor(F32), "e4m3", 1e-40),
     ValueError, r"scale must lie in \(2\^-128, FLT_MAX\]"),
    ("quantize-multiplier", lambda: Q.quantize_multiplier(NAN), ValueError,
     "multiplier must be a finite real number > 0; got nan"),
    ("fp8-state-load-scale", lambda: _state_load(0.0), ValueError,
     "scale must be a finite real number > 0; got 0.0"),
    ("fp8-current-epsilon", lambda: fp8.current_scale(F32, "e4m3", epsilon=-1.0), ValueError,
     "epsilon must be a finite real number >= 0"),
    ("fp8-current-margin", lambda: fp8.current_scale(F32, "e4m3", margin=-1), ValueError,
     "margin must be a non-negative int; got -1"),
    ("fp8-recipe-margin", lambda: fp8.DelayedScaling(margin=True), TypeError,
     "margin must be a non-negative int; got bool"),
    # ---- training, attention masks, nibbles, rounding ----------------------------------------
    ("trainconfig-lr-nan", lambda: TrainConfig(lr=NAN), ValueError,
     "lr must be a finite real number >= 0; got nan"),
    ("trainconfig-min-lr", lambda: TrainConfig(min_lr=-1e-4), ValueError,
     "min_lr must be None or a finite real number >= 0"),
    ("trainconfig-eps", lambda: TrainConfig(eps=INF), ValueError,
     "eps must be a finite real number >= 0; got inf"),
    ("trainconfig-betas", lambda: TrainConfig(betas=0.9), TypeError,
     r"betas must be a pair \(beta1, beta2\)"),
    ("trainconfig-weight-decay", lambda: TrainConfig(weight_decay=NAN), ValueError,
     "weight_decay must be a finite real number >= 0"),
    ("trainconfig-warmup", lambda: TrainConfig(warmup_steps=-1), ValueError,
     "warmup_steps must be a non-negative int"),
    ("trainconfig-total-steps", lambda: TrainConfig(total_steps=0), ValueError,
     "total_steps must be None or a positive int"),
    ("trainconfig-grad-accum", lambda: TrainConfig(grad_accum=1.5), TypeError,
     "grad_accum must be a positive int; got float"),
    ("trainconfig-clip", lambda: TrainConfig(clip_grad_norm=0.0), ValueError,
     "clip_grad_norm must be None or a finite real number > 0"),
    ("trainconfig-loss-multiplier", lambda: TrainConfig(loss_multiplier=INF), ValueError,
     "loss_multiplier must be a finite real number > 0"),
    ("trainconfig-seed", lambda: TrainConfig(seed=-1), ValueError, "seed must be an int in"),
    ("trainconfig-fused", lambda: TrainConfig(fused=1), TypeError, "fused must be a bool"),
    ("trainconfig-detail-steps", lambda: TrainConfig(detail_steps=(0,)), ValueError,
     r"detail_steps\[0\] must be a positive int; got 0"),
    ("learning-rate-step-0", lambda: learning_rate(TrainConfig(), 0), ValueError,
     "step must be a positive int; got 0"),
    ("evaluate-no-batches", lambda: _tiny_trainer().evaluate([]), ValueError,
     r"batches must hold at least one \(idx, targets\) batch"),
    ("causal-mask-negative", lambda: F.causal_mask(-1, 3), ValueError,
     "L must be a non-negative int; got -1"),
    ("causal-mask-float", lambda: F.causal_mask(2.5, 3), TypeError,
     "L must be a non-negative int; got float 2.5"),
    ("causal-mask-s", lambda: F.causal_mask(2, -3), ValueError, "S must be a non-negative int"),
    ("pack-nibbles-float", lambda: Q.pack_nibbles([1.5]), TypeError,
     r"codes must be integers in \[0, 15\]; got dtype float64"),
    ("pack-nibbles-16", lambda: Q.pack_nibbles([16]), ValueError,
     r"codes must be integers in \[0, 15\] \(4-bit\); got values in \[16, 16\]"),
    ("pack-nibbles-negative", lambda: Q.pack_nibbles([-1]), ValueError,
     r"codes must be integers in \[0, 15\]"),
    ("unpack-nibbles-n", lambda: Q.unpack_nibbles(np.zeros(2, np.uint8), 5), ValueError,
     r"n must be an int in \[0, 4\]; got 5"),
    ("round-format-none", lambda: mpt.round(F32, None), TypeError,
     "format must be a Format, a format name or a numpy dtype; got None"),
    ("decode-dtype-none", lambda: mpt.decode(np.ones(2, np.float16), None), ValueError,
     "dtype must be float32 or float64; got None"),
    ("round-saturate-str", lambda: mpt.round(F32, "fp16", saturate="no"), TypeError,
     r"saturate must be a bool \(True or False\); got str 'no'"),
    ("round-subnormals-int", lambda: mpt.round(F32, "fp16", subnormals=0), TypeError,
     "subnormals must be a bool"),
    # ---- obscure errors made clear -----------------------------------------------------------
    ("linear-negative", lambda: nn.Linear(-1, 4), ValueError,
     "in_features must be a non-negative int; got -1"),
    ("linear-float", lambda: nn.Linear(4, 2.0), TypeError,
     "out_features must be a non-negative int; got float"),
    ("conv-groups-0", lambda: nn.Conv2d(4, 4, 3, groups=0), ValueError,
     "groups must be a positive int; got 0"),
    ("mha-heads-0", lambda: nn.MultiheadAttention(8, 0), ValueError,
     "n_heads must be a positive int; got 0"),
    ("embedding-padding-idx", lambda: nn.Embedding(3, 2, padding_idx=3), ValueError,
     r"padding_idx must be None or an int in \[-3, 2\]; got 3"),
    ("gpt-checkpoint", lambda: nn.GPT(8, 8, 1, 2, 4, checkpoint="all"), ValueError,
     "checkpoint must be False, True, 'sqrt' or a number of segments"),
    ("lora-non-linear", lambda: lora.LoRALinear(nn.Dropout(0.1), 4), TypeError,
     r"base must be an mpt.nn.Linear \(the layer LoRA adapts\); got Dropout"),
    ("lora-r", lambda: lora.LoRALinear(nn.Linear(4, 4), r=0), ValueError,
     "r must be a positive int; got 0"),
    ("lora-targets", lambda: lora.apply(nn.Sequential(nn.Linear(2, 2)), targets=[1]), TypeError,
     "targets must be None, a layer name or a sequence of names"),
    ("init-normal-std", lambda: nn.init_normal_(_p(), NAN, seed=0, key="w"), ValueError,
     "std must be a finite real number >= 0; got nan"),
    ("init-uniform-bound", lambda: nn.init_uniform_(_p(), -1.0, seed=0, key="w"), ValueError,
     "bound must be a finite real number >= 0"),
    ("uniform-key", lambda: nn.uniform(0, 3, 2), TypeError,
     r"key must be a str \(a parameter's dotted name\); got int"),
    ("var-correction-str", lambda: F.var(mpt.tensor(F32), correction="1"), TypeError,
     "var: correction must be a finite real number; got str"),
    ("sdpa-dropout-nan", lambda: F.scaled_dot_product_attention(
        *[mpt.tensor(np.ones((2, 4), np.float32))] * 3, dropout_p=NAN), ValueError,
     r"scaled_dot_product_attention: dropout_p must be a finite real number in \[0, 1\)"),
    ("sdpa-is-causal", lambda: F.scaled_dot_product_attention(
        *[mpt.tensor(np.ones((2, 4), np.float32))] * 3, is_causal=1), TypeError,
     "scaled_dot_product_attention: is_causal must be a bool"),
    ("sdpa-scale-inf", lambda: F.scaled_dot_product_attention(
        *[mpt.tensor(np.ones((2, 4), np.float32))] * 3, scale=INF), ValueError,
     "scaled_dot_product_attention: scale must be a finite real number; got inf"),
    ("sdpa-e-zero", lambda: F.scaled_dot_product_attention(
        *[mpt.tensor(np.ones((2, 0), np.float32))] * 3), ValueError,
     r"the default scale 1/sqrt\(E\) needs E >= 1"),
    ("layer-norm-eps", lambda: F.layer_norm(mpt.tensor(F32), (4,), eps=-1.0), ValueError,
     "layer_norm: eps must be a finite real number >= 0; got -1.0"),
    ("rms-norm-eps", lambda: F.rms_norm(mpt.tensor(F32), (4,), eps=NAN), ValueError,
     "rms_norm: eps must be a finite real number >= 0; got nan"),
    ("dropout-training", lambda: F.dropout(mpt.tensor(F32), 0.5, "yes"), TypeError,
     "dropout: training must be a bool"),
    ("reshape-minus-two", lambda: mpt.tensor(F32).reshape(-2, 2), ValueError,
     r"reshape: shape\[0\] must be an int >= -1; got -2"),
    ("reshape-two-unknown", lambda: mpt.tensor(F32).reshape(-1, -1), ValueError,
     "reshape: only one dimension of shape can be -1"),
    ("sum-keepdim", lambda: F.sum(mpt.tensor(F32), keepdim="no"), TypeError,
     "sum: keepdim must be a bool"),
    ("set-rng-state", lambda: F.set_rng_state((1,)), TypeError,
     r"state must be a \(seed, counter\) pair"),
    ("requires-grad", lambda: mpt.tensor(F32, requires_grad="yes"), TypeError,
     "requires_grad must be a bool"),
    ("matmul-model", lambda: mpt.matmul_model("pentium"), ValueError,
     "unknown MMA model 'pentium'"),
    ("autocast-model", lambda: mpt.autocast("bf16", model="pentium"), ValueError,
     "unknown MMA model 'pentium'"),
    ("gemm-split-k-bool", lambda: mpt.gemm(np.ones((2, 4), np.float16), np.ones((4, 2), np.float16),
                                           model="ampere", split_k=True), TypeError,
     "split_k must be a positive int; got bool True"),
    ("int8-quantize-axis", lambda: Q.int8_quantize_per_channel(np.ones((2, 2), np.float32), 3),
     ValueError, r"axis must be an int in \[-2, 1\]; got 3"),
    ("custom-format-has-inf", lambda: mpt.custom_format(4, 3, has_inf="yes"), TypeError,
     "has_inf must be a bool"),
    ("gpt-shape-float", lambda: planning.GPTShape(10, 8, 1.5, 2, 4), TypeError,
     "n_layers must be a positive int; got float 1.5"),
]


@pytest.mark.parametrize("call, error, match", [pytest.param(c, e, m, id=i) for i, c, e, m in BAD])
def test_bad_input_is_refused_with_a_clear_error(call, error, match):
    with pytest.raises(error, match=match) as info:
        call()
    assert type(info.value) is error                      # not a subclass (IndexError, AxisError)


# ---- the checks themselves --------------------------------------------------------------------
def test_checks_return_plain_python_values():
    assert check_int("n", np.int64(3), min=0) == 3 and type(check_int("n", np.uint8(3))) is int
    assert check_real("x", np.float32(0.1)) == float(np.float32(0.1))
    assert type(check_real("x", np.float32(0.1))) is float and check_real("x", 2) == 2.0
    assert (check_real("x", -INF, finite=False) == -INF
            and check_real("x", None, optional=True) is None)
    assert check_bool("b", np.bool_(True)) is True
    assert check_real("x", 10**400, finite=False) == INF          # beyond float64: +inf
    assert check_finite("x", np.ones(2, ml_dtypes.bfloat16)).dtype == ml_dtypes.bfloat16
    for bad in (True, np.bool_(False), "1", 1j, np.ones(1), None):
        with pytest.raises(TypeError, match=r"x must be a finite real number"):
            check_real("x", bad)
    with pytest.raises(ValueError, match=r"x must be a real number in \[0, 1\]; got nan"):
        check_real("x", NAN, min=0, max=1, finite=False)
    with pytest.raises(ValueError, match="has_nan must hold only finite values; got 1 NaN"):
        check_finite("has_nan", np.array([1, NAN], ml_dtypes.bfloat16))


# ---- all or nothing ---------------------------------------------------------------------------
def test_refused_state_dicts_change_nothing():
    p = _p()
    opt = optim.Adam([p], lr=0.1)
    state = opt.state_dict()
    state["param_groups"][0]["lr"] = 0.5
    state["param_groups"][0]["betas"] = (0.9, 1.5)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        opt.load_state_dict(state)
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[0]["betas"] == (0.9, 0.999)
    scaler = amp.GradScaler(init_scale=8.0)
    with pytest.raises(ValueError, match="growth_interval"):
        scaler.load_state_dict({**scaler.state_dict(), "scale": 4.0, "growth_interval": 0})
    assert scaler.get_scale() == 8.0 and scaler.get_growth_interval() == 2000
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="r must be"):
        lora.apply(model, r=0)
    assert all(p.requires_grad for p in model.parameters()) and type(model[0]) is nn.Linear


def test_the_nf4_crash_input_is_refused_before_any_kernel_runs():
    # The reproducer: 2^26 codes in 2^25 bytes, blocksize 1, one absmax value. The
    # decode kernel read 2^26 absmax values from an array of 1 and segfaulted.
    with pytest.raises(ValueError, match=r"absmax must have shape \(67108864,\)"):
        Q.nf4_dequantize(Q.NF4Weight(np.zeros(1 << 25, np.uint8), (1 << 26,), 1,
                                     np.ones(1, np.float32)))
    w = Q.nf4_quantize(np.linspace(-1, 1, 200, dtype=np.float32), double_quant=True)
    assert w.double_quant and Q.nf4_dequantize(w).shape == (200,)   # well-formed input still works


# ---- inputs PyTorch answers with a result: exact checks ----------------------------------------

def test_softmax_over_an_empty_dim_is_empty():
    # torch.softmax(torch.zeros(2, 0), -1) is an empty (2, 0) tensor, and so is its gradient.
    x = mpt.tensor(np.zeros((2, 0), np.float32), requires_grad=True)
    for op in (F.softmax, F.log_softmax):
        y = op(x, -1)
        assert y.shape == (2, 0) and y.data.dtype == np.float32 and y.format.name == "fp32"
    F.sum(F.softmax(x, -1)).backward()
    assert x.grad.shape == (2, 0)
    assert F.softmax(mpt.tensor(np.zeros((0, 3), np.float32)), -1).shape == (0, 3)
    bf = F.softmax(mpt.tensor(np.zeros((3, 0), ml_dtypes.bfloat16), "bf16"), 0)
    assert bf.shape == (3, 0) and bf.format.name == "bf16"


@pytest.mark.parametrize("L, S", [(3, 0), (0, 3), (0, 0)])
def test_naive_attention_without_keys_or_queries_follows_pytorch(L, S):
    # PyTorch's math path: softmax over an empty key axis is empty, and an empty P times an
    # empty V is +0 (L, Ev); with L = 0 the output is (0, Ev). The flash backend already gave
    # these; both must now agree bit for bit, forward and backward.
    rng = np.random.default_rng(0)
    shapes = {"q": (1, 2, L, 4), "k": (1, 2, S, 4), "v": (1, 2, S, 5)}
    outs = {}
    for backend in ("naive", "flash"):
        t = {n: mpt.tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True)
             for n, s in shapes.items()}
        o = F.scaled_dot_product_attention(t["q"], t["k"], t["v"], backend=backend)
        F.sum(o).backward()
        outs[backend] = [o.data] + [t[n].grad.data for n in "qkv"]
        assert o.shape == (1, 2, L, 5)
        assert not _bits(o.data).any() and not _bits(t["q"].grad.data).any()   # all +0
    for a, b in zip(outs["naive"], outs["flash"]):
        assert a.shape == b.shape and np.array_equal(_bits(a), _bits(b))
    causal = F.scaled_dot_product_attention(*[mpt.tensor(np.ones(shapes[n], np.float32))
                                              for n in "qkv"], is_causal=True)
    assert causal.shape == (1, 2, L, 5) and not _bits(causal.data).any()


def test_variance_with_correction_at_least_n_is_inf_or_nan():
    # torch.var divides by max(0, N - correction): Σd² > 0 over 0 is +inf, 0/0 is NaN; never the
    # negative value Σd²/(N - correction) (var([1, 2], correction=3) was -0.5).
    inf_bits = 0x7F800000
    assert _bits(F.var(mpt.tensor(np.array([1, 2], np.float32)), correction=3).data) == inf_bits
    assert _bits(F.var(mpt.tensor(np.array([1, 2], np.float32)), correction=2).data) == inf_bits
    assert np.isnan(F.var(mpt.tensor(np.array([1, 1], np.float32)), correction=3).data)
    rows = F.var(mpt.tensor(np.array([[1, 2], [3, 3]], np.float32)), dim=1, correction=5)
    assert _bits(rows.data)[0] == inf_bits and np.isnan(rows.data[1])
    # correction < N is unchanged: Σd² = 0.5, divided by 1
    assert F.var(mpt.tensor(np.array([1, 2], np.float32))).data == np.float32(0.5)
    x = mpt.tensor(np.array([1, 2, 4], np.float32), requires_grad=True)
    F.var(x, correction=4).backward()                    # factor +inf: ±inf where x ≠ mean
    assert np.isinf(x.grad.data).all()


def test_a_numpy_learning_rate_is_a_real_scalar():
    # lr=np.float32(0.1) was refused ("must be a float"); any real scalar but a bool is accepted
    # and stored as the Python float of its exact value, so a step gives the same bits as that
    # float.
    grads = np.array([0.5, -1.25, 3.0], np.float32)
    steps = []
    for lr in (np.float32(0.1), float(np.float32(0.1))):
        p = _p()
        opt = optim.SGD([p], lr=lr, momentum=np.float64(0.9))
        assert type(opt.param_groups[0]["lr"]) is float
        assert opt.param_groups[0]["lr"] == float(np.float32(0.1))
        p.grad = mpt.tensor(grads)
        opt.step()
        steps.append(_bits(p.data).copy())
    assert np.array_equal(steps[0], steps[1])
    assert optim.AdamW([_p()], lr=np.int64(1)).param_groups[0]["lr"] == 1.0
    assert TrainConfig(lr=np.float32(0.5)).lr == 0.5 and type(TrainConfig(lr=1).lr) is float


def test_linear_without_inputs_follows_pytorch():
    # torch.nn.Linear(0, 4): bound = 1/sqrt(fan_in) if fan_in > 0 else 0, so the bias is 0 and
    # the output (x·Wᵀ over K = 0, plus the bias) is 0.
    layer = nn.Linear(0, 4)
    assert layer.weight.shape == (4, 0) and not _bits(layer.bias.data).any()
    x = mpt.tensor(np.zeros((2, 0), np.float32), requires_grad=True)
    y = layer(x)
    assert y.shape == (2, 4) and not _bits(y.data).any()
    F.sum(y).backward()
    assert np.array_equal(layer.bias.grad.data, np.full(4, 2, np.float32))
    assert x.grad.shape == (2, 0) and layer.weight.grad.shape == (4, 0)


def test_pow_warns_nothing():
    # np.broadcast_arrays' views are flagged "warn on write"; handing one to the Numba kernel
    # raised NumPy's FutureWarning. The suite turns warnings into errors; check explicitly too.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        base = mpt.tensor(np.array([2.0, 3.0], np.float32), requires_grad=True)
        y = F.pow(base, 2)
        F.sum(y).backward()
        z = F.pow(mpt.tensor(np.array([[2.0], [0.5]], np.float32)),
                  mpt.tensor(np.array([1.0, -1.0, 3.0], np.float32)))
    assert y.data.tolist() == [4.0, 9.0] and base.grad.data.tolist() == [4.0, 6.0]
    assert z.data.tolist() == [[2.0, 0.5, 8.0], [0.5, 2.0, 0.125]]


# ---- the command line ---------------------------------------------------------------------------
def test_round_takes_negative_numbers(capsys):
    assert main(["round", "-inf", "-2.5", "-0x1p-3", "-1/3", "--to", "fp16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    # fp16: -inf 0xfc00, -2.5 0xc100, -0.125 0xb000, -1/3 RNE 0xb555
    assert [r["bits"] for r in rows] == ["0xfc00", "0xc100", "0xb000", "0xb555"]
    assert main(["round", "0x1p99999", "--to", "fp16", "--json"]) == 0  # beyond float64: +inf
    assert json.loads(capsys.readouterr().out)[0]["bits"] == "0x7c00"


@pytest.mark.parametrize("argv, message", [
    (["round", "1", "--to", "fp12"], "unknown format 'fp12'"),
    (["round", "1", "--to", "nf4"], "codebook format"),
    (["round", "nan", "--to", "int8"], "x contains NaN"),
    (["round", "1", "--mode", "stochastic"], "needs exactly one of seed"),
    (["round", "1", "--mode", "stochastic", "--seed", "-1"], "seed must be an int"),
    (["round", "1", "--seed", "3"], "seed is only used by mode='stochastic'"),
    (["plan", "--layers", "0"], "n_layers must be a positive int"),
    (["plan", "--heads", "0"], "n_heads must be a positive int"),
    (["plan", "--batch", "0"], "batch must be positive"),
    (["plan", "--checkpoint", "-1"], "segments must be a positive int"),
    (["plan", "--d-model", "7", "--heads", "2"], "must divide d_model"),
    (["plan", "--recipe", "nope"], "unknown recipe 'nope'"),
    (["study", "--steps", "0"], "steps must be a positive int"),
    (["study", "--seed", "-1"], "seed must be an int"),
    (["study", "--recipes", "nope"], "unknown recipe"),
    (["study", "--text", "/nonexistent/mpt-input.txt"], "No such file or directory"),
])
def test_bad_command_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                 # a study would create its --out folder here
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"mpt {argv[0]}: error: ") and message in err


@pytest.mark.parametrize("argv", [["round"], ["round", "abc"], ["round", "1", "--mode", "x"],
                                  ["formats", "--bogus"], ["demo", "extra"], ["plan", "--seq", "x"],
                                  ["study", "--steps", "1.5"], ["bogus"]])
def test_usage_errors_exit_2_without_traceback(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and "Traceback" not in capsys.readouterr().err


def test_python_dash_m_mpt_is_the_command():
    repo = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(repo)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "mpt", *argv], capture_output=True,
                              text=True, timeout=600, cwd=repo, env=env)
    done = run("round", "-inf", "--to", "fp16", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)[0]["bits"] == "0xfc00"
    bad = run("round", "1", "--to", "fp12")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("mpt round: error: unknown format 'fp12'")
