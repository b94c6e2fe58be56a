"""FP8 scaling: Transformer Engine's delayed-scaling rule step by step, saturating quantization,
current scaling, OCP MX blocks, state round trips and errors."""
import ml_dtypes
import numpy as np
import pytest

from mpt.formats import get_format
from mpt.fp8 import (DelayedScaling, DelayedScalingState, current_scale, mx_quantize, quantize,
                     quantize_current)
from mpt.reference.optim import delayed_scaling_reference, mx_scale_exponent_reference
from mpt.testing import as_bits as bits

E4M3, E5M2 = get_format("fp8_e4m3fn"), get_format("fp8_e5m2")
FLT_MAX = float(np.finfo(np.float32).max)


def saturating_cast(x32, fmt):
    """ml_dtypes' RNE cast after clamping to ±max: the same as a saturating RNE (values between
    max and max + ½ulp round to max anyway); NaN stays NaN."""
    with np.errstate(invalid="ignore", over="ignore"):
        clipped = np.where(np.isnan(x32), x32, np.clip(x32, -fmt.max, fmt.max))
        return clipped.astype(fmt.dtype)


def amax_sequence(seed, n, non_finite):
    """Per-step amax values: random magnitudes with zeros, tiny values and (``non_finite``) Inf
    and NaN mixed in. An Inf or NaN freezes the scale while it is in the history window."""
    rng = np.random.default_rng(seed)
    values = (np.exp2(rng.uniform(-20, 20, n)) * rng.uniform(0.5, 1, n)).astype(np.float32)
    specials = rng.random(n)
    values[specials < 0.05] = 0.0
    if non_finite:
        values[(specials >= 0.05) & (specials < 0.07)] = np.inf
        values[(specials >= 0.07) & (specials < 0.08)] = np.nan
    values[(specials >= 0.08) & (specials < 0.10)] = np.float32(2.0**-140)  # 448/amax overflows
    return values


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("history_len,margin", [(1, 0), (4, 0), (16, 2), (1024, 1)])
@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_delayed_scaling_follows_the_rule(fmt, history_len, margin, algo):
    recipe = DelayedScaling(margin=margin, amax_history_len=history_len, amax_compute_algo=algo)
    state = DelayedScalingState(fmt, recipe)
    amaxes = amax_sequence(history_len + margin, 300, non_finite=history_len <= 16)
    rng = np.random.default_rng(0)
    scales = []
    for step, a in enumerate(amaxes):
        # two tensors per step; the first holds the step's amax, the second less
        x = np.array([a, -a / 2, 0.25 * a], np.float32) * np.float32(rng.choice([1, -1]))
        (state.quantize if step % 25 == 0 else state.observe)(x)   # quantize records the same
        state.observe(x / np.float32(4))
        scales.append(float(state.update()))
    expected = delayed_scaling_reference([float(a) for a in amaxes], fp8_max=fmt.max,
                                         margin=margin, history_len=history_len, algo=algo)
    assert scales == expected
    assert len(set(expected)) > 3                          # the scale did move


def test_delayed_scaling_hand_derived():
    state = DelayedScaling(amax_history_len=2).state("forward")
    assert state.scale == 1.0
    state.quantize(np.array([2.0, -7.0], np.float32))
    assert state.update() == np.float32(448 / 7)          # f32(448/7), history max 7
    state.quantize(np.array([1.0], np.float32))
    assert state.update() == np.float32(448 / 7)          # 7 still in the 2-step window
    state.quantize(np.array([0.0], np.float32))
    assert state.update() == np.float32(448.0)            # window {1, 0}: amax 1
    state.quantize(np.array([0.0], np.float32))
    assert state.update() == np.float32(448.0)            # amax 0: scale unchanged
    assert state.amax_history.tolist() == [0.0, 0.0]


def test_quantize_is_saturating_rne_of_the_float32_product():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(4000) * np.exp2(rng.integers(-12, 12, 4000))).astype(np.float32)
    x[:4] = [np.inf, -np.inf, np.nan, 1e30]
    for fmt in (E4M3, E5M2):
        scale = np.float32(3.7)
        q = quantize(x, fmt, scale)
        with np.errstate(over="ignore"):
            want = saturating_cast(x * scale, fmt)
        nan = np.isnan(want.astype(np.float32))
        assert np.array_equal(bits(q.data)[~nan], bits(want)[~nan])
        assert np.isnan(q.data.astype(np.float32)[nan]).all()
        assert q.data.astype(np.float32)[0] == fmt.max and q.data.astype(np.float32)[1] == -fmt.max
        assert q.scale_inv == np.float32(1) / scale
        deq = q.dequantize()
        assert np.array_equal(bits(deq[~nan]),
                              bits(want.astype(np.float32)[~nan] * q.scale_inv))


def test_quantize_rounds_the_product_to_float32_first():
    # x·scale is rounded to float32 before the FP8 rounding (TE's cast): x·scale = 1.0625 +
    # 2^-27 − 2^-46 lies just above the E4M3 tie 1.0625 (between 1 and 1.125); float32 rounds it
    # onto the tie, which rounds to even (1.0); one rounding of the exact product would give 1.125.
    x = np.float32(1.0625 - 2**-23)
    scale = np.float32(1 + 2**-23)
    assert float(x) * float(scale) > 1.0625 and x * scale == np.float32(1.0625)
    assert quantize(np.array([x]), E4M3, scale).data.astype(np.float32)[0] == 1.0


def test_current_scaling():
    x = np.array([0.5, -3.0, 1.5], np.float32)
    assert current_scale(x, E4M3) == np.float32(448 / 3)
    assert current_scale(x, E4M3, power_of_2=True) == np.float32(128.0)     # 2^floor(log2 149.3)
    assert current_scale(x, E5M2, margin=1) == np.float32(np.float32(57344 / 3) / 2)
    assert current_scale(np.zeros(3, np.float32), E4M3) == 1.0
    assert current_scale(np.array([np.nan], np.float32), E4M3) == 1.0
    assert current_scale(np.array([2.0**-140], np.float32), E4M3) == np.float32(FLT_MAX)
    assert current_scale(np.array([2.0**-140], np.float32), E4M3, power_of_2=True) == 2.0**127
    tiny = np.array([1e-9], np.float32)
    assert current_scale(tiny, E4M3, epsilon=1e-3) == np.float32(448) / np.float32(1e-3)
    q = quantize_current(x, E4M3)
    assert q.data.astype(np.float32)[1] == -448.0


# ---- MX -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fp8_e4m3fn", "fp8_e5m2", "fp6_e2m3fn", "fp6_e3m2fn",
                                  "fp4_e2m1fn"])
def test_mx_scales_and_elements(name):
    fmt = get_format(name)
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 80)) * np.exp2(rng.integers(-30, 30, (3, 1)))).astype(np.float32)
    x[0, 32:64] = 0.0                                    # an all-zero block
    x[1, 70] = np.nan                                    # a NaN block (the partial last one)
    x[2, :32] = x[2, :32] * np.float32(2.0**-120)        # tiny values: shared exponent clamps
    x[2, 40] = np.float32(2.0**-140)                     # a subnormal in a block of normal values
    mx = mx_quantize(x, fmt)
    assert mx.scales.shape == (3, 3) and mx.data.shape == x.shape
    scale_bits = mx.scales.view(np.uint8)
    for r in range(3):
        for b in range(3):
            block = x[r, 32 * b:32 * (b + 1)]
            e = mx_scale_exponent_reference(block, fmt.emax)
            assert scale_bits[r, b] == (0xFF if e is None else e + 127), (r, b)
            if e is None:
                continue
            want = saturating_cast((block.astype(np.float64) * 2.0**-e).astype(np.float32), fmt)
            assert np.array_equal(bits(mx.data[r, 32 * b:32 * (b + 1)]), bits(want)), (r, b)
    deq = mx.dequantize()
    assert np.isnan(deq[1, 64:]).all() and np.isfinite(deq[0]).all()
    assert np.array_equal(deq[0, 32:64], np.zeros(32, np.float32))


def test_mx_round_trip_of_representable_values():
    # Values that are E4M3 numbers times a block power of two come back exactly.
    codes = np.arange(0, 0x7F, 4, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)   # (32,)
    x = (codes.astype(np.float32) * np.float32(2.0**-20))[None, :]
    mx = mx_quantize(x, E4M3)
    assert np.array_equal(mx.dequantize(), x)


# ---- state and errors ---------------------------------------------------------------------------
def test_state_dict_round_trip():
    recipe = DelayedScaling(amax_history_len=8)
    a = recipe.state("backward")
    assert a.format == E5M2
    for v in (3.0, 100.0, 0.5):
        a.quantize(np.array([v], np.float32))
        a.update()
    saved = a.state_dict()
    b = recipe.state("backward")
    b.load_state_dict(saved)
    for s in (a, b):
        s.quantize(np.array([7.0], np.float32))
        s.update()
    assert a.scale == b.scale and np.array_equal(a.amax_history, b.amax_history)
    assert saved["amax_history"].dtype == np.float32 and saved["scale"].dtype == np.float32
    with pytest.raises(ValueError, match="format"):
        recipe.state("forward").load_state_dict(saved)
    with pytest.raises(ValueError, match="amax_history"):
        DelayedScaling(amax_history_len=4).state("backward").load_state_dict(saved)


def test_errors():
    with pytest.raises(ValueError, match="amax_compute_algo"):
        DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="fp8_format"):
        DelayedScaling(fp8_format="E3M4")
    with pytest.raises(ValueError, match="amax_history_len"):
        DelayedScaling(amax_history_len=0)
    with pytest.raises(ValueError, match="margin"):
        DelayedScaling(margin=-1)
    with pytest.raises(ValueError, match="FP8"):
        DelayedScalingState("bf16")
    with pytest.raises(ValueError, match="role"):
        DelayedScaling().format_for("weights")
    with pytest.raises(ValueError, match="MX element"):
        mx_quantize(np.ones(32, np.float32), "bf16")
    with pytest.raises(TypeError, match="float32"):
        quantize(np.ones(2), E4M3, 1.0)


def test_infinite_scale_becomes_flt_max_and_non_finite_amax_keeps_the_scale():
    state = DelayedScaling(amax_history_len=1).state()
    state.quantize(np.array([2.0**-140], np.float32))    # 448 / 2^-140 overflows float32
    assert state.update() == np.float32(FLT_MAX)
    state.quantize(np.array([3.0], np.float32))
    assert state.update() == np.float32(448 / 3)
    for bad in (np.inf, np.nan):
        with np.errstate(invalid="ignore"):
            state.quantize(np.array([bad, 1.0], np.float32))
        assert state.update() == np.float32(448 / 3)
