"""Fake quantization (per tensor, per channel, learnable/LSQ), observers and the QAT functions.

Expectations: bit equality against ``mpt.reference.quant`` (exact rationals) on adversarial inputs
(.5 ties, clamp boundaries, zero points at both ends, subnormal and huge scales, NaN/±Inf), against
hand-derived qparams, and — when torch is installed — against PyTorch's own kernels.
"""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mpt
import mpt.quant as Q
from mpt.kernels import quant as K
from mpt.reference.quant import fake_quant_reference, lsq_grad_reference, qparams_reference
from mpt.testing import assert_bits_equal

F32 = np.float32
RANGES = [(-128, 127), (0, 255), (0, 127), (-64, 63), (-8, 7), (-(2**31), 2**31 - 1)]


def _f32(bits):
    return np.array(bits, np.uint32).view(np.float32)


def _adversarial(scale: float, zp: int, qmin: int, qmax: int) -> np.ndarray:
    """Ties, clamp edges and specials for one (scale, zp, range)."""
    s = F32(scale)
    ks = np.array([qmin - zp, qmax - zp, 0, 1, -1, 2, -2, 3], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):              # huge scales overflow: fine
        x = np.concatenate([ks * s, (ks + F32(0.5)) * s, (ks - F32(0.5)) * s])
        x = np.concatenate([x, np.nextafter(x[:8], F32(np.inf)), np.nextafter(x[:8], F32(-np.inf)),
                            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38,
                                      -3.4e38, 1.0, -1.0], np.float32)])
    return x


def _spread(rng, n: int, width: float, scale: float) -> np.ndarray:
    """``n`` normals times ``width·scale`` in float32 (overflow to ±inf is intended for huge
    scales)."""
    with np.errstate(over="ignore"):
        return rng.standard_normal(n).astype(np.float32) * F32(width) * F32(scale)


SCALES = [0.25, 1.0, 0.1, 0.0731, 2.0**-20, 1e-45, 2.0**-140, 3e38, 2.0**127, 2.0**-126]


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("qmin, qmax", RANGES[:5])
def test_per_tensor_adversarial_equals_oracle(scale, qmin, qmax):
    for zp in (qmin, qmax, (qmin + qmax) // 2, 0 if qmin <= 0 <= qmax else qmin):
        x = _adversarial(scale, zp, qmin, qmax)
        y, mask, codes = K.fake_quant_per_tensor(x, F32(scale), zp, qmin, qmax)
        y_ref, mask_ref = fake_quant_reference(x, F32(scale), zp, qmin, qmax)
        assert_bits_equal(y, y_ref, err_msg=f"s={scale} zp={zp} [{qmin},{qmax}]")
        assert np.array_equal(mask, mask_ref)
        assert ((codes >= qmin) & (codes <= qmax)).all()


def test_ties_round_half_to_even_and_mask_on_unclamped():
    s = F32(0.25)                               # x·inv exact: ties are exact .5
    x = np.array([0.125, 0.375, 0.625, -0.125, -0.375, 31.875, 32.125, -32.125], np.float32)
    y, mask, codes = K.fake_quant_per_tensor(x, s, 0, -128, 127)
    # x/s = .5, 1.5, 2.5, -.5, -1.5, 127.5, 128.5, -128.5 -> 0, 2, 2, -0, -2, 128, 128, -128
    assert codes.tolist() == [0, 2, 2, 0, -2, 127, 127, -128]
    assert mask.tolist() == [True] * 5 + [False, False, True]   # 128 > 127; -128 inside
    assert_bits_equal(y, np.array([0, .5, .5, 0, -.5, 31.75, 31.75, -32], np.float32))


def test_nan_maps_to_qmin_and_inverse_overflow():
    # scale 2^-149: inv = +inf, so 0·inf = NaN -> qmin (fmax(NaN, qmin)), x > 0 -> +inf -> qmax
    x = np.array([0.0, 1.0, -1.0, np.nan], np.float32)
    y, mask, codes = K.fake_quant_per_tensor(x, F32(2.0**-149), 3, -128, 127)
    assert codes.tolist() == [-128, 127, -128, -128]
    assert not mask.any()
    assert_bits_equal(y, np.array([-131, 124, -131, -131], np.float32) * F32(2.0**-149))


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=12),
       st.integers(1, 0x7F7FFFFF), st.sampled_from(RANGES), st.integers(0, 2**31))
def test_per_tensor_random_bits_equals_oracle(xbits, sbits, qrange, zseed):
    qmin, qmax = qrange
    zp = qmin + zseed % (qmax - qmin + 1)
    x, s = _f32(xbits), _f32(sbits)
    y, mask, _ = K.fake_quant_per_tensor(x, s, zp, qmin, qmax)
    y_ref, mask_ref = fake_quant_reference(x, s, zp, qmin, qmax)
    assert_bits_equal(y, y_ref)
    assert np.array_equal(mask, mask_ref)


@given(st.lists(st.integers(0, 2**32 - 1), min_size=12, max_size=12),
       st.lists(st.integers(1, 0x7F7FFFFF), min_size=3, max_size=3),
       st.lists(st.integers(-128, 127), min_size=3, max_size=3), st.sampled_from([0, 1, -1]))
def test_per_channel_random_bits_equals_oracle(xbits, sbits, zps, axis):
    x = _f32(xbits).reshape(3, 4) if axis in (0, -2) else _f32(xbits).reshape(4, 3)
    y, mask, _ = K.fake_quant_per_channel(x, _f32(sbits), np.array(zps), axis, -128, 127)
    y_ref, mask_ref = fake_quant_reference(x, _f32(sbits), zps, -128, 127, axis=axis)
    assert_bits_equal(y, y_ref)
    assert np.array_equal(mask, mask_ref)


@pytest.mark.parametrize("scale", SCALES)
def test_per_channel_adversarial_equals_oracle(scale):
    zps = np.array([-128, 127, 0, 5])
    x = np.stack([_adversarial(scale, int(z), -128, 127) for z in zps], axis=1)  # (n, 4)
    s = F32(scale)
    scales = np.array([s, np.nextafter(s, F32(np.inf)), s, s], np.float32)
    y, mask, _ = K.fake_quant_per_channel(x, scales, zps, 1, -128, 127)
    y_ref, mask_ref = fake_quant_reference(x, scales, zps, -128, 127, axis=1)
    assert_bits_equal(y, y_ref)
    assert np.array_equal(mask, mask_ref)


def test_per_channel_infinity_follows_x86_int64_conversion():
    # per channel, +inf becomes INT64_MIN before the clamp (x86), so it lands on qmin, mask 0
    x = np.array([[np.inf, -np.inf, np.nan]], np.float32)
    _, mask, codes = K.fake_quant_per_channel(x, F32([1.0]), np.array([0]), 0, -128, 127)
    assert codes.tolist() == [[-128, -128, -128]] and not mask.any()
    _, _, codes_t = K.fake_quant_per_tensor(x, F32(1.0), 0, -128, 127)
    assert codes_t.tolist() == [[127, -128, -128]]


def test_bad_arguments_raise():
    x = np.zeros(3, np.float32)
    with pytest.raises(TypeError, match="x must be a float32"):
        K.fake_quant_per_tensor(x.astype(np.float64), F32(1), 0, 0, 255)
    with pytest.raises(ValueError, match="zero_point"):
        K.fake_quant_per_tensor(x, F32(1), 300, 0, 255)
    with pytest.raises(ValueError, match="scale"):
        K.fake_quant_per_tensor(x, F32(0), 0, 0, 255)
    with pytest.raises(ValueError, match="quant_min"):
        K.fake_quant_per_tensor(x, F32(1), 0, 5, 4)
    with pytest.raises(ValueError, match="entries"):
        K.fake_quant_per_channel(x.reshape(1, 3), F32([1, 1]), np.array([0, 0]), 1, 0, 255)


# ---- learnable (LSQ) -------------------------------------------------------------------------
LSQ_CASES = [(0.1, 2.5, -128, 127, 1.0), (0.05, 0.3, 0, 255, 0.01),
             (2.0**-140, 3.0, -128, 127, 1.0), (0.02, -0.7, -128, 127, 0.3),
             (0.25, 127.0, -128, 127, 1.0), (0.25, -128.4, -128, 127, 1.0),
             (1.0, 0.5, -8, 7, 1 / math.sqrt(7 * 40))]


@pytest.mark.parametrize("fma", [True, False])
@pytest.mark.parametrize("scale, zf, qmin, qmax, gf", LSQ_CASES)
def test_lsq_gradients_equal_oracle(scale, zf, qmin, qmax, gf, fma):
    rng = np.random.default_rng(7)
    x = np.concatenate([_adversarial(scale, 0, qmin, qmax),
                        _spread(rng, 64, 40, scale)])
    with np.errstate(invalid="ignore"):
        x = x[np.isfinite(x) | np.isnan(x)]
    dy = rng.standard_normal(x.size).astype(np.float32)
    dx, ds, dz, dsv, dzv = K.fake_quant_learnable_grad(x, dy, F32(scale), F32(zf), qmin, qmax, gf,
                                                       fma=fma)
    dx_ref, dsv_ref, dzv_ref, zb = lsq_grad_reference(x, dy, F32(scale), F32(zf), qmin, qmax, gf,
                                                      fma=fma)
    assert zb == K.backward_zero_point(F32(zf), qmin, qmax)
    for got, want in ((dx, dx_ref), (dsv, dsv_ref), (dzv, dzv_ref)):
        assert_bits_equal(got, want)
    # the sums: float64 in C order (Python floats are float64), rounded once
    assert ds == F32(sum(float(v) for v in dsv_ref)) and dz == F32(sum(float(v) for v in dzv_ref))


def test_lsq_fma_contraction_changes_near_ties():
    # x = (k + 1/2)·s nudged: fl32(zb + fl32(x·inv)) and fma(x, inv, zb) round differently somewhere
    s = F32(0.1)
    x = np.array([np.nextafter(F32((k + 0.5) * s), F32(d))
                  for k in range(-20, 20) for d in (-1, 1)], np.float32)
    dy = np.ones_like(x)
    fused = K.fake_quant_learnable_grad(x, dy, s, F32(2.5), -128, 127)[3]
    unfused = K.fake_quant_learnable_grad(x, dy, s, F32(2.5), -128, 127, fma=False)[3]
    assert (fused != unfused).any()


def test_lsq_zero_points_forward_and_backward_differ():
    # forward rne(z), backward trunc(z + 0.5): 2.5 -> 2 and 3; -0.5 -> -0 and 0; clamps to range
    assert (K.forward_zero_point(F32(2.5), -128, 127),
            K.backward_zero_point(F32(2.5), -128, 127)) == (2, 3)
    assert K.forward_zero_point(F32(300.0), 0, 255) == 255
    assert K.backward_zero_point(F32(-3.7), 0, 255) == 0


def test_lsq_formula_matches_esser_inside_and_outside():
    # z = 0, s = 1/4: inside dscale = round(x/s) − x/s, outside −Q_N / Q_P (times dy = 1, g = 1)
    x = np.array([0.3, -0.3, 100.0, -100.0], np.float32)
    _, _, _, dsv, dzv = K.fake_quant_learnable_grad(x, np.ones(4, np.float32), F32(0.25), F32(0.0),
                                                    -128, 127)
    assert_bits_equal(dsv, np.array([1 - F32(0.3) * 4, -(1 - F32(0.3) * 4), 127, -128], np.float32))
    assert_bits_equal(dzv, np.array([0, 0, -0.25, -0.25], np.float32))


def test_lsq_helpers():
    assert Q.lsq_grad_factor(100, 127) == 1 / math.sqrt(12700)
    x = np.array([1.0, -3.0], np.float32)
    assert Q.lsq_init_scale(x, 4) == F32(2 * 2.0 / 2)


# ---- observers -------------------------------------------------------------------------------
def test_affine_qparams_hand_derived():
    # min −1, max 3, uint8: s = 4/255, z = 0 − rne(−1/s) = rne(63.75) = 64
    s, z = Q.calculate_qparams(F32(-1), F32(3), 0, 255, symmetric=False)
    assert s[0] == F32(F32(4) / F32(255)) and z[0] == 64
    # all positive: min⁻ = 0 -> z = qmin; reduce_range [0, 127]
    s, z = Q.calculate_qparams(F32(0.5), F32(2.54), 0, 127, symmetric=False)
    assert s[0] == F32(F32(2.54) / F32(127)) and z[0] == 0
    # all negative: max⁺ = 0 -> z = qmax (clamped)
    s, z = Q.calculate_qparams(F32(-2.55), F32(-1), 0, 255, symmetric=False)
    assert s[0] == F32(F32(2.55) / F32(255)) and z[0] == 255
    # all zero: scale floored to eps = 2^-23
    s, z = Q.calculate_qparams(F32(0), F32(0), 0, 255, symmetric=False)
    assert s[0] == F32(2.0**-23) and z[0] == 0


def test_symmetric_qparams_hand_derived():
    s, z = Q.calculate_qparams(F32(-2.55), F32(1), -128, 127, symmetric=True, dtype="qint8")
    assert s[0] == F32(F32(2.55) / F32(127.5)) and z[0] == 0
    s, z = Q.calculate_qparams(F32(-1), F32(2), 0, 255, symmetric=True, dtype="quint8")
    assert s[0] == F32(F32(2) / F32(127.5)) and z[0] == 128
    s, z = Q.calculate_qparams(F32(-1), F32(2), 0, 100, symmetric=True, dtype="quint8",
                               custom_range=True)
    assert s[0] == F32(F32(2) / F32(50)) and z[0] == 50
    s, z = Q.calculate_qparams(F32(np.inf), F32(-np.inf), 0, 255, symmetric=False)
    assert (s[0], z[0]) == (1.0, 0)


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.sampled_from(RANGES[:5]),
       st.booleans())
def test_qparams_equal_oracle(abits, bbits, qrange, symmetric):
    lo, hi = sorted(float(v) for v in _f32([abits, bbits]))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return
    qmin, qmax = qrange
    dtype = "quint8" if qmin == 0 else "qint8"
    with np.errstate(over="ignore"):
        s, z = Q.calculate_qparams(F32(lo), F32(hi), qmin, qmax, symmetric, dtype)
    s_ref, z_ref = qparams_reference(lo, hi, qmin, qmax, symmetric, 128 if dtype == "quint8" else 0)
    assert s[0] == F32(s_ref) and z[0] == z_ref


def test_ranges_and_reduce_range():
    assert Q.quant_range("quint8") == (0, 255) and Q.quant_range("quint8", True) == (0, 127)
    assert Q.quant_range("qint8") == (-128, 127) and Q.quant_range("qint8", True) == (-64, 63)
    assert Q.quant_range("quint8", True, 0, 255) == (0, 127)
    with pytest.raises(ValueError, match="contain 0"):
        Q.quant_range("quint8", False, 1, 255)
    with pytest.raises(ValueError, match="256 codes"):
        Q.quant_range("qint8", False, -200, 127)


def test_moving_average_update_in_float32():
    obs = Q.MovingAverageMinMaxObserver(dtype="quint8")
    obs(np.array([-1.0, 2.0], np.float32))                      # first batch initialises
    assert (obs.min_val, obs.max_val) == (F32(-1), F32(2))
    obs(np.array([-3.0, 10.0], np.float32))
    c = F32(0.01)
    assert obs.min_val == F32(-1) + c * (F32(-3) - F32(-1))
    assert obs.max_val == F32(2) + c * (F32(10) - F32(2))
    pc = Q.MovingAveragePerChannelMinMaxObserver(ch_axis=1, dtype="qint8",
                                                 qscheme="per_channel_symmetric")
    pc(np.array([[1.0, -2.0], [3.0, 4.0]], np.float32))
    pc(np.array([[0.0, 0.0], [0.0, 8.0]], np.float32))
    # columns are the channels: first batch min (1, -2), max (3, 4); second min (0, 0), max (0, 8)
    lo, hi = np.array([1, -2], np.float32), np.array([3, 4], np.float32)
    assert_bits_equal(pc.min_val, lo + c * (np.array([0, 0], np.float32) - lo))
    assert_bits_equal(pc.max_val, hi + c * (np.array([0, 8], np.float32) - hi))
    minmax = Q.PerChannelMinMaxObserver(ch_axis=0)
    minmax(np.array([[1.0, -2.0], [3.0, 4.0]], np.float32))
    minmax(np.array([[0.0, 5.0], [9.0, 2.0]], np.float32))
    assert minmax.min_val.tolist() == [-2, 2] and minmax.max_val.tolist() == [5, 9]


# ---- differentiable functions ----------------------------------------------------------------
def test_fake_quantize_function_straight_through_gradient():
    x = mpt.tensor(np.array([0.1, 0.9, 2.0, -3.0, 0.37], np.float32), requires_grad=True)
    y = Q.fake_quantize_per_tensor_affine(x, 0.1, 0, -10, 10)
    y_ref, mask = fake_quant_reference(x.data, F32(0.1), 0, -10, 10)
    assert_bits_equal(y.data, y_ref)
    g = np.array([1, -2, 3, -4, 5], np.float32)
    y.backward(mpt.tensor(g))
    assert_bits_equal(x.grad.data, g * mask)            # masked entries are ±0 (dy·0)


def test_fake_quantize_fp16_input_rounds_output_to_fp16():
    x16 = np.array([[0.1, 1.7, -2.3]], np.float16)                 # (1 channel, 3)
    y = Q.fake_quantize_per_channel_affine(mpt.tensor(x16, "fp16"), [0.3], [1], 0, 0, 255)
    y32, _, _ = K.fake_quant_per_channel(x16.astype(np.float32), F32([0.3]), np.array([1]),
                                         0, 0, 255)
    assert y.format.name == "fp16"
    assert_bits_equal(y.data, y32.astype(np.float16))


def test_learnable_function_gradients():
    rng = np.random.default_rng(3)
    xv = (rng.standard_normal(50) * 2).astype(np.float32)
    x = mpt.tensor(xv, requires_grad=True)
    s = mpt.tensor(np.array([0.05], np.float32), requires_grad=True)
    z = mpt.tensor(np.array([1.6], np.float32), requires_grad=True)
    y = Q.fake_quantize_learnable_per_tensor_affine(x, s, z, -128, 127, 0.5)
    g = rng.standard_normal(50).astype(np.float32)
    y.backward(mpt.tensor(g))
    dx, ds, dz, _, _ = K.fake_quant_learnable_grad(xv, g, F32(0.05), F32(1.6), -128, 127, 0.5)
    assert_bits_equal(x.grad.data, dx)
    assert s.grad.data.tolist() == [ds] and z.grad.data.tolist() == [dz]
    y_ref, _ = fake_quant_reference(xv, F32(0.05), 2, -128, 127)     # forward z = rne(1.6) = 2
    assert_bits_equal(y.data, y_ref)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_fake_quant_equals_saturating_ml_dtypes_cast(fmt):
    import ml_dtypes
    dtype = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt]
    top = float(mpt.get_format(fmt).max)
    rng = np.random.default_rng(9)
    xv = np.concatenate([rng.standard_normal(300).astype(np.float32) * F32(40),
                         np.array([0.0, -0.0, 1e-30, np.inf, -np.inf, 4e4, -4e4], np.float32)])
    x = mpt.tensor(xv, requires_grad=True)
    s = F32(3.0)
    y = Q.fake_quantize_fp8(x, fmt, s)
    t = xv * s
    q = np.clip(t, -top, top).astype(dtype).astype(np.float32)   # clip first: saturating RNE
    assert_bits_equal(y.data, q * (F32(1) / s))
    y.backward(mpt.tensor(np.ones_like(xv)))
    assert_bits_equal(x.grad.data, (np.abs(t) <= top).astype(np.float32))


def test_fake_quantize_module_switches():
    fq = Q.FakeQuantize(observer=Q.MovingAverageMinMaxObserver, quant_min=0, quant_max=255)
    x = mpt.tensor(np.array([-1.0, 0.5, 3.0], np.float32))
    y = fq(x)
    assert fq.scale[0] == F32(F32(4) / F32(255)) and fq.zero_point[0] == 64
    assert_bits_equal(y.data, K.fake_quant_per_tensor(x.data, fq.scale[0], 64, 0, 255)[0])
    fq.disable_observer()
    fq(mpt.tensor(np.array([-100.0, 100.0], np.float32)))
    assert fq.scale[0] == F32(F32(4) / F32(255))                # observer off: qparams frozen
    fq.disable_fake_quant()
    assert fq(x) is x
    fq.enable_observer().enable_fake_quant()
    fq(mpt.tensor(np.array([-100.0, 100.0], np.float32)))       # moving average moved the range
    assert fq.activation_post_process.max_val == F32(3) + F32(0.01) * (F32(100) - F32(3))
    w = Q.default_qat_qconfig().weight()
    assert w.per_channel and (w.quant_min, w.quant_max) == (-128, 127)
    a = Q.default_qat_qconfig().activation()
    assert (a.quant_min, a.quant_max) == (0, 127)
    assert not Q.default_qat_qconfig("qnnpack").weight().per_channel


# ---- PyTorch (optional) ----------------------------------------------------------------------
def _torch():
    return pytest.importorskip("torch", reason="torch not installed (optional comparison)")


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("qmin, qmax", RANGES[:3])
def test_per_tensor_equals_torch(scale, qmin, qmax):
    torch = _torch()
    rng = np.random.default_rng(11)
    for zp in (qmin, qmax, (qmin + qmax) // 2):
        x = np.concatenate([_adversarial(scale, zp, qmin, qmax),
                            _spread(rng, 500, 100, scale)])
        y, mask, _ = K.fake_quant_per_tensor(x, F32(scale), zp, qmin, qmax)
        yt, mt = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(
            torch.from_numpy(x), float(F32(scale)), zp, qmin, qmax)
        assert_bits_equal(y, yt.numpy())
        assert np.array_equal(mask, mt.numpy())


def test_per_channel_equals_torch():
    torch = _torch()
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((6, 40)) * 3).astype(np.float32)
    x[0, :5] = [np.inf, -np.inf, np.nan, 0.5, -0.5]
    scales = np.array(SCALES[:6], np.float32)
    zps = np.array([-128, 127, 0, 3, -5, 100])
    y, _, _ = K.fake_quant_per_channel(x, scales, zps, 0, -128, 127)
    yt = torch.fake_quantize_per_channel_affine(
        torch.from_numpy(x), torch.from_numpy(scales), torch.from_numpy(zps.astype(np.int32)),
        0, -128, 127)
    assert_bits_equal(y, yt.numpy())


@pytest.mark.parametrize("scale, zf, qmin, qmax, gf", LSQ_CASES)
def test_learnable_equals_torch_per_element(scale, zf, qmin, qmax, gf):
    """torch sums dscale in float32 in a SIMD-dependent order, so compare per element (one-element
    calls, where torch's sum is the element itself) and the forward on the whole array."""
    torch = _torch()
    rng = np.random.default_rng(13)
    x = np.concatenate([_adversarial(scale, 0, qmin, qmax)[:40],
                        _spread(rng, 60, 40, scale)])
    dy = rng.standard_normal(x.size).astype(np.float32)
    _, _, _, dsv, dzv = K.fake_quant_learnable_grad(x, dy, F32(scale), F32(zf), qmin, qmax, gf)
    dx, _, _, _, _ = K.fake_quant_learnable_grad(x, dy, F32(scale), F32(zf), qmin, qmax, gf)
    for i in range(x.size):
        X = torch.from_numpy(x[i:i + 1].copy()).requires_grad_()
        S = torch.tensor([scale], dtype=torch.float32, requires_grad=True)
        Z = torch.tensor([zf], dtype=torch.float32, requires_grad=True)
        Y = torch._fake_quantize_learnable_per_tensor_affine(X, S, Z, qmin, qmax, gf)
        Y.backward(torch.from_numpy(dy[i:i + 1].copy()))
        # a one-element sum is 0 + v (it turns −0 into +0), as torch's and ours
        got = np.array([dx[i], dsv[i] + F32(0), dzv[i] + F32(0)], np.float32)
        want = np.array([X.grad.item(), S.grad.item(), Z.grad.item()], np.float32)
        assert_bits_equal(got, want, err_msg=f"element {i}: x={x[i]!r}")
    xt = torch.from_numpy(x)
    yt = torch._fake_quantize_learnable_per_tensor_affine(
        xt, torch.tensor([scale], dtype=torch.float32), torch.tensor([zf], dtype=torch.float32),
        qmin, qmax, gf)
    y, _, _ = K.fake_quant_per_tensor(x, F32(scale), K.forward_zero_point(F32(zf), qmin, qmax),
                                      qmin, qmax)
    assert_bits_equal(y, yt.detach().numpy())


def test_observers_equal_torch():
    torch = _torch()
    from torch.ao.quantization import observer as O
    rng = np.random.default_rng(14)
    batches = [(rng.standard_normal((8, 16)) * s + o).astype(np.float32)
               for s, o in [(1, .3), (2, -1), (.5, 2), (3, 0)]]
    cases = [
        (Q.MinMaxObserver, O.MinMaxObserver, {}, {}),
        (Q.MovingAverageMinMaxObserver, O.MovingAverageMinMaxObserver,
         dict(quant_min=0, quant_max=255, reduce_range=True),
         dict(quant_min=0, quant_max=255, reduce_range=True)),
        (Q.MovingAverageMinMaxObserver, O.MovingAverageMinMaxObserver,
         dict(dtype="qint8", qscheme="per_tensor_symmetric"),
         dict(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)),
        (Q.MinMaxObserver, O.MinMaxObserver, dict(quant_min=0, quant_max=100,
                                                  qscheme="per_tensor_symmetric"),
         dict(quant_min=0, quant_max=100, qscheme=torch.per_tensor_symmetric)),
        (Q.MovingAveragePerChannelMinMaxObserver, O.MovingAveragePerChannelMinMaxObserver,
         dict(dtype="qint8", qscheme="per_channel_symmetric", ch_axis=1),
         dict(dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=1)),
        (Q.PerChannelMinMaxObserver, O.PerChannelMinMaxObserver, {}, {}),
    ]
    import warnings
    for ours_cls, theirs_cls, kw_ours, kw_theirs in cases:
        ours = ours_cls(**kw_ours)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # torch's reduce_range deprecation notice
            theirs = theirs_cls(**kw_theirs)
        for x in batches:
            ours(x)
            theirs(torch.from_numpy(x))
            s, z = ours.calculate_qparams()
            st_, zt = theirs.calculate_qparams()
            assert_bits_equal(s, st_.numpy(), err_msg=ours_cls.__name__)
            assert np.array_equal(z, zt.numpy())
