"""Loss scaling: PyTorch GradScaler's rule bit for bit, exact power-of-two scaling, skipping,
several optimizers, the fused/master path, records, state and misuse errors."""
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import mpt
from mpt.amp import GradScaler, ScalerUsageError, StaticLossScale
from mpt.autograd.tensor import Tensor
from mpt.nn import Parameter
from mpt.optim import SGD, AdamW
from mpt.reference.optim import f32, grad_scaler_reference
from mpt.testing import as_bits as bits


def loss_of(value, dtype=np.float32):
    """A scalar loss tensor (0-d) of ``dtype``."""
    return Tensor(np.array(value, dtype))


def make(n=4, dtype=np.float32, name="w"):
    p = Parameter(np.ones(n, np.float32).astype(dtype))
    return p, SGD([(name, p)], lr=0.5)


def iteration(scaler, p, opt, overflow, value=1.0):
    """One training iteration with a gradient that holds Inf when ``overflow``."""
    scaler.scale(loss_of(1.0))
    g = np.full(p.shape, value, np.float32)
    if overflow:
        g[-1] = np.inf
    p.grad = Tensor(g.astype(p.dtype))
    scaler.step(opt)
    scaler.update()


def flags(seed, n, p):
    return (np.random.default_rng(seed).random(n) < p).tolist()


# ---- the update rule -----------------------------------------------------------------------------
def test_hand_derived_sequence():
    scaler = GradScaler(init_scale=8.0, growth_interval=2)
    p, opt = make()
    got = []
    for overflow in [0, 0, 1, 0, 0, 0, 1, 1]:
        iteration(scaler, p, opt, overflow)
        got.append((scaler.get_scale(), scaler.get_growth_tracker()))
    assert got == [(8, 1), (16, 0), (8, 0), (8, 1), (16, 0), (16, 1), (8, 0), (4, 0)]


@pytest.mark.parametrize("config,steps,p_overflow", [
    (dict(), 4500, 0.0004),                                            # defaults: 2000-step growth
    (dict(init_scale=1.0, growth_interval=5), 2000, 0.3),              # scale falls below 1
    (dict(init_scale=2.0**120, growth_interval=3), 600, 0.05),         # growth to inf refused
    (dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3, growth_interval=4), 1500, 0.2),
])
def test_update_rule_equals_reference_on_long_random_sequences(config, steps, p_overflow):
    scaler = GradScaler(**config, record=True)
    p, opt = make()
    sequence = flags(steps, steps, p_overflow)
    for overflow in sequence:
        iteration(scaler, p, opt, overflow)
    expected = grad_scaler_reference(sequence, **config)
    got = [(r.new_scale, r.growth_tracker) for r in scaler.records]
    assert got == expected
    assert any(overflow for overflow in sequence) and not all(sequence)
    scales = {s for s, _ in expected}
    assert len(scales) > 2                                            # the scale moved both ways


def test_scale_is_float32_and_inverse_is_rounded_from_float64():
    scaler = GradScaler(init_scale=3.0 * 2**20 + 1)                  # not a float32: 2^21 + ...
    scaler.scale(loss_of(1.0))
    assert scaler.get_scale() == f32(3.0 * 2**20 + 1)
    assert scaler.inv_scale() == np.float32(1.0 / f32(3.0 * 2**20 + 1))


def test_matches_torch_grad_scaler():
    torch = pytest.importorskip("torch")
    config = dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3, growth_interval=4)
    ours = GradScaler(**config)
    theirs = torch.amp.GradScaler("cpu", **config)
    p, opt = make(3)
    tp = torch.nn.Parameter(torch.ones(3))
    topt = torch.optim.SGD([tp], lr=0.5)
    for overflow in flags(1, 400, 0.2):
        ours.scale(loss_of(1.0))
        theirs.scale((tp * 0.25).sum()).backward()
        if overflow:
            with torch.no_grad():
                tp.grad[-1] = math.inf
        p.grad = Tensor(tp.grad.numpy().copy())
        for scaler, optimizer in ((ours, opt), (theirs, topt)):
            scaler.step(optimizer)
            scaler.update()
        topt.zero_grad()
        assert np.float32(ours.get_scale()) == np.float32(theirs.get_scale())
        assert ours.get_growth_tracker() == theirs._get_growth_tracker()
    assert bits(p.data.copy()).tolist() == bits(tp.detach().numpy()).tolist()


# ---- exact power-of-two scaling ------------------------------------------------------------------
def scaled_grads(x16, scale):
    """fp32 weights, fp16 compute: loss = Σ fp16(w)·x; returns the unscaled fp32 grads."""
    w = Parameter(np.full(x16.shape, 1.5, np.float32))
    opt = SGD([w], lr=0.0)
    scaler = StaticLossScale(scale)
    loss = (w.to("fp16") * Tensor(x16)).sum()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    return w.grad.data


@given(st.lists(st.integers(0, 0x7BFF), min_size=1, max_size=16), st.integers(-14, 15),
       st.booleans())
def test_power_of_two_scaling_is_bit_exact(magnitudes, k, negative):
    x16 = np.array(magnitudes, np.uint16).view(np.float16) * np.float16(-1 if negative else 1)
    scale = 2.0**k
    exact = x16.astype(np.float64) * scale
    # nothing over/underflowed: every scaled gradient is an fp16 number (no rounding, no Inf)
    assume(np.all(np.abs(exact) <= 65504) and np.all(exact.astype(np.float16) == exact))
    assert np.array_equal(bits(scaled_grads(x16, scale)), bits(scaled_grads(x16, 1.0)))


def test_scaling_by_a_non_power_of_two_is_not_exact():
    # The property above can fail: with S = 3 the fp16 products S·x round.
    x16 = np.array([1.0009765625, 3.0, 0.1], np.float16)
    assert not np.array_equal(bits(scaled_grads(x16, 3.0)), bits(scaled_grads(x16, 1.0)))


def test_underflow_without_scaling_and_recovery_with_it():
    # loss = Σ fp16(w)·a·b with a = 2^-12, b = 2^-13: dL/dw = 2^-25 is half fp16's smallest
    # subnormal and flushes to zero in the fp16 backward; a loss scale of 2^10 keeps it
    # (docs/amp.md §5).
    def grad_of_w(scaler):
        w = Parameter(np.ones(3, np.float32))
        a, b = Tensor(np.full(3, 2.0**-12, np.float16)), Tensor(np.full(3, 2.0**-13, np.float16))
        scaler.scale((w.to("fp16") * a * b).sum()).backward()
        scaler.unscale_(SGD([w], lr=0.0))
        return w.grad.data

    assert grad_of_w(StaticLossScale(1.0)).tolist() == [0.0] * 3
    assert grad_of_w(StaticLossScale(2.0**10)).tolist() == [2.0**-25] * 3


# ---- skipping, several optimizers, the master/fused path -----------------------------------------
def test_step_skipped_on_overflow_and_applied_otherwise():
    scaler = GradScaler(init_scale=4.0)
    p, opt = make(3)
    iteration(scaler, p, opt, overflow=True)
    assert p.data.tolist() == [1.0, 1.0, 1.0] and scaler.get_scale() == 2.0
    iteration(scaler, p, opt, overflow=False, value=4.0)
    # unscaled grad 4·f32(1/2) = 2, SGD lr 0.5: 1 − 1 = 0
    assert p.data.tolist() == [0.0, 0.0, 0.0]


def test_several_optimizers_share_the_scale():
    scaler = GradScaler(init_scale=16.0, growth_interval=1)
    a, opt_a = make(2, name="a")
    b, opt_b = make(2, name="b")
    scaler.scale(loss_of(1.0))
    a.grad = Tensor(np.array([np.nan, 1], np.float32))
    b.grad = Tensor(np.array([16, 16], np.float32))
    scaler.step(opt_a)
    scaler.step(opt_b)
    scaler.update()
    assert a.data.tolist() == [1.0, 1.0]              # its own overflow: skipped
    assert b.data.tolist() == [0.5, 0.5]              # clean: stepped (grad 16/16 = 1, lr 0.5)
    assert scaler.get_scale() == 8.0                  # summed found_inf: back off
    assert scaler.get_growth_tracker() == 0


@pytest.mark.parametrize("fused", [False, True])
def test_master_weight_optimizer_unscales_fp16_grads_in_step(fused):
    rng = np.random.default_rng(3)
    values = rng.standard_normal(64).astype(np.float16)
    grad16 = (rng.standard_normal(64) * 100).astype(np.float16)
    p, q = Parameter(values.copy()), Parameter(values.copy())
    opt_p = AdamW([p], master_weights=True, fused=fused)
    opt_q = AdamW([q], master_weights=True, fused=fused)
    scaler = GradScaler(init_scale=2.0**10)
    scaler.scale(loss_of(1.0))
    p.grad = Tensor(grad16.copy())
    q.grad = Tensor(grad16.copy())
    scaler.step(opt_p)                                # fp16 grads: no ValueError on this path
    scaler.update()
    opt_q.step(inv_scale=np.float32(2.0**-10))
    assert np.array_equal(bits(p.data), bits(q.data))
    assert np.array_equal(bits(opt_p.state[p]["master"]), bits(opt_q.state[q]["master"]))
    grad16[5] = np.float16(np.inf)
    scaler.scale(loss_of(1.0))
    p.grad = Tensor(grad16.copy())
    before = opt_p.state[p]["master"].copy()
    scaler.step(opt_p)
    scaler.update()
    assert np.array_equal(bits(opt_p.state[p]["master"]), bits(before))
    assert scaler.get_scale() == 2.0**9


def test_bf16_grads_are_unscaled_in_float32_and_rounded():
    scaler = GradScaler(init_scale=3.0)
    p, opt = make(2, dtype=mpt.get_format("bf16").dtype)
    scaler.scale(loss_of(1.0))
    g = np.array([1.0, 5.0], np.float32)
    p.grad = Tensor(g.astype(p.dtype))
    scaler.unscale_(opt)
    want = (g * np.float32(1 / 3.0)).astype(p.dtype)
    assert np.array_equal(bits(p.grad.data), bits(want))


# ---- records, floor and cap ----------------------------------------------------------------------
def test_records_name_the_first_overflowing_tensor():
    a, b = Parameter(np.ones(2, np.float32)), Parameter(np.ones(2, np.float32))
    opt = SGD([("layer1.weight", a), ("layer2.weight", b)], lr=0.1)
    scaler = GradScaler(init_scale=8.0, growth_interval=1, record=True)
    for bad in (None, "b", "ab"):
        scaler.scale(loss_of(1.0))
        a.grad = Tensor(np.array([1, np.inf if bad and "a" in bad else 1], np.float32))
        b.grad = Tensor(np.array([np.nan if bad and "b" in bad else 1, 1], np.float32))
        scaler.step(opt)
        scaler.update()
    r = scaler.records
    assert [x.first_overflow for x in r] == [None, "layer2.weight", "layer1.weight"]
    assert [x.skipped for x in r] == [False, True, True]
    assert [x.found_inf for x in r] == [0, 1, 2]
    assert [x.scale for x in r] == [8.0, 16.0, 8.0]
    assert [x.new_scale for x in r] == [16.0, 8.0, 4.0]


def test_min_and_max_scale():
    scaler = GradScaler(init_scale=4.0, growth_interval=1, min_scale=2.0, max_scale=16.0)
    p, opt = make()
    got = []
    for overflow in [1, 1, 1, 0, 0, 0, 0]:
        iteration(scaler, p, opt, overflow)
        got.append(scaler.get_scale())
    assert got == [2.0, 2.0, 2.0, 4.0, 8.0, 16.0, 16.0]
    with pytest.raises(ValueError, match="min_scale"):
        GradScaler(min_scale=4.0, max_scale=2.0)


def test_static_loss_scale_keeps_its_scale_and_skips_overflow():
    scaler = StaticLossScale(128.0)
    p, opt = make()
    iteration(scaler, p, opt, overflow=True)
    assert scaler.get_scale() == 128.0 and p.data.tolist() == [1.0] * 4
    for _ in range(3):
        iteration(scaler, p, opt, overflow=False, value=128.0)
    assert scaler.get_scale() == 128.0 and p.data.tolist() == [-0.5] * 4


# ---- state and errors ----------------------------------------------------------------------------
def test_state_dict_round_trip():
    scaler = GradScaler(init_scale=64.0, growth_interval=3, record=True)
    p, opt = make()
    for overflow in [0, 1, 0, 0]:
        iteration(scaler, p, opt, overflow)
    state = scaler.state_dict()
    assert state["scale"] == 32.0 and state["_growth_tracker"] == 2
    assert all(isinstance(v, (int, float, list)) for v in state.values())
    other = GradScaler(record=True)
    other.load_state_dict(state)
    for s in (scaler, other):
        iteration(s, p, opt, overflow=False)
    assert other.get_scale() == scaler.get_scale() == 64.0
    assert other.records == scaler.records
    with pytest.raises(RuntimeError, match="empty"):
        GradScaler().load_state_dict({})
    assert GradScaler(enabled=False).state_dict() == {}


def test_disabled_scaler_passes_through():
    scaler = GradScaler(enabled=False)
    p, opt = make()
    loss = loss_of(2.0)
    assert scaler.scale(loss) is loss
    p.grad = Tensor(np.ones(4, np.float32))
    scaler.step(opt)
    scaler.update()
    assert p.data.tolist() == [0.5] * 4 and scaler.get_scale() == 1.0


def test_misuse_errors():
    p, opt = make()
    scaler = GradScaler()
    for call in (lambda: scaler.unscale_(opt), lambda: scaler.step(opt), scaler.update):
        with pytest.raises(AssertionError, match="_scale is None"):
            call()
    assert issubclass(ScalerUsageError, RuntimeError)
    scaler.scale(loss_of(1.0))
    with pytest.raises(ScalerUsageError, match="No inf checks"):
        scaler.update()
    p.grad = Tensor(np.ones(4, np.float32))
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    scaler.update()
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, closure=lambda: None)
    q, opt16 = make(dtype=np.float16)
    q.grad = Tensor(np.ones(4, np.float16))
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        scaler.unscale_(opt16)
    with pytest.raises(TypeError, match="outputs"):
        scaler.scale(3.0)
    for bad in (dict(growth_factor=1.0), dict(backoff_factor=1.0), dict(growth_interval=0),
                dict(init_scale=0.0)):
        with pytest.raises(ValueError):
            GradScaler(**bad)


def test_scale_of_an_fp16_loss_is_fp32():
    scaler = GradScaler()
    out = scaler.scale(loss_of(2.0, np.float16))
    assert out.format.name == "fp32" and out.item() == 2.0 * 2**16
    outs = scaler.scale([loss_of(1.0), (loss_of(3.0),)])
    assert outs[0].item() == 2.0**16 and outs[1][0].item() == 3 * 2.0**16
