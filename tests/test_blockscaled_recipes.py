"""The block-scaled recipes (mxfp8, nvfp4 and its ablations, mxfp4) through BlockScaledLinear and
the one Linear's GemmPlan, against the same ``mpt.microscaling`` / ``mpt.gemm`` steps composed by
hand: the quantization of each tensor along each GEMM's reduction axis, the random Hadamard
transform of the wgrad inputs, the stochastic rounding of the gradients (its Philox stream), the
16x16 weight tiles shared by the forward and backward GEMMs, and TE's NVFP4 alpha."""
import numpy as np
import pytest

import mpt
from mpt import nn
from mpt.amp.linear import BlockScaledLinear, mxfp4_plan, mxfp8_plan, nvfp4_plan
from mpt.amp.recipes import BlockScaledConfig, get_recipe, recipes_for
from mpt.autograd.tensor import Tensor
from mpt.functional.gemm_plan import Quantization
from mpt.kernels.random import random_words
from mpt.microscaling import (hadamard_transform, nvfp4_gemm_alpha, quantize_mx, quantize_nvfp4,
                              rht_matrix)
from mpt.testing import assert_bits_equal

F32 = np.float32
M, K, N = 64, 64, 96          # every reduction (64, 96, 64) a multiple of 32; 64 rows for the RHT
SEED, INDEX, STEP = 5, 3, (7, 1)


def _random(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(F32)


def _stream(role, axis):
    """The layer's Philox stream for a role and axis (BlockScaledLinear's documented key)."""
    step, micro = STEP
    code = ("input", "weight", "grad_output").index(role)
    return (((step << 8 | micro) << 13 | INDEX) << 3) | (2 * code + axis)


def _run(plan, x_val, g_val):
    """One forward and backward of a BlockScaledLinear; returns (layer, linear, x, y, the
    quantizations it made as {(role, axis): (values, result)})."""
    lin = nn.Linear(K, N, seed=3)
    layer = BlockScaledLinear(lin, plan, seed=SEED, index=INDEX)
    layer.set_step(*STEP)
    seen = {}
    record = layer._record

    def spy(role, values, result):
        seen[(role, result.axis)] = (np.array(values), result)
        record(role, values, result)
    layer._record = spy
    x = mpt.tensor(x_val, requires_grad=True)
    with mpt.autocast(dtype="bf16", model="blackwell"):
        y = layer(x)
    y.backward(Tensor(g_val))
    return layer, lin, x, y, seen


def _expand(q, axis):
    """A 2-D tile's scales repeated along the other axis (the instruction's layout)."""
    rows, cols = q.shape
    size = q.block[0]
    if size == 1:
        return q.scales
    return np.repeat(q.scales, size, 0)[:rows] if axis == 1 else \
        np.repeat(q.scales, size, 1)[:, :cols]


def _gemm(a, a_scales, b, b_scales, variant, alpha=None):
    return mpt.gemm(a, b, model="blackwell", variant=variant, block_scale_a=a_scales,
                    block_scale_b=b_scales, scale_a=alpha)


def _column_sum(g):
    acc = np.zeros(g.shape[1], F32)
    for row in g.astype(F32):
        acc = acc + row
    return acc


@pytest.fixture(scope="module")
def data():
    x_val = _random((M, K), 1, 4.0)
    g_val = mpt.round(_random((M, N), 2, 2.0**-10), "bf16")
    return x_val, g_val


def test_nvfp4_linear_matches_the_recipe_by_hand(data):
    x_val, g_val = data
    layer, lin, x, y, _ = _run(nvfp4_plan(), x_val, g_val)
    xb = mpt.round(x_val, "bf16")                                 # TE's cast_if_needed
    w, b = lin.weight.data, lin.bias.data
    g = g_val.astype(F32)
    # fprop: X in 1x16 blocks along K, W in 16x16 tiles (RNE); TE's alpha
    qx = quantize_nvfp4(xb.astype(F32))
    qw1 = quantize_nvfp4(w, block=(16, 16))
    acc = _gemm(qx.codes, qx.scales, qw1.codes.T, _expand(qw1, 1).T, "mxf4nvf4",
                nvfp4_gemm_alpha(qx.amax, qw1.amax))
    assert_bits_equal(y.data, mpt.round(acc + b, "bf16"))
    # dgrad: G along N with 8-bit stochastic rounding from the layer's stream; W's tiles along N
    qg1 = quantize_nvfp4(g, mode="stochastic_8bit", seed=SEED, stream=_stream("grad_output", 1))
    qw0 = quantize_nvfp4(w, axis=0, block=(16, 16))
    dx = _gemm(qg1.codes, qg1.scales, qw0.codes, _expand(qw0, 0), "mxf4nvf4",
               nvfp4_gemm_alpha(qg1.amax, qw0.amax))
    assert_bits_equal(x.grad.data, mpt.round(dx, "bf16").astype(F32))
    # wgrad: the RHT along M on both operands, then 1x16 blocks along M (the amax after it)
    hx = hadamard_transform(xb, axis=0).astype(F32)
    hg = hadamard_transform(g_val, axis=0).astype(F32)
    qx0 = quantize_nvfp4(hx, axis=0)
    qg0 = quantize_nvfp4(hg, axis=0, mode="stochastic_8bit", seed=SEED,
                         stream=_stream("grad_output", 0))
    dw = _gemm(qg0.codes.T, qg0.scales.T, qx0.codes, qx0.scales, "mxf4nvf4",
               nvfp4_gemm_alpha(qg0.amax, qx0.amax))
    assert_bits_equal(lin.weight.grad.data, dw)
    assert_bits_equal(lin.bias.grad.data, _column_sum(g))       # unquantized, FP32


def test_mxfp8_linear_matches_te_mxfp8_by_hand(data):
    """TE's MXFP8BlockScaling: E4M3, 1x32 blocks along each GEMM's reduction axis, TE's scale
    rule, RNE: every tensor used along two axes is quantized twice."""
    x_val, g_val = data
    x_val, g_val = x_val[:, :32], g_val[:, :64]              # K = 32, N = 64: whole blocks
    lin = nn.Linear(32, 64, seed=3)
    layer = BlockScaledLinear(lin, mxfp8_plan())
    x = mpt.tensor(x_val, requires_grad=True)
    with mpt.autocast(dtype="bf16", model="blackwell"):
        y = layer(x)
    y.backward(Tensor(g_val))
    xb, w, g = mpt.round(x_val, "bf16").astype(F32), lin.weight.data, g_val.astype(F32)

    def q(t, axis):
        return quantize_mx(t, "e4m3", axis=axis, scale_rule="te")
    qx1, qw1, qg1, qw0, qg0, qx0 = q(xb, 1), q(w, 1), q(g, 1), q(w, 0), q(g, 0), q(xb, 0)
    acc = _gemm(qx1.codes, qx1.scales, qw1.codes.T, qw1.scales.T, "mxf8f6f4")
    assert_bits_equal(y.data, mpt.round(acc + lin.bias.data, "bf16"))
    dx = _gemm(qg1.codes, qg1.scales, qw0.codes, qw0.scales, "mxf8f6f4")
    assert_bits_equal(x.grad.data, mpt.round(dx, "bf16").astype(F32))
    dw = _gemm(qg0.codes.T, qg0.scales.T, qx0.codes, qx0.scales, "mxf8f6f4")
    assert_bits_equal(lin.weight.grad.data, dw)


@pytest.mark.parametrize("plan, same", [(nvfp4_plan(), True), (mxfp4_plan(), True),
                                        (nvfp4_plan(two_d=False), False)])
def test_2d_weight_tiles_are_one_quantized_weight_forward_and_backward(data, plan, same):
    """With 16x16 (NVFP4) or 32x32 (MXFP4) tiles the weight the forward GEMM reads (blocks
    along K) and the one the dgrad GEMM reads (along N) are the same numbers, bit for bit;
    with 1x16 blocks (the ablation) they are not."""
    _, _, _, _, seen = _run(plan, *data)
    (_, fwd), (_, bwd) = seen[("weight", 1)], seen[("weight", 0)]
    identical = np.array_equal(fwd.codes.view(np.uint8), bwd.codes.view(np.uint8)) and \
        np.array_equal(fwd.decode(), bwd.decode())
    assert identical == same
    if same:
        assert np.array_equal(fwd.scales.view(np.uint8), bwd.scales.view(np.uint8))


def test_the_rht_is_applied_identically_to_both_wgrad_operands(data):
    """Through the recipe: the wgrad inputs the layer quantized are the input and the output
    gradient each times the one orthogonal Q (exact in float64: Q·Qᵀ = I), run by run of 16
    rows; the forward and dgrad operands are not transformed; without RHT neither is."""
    x_val, g_val = data
    q = rht_matrix()
    assert np.array_equal(q @ q.T, np.eye(16))                  # exact: entries ±1/4
    _, _, _, _, seen = _run(nvfp4_plan(), x_val, g_val)
    xb = mpt.round(x_val, "bf16")
    for role, t in (("input", xb), ("grad_output", g_val)):
        values, _ = seen[(role, 0)]
        assert_bits_equal(values.astype(F32), hadamard_transform(t, axis=0).astype(F32))
        # the transform's error: each output is a bf16 rounding of a block dot product of
        # t's column runs with Q (F = 25 truncation, then RNE): within 2^-8 relative + 2^-20
        exact = np.einsum("rkc,kj->rjc", t.astype(np.float64).reshape(-1, 16, t.shape[1]),
                          q).reshape(t.shape)
        bound = 2.0**-8 * np.abs(exact) + 2.0**-20 * np.abs(t.astype(np.float64)).max()
        assert (np.abs(values - exact) <= bound).all()
        assert_bits_equal(seen[(role, 1)][0].astype(F32), t.astype(F32))
    _, _, _, _, plain = _run(nvfp4_plan(rht=False), x_val, g_val)
    assert_bits_equal(plain[("input", 0)][0].astype(F32), xb.astype(F32))


def test_gradient_rounding_uses_the_layers_philox_words(data):
    """The gradients' stochastic rounding is quantize_nvfp4's with the words of the layer's
    stream (seed, (step, micro, layer, role, axis)); another step draws other words; without
    SR the gradient rounds to nearest. (The expectation over every 8-bit word is exact:
    tests/test_microscaling.py::test_stochastic_rounding_mean_over_all_words_is_exact.)"""
    x_val, g_val = data
    _, _, _, _, seen = _run(nvfp4_plan(), x_val, g_val)
    values, result = seen[("grad_output", 1)]
    words = random_words(SEED, _stream("grad_output", 1), values.size).reshape(values.shape)
    want = quantize_nvfp4(values, mode="stochastic_8bit", random_bits=words)
    assert_bits_equal(result.codes, want.codes)
    rne = quantize_nvfp4(values)
    assert not np.array_equal(result.codes.view(np.uint8), rne.codes.view(np.uint8))
    _, _, _, _, no_sr = _run(nvfp4_plan(stochastic=False), x_val, g_val)
    assert_bits_equal(no_sr[("grad_output", 1)][1].codes, rne.codes)


def test_statistics_and_rounding_state(data):
    layer, _, _, _, seen = _run(nvfp4_plan(), *data)
    counts = layer.quantization_counts
    for role, axes in (("input", (0, 1)), ("weight", (0, 1)), ("grad_output", (0, 1))):
        values = [seen[(role, a)][0] for a in axes]
        assert counts[role]["numel"] == sum(v.size for v in values)
        errs = [seen[(role, a)][1].decode() - v for a, v in zip(axes, values)]
        assert counts[role]["sq_err"] == pytest.approx(sum(float((e * e).sum()) for e in errs),
                                                       rel=1e-12)
        assert 0 <= counts[role]["saturated"] <= counts[role]["nonzero"]
    lin = nn.Linear(K, N, seed=3)
    with pytest.raises(TypeError, match="stochastic_8bit rounding needs the layer's per-role "
                                        "state"):
        x = mpt.tensor(data[0], requires_grad=True)
        with mpt.autocast(dtype="bf16", model="blackwell"):
            y = mpt.functional.linear(x, lin.weight, lin.bias, plan=nvfp4_plan())
        y.backward(Tensor(data[1]))


def test_recipes_need_block_scaled_mma():
    nv = get_recipe("nvfp4")
    assert nv.target == "b200" and nv.block_scaled.model == "blackwell"
    assert nv.param_format == nv.master_format or nv.master_format is None
    assert nv.param_format == "fp32" and nv.state_format == "fp32" and nv.autocast
    assert get_recipe("nvfp4", "rtx5090").block_scaled.model == "rtx_blackwell"
    for name in ("mxfp8", "nvfp4", "mxfp4"):
        assert name in recipes_for("b200") and name in recipes_for("rtx5090")
        assert name not in recipes_for("h100")
        with pytest.raises(ValueError, match=f"recipe '{name}' needs block-scaled MMA "
                                             r"\(kind::mxf.*\), which target 'h100' does not"):
            get_recipe(name, "h100")
    assert get_recipe("nvfp4-no-rht").block_scaled.plan().grad_output.wgrad_rht is False
    assert get_recipe("nvfp4-no-sr").block_scaled.plan().grad_output.rounding == "nearest_even"
    assert get_recipe("nvfp4-no-2d").block_scaled.plan().weight.block == (1, 16)
    assert get_recipe("mxfp4").block_scaled.plan().weight.block == (32, 32)
    assert get_recipe("mxfp8").describe()["block_scaled"]["kind"] == "mxfp8"
    with pytest.raises(ValueError, match="kind must be one of"):
        BlockScaledConfig("nvfp8")
    with pytest.raises(ValueError, match="fp8_format must be"):
        BlockScaledConfig("mxfp8", fp8_format="E5M2")
    with pytest.raises(ValueError, match="got fp8 and block_scaled"):
        get_recipe("fp8-hybrid").replace(block_scaled=BlockScaledConfig("mxfp8"))


def test_quantization_arguments():
    with pytest.raises(ValueError, match="scale_rule and wgrad_rht belong"):
        Quantization("fp8_e4m3fn", "none", scale_rule="te")
    with pytest.raises(ValueError, match="nvfp4 scaling needs format 'fp4_e2m1fn'"):
        Quantization("fp8_e4m3fn", "nvfp4")
    with pytest.raises(ValueError, match="mx scaling needs an MX float element format"):
        Quantization("bf16", "mx")
    with pytest.raises(ValueError, match="block must be one of"):
        Quantization("fp8_e4m3fn", "mx", block=(8, 8))
    with pytest.raises(ValueError, match="mode must be one of"):
        Quantization("bf16", "none", rounding="stochastic_8bit")
    assert Quantization("fp4_e2m1fn", "nvfp4").block == (1, 16)
    assert Quantization("fp8_e5m2", "mx").block == (1, 32)


def test_trainer_swaps_all_but_the_last_layers():
    from mpt.train.trainer import TrainConfig, Trainer
    for bf16_last, expected in ((0, 4), (1, 3)):
        recipe = get_recipe("nvfp4").replace(
            block_scaled=BlockScaledConfig("nvfp4", bf16_last=bf16_last))
        net = nn.GPT(16, 32, 1, 2, 8, seed=0)
        trainer = Trainer(net, recipe, TrainConfig(seed=9))
        assert len(trainer.block_layers) == expected
        assert sorted(m.index for m in trainer.block_layers.values()) == list(range(expected))
        if bf16_last:
            assert type(net.blocks[0].mlp.fc2) is nn.Linear
    idx = np.arange(16).reshape(2, 8) % 16
    m = trainer.train_step([(idx, (idx + 1) % 16)])
    assert m.block_scaled["numel"] > 0 and m.block_scaled["sq"] > 0
    assert all(layer.step == (1, 0) for layer in trainer.block_layers.values())
