"""LoRA: peft's initialisation and scaling, bit-identity at init, merged vs unmerged within a
derived bound, only adapters trained, quantized (int8 / NF4) bases."""
import math

import numpy as np
import pytest

import mpt
import mpt.functional as F
import mpt.quant as Q
import mpt.quant.lora as lora
from mpt import nn
from mpt.optim import AdamW
from mpt.testing import assert_bits_equal

U = 2.0**-24


def _mlp(seed=0):
    return nn.Sequential(nn.Linear(48, 32, seed=seed), nn.Linear(32, 16, seed=seed + 1))


def _x(shape=(8, 48), seed=5):
    return mpt.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def test_init_follows_peft():
    layer = lora.LoRALinear(nn.Linear(48, 32), r=8, alpha=16, key="blk.q")
    a = layer.lora_A.data
    assert a.shape == (8, 48) and layer.lora_B.data.shape == (32, 8)
    assert not layer.lora_B.data.any()
    bound = 1 / math.sqrt(48)                              # kaiming_uniform(a=√5) on fan_in 48
    assert np.abs(a).max() < bound and np.abs(a).max() > 0.9 * bound
    again = lora.LoRALinear(nn.Linear(48, 32), r=8, alpha=16, key="blk.q")
    assert_bits_equal(again.lora_A.data, a)                 # same seed and key: same bits
    other = lora.LoRALinear(nn.Linear(48, 32), r=8, alpha=16, key="blk.v")
    assert not np.array_equal(other.lora_A.data, a)
    assert layer.scaling == 2.0
    assert lora.LoRALinear(nn.Linear(48, 32), r=4, alpha=8, use_rslora=True).scaling == 4.0


@pytest.mark.parametrize("fmt", [None, "fp16", "bf16"])
def test_output_at_init_is_bit_identical(fmt):
    base = _mlp()
    if fmt:
        base.to(fmt)
    x = _x()
    want = base(x.to(fmt) if fmt else x)
    model = lora.apply(_mlp().to(fmt) if fmt else _mlp(), r=8, alpha=8)
    got = model(x)
    assert got.format == want.format
    assert_bits_equal(got.data, want.data)


@pytest.mark.parametrize("fmt, dq", [("int8", False), ("nf4", False), ("nf4", True)])
def test_quantized_base_at_init_equals_dequantized_base(fmt, dq):
    model = lora.apply(_mlp(), base_format=fmt, double_quant=dq)
    x = _x()
    h = x.to("bf16")
    for layer in model:                                    # a base model of the dequantized weights
        w = layer.compute_weight()
        assert w.format.name == "bf16"
        h = F.linear(h, w, layer.bias)
    assert_bits_equal(model(x).data, h.data)


def test_quantized_storage_matches_quant_module():
    w = _mlp()[0].weight.data
    layer_nf4 = lora.LoRALinear(_mlp()[0], base_format="nf4")
    assert_bits_equal(layer_nf4.base_weight_fp32(), Q.nf4_dequantize(Q.nf4_quantize(w)))
    layer_i8 = lora.LoRALinear(_mlp()[0], base_format="int8")
    fq = Q.fake_quantize_per_channel_affine(mpt.tensor(w), layer_i8.qweight.scale,
                                            np.zeros(32, np.int64), 0, -128, 127)
    assert_bits_equal(layer_i8.base_weight_fp32(), fq.data)
    assert layer_nf4.base_nbytes == 48 * 32 // 2 + 4 * (48 * 32 // 64)
    assert layer_i8.base_nbytes == 48 * 32 + 4 * 32


def test_only_adapters_get_gradients_and_optimizer_state():
    model = lora.apply(_mlp(), r=4, alpha=8, base_format="nf4")
    named = dict(model.named_parameters())
    trainable = [n for n, p in named.items() if p.requires_grad]
    assert sorted(trainable) == ["0.lora_A", "0.lora_B", "1.lora_A", "1.lora_B"]
    opt = AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        model.zero_grad()
        F.mse_loss(model(_x()).to("fp32"), mpt.tensor(np.ones((8, 16), np.float32))).backward()
        opt.step()
    assert all((p.grad is not None) == p.requires_grad for p in model.parameters())
    assert set(map(id, opt.state)) == {id(named[n]) for n in trainable}
    assert model[0].lora_B.data.any()                       # training moved B off zero
    report = lora.trainable_parameters(model)
    assert report["trainable"] == 4 * 48 + 32 * 4 + 4 * 32 + 16 * 4
    assert report["total"] == report["trainable"] + 48 * 32 + 32 + 32 * 16 + 16
    assert report["percent"] == 100 * report["trainable"] / report["total"]


def _gamma(n):
    return n * U / (1 - n * U)


@pytest.mark.parametrize("use_rslora", [False, True])
def test_merged_within_bound_of_unmerged(use_rslora):
    """fp32 base, K = 48, r = 8. Unmerged: A·x (K FMAs), B·(Ax) (r), ·s (1), + base (1) -> at most
    K + r + 2 roundings on any path; base W·x + b: K + 1. Merged: W' = W + fl(s·fl(B·A)) (r + 2),
    then W'·x + b (K + 1). Each is within γ_{K+r+3}·(|W||x| + |b| + |s||B||A||x|) of the exact
    W x + b + s·B·A·x, so they are within twice that of each other."""
    rng = np.random.default_rng(2)
    layer = lora.LoRALinear(nn.Linear(48, 32, seed=3), r=8, alpha=16, use_rslora=use_rslora)
    layer.lora_B.data = rng.standard_normal((32, 8)).astype(np.float32)
    x = _x((8, 48))
    unmerged = layer(x).data.astype(np.float64)
    w0 = layer.weight.data.copy()
    layer.merge()
    merged = layer(x).data.astype(np.float64)
    s = abs(float(np.float32(layer.scaling)))
    absx = np.abs(x.data.astype(np.float64))
    size = absx @ np.abs(w0.astype(np.float64)).T + np.abs(layer.bias.data) + \
        s * (absx @ np.abs(layer.lora_A.data.astype(np.float64)).T) @ np.abs(layer.lora_B.data).T
    bound = 2 * _gamma(48 + 8 + 3) * size
    diff = np.abs(merged - unmerged)
    assert (diff <= bound).all()
    assert diff.max() > 0                                   # the two orders do round differently
    layer.unmerge()
    # unmerge subtracts the same delta: W ± d rounds once each way, |W'' − W| <= 2u(|W| + |d|)
    d = np.abs(layer.delta_weight().astype(np.float64))
    assert (np.abs(layer.weight.data - w0) <= 2 * U * (np.abs(w0) + d) * 1.0001).all()


def test_merge_quantized_base_requantizes():
    layer = lora.LoRALinear(nn.Linear(48, 32, seed=3), base_format="int8")
    layer.lora_B.data = np.full((32, 8), 0.01, np.float32)
    before = layer.base_weight_fp32()
    layer.merge()
    after = layer.base_weight_fp32()
    assert isinstance(layer.qweight, Q.Int8Weight) and not np.array_equal(before, after)
    want = Q.int8_quantize_per_channel(before + layer.delta_weight()).dequantize()
    assert_bits_equal(after, want)


def test_targets_and_errors():
    model = lora.apply(_mlp(), targets=["1"])
    assert isinstance(model[1], lora.LoRALinear) and type(model[0]) is nn.Linear
    assert list(model.named_children())[0][0] == "0"        # order kept
    with pytest.raises(ValueError, match="match no"):
        lora.apply(_mlp(), targets=["q_proj"])
    with pytest.raises(ValueError, match="base_format"):
        lora.LoRALinear(nn.Linear(4, 4), base_format="fp8_e4m3fn")
    with pytest.raises(ValueError, match="r must"):
        lora.LoRALinear(nn.Linear(4, 4), r=0)
