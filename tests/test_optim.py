"""Optimizers: bits equal to the exact-rational oracle of PyTorch's operation order (both fma
profiles), fused == unfused, master weights and lost updates, clipping, state, errors."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpt.autograd.tensor import Tensor
from mpt.kernels.fma import fma_array
from mpt.nn import Parameter
from mpt.optim import SGD, Adam, AdamW, CopyDownStats, clip_grad_norm_
from mpt.reference.optim import (adam_reference, add32, div32, fma32, mul32, sgd_reference, sqrt32,
                                 sub32)
from mpt.testing import as_bits as bits

BF16 = ml_dtypes.bfloat16


def same_bits(a, b):
    return a.dtype == b.dtype and np.array_equal(bits(a), bits(b))


def f32_from_bits(words):
    return np.array(words, dtype=np.uint32).view(np.float32)


def grads(rng, n, low=-12, high=3):
    """Gradient-like float32 values spread over many binades."""
    return (rng.standard_normal(n) * np.exp2(rng.integers(low, high, n))).astype(np.float32)


def param(values, dtype=np.float32):
    return Parameter(np.asarray(values, np.float32).astype(dtype))


def set_grad(p, g):
    p.grad = Tensor(np.asarray(g, np.float32).astype(p.data.dtype))


# ---- the fma primitive and the oracle's arithmetic ----------------------------------------------
def test_fma_kernel_is_single_rounding_where_float64_double_rounds():
    # a·b = 2^-24 + δ with 0 < δ < 2^-53 (found by search): float64 rounds 1 + a·b to the
    # float32 tie 1 + 2^-24, which then rounds to even (1.0); one rounding gives 1 + 2^-23.
    a = np.float32(float.fromhex("0x1.f339c6p+0"))
    b = np.float32(float.fromhex("0x1.068cf4p-25"))
    c = np.float32(1.0)
    assert np.float32(np.float64(a) * np.float64(b) + np.float64(c)) == np.float32(1.0)
    expected = np.float32(1 + 2**-23)
    assert fma_array(np.array([a]), np.array([b]), np.array([c]))[0] == expected
    assert fma32(float(a), float(b), float(c)) == float(expected)


words = st.integers(0, 2**32 - 1)


@given(st.lists(st.tuples(words, words, words), min_size=1, max_size=64))
def test_fma_kernel_matches_exact_oracle(triples):
    a, b, c = (f32_from_bits(col) for col in zip(*triples))
    got = fma_array(a, b, c)
    want = np.array([fma32(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)], np.float32)
    nan = np.isnan(got) & np.isnan(want)
    assert np.array_equal(bits(got)[~nan], bits(want)[~nan]), (a, b, c)
    assert np.array_equal(np.isnan(got), np.isnan(want))


@given(st.lists(st.tuples(words, st.integers(0, 8), st.integers(-8, 8)), min_size=1, max_size=64))
def test_fma_kernel_on_cancelling_products(rows):
    # c close to −a·b: massive cancellation, where a wrong intermediate rounding shows.
    a = f32_from_bits([r[0] for r in rows])
    b = np.array([1 + r[1] * 2.0**-20 for r in rows], np.float32)
    with np.errstate(all="ignore"):
        c = (-(a.astype(np.float64) * b) * (1 + np.array([r[2] for r in rows]) * 2.0**-24)
             ).astype(np.float32)
        got = fma_array(a, b, c)
    want = np.array([fma32(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)], np.float32)
    nan = np.isnan(got)
    assert np.array_equal(nan, np.isnan(want))
    assert np.array_equal(bits(got)[~nan], bits(want)[~nan])


@given(st.lists(st.tuples(words, words), min_size=1, max_size=64))
def test_oracle_arithmetic_agrees_with_ieee_float32(pairs):
    # The oracle computes on rationals; numpy's float32 ufuncs are IEEE operations. Agreement on
    # random bit patterns (specials, subnormals, overflow included) checks the oracle itself.
    x, y = (f32_from_bits(col) for col in zip(*pairs))
    with np.errstate(all="ignore"):
        cases = [(add32, x + y), (sub32, x - y), (mul32, x * y), (div32, x / y)]
        for op, want in cases:
            got = np.array([op(float(a), float(b)) for a, b in zip(x, y)], np.float32)
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(got), nan), op.__name__
            assert np.array_equal(bits(got)[~nan], bits(want)[~nan]), op.__name__
        want = np.sqrt(x)
    got = np.array([sqrt32(float(a)) for a in x], np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(bits(got)[~nan], bits(want)[~nan])


# ---- optimizers against the oracle ---------------------------------------------------------------
SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9, weight_decay=0.01),
    dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.001),
    dict(lr=0.1, momentum=0.8, weight_decay=0.01, nesterov=True),
]
ADAM_CONFIGS = [
    (Adam, dict(lr=1e-2)),
    (Adam, dict(lr=1e-2, weight_decay=0.1)),
    (AdamW, dict(lr=1e-2)),                               # default weight_decay 1e-2
    (AdamW, dict(lr=3e-3, betas=(0.3, 0.6), eps=1e-6, weight_decay=0.1)),  # lerp weight >= 0.5
]
ADAM_DEFAULTS = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8)


def run_sgd(config, fma, fused, steps=4, n=40, seed=0):
    rng = np.random.default_rng(seed)
    p = param(rng.standard_normal(n))
    opt = SGD([p], fma=fma, fused=fused, **config)
    ref_p, ref_buf, history = p.data.copy(), None, []
    for _ in range(steps):
        g = grads(rng, n)
        set_grad(p, g)
        opt.step()
        ref_p, ref_buf = sgd_reference(ref_p, g, ref_buf, fma=fma, **config)
        history.append((p.data.copy(), ref_p))
    return p, opt, ref_buf, history


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("fma", [True, False])
@pytest.mark.parametrize("config", SGD_CONFIGS)
def test_sgd_matches_oracle(config, fma, fused):
    p, opt, ref_buf, history = run_sgd(config, fma, fused)
    for got, want in history:
        assert same_bits(got, want)
    if ref_buf is not None:
        assert same_bits(opt.state[p]["momentum_buffer"], ref_buf)


def run_adam(cls, config, fma, fused, steps=4, n=40, seed=1):
    rng = np.random.default_rng(seed)
    p = param(rng.standard_normal(n))
    opt = cls([p], fma=fma, fused=fused, **config)
    full = {**ADAM_DEFAULTS, "weight_decay": 0.01 if cls is AdamW else 0.0, **config}
    ref = (p.data.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32))
    history = []
    for t in range(1, steps + 1):
        g = grads(rng, n)
        set_grad(p, g)
        opt.step()
        ref = adam_reference(*ref[:1], g, *ref[1:], t, decoupled=cls is AdamW, fma=fma, **full)
        history.append((p.data.copy(), opt.state[p]["exp_avg"].copy(),
                        opt.state[p]["exp_avg_sq"].copy(), ref))
    return history


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("fma", [True, False])
@pytest.mark.parametrize("cls,config", ADAM_CONFIGS)
def test_adam_matches_oracle(cls, config, fma, fused):
    for p, m, v, (ref_p, ref_m, ref_v) in run_adam(cls, config, fma, fused):
        assert same_bits(m, ref_m)
        assert same_bits(v, ref_v)
        assert same_bits(p, ref_p)


def test_fma_profile_changes_bits():
    # The two profiles must be distinguishable, or the oracle tests above could not fail on a
    # profile mix-up.
    for config in SGD_CONFIGS[1:]:
        a = run_sgd(config, True, False)[3][-1][0]
        b = run_sgd(config, False, False)[3][-1][0]
        assert not same_bits(a, b)
    for cls, config in ADAM_CONFIGS:
        a = run_adam(cls, config, True, False)[-1][1]
        b = run_adam(cls, config, False, False)[-1][1]
        assert not same_bits(a, b)


def test_adam_step_counter_and_states_are_float32():
    p = param(np.ones(3), np.float16)
    opt = AdamW([p], master_weights=True)
    set_grad(p, [1, 2, 3])
    opt.step()
    opt.step()
    state = opt.state[p]
    assert state["step"].dtype == np.float32 and float(state["step"]) == 2.0
    for key in ("exp_avg", "exp_avg_sq", "master"):
        assert state[key].dtype == np.float32 and state[key].shape == (3,)


# ---- fused == unfused, master weights, copy-down -------------------------------------------------
OPTIMIZERS = [
    (SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True)),
    (Adam, dict(lr=1e-3, weight_decay=0.01)),
    (AdamW, dict(lr=1e-3)),
]


def train(cls, config, *, fused, fma, dtype, master, rounding="nearest_even", steps=5,
          n=3000, inv_scale=None, seed=2):
    rng = np.random.default_rng(seed)
    weights = [param(rng.standard_normal(n), dtype), param(rng.standard_normal((30, 7)), dtype)]
    opt = cls(weights, fused=fused, fma=fma, master_weights=master, rounding=rounding, seed=11,
              **config)
    stats = []
    for _ in range(steps):
        for w in weights:
            scale = 1.0 if inv_scale is None else 1.0 / inv_scale
            set_grad(w, grads(rng, w.data.size).reshape(w.shape) * np.float32(scale))
        opt.step(inv_scale=inv_scale)
        stats.append(dict(opt.lost_updates))
    return weights, opt, stats


@pytest.mark.parametrize("fma", [True, False])
@pytest.mark.parametrize("cls,config", OPTIMIZERS)
@pytest.mark.parametrize("dtype,master", [(np.float16, True), (BF16, True), (BF16, False),
                                          (np.float32, False)])
def test_fused_equals_unfused(cls, config, fma, dtype, master):
    kwargs = dict(fma=fma, dtype=dtype, master=master, inv_scale=2.0**-10)
    w1, o1, s1 = train(cls, config, fused=False, **kwargs)
    w2, o2, s2 = train(cls, config, fused=True, **kwargs)
    for a, b in zip(w1, w2):
        assert same_bits(a.data, b.data)
        for key, value in o1.state[a].items():
            assert same_bits(value, o2.state[b][key]), key
    assert s1 == s2
    if dtype != np.float32:
        assert sum(s.changed for s in s1[-1].values()) > 0


@pytest.mark.parametrize("cls,config", OPTIMIZERS)
def test_fused_equals_unfused_stochastic_copy_down(cls, config):
    kwargs = dict(fma=True, dtype=BF16, master=True, rounding="stochastic")
    w1, o1, s1 = train(cls, config, fused=False, **kwargs)
    w2, o2, s2 = train(cls, config, fused=True, **kwargs)
    for a, b in zip(w1, w2):
        assert same_bits(a.data, b.data)
        assert same_bits(o1.state[a]["master"], o2.state[b]["master"])
    assert s1 == s2


def test_master_copy_down_is_rne_of_master():
    w, opt, _ = train(AdamW, dict(lr=1e-2), fused=True, fma=True, dtype=np.float16, master=True)
    for p in w:
        assert same_bits(p.data, opt.state[p]["master"].astype(np.float16))


def test_inv_scale_equals_prescaled_gradients():
    # step(inv_scale=s) on grads G gives the bits of step() on grads f32(G·s).
    rng = np.random.default_rng(5)
    g = grads(rng, 500) * np.float32(2.0**12)
    inv = np.float32(2.0**-12) * np.float32(3)                      # not a power of two
    a, b = param(np.ones(500)), param(np.ones(500))
    oa, ob = AdamW([a], fused=True), AdamW([b])
    set_grad(a, g)
    set_grad(b, g * inv)
    oa.step(inv_scale=inv)
    ob.step()
    assert same_bits(a.data, b.data)


def test_lost_updates_without_master_and_kept_with_master():
    # A bf16 weight of 1.0 ignores updates below half an ULP (its ULP above 1.0 is 2^-7, so
    # below 2^-8); SGD with lr·g = 2^-10 every step: without a master every update is lost, the
    # master keeps them.
    n, steps = 64, 8
    pure, mixed = param(np.ones(n), BF16), param(np.ones(n), BF16)
    o_pure = SGD([("w", pure)], lr=2.0**-10)
    o_mixed = SGD([("w", mixed)], lr=2.0**-10, master_weights=True)
    mixed_lost = []
    for _ in range(steps):
        set_grad(pure, -np.ones(n))
        set_grad(mixed, -np.ones(n))
        o_pure.step()
        o_mixed.step()
        assert o_pure.lost_updates["w"] == CopyDownStats(lost=n, changed=n, numel=n)
        mixed_lost.append(o_mixed.lost_updates["w"].lost)
    assert np.all(pure.data.astype(np.float32) == 1.0)
    master = o_mixed.state[mixed]["master"]
    assert np.all(master == np.float32(1 + steps * 2.0**-10))          # exact in float32
    assert np.all(mixed.data.astype(np.float32) == np.float32(1 + 2.0**-7))
    # The copy moves once: at step 5 the master 1 + 5·2^-10 passes the tie 1 + 2^-8 (step 4 is
    # exactly on it and rounds to the even 1.0).
    assert mixed_lost == [n, n, n, n, 0, n, n, n]


def test_stochastic_rounding_reduces_lost_updates():
    n = 4096
    rne, sr = param(np.ones(n), BF16), param(np.ones(n), BF16)
    o_rne = SGD([rne], lr=2.0**-10)
    o_sr = SGD([sr], lr=2.0**-10, rounding="stochastic", seed=3)
    for _ in range(16):
        set_grad(rne, -np.ones(n))
        set_grad(sr, -np.ones(n))
        o_rne.step()
        o_sr.step()
    assert np.all(rne.data.astype(np.float32) == 1.0)
    # Each step moves up by 2^-7 with probability 2^-10/2^-7 = 1/8: the mean is 1 + 16·2^-10.
    mean_gain = float(np.mean(sr.data.astype(np.float64))) - 1.0
    assert abs(mean_gain - 16 * 2.0**-10) < 4 * math.sqrt(16 * (1 / 8) * (7 / 8) / n) * 2.0**-7
    assert o_sr.lost_updates["group0.param0"].lost_fraction < 1.0


# ---- PyTorch, when installed ---------------------------------------------------------------------
@pytest.mark.parametrize("name,config", [
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.1)),
    ("Adam", dict(lr=1e-2, weight_decay=0.1)),
    ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
    ("AdamW", dict(lr=1e-2, betas=(0.3, 0.5))),
])
def test_bit_identical_to_torch_cpu(name, config):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    n = 2000
    p0 = rng.standard_normal(n).astype(np.float32)
    ours = param(p0)
    extra = {} if name == "SGD" else dict(sqrt=lambda v: torch.from_numpy(v).sqrt().numpy())
    opt = {"SGD": SGD, "Adam": Adam, "AdamW": AdamW}[name]([ours], fma=True, **extra, **config)
    theirs = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    topt = getattr(torch.optim, name)([theirs], foreach=False, **config)
    for _ in range(20):
        g = grads(rng, n)
        set_grad(ours, g)
        theirs.grad = torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    assert same_bits(ours.data, theirs.detach().numpy())


def test_clip_grad_norm_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    gs = [grads(rng, 300, 0, 6) for _ in range(3)]
    ours = [param(np.zeros(300)) for _ in gs]
    theirs = [torch.nn.Parameter(torch.zeros(300)) for _ in gs]
    for p, t, g in zip(ours, theirs, gs):
        set_grad(p, g)
        t.grad = torch.from_numpy(g.copy())
    norm = clip_grad_norm_(ours, 1.0)
    tnorm = torch.nn.utils.clip_grad_norm_(theirs, 1.0, foreach=False)
    assert norm == np.float32(tnorm.item())
    for p, t in zip(ours, theirs):
        assert same_bits(p.grad.data, t.grad.numpy())


# ---- clipping ------------------------------------------------------------------------------------
def test_clip_grad_norm_hand_computed():
    a, b = param(np.zeros(2)), param(np.zeros(1))
    set_grad(a, [3.0, 0.0])
    set_grad(b, [4.0])
    total = clip_grad_norm_([a, b], max_norm=1.0)
    assert total == np.float32(5.0)
    coef = np.float32(np.float32(1) / np.float32(np.float32(5) + np.float32(1e-6)))
    assert same_bits(a.grad.data, np.array([np.float32(3) * coef, 0], np.float32))
    assert same_bits(b.grad.data, np.array([np.float32(4) * coef], np.float32))
    # below max_norm: coefficient clamped to 1, gradients unchanged
    set_grad(a, [0.3, 0.4])
    assert clip_grad_norm_(a, 1.0) == np.float32(0.5)
    assert same_bits(a.grad.data, np.array([0.3, 0.4], np.float32))


def test_clip_grad_norm_inf_norm_low_precision_and_errors():
    a = param(np.zeros(3), np.float16)
    set_grad(a, [1.0, -6.0, 2.0])
    assert clip_grad_norm_([a], 3.0, norm_type=math.inf) == np.float32(6.0)
    coef = np.float32(1) / np.float32(np.float32(6) + np.float32(1e-6)) * np.float32(3)
    want = (np.array([1.0, -6.0, 2.0], np.float32) * coef).astype(np.float16)
    assert same_bits(a.grad.data, want)
    set_grad(a, [np.inf, 1.0, 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_([a], 1.0, error_if_nonfinite=True)
    with pytest.raises(ValueError, match="norm_type"):
        clip_grad_norm_([a], 1.0, norm_type=0)
    assert clip_grad_norm_([param(np.zeros(2))], 1.0) == 0


def test_gradient_accumulation_uses_the_summed_grad():
    # Two backward passes accumulate into .grad (fp32 adds); the step uses that sum.
    x1 = np.array([0.5, -1.25, 3.0], np.float32)
    x2 = np.array([0.125, 2.0, -0.75], np.float32)
    p = param([1.0, 2.0, 3.0])
    opt = SGD([p], lr=0.5)
    for x in (x1, x2):
        (p * Tensor(x)).sum().backward()
    assert same_bits(p.grad.data, x1 + x2)
    opt.step()
    want, _ = sgd_reference(np.array([1.0, 2.0, 3.0], np.float32), x1 + x2, None, lr=0.5)
    assert same_bits(p.data, want)


# ---- state, groups, errors -----------------------------------------------------------------------
@pytest.mark.parametrize("cls,config", OPTIMIZERS)
def test_state_dict_resume_is_bit_identical(cls, config):
    def make():
        rng = np.random.default_rng(9)
        w = [param(rng.standard_normal(50), np.float16), param(rng.standard_normal(4))]
        return w, cls(w, master_weights=True, **config)

    def feed(w, rng):
        for p in w:
            set_grad(p, grads(rng, p.data.size))

    w1, o1 = make()
    rng = np.random.default_rng(10)
    for _ in range(3):
        feed(w1, rng)
        o1.step()
    saved = o1.state_dict()
    w2, o2 = make()
    for a, b in zip(w1, w2):
        b.data = a.data.copy()
    o2.load_state_dict(saved)
    rng_a, rng_b = np.random.default_rng(11), np.random.default_rng(11)
    for _ in range(2):
        feed(w1, rng_a)
        feed(w2, rng_b)
        o1.step()
        o2.step()
    for a, b in zip(w1, w2):
        assert same_bits(a.data, b.data)
    for value in saved["state"][0].values():
        assert isinstance(value, np.ndarray) and value.dtype == np.float32


def test_load_state_dict_rejects_mismatches():
    p = param(np.zeros(4))
    opt = Adam([p])
    set_grad(p, np.ones(4))
    opt.step()
    saved = opt.state_dict()
    with pytest.raises(ValueError, match="param_groups"):
        Adam([{"params": [param(np.zeros(4))]}, {"params": [param(np.zeros(4))]}]
             ).load_state_dict(saved)
    with pytest.raises(ValueError, match="shape"):
        Adam([param(np.zeros(5))]).load_state_dict(saved)
    bad = {**saved, "state": {0: {**saved["state"][0], "exp_avg": np.zeros(4)}}}
    with pytest.raises(ValueError, match="float32"):
        Adam([param(np.zeros(4))]).load_state_dict(bad)


def test_param_groups_names_and_zero_grad():
    a, b = param(np.ones(2)), param(np.ones(2))
    opt = SGD([{"params": [("a", a)]}, {"params": [("b", b)], "lr": 0.5}], lr=0.25)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.5]
    assert [name for name, _ in opt.named_parameters()] == ["a", "b"]
    set_grad(a, [1, 1])
    set_grad(b, [1, 1])
    opt.step()
    assert a.data.tolist() == [0.75, 0.75] and b.data.tolist() == [0.5, 0.5]
    opt.zero_grad(set_to_none=False)
    assert a.grad.data.tolist() == [0.0, 0.0]
    opt.zero_grad()
    assert a.grad is None and b.grad is None
    opt.step()                                           # no grads: nothing changes
    assert a.data.tolist() == [0.75, 0.75]


def test_optimizer_errors():
    p = param(np.ones(2))
    with pytest.raises(ValueError, match="empty"):
        SGD([])
    with pytest.raises(ValueError, match="lr"):
        SGD([p], lr=-1.0)
    with pytest.raises(ValueError, match="more than one"):
        SGD([{"params": [p]}, {"params": [p]}])
    with pytest.raises(ValueError, match="betas"):
        Adam([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="nesterov"):
        SGD([p], nesterov=True)
    with pytest.raises(TypeError, match="fma"):
        SGD([p], fma=1)
    with pytest.raises(ValueError, match="sqrt"):
        Adam([p], sqrt="fast")
    with pytest.raises(ValueError, match="fused"):
        Adam([p], sqrt=np.sqrt, fused=True)
    with pytest.raises(ValueError, match="mode"):
        SGD([p], rounding="banker")
    with pytest.raises(TypeError, match="fp32 or narrower"):
        SGD([Parameter(np.ones(2))])                     # float64 storage: fp64
