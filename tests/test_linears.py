"""mpt.linears: Fp8Linear and Tf32Linear against the same mpt.fp8 / mpt.gemm steps composed by hand
(TE's HYBRID recipe: E4M3 forward, E5M2 gradients, fast-accumulated fprop, promoted dgrad/wgrad)."""
import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt import nn
from mpt.amp.linear import Fp8Linear, Tf32Linear, replace_linears
from mpt.autograd.tensor import Tensor
from mpt.fp8 import DelayedScaling, quantize
from mpt.testing import as_bits as _bits

F32 = np.float32


def _assert_bits(actual, desired):
    assert actual.dtype == desired.dtype and actual.shape == desired.shape
    assert np.array_equal(_bits(actual), _bits(desired))


def _column_sum(g):
    acc = np.zeros(g.shape[1], F32)
    for row in g.astype(F32):           # sequential FP32 adds, row after row
        acc = acc + row
    return acc


def _random(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(F32)


def test_fp8_linear_matches_te_hybrid_by_hand():
    M, K, N = 160, 160, 160                                  # every GEMM has K > 128
    lin = nn.Linear(K, N, seed=3)
    layer = Fp8Linear(lin)
    x_val = _random((2, M // 2, K), 1)
    g_val = mpt.round(_random((2, M // 2, N), 2, 2.0**-12), "bf16")
    for step in range(2):                                    # step 2 uses delayed scales
        layer.weight.grad = layer.bias.grad = None
        x = mpt.tensor(x_val, requires_grad=True)
        with mpt.autocast(format="bf16", model="hopper"):
            y = layer(x)
        y.backward(Tensor(g_val))
        if step == 0:
            layer.fp8_update()
            counts_first = {k: dict(v) for k, v in layer.quantization_counts.items()}
            layer.reset_counts()

    xb = mpt.round(x_val, "bf16").astype(F32).reshape(M, K)            # TE's cast_if_needed
    w = lin.weight.data
    g = g_val.astype(F32).reshape(M, N)
    scales = [F32(F32(448.0) / np.max(np.abs(xb))), F32(F32(448.0) / np.max(np.abs(w))),
              F32(F32(57344.0) / np.max(np.abs(g)))]
    assert [layer.fp8_states[r].scale for r in ("input", "weight", "grad_output")] == scales
    qx, qw = quantize(xb, "fp8_e4m3fn", scales[0]), quantize(w, "fp8_e4m3fn", scales[1])
    qg = quantize(g, "fp8_e5m2", scales[2])

    def fp8_gemm(a, a_inv, b, b_inv, promote):
        return mpt.gemm(a, b, model="hopper", promote_every=promote, scale_a=a_inv, scale_b=b_inv)

    y_ref = fp8_gemm(qx.data, qx.scale_inv, qw.data.T, qw.scale_inv, None) + lin.bias.data
    dx_ref = fp8_gemm(qg.data, qg.scale_inv, qw.data, qw.scale_inv, 128)
    dw_ref = fp8_gemm(qg.data.T, qg.scale_inv, qx.data, qx.scale_inv, 128)
    _assert_bits(y.data.reshape(M, N), mpt.round(y_ref, "bf16"))
    _assert_bits(x.grad.data.reshape(M, K), mpt.round(dx_ref, "bf16").astype(F32))
    _assert_bits(lin.weight.grad.data, dw_ref)
    _assert_bits(lin.bias.grad.data, _column_sum(g))
    # the test tells promotion from fast accumulation apart on these operands
    assert not np.array_equal(dw_ref, fp8_gemm(qg.data.T, qg.scale_inv, qx.data, qx.scale_inv,
                                               None))
    assert not np.array_equal(y_ref, fp8_gemm(qx.data, qx.scale_inv, qw.data.T, qw.scale_inv,
                                              128) + lin.bias.data)
    # scale 1 on the first step: the 2^-12 gradients mostly flush in E5M2 (min 2^-16)
    assert counts_first["grad_output"]["flushed"] > 0
    flushed = np.count_nonzero((g != 0) & (qg.data.astype(F32) == 0))
    assert layer.quantization_counts["grad_output"] == {
        "numel": g.size, "nonzero": np.count_nonzero(g), "flushed": flushed, "saturated": 0}


def test_fp8_linear_without_autocast_keeps_its_input_format():
    layer = Fp8Linear(nn.Linear(32, 8, seed=0))
    y = layer(mpt.tensor(_random((4, 32), 5)))
    assert y.format.name == "fp32" and y.shape == (4, 8)
    with mpt.autocast(format="fp16"):
        assert layer(mpt.tensor(_random((4, 32), 5))).format.name == "fp16"


def test_fp8_state_round_trip_and_errors():
    layer = Fp8Linear(nn.Linear(32, 8, seed=0), DelayedScaling(amax_history_len=4))
    layer(mpt.tensor(_random((4, 32), 5)))
    layer.fp8_update()
    saved = layer.fp8_state_dict()
    other = Fp8Linear(nn.Linear(32, 8, seed=0), DelayedScaling(amax_history_len=4))
    other.load_fp8_state_dict(saved)
    for role, s in other.fp8_states.items():
        assert s.scale == layer.fp8_states[role].scale
        assert np.array_equal(s.amax_history, layer.fp8_states[role].amax_history)
    with pytest.raises(ValueError, match="roles"):
        other.load_fp8_state_dict({"input": saved["input"]})
    with pytest.raises(TypeError, match="DelayedScaling"):
        Fp8Linear(nn.Linear(4, 4), scaling="HYBRID")
    assert "fp8_e4m3fn/fp8_e5m2" in repr(layer)


def test_tf32_linear_runs_every_gemm_in_tf32():
    lin = nn.Linear(40, 24, seed=1)
    layer = Tf32Linear(lin)
    x = mpt.tensor(_random((3, 5, 40), 7), requires_grad=True)
    g = _random((3, 5, 24), 8)
    y = layer(x)
    y.backward(Tensor(g))
    x2, g2, w = x.data.reshape(15, 40), g.reshape(15, 24), lin.weight.data
    tf32 = dict(model="hopper", in_format="tf32")
    _assert_bits(y.data.reshape(15, 24), mpt.gemm(x2, w.T, **tf32) + lin.bias.data)
    _assert_bits(x.grad.data.reshape(15, 40), mpt.gemm(g2, w, **tf32))
    _assert_bits(lin.weight.grad.data, mpt.gemm(g2.T, x2, **tf32))
    _assert_bits(lin.bias.grad.data, _column_sum(g2))
    fp32 = F.linear(mpt.tensor(x.data), lin.weight.detach(), lin.bias.detach())
    assert not np.array_equal(fp32.data, y.data)              # TF32 drops 13 bits: it shows
    with pytest.raises(TypeError, match="fp32"):
        layer(mpt.tensor(x.data, "bf16"))
    with pytest.raises(TypeError, match="fp32 parameters"):
        Tf32Linear(nn.Linear(4, 4, format="bf16"))


def test_replace_linears_shares_parameters_and_names():
    model = nn.GPT(16, 16, 2, 2, 8, seed=0)
    before = dict(model.named_parameters())
    replaced = replace_linears(model, lambda lin: Fp8Linear(lin))
    assert sorted(replaced) == sorted(f"blocks.{i}.{n}" for i in range(2) for n in
                                      ("attn.in_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2"))
    after = dict(model.named_parameters())
    assert set(after) == set(before)
    assert all(after[k] is before[k] for k in before)
    assert isinstance(model.blocks[0].mlp.fc1, Fp8Linear)
    logits = model(np.zeros((2, 8), np.int64))
    assert logits.shape == (2, 8, 16)
