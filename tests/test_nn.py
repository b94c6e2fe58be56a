"""mpt.nn: initialisation streams, Parameter, Module bookkeeping, state dicts, layers."""
import math

import ml_dtypes
import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt import nn
from mpt.kernels.random import random_words
from mpt.nn import Module, Parameter, gaussian, uniform
from mpt.nn.init import _log, _stream
from mpt.testing import as_bits as bits

F32, BF16, F16, F64 = (mpt.get_format(n) for n in ("fp32", "bf16", "fp16", "fp64"))
U = 2.0**-53  # unit roundoff of float64


def assert_bits_equal(a, b):
    a = a.data if isinstance(a, mpt.Tensor) else a
    b = b.data if isinstance(b, mpt.Tensor) else b
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(bits(a), bits(b))


# ---- initialisation streams ---------------------------------------------------------------
def test_log_matches_libm():
    # Error budget of _log relative to ln x, in float64 units u = 2^-53: m+1 rounded (1u), the
    # division (1u) -> f within 3u; Horner on a series ≈ 1 + z/3 (≤ 1u); 2f·p (1u); the final
    # two additions (≤ 1u, and they only shrink the relative error when e ≠ 0): ≤ 6u. math.log
    # is within 1 ulp: tolerance 8u.
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.random(20000), np.exp(-700 * rng.random(20000)),
                        1.0 - 1e-9 * rng.random(2000), [2.0**-1074, 2.0**-1022, 0.5, 1.0]])
    x = x[x > 0]
    ref = np.array([math.log(v) for v in x])
    mine = _log(x)
    assert mine[-1] == 0.0  # ln 1 = 0 exactly
    err = np.abs(mine - ref)
    assert np.all(err <= 8 * U * np.abs(ref))


def test_uniform_takes_53_bits_of_two_philox_words():
    w = random_words(5, _stream("k"), 6).astype(np.uint64)
    expected = [float((int(w[2 * i]) << 21) | (int(w[2 * i + 1]) >> 11)) * 2.0**-53
                for i in range(3)]
    got = uniform(5, "k", 3)
    assert got.tolist() == expected
    u = uniform(5, "k", 10000)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert np.all(u * 2.0**53 == np.floor(u * 2.0**53))


def _polar_oracle(seed, key, n):
    """The polar method written out per pair with Python floats and math.log (an independent
    sequential implementation of the same rule)."""
    u = uniform(seed, key, 4 * n + 200)
    out = []
    for i in range(0, len(u), 2):
        a, b = 2 * u[i] - 1, 2 * u[i + 1] - 1
        s = a * a + b * b
        if 0 < s < 1:
            k = math.sqrt(-2 * math.log(s) / s)
            out += [a * k, b * k]
        if len(out) >= n:
            return np.array(out[:n])
    raise AssertionError("not enough accepted pairs")


def test_gaussian_follows_the_polar_method():
    got = gaussian(3, "blocks.0.attn.in_proj.weight", 501)
    ref = _polar_oracle(3, "blocks.0.attn.in_proj.weight", 501)
    # _log is within 8u of ln s (above); -2 ln s / s, sqrt and the product add 3 roundings, the
    # sqrt halves the relative error of its argument: |err| <= (8/2 + 1 + 1 + 1 + 1)u·|z| plus
    # math.log's own 1 ulp: 10u relative.
    assert np.all(np.abs(got - ref) <= 10 * U * np.abs(ref))


def test_gaussian_golden_values():
    # Pinned bits: the init of every model depends on them; a change here changes every seeded
    # model. They are a function of Philox4x32-10 and IEEE + - * / sqrt only (no libm).
    got = [float(v).hex() for v in gaussian(0, "weight", 4)]
    assert got == ["0x1.aadc185422b9dp-2", "-0x1.6f9a5371158b8p-2",
                   "0x1.b5e36d41e704bp+0", "0x1.2631a037c8780p+1"]


def test_gaussian_prefix_and_key_independence():
    long = gaussian(1, "w", 10001)
    assert_bits_equal(gaussian(1, "w", 7), long[:7])  # a longer draw extends a shorter one
    assert not np.any(gaussian(1, "v", 7) == long[:7])
    assert not np.any(gaussian(2, "w", 7) == long[:7])
    assert gaussian(1, "w", 0).shape == (0,)
    with pytest.raises(ValueError, match="n must be"):
        gaussian(1, "w", -1)


def test_gaussian_statistics():
    n = 200_000
    z = gaussian(11, "stats", n)
    # Fixed samples, so these are fixed numbers; bounds are 5 standard errors of each statistic.
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    p1 = math.erf(1 / math.sqrt(2))  # P(|Z| < 1) = 0.6827
    assert abs(np.mean(np.abs(z) < 1) - p1) < 5 * math.sqrt(p1 * (1 - p1) / n)
    # Kolmogorov-Smirnov distance against Φ; 1.95/sqrt(n) is the 0.1% critical value.
    zs = np.sort(z)
    phi = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in zs[::50]]))
    emp = (np.arange(n)[::50] + 1) / n
    assert np.max(np.abs(emp - phi)) < 1.95 / math.sqrt(n)


def _rne_bf16_oracle(x):
    """float64 -> bf16 by exact float64 steps for normal bf16 values: 8 significant bits,
    ties to even (np.round), ldexp/frexp are exact."""
    m, e = np.frexp(x)
    return np.ldexp(np.round(np.ldexp(m, 8)), e - 8)


def test_init_helpers_round_once_to_the_format():
    p = Parameter(np.zeros((3, 5), ml_dtypes.bfloat16))
    nn.init_normal_(p, 0.02, seed=4, key="w")
    values = 0.02 * gaussian(4, "w", 15)  # float64, all far inside bf16's normal range
    np.testing.assert_array_equal(p.data.astype(np.float64).reshape(-1), _rne_bf16_oracle(values))
    q = Parameter(np.zeros((4,), np.float32))
    nn.init_uniform_(q, 0.5, seed=1, key="b")
    assert_bits_equal(q.data, (0.5 * (2 * uniform(1, "b", 4) - 1)).astype(np.float32))
    nn.init_constant_(q, 1 / 3)
    assert_bits_equal(q.data, np.full(4, 1 / 3).astype(np.float32))


# ---- Parameter ----------------------------------------------------------------------------
def test_parameter_is_a_leaf_that_requires_grad():
    p = Parameter(np.ones((2, 3), np.float32))
    assert p.requires_grad and p.is_leaf and p.format == F32
    t = mpt.tensor([1.0, 2.0], format="bf16")
    q = Parameter(t)
    assert q.format == BF16 and q.data is t.data  # storage taken over, not copied
    with pytest.raises(ValueError, match="differs"):
        Parameter(t, format="fp32")
    with pytest.raises(TypeError, match="dtype float64 but format fp32"):
        Parameter(np.ones(2), format="fp32")


def test_parameter_grad_assignment_checks():
    p = Parameter(np.ones((2, 3), np.float32))
    g = mpt.tensor(np.full((2, 3), 0.5), "fp32")
    p.grad = g
    assert p.grad is g
    p.grad = None
    assert p.grad is None
    with pytest.raises(TypeError, match="grad must be a Tensor or None"):
        p.grad = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="fp32 tensor of shape"):
        p.grad = mpt.tensor(np.ones((3, 2)), "fp32")
    with pytest.raises(ValueError, match="got bf16"):
        p.grad = mpt.tensor(np.ones((2, 3)), format="bf16")


# ---- Module bookkeeping (a hand-built tree, no layers) ------------------------------------
class Leaf(Module):
    def __init__(self, n):
        super().__init__()
        self.w = Parameter(np.arange(n, dtype=np.float32))
        self.b = Parameter(np.zeros(1, np.float32))

    def forward(self, x):
        return x * self.compute(self.w) + self.compute(self.b)


class Tree(Module):
    def __init__(self):
        super().__init__()
        self.scale = Parameter(np.full(3, 2.0, np.float32))
        self.first = Leaf(3)
        self.second = Leaf(3)
        self.again = self.first          # the same module twice: listed once
        self.second.b = self.first.b     # a tied parameter: listed once, under its first name

    def forward(self, x):
        return self.second(self.first(x)) * self.compute(self.scale)


def test_named_parameters_modules_children():
    t = Tree()
    assert [n for n, _ in t.named_parameters()] == ["scale", "first.w", "first.b", "second.w"]
    assert [n for n, _ in t.named_modules()] == ["", "first", "second"]
    assert [n for n, _ in t.named_children()] == ["first", "second", "again"]
    assert list(t.children())[2] is t.first
    assert [n for n, _ in t.named_parameters(recurse=False)] == ["scale"]
    assert len(list(t.parameters())) == 4
    t.extra = 5                       # a plain attribute is not registered
    t.first = None                    # re-assigning a registered name unregisters it
    assert [n for n, _ in t.named_modules()] == ["", "second", "again"]
    del t.scale
    assert "scale" not in dict(t.named_parameters())


def test_module_init_must_run_first():
    class Broken(Module):
        def __init__(self):
            self.w = Parameter(np.ones(1, np.float32))

    with pytest.raises(AttributeError, match="must call Module.__init__"):
        Broken()


def test_train_eval_zero_grad():
    t = Tree()
    assert all(m.training for m in t.modules())
    t.eval()
    assert not any(m.training for m in t.modules())
    t.train()
    assert t.second.training
    x = mpt.tensor(np.ones(3), "fp32")
    t(x).sum().backward()
    assert all(p.grad is not None for p in t.parameters())
    t.zero_grad(set_to_none=False)
    assert all(np.all(p.grad.data == 0) for p in t.parameters())
    t.zero_grad()
    assert all(p.grad is None for p in t.parameters())


def test_state_dict_round_trip_is_bit_exact():
    a, b = Tree(), Tree()
    for i, p in enumerate(a.parameters()):
        nn.init_normal_(p, 1.0, seed=9, key=str(i))
    state = a.state_dict()
    assert list(state) == ["scale", "first.w", "first.b", "second.w"]
    state["scale"][0] = 99.0              # a copy: the module is unchanged
    assert a.scale.data[0] != 99.0
    state = a.state_dict()
    b.to("bf16").to("fp32")
    versions = [p._version for p in b.parameters()]
    assert b.load_state_dict(state) == ([], [])
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert_bits_equal(p.data, q.data)
    assert all(p._version > v for p, v in zip(b.parameters(), versions))  # loads bump versions
    a.to("bf16")
    bf = a.state_dict()
    assert bf["scale"].dtype == ml_dtypes.bfloat16
    b.to("bf16").load_state_dict(bf)
    assert_bits_equal(b.first.w.data, a.first.w.data)


def test_load_state_dict_errors_write_nothing():
    t = Tree()
    good = t.state_dict()
    before = t.state_dict()
    with pytest.raises(KeyError, match=r"missing keys \['second.w'\], unexpected keys \['zzz'\]"):
        t.load_state_dict({**{k: v for k, v in good.items() if k != "second.w"},
                           "zzz": good["scale"]})
    missing, unexpected = t.load_state_dict({"scale": good["scale"], "zzz": good["scale"]},
                                            strict=False)
    assert missing == ["first.w", "first.b", "second.w"] and unexpected == ["zzz"]
    with pytest.raises(ValueError, match=r"state\['first.w'\] has shape \(4,\)"):
        t.load_state_dict({**good, "first.w": np.zeros(4, np.float32), "scale": good["scale"] + 1})
    with pytest.raises(TypeError, match=r"state\['first.b'\] has dtype float64"):
        t.load_state_dict({**good, "first.b": np.zeros(1)})
    with pytest.raises(TypeError, match="must be a numpy ndarray"):
        t.load_state_dict({**good, "first.b": [0.0]})
    tf = mpt.get_format("tf32")
    t.to(tf)
    with pytest.raises(ValueError, match="not tf32 numbers"):
        t.load_state_dict({**good, "first.b": np.full(1, 1 + 2.0**-20, np.float32)})
    t.to("fp32")
    for k, v in t.state_dict().items():
        assert_bits_equal(v, before[k])


def test_to_rounds_parameters_and_grads_nearest_even():
    t = Tree()
    t.first.w.copy_(np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -2.0**-140]))  # ties and a tiny value
    t.first.w.grad = mpt.tensor(np.array([1 + 2.0**-8, 0.0, 1.0]), "fp32")
    ident = id(t.first.w)
    assert t.to("bf16") is t
    assert id(t.first.w) == ident and t.first.w.format == BF16
    # ties go to the even neighbour: 1 and 1 + 2^-6; -2^-140 is a bf16 subnormal (min 2^-133)
    # and rounds to -0.
    np.testing.assert_array_equal(t.first.w.data.astype(np.float32),
                                  np.array([1.0, 1 + 2.0**-6, -0.0], np.float32))
    assert bits(t.first.w.data)[2] == 0x8000
    assert t.first.w.grad.format == BF16 and t.first.w.grad.data[0] == 1.0
    with pytest.raises(ValueError, match="floating format"):
        t.to("int8")
    with pytest.raises(ValueError, match="unknown format"):
        t.to("fp17")


def test_repr_lists_children():
    text = repr(Tree())
    assert text.startswith("Tree(\n  (first): Leaf()") and "(again): Leaf()" in text
    assert repr(Parameter(np.ones(1, np.float32))).startswith("Parameter containing:")


# ---- layers -------------------------------------------------------------------------------
def _x(shape, seed=0, format="fp32"):
    return mpt.tensor(np.random.default_rng(seed).standard_normal(shape), format=format)


def test_linear_init_forward_and_options():
    lin = nn.Linear(5, 3, seed=2)
    bound = 1 / math.sqrt(5)
    for name in ("weight", "bias"):
        p = getattr(lin, name)
        draw = bound * (2 * uniform(2, name, p.size) - 1)  # keyed by the parameter's name
        assert_bits_equal(p.data, draw.astype(np.float32).reshape(p.shape))
        assert np.all(np.abs(p.data) <= bound)
    assert not np.array_equal(nn.Linear(5, 3, seed=3).weight.data, lin.weight.data)
    assert not np.any(nn.Linear(5, 3, seed=None).weight.data)  # seed=None: zeros, for a parent
    x = _x((2, 4, 5))
    assert_bits_equal(lin(x), F.linear(x, lin.weight, lin.bias))
    assert lin(x).shape == (2, 4, 3)
    nobias = nn.Linear(5, 3, bias=False)
    assert nobias.bias is None and [n for n, _ in nobias.named_parameters()] == ["weight"]
    assert_bits_equal(nobias(x), F.linear(x, nobias.weight))
    half = nn.Linear(5, 3, format="bf16", seed=2)
    assert half.weight.format == BF16
    assert_bits_equal(half.weight.data.reshape(-1),
                      mpt.round(bound * (2 * uniform(2, "weight", 15) - 1), "bf16"))
    with pytest.raises(TypeError, match="different formats"):
        half(x)  # fp32 input, bf16 weight: mpt does not promote outside autocast
    with pytest.raises(ValueError, match="floating format"):
        nn.Linear(2, 2, format="int8")


def test_conv2d():
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, seed=1)
    assert conv.weight.shape == (6, 2, 3, 3) and conv.fan_in == 18
    assert np.all(np.abs(conv.weight.data) <= 1 / math.sqrt(18))
    x = _x((2, 4, 7, 7))
    y = conv(x)
    assert y.shape == (2, 6, 4, 4)
    assert_bits_equal(y, F.conv2d(x, conv.weight, conv.bias, 2, 1, 1, 2))
    with pytest.raises(ValueError, match="groups=4 must divide"):
        nn.Conv2d(6, 6, 3, groups=4)


def test_norms():
    ln = nn.LayerNorm(6)
    assert np.all(ln.weight.data == 1) and not np.any(ln.bias.data)
    nn.init_normal_(ln.weight, 1.0, seed=0, key="w")
    nn.init_normal_(ln.bias, 1.0, seed=0, key="b")
    x = _x((3, 6))
    assert_bits_equal(ln(x), F.layer_norm(x, (6,), ln.weight, ln.bias, 1e-5))
    bare = nn.LayerNorm((2, 3), elementwise_affine=False)
    assert list(bare.parameters()) == []
    assert_bits_equal(bare(x.reshape(3, 2, 3)), F.layer_norm(x.reshape(3, 2, 3), (2, 3)))
    rms = nn.RMSNorm(6, eps=1e-6)
    assert np.all(rms.weight.data == 1) and [n for n, _ in rms.named_parameters()] == ["weight"]
    assert_bits_equal(rms(x), F.rms_norm(x, (6,), rms.weight, 1e-6))


def test_embedding():
    emb = nn.Embedding(10, 4, padding_idx=3, seed=1)
    assert not np.any(emb.weight.data[3])
    others = np.delete(np.arange(10), 3)
    draw = gaussian(1, "weight", 40).astype(np.float32).reshape(10, 4)  # normal(0, 1)
    assert_bits_equal(emb.weight.data[others], draw[others])
    idx = np.array([[1, 3], [3, 9]])
    y = emb(idx)
    assert y.shape == (2, 2, 4)
    assert_bits_equal(y.data, emb.weight.data[idx])
    y.sum().backward()
    assert not np.any(emb.weight.grad.data[3])       # the padding row gets no gradient
    assert np.all(emb.weight.grad.data[9] == 1) and np.all(emb.weight.grad.data[0] == 0)


def test_dropout():
    d = nn.Dropout(0.25)
    x = _x((64, 64))
    F.manual_seed(5)
    y1 = d(x)
    F.manual_seed(5)
    y2 = d(x)
    assert_bits_equal(y1, y2)                      # replayable from the generator's seed
    dropped = np.mean(y1.data == 0)
    assert abs(dropped - 0.25) < 5 * math.sqrt(0.25 * 0.75 / x.size)  # 5 standard errors
    kept = y1.data != 0
    assert_bits_equal(y1.data[kept], (x.data[kept] * np.float32(1 / 0.75)).astype(np.float32))
    assert d.eval()(x) is x and nn.Dropout(0.0)(x) is x
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        nn.Dropout(1.5)


def test_sequential_and_module_list():
    a, b = nn.Linear(4, 3, seed=1), nn.Linear(3, 2, seed=2)
    seq = nn.Sequential(a, b)
    x = _x((5, 4))
    assert_bits_equal(seq(x), b(a(x)))
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert len(seq) == 2 and seq[1] is b and seq[-1] is b and list(seq) == [a, b]
    lst = nn.ModuleList([a]).append(b)
    assert len(lst) == 2 and lst[1] is b
    with pytest.raises(TypeError, match="must be a Module"):
        lst.append(lambda t: t)


def test_mlp_is_linear_gelu_linear_with_distinct_keyed_init():
    mlp = nn.MLP(8, hidden=8, seed=4)
    assert not np.array_equal(mlp.fc1.weight.data, mlp.fc2.weight.data)  # same shape, own keys
    w = mlp.fc1.weight
    draw = (2 * uniform(4, "fc1.weight", w.size) - 1) / math.sqrt(8)
    assert_bits_equal(w.data, draw.astype(np.float32).reshape(w.shape))
    x = _x((3, 8))
    assert_bits_equal(mlp(x), mlp.fc2(F.gelu(mlp.fc1(x), approximate="tanh")))
    exact = nn.MLP(8, approximate="none", seed=4)
    assert exact.fc1.weight.shape == (32, 8)
    assert_bits_equal(exact(x), exact.fc2(F.gelu(exact.fc1(x))))


def _attention_oracle(mha, x):
    """Causal multi-head self-attention in float64 numpy (an independent oracle)."""
    B, T, d = x.shape
    H = mha.n_heads
    qkv = x @ mha.in_proj.weight.data.T + mha.in_proj.bias.data          # (B, T, 3d)
    q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(B, T, H, d // H).transpose(0, 2, 1, 3)
               for i in range(3))                                       # (B, H, T, hd)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // H)                 # (B, H, T, T)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = (p @ v).transpose(0, 2, 1, 3).reshape(B, T, d)
    return y @ mha.out_proj.weight.data.T + mha.out_proj.bias.data


def test_multihead_attention_matches_a_float64_oracle():
    mha = nn.MultiheadAttention(8, 2, causal=True, seed=1).to("fp64")
    x = _x((2, 5, 8), format="fp64")
    y = mha(x)
    assert y.shape == (2, 5, 8) and y.format == F64
    # Every stage is a dot product of ≤ 8 terms of size ≤ 4 or a softmax: float64 rounding
    # differences between the two evaluation orders stay below 64u per stage, 6 stages, with
    # magnitudes ≤ 8: 6·64·8·2^-53 < 2^-41. We allow 2^-40.
    np.testing.assert_allclose(y.data, _attention_oracle(mha, x.data), rtol=0, atol=2.0**-40)


def test_causal_attention_ignores_the_future():
    mha = nn.MultiheadAttention(16, 4, causal=True, seed=2)
    x = _x((2, 6, 16), seed=1)
    future = x.numpy()
    future[:, 3:] += 1.0
    y1, y2 = mha(x), mha(mpt.tensor(future))
    assert_bits_equal(y1.data[:, :3], y2.data[:, :3])
    assert not np.array_equal(y1.data[:, 3:], y2.data[:, 3:])
    full = nn.MultiheadAttention(16, 4, causal=False, seed=2)
    assert not np.array_equal(full(x).data[:, :3], full(mpt.tensor(future)).data[:, :3])
    with pytest.raises(ValueError, match="must divide"):
        nn.MultiheadAttention(10, 4)


def test_attention_backend_hook():
    calls = []

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        calls.append((q.shape, is_causal, dropout_p))
        return F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)

    x = _x((2, 4, 8))
    ref = nn.MultiheadAttention(8, 2, causal=True, backend="naive", seed=3)
    custom = nn.MultiheadAttention(8, 2, causal=True, backend=recording, seed=3)
    assert_bits_equal(custom(x), ref(x))
    assert calls == [((2, 2, 4, 4), True, 0.0)]
    nn.register_attention_backend("recording-test", recording)
    try:
        named = nn.MultiheadAttention(8, 2, causal=True, backend="recording-test", seed=3)
        assert_bits_equal(named(x), ref(x))
        assert len(calls) == 2
    finally:
        del nn.ATTENTION_BACKENDS["recording-test"]
    with pytest.raises(ValueError, match="unknown attention backend 'nope'; registered: naive"):
        nn.MultiheadAttention(8, 2, backend="nope")(x)
    with pytest.raises(TypeError, match="register_attention_backend"):
        nn.register_attention_backend("x", 3)


def test_transformer_block_is_pre_ln_residual():
    blk = nn.TransformerBlock(16, 4, seed=5)
    assert blk.attn.causal
    x = _x((2, 5, 16))
    h = x + blk.attn(blk.ln1(x))
    assert_bits_equal(blk(x), h + blk.mlp(blk.ln2(h)))
    keys = [n for n, _ in blk.named_parameters()]
    assert keys[:4] == ["ln1.weight", "ln1.bias", "attn.in_proj.weight", "attn.in_proj.bias"]
    w = blk.attn.out_proj.weight  # keyed by its dotted name under the block
    draw = (2 * uniform(5, "attn.out_proj.weight", w.size) - 1) / math.sqrt(16)
    assert_bits_equal(w.data, draw.astype(np.float32).reshape(w.shape))
