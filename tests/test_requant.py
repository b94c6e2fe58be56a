"""gemmlowp integer requantization: SRDHM, RoundingDivideByPOT, the multiplier M = M0·2^(shift−31),
int32 accumulation, each against its definition (mpt.reference.quant) and the exact rational."""
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpt.kernels import quant as K
from mpt.reference.quant import (quantize_multiplier_reference, requantize_reference,
                                 rounding_divide_by_pot_reference, srdhm_reference)

I32 = st.integers(-(2**31), 2**31 - 1)
EDGES = [-(2**31), -(2**31) + 1, -(2**30), -1, 0, 1, 2**30, 2**31 - 1, -(2**30) - 1, 2**30 + 1]


def test_srdhm_edges_equal_definition():
    srdhm = K.srdhm.py_func
    for a in EDGES:
        for b in EDGES:
            assert srdhm(a, b) == srdhm_reference(a, b), (a, b)
    assert srdhm(-(2**31), -(2**31)) == 2**31 - 1                   # the one saturating case
    # ties round half up: −0.5 -> 0, 0.5 -> 1, −1.5 -> −1
    assert (srdhm(-(2**30), 1), srdhm(2**30, 1), srdhm(-3 * 2**29, 2)) == (0, 1, -1)


@given(I32, I32)
def test_srdhm_random_equals_definition(a, b):
    assert K.srdhm.py_func(a, b) == srdhm_reference(a, b)


@given(I32, st.integers(0, 31))
def test_rounding_divide_by_pot_equals_definition(x, e):
    assert K.rounding_divide_by_pot.py_func(x, e) == rounding_divide_by_pot_reference(x, e)


def test_rounding_divide_by_pot_ties_away_from_zero():
    rdbpot = K.rounding_divide_by_pot.py_func
    assert [rdbpot(v, 1) for v in (-3, -1, 1, 3, 5)] == [-2, -1, 1, 2, 3]


@given(st.floats(2.0**-40, 2.0**20, allow_nan=False, allow_infinity=False))
def test_quantize_multiplier_equals_definition(m):
    m0, shift = K.quantize_multiplier(m)
    assert (m0, shift) == quantize_multiplier_reference(m)
    assert 2**30 <= m0 < 2**31
    assert abs(Fraction(m0) * Fraction(2) ** (shift - 31) - Fraction(m)) <= Fraction(m) * 2**-31


def test_quantize_multiplier_renormalises():
    # f·2^31 = 2^31 − 1/4 rounds up to 2^31 -> M0 = 2^30, shift + 1
    m = (2.0**31 - 0.25) / 2.0**31
    assert K.quantize_multiplier(m) == (2**30, 1)
    with pytest.raises(ValueError, match="multiplier"):
        K.quantize_multiplier(0.0)


@given(st.lists(I32, min_size=1, max_size=20), st.floats(2.0**-30, 8.0), st.integers(-20, 20),
       st.sampled_from([(-128, 127), (0, 255), (0, 127)]))
def test_requantize_equals_definition(accs, m, zo, qrange):
    qmin, qmax = qrange
    zo = min(max(zo, qmin), qmax)
    m0, shift = K.quantize_multiplier(m)
    acc = np.array(accs, np.int32)
    out = K.requantize(acc, m0, shift, zo, qmin, qmax)
    assert out.tolist() == [requantize_reference(int(a), m0, shift, zo, qmin, qmax) for a in accs]


@given(st.lists(st.integers(-(2**24), 2**24), min_size=1, max_size=30), st.floats(2.0**-20, 0.99))
def test_requantize_within_bound_of_exact_rational(accs, m):
    """|v − acc·M| <= 1/2 + 2^-(n+1) + |acc|·M·2^-31 before the clamp (n = −shift): SRDHM rounds
    acc·M0/2^31 (<= 1/2, i.e. 2^-(n+1) after the shift), RDBPOT rounds once more (<= 1/2), and M0
    carries the multiplier's relative error 2^-31."""
    m0, shift = K.quantize_multiplier(m)
    n = -shift
    out = K.requantize(np.array(accs, np.int32), m0, shift, 0, -(2**31), 2**31 - 1)
    for a, v in zip(accs, out.tolist()):
        err = abs(Fraction(v) - a * Fraction(m))
        assert err <= Fraction(1, 2) + Fraction(1, 2 ** (n + 1)) + abs(a) * Fraction(m) * 2**-31


def test_double_rounding_example():
    # M = 1/4 = 2^30·2^(−1−31): SRDHM(5, 2^30) = round(2.5) = 3, RDBPOT(3, 1) = 2, but 5/4 -> 1
    m0, shift = K.quantize_multiplier(0.25)
    assert (m0, shift) == (2**30, -1)
    assert K.requantize(np.array([5], np.int32), m0, shift, 0, -128, 127).tolist() == [2]


def test_per_channel_requantize():
    acc = np.array([[100, 100], [-7, 9]], np.int32)                 # (N, C): channel axis −1
    mults = [K.quantize_multiplier(m) for m in (0.5, 0.125)]
    out = K.requantize(acc, [m for m, _ in mults], [s for _, s in mults], 3, 0, 255)
    want = [[requantize_reference(int(acc[i, c]), *mults[c], 3, 0, 255) for c in range(2)]
            for i in range(2)]
    assert out.tolist() == want == [[53, 16], [0, 4]]


@pytest.mark.parametrize("adtype, za", [(np.uint8, 128), (np.int8, 0), (np.uint8, 0)])
def test_int_matmul_equals_exact(adtype, za):
    rng = np.random.default_rng(1)
    info = np.iinfo(adtype)
    a = rng.integers(info.min, info.max + 1, (7, 300)).astype(adtype)
    b = rng.integers(-128, 128, (5, 300)).astype(np.int8)
    zb = rng.integers(-3, 3, 5)
    want = (a.astype(np.int64) - za) @ (b.astype(np.int64) - zb[:, None]).T
    assert np.array_equal(K.int_matmul(a, za, b, zb), want.astype(np.int32))


def test_int_matmul_wraps_like_int32():
    a = np.full((1, 70000), 255, np.uint8)
    b = np.full((1, 70000), -128, np.int8)
    exact = 255 * -128 * 70000
    wrapped = (exact + 2**31) % 2**32 - 2**31
    assert K.int_matmul(a, 0, b, 0)[0, 0] == wrapped != exact


# ---- the converted integer-only model against the fake-quant model ---------------------------
import copy  # noqa: E402

import mpt  # noqa: E402
import mpt.quant as Q  # noqa: E402
from mpt import nn  # noqa: E402

U = Fraction(1, 2**24)


def _calibrated(layers, shape, relu=(), seed=0):
    rng = np.random.default_rng(seed)
    model = nn.Sequential(Q.QuantStub(), *layers, Q.DeQuantStub())
    Q.prepare_qat(model, fuse_relu=set(relu))
    for _ in range(4):
        model(mpt.tensor(rng.standard_normal(shape).astype(np.float32)))
    for m in model.modules():
        if isinstance(m, Q.FakeQuantize):
            m.disable_observer()
    return model, mpt.tensor(rng.standard_normal(shape).astype(np.float32))


def _check_layer(qat, intl, x_codes, sx, zx, as_rows):
    """Compare one layer's int8 output with the fake-quant layer's on the same input codes; return
    (#elements that must agree, #near-tie elements). See mpt.quant.convert for the criterion."""
    x_fq = (x_codes.astype(np.float32) - np.float32(zx)) * np.float32(sx)      # fake-quant values
    w_fq = qat.weight_fake_quant(qat.weight).data
    y = qat._op(mpt.tensor(x_fq), mpt.tensor(w_fq)).data                        # fp32 pre-FQ output
    out = qat.activation_post_process
    fake = out.codes(np.maximum(y, 0) if qat.relu else y)
    got = intl(Q.QTensor(x_codes, np.float32(sx), zx)).q.astype(np.int64)
    # exact quantities, one output element at a time: rows (M, K) of x and w
    xr, wr = as_rows(x_codes.astype(np.int64) - zx), intl.weight_codes.reshape(len(w_fq), -1)
    xf, wf = as_rows(x_fq), w_fq.reshape(len(w_fq), -1)
    fake_r, got_r = as_rows(fake[..., None])[..., 0], as_rows(got[..., None])[..., 0]
    bias_q, m0, shift = intl.requant_params(np.float32(sx))
    b = np.zeros(len(w_fq)) if qat.bias is None else qat.bias.data.astype(np.float64)
    so = Fraction(float(out.scale[0]))
    must, near = 0, 0
    for i in range(xr.shape[0]):
        for c in range(wr.shape[0]):
            acc = int(xr[i] @ wr[c]) + (0 if bias_q is None else int(bias_q[c]))
            sw = Fraction(float(intl.weight_scale[c]))
            m = Fraction(float(sx)) * sw / so
            r = acc * m
            ideal = sum(Fraction(float(a)) * Fraction(float(w)) for a, w in zip(xf[i], wf[c]))
            ideal += Fraction(float(b[c]))
            delta = abs(ideal - Fraction(float(sx)) * sw * acc) / so
            size = sum(abs(float(a) * float(w)) for a, w in zip(xf[i], wf[c])) + abs(float(b[c]))
            k = xr.shape[1] + 1
            eps_f = Fraction(k * size * 1.0001) * U / so + 3 * U * abs(ideal / so)
            n = -int(shift[c])
            eps_i = (Fraction(1, 2 ** (n + 1)) if n > 0 else 0) + \
                abs(acc) * abs(Fraction(int(m0[c])) * Fraction(2) ** int(shift[c]) / 2**31 - m)
            margin = abs(r - math.floor(r) - Fraction(1, 2))
            if margin > max(delta + eps_f, eps_i):
                must += 1
                assert got_r[i, c] == fake_r[i, c], (i, c, float(r), got_r[i, c], fake_r[i, c])
            else:
                near += 1
                assert abs(got_r[i, c] - fake_r[i, c]) <= 1
    return must, near, fake


def test_int_linear_model_equals_fake_quant_model():
    model, x = _calibrated([nn.Linear(32, 24, seed=1), nn.Linear(24, 10, seed=2)], (16, 32),
                           relu={"1"})
    y_fake = model(x)
    int_model = Q.convert(copy.deepcopy(model))
    stub = model[0].activation_post_process
    codes = stub.codes(x).astype(np.uint8)
    assert np.array_equal(int_model[0](x).q, codes)
    sx, zx = stub.scale[0], int(stub.zero_point[0])
    total_must = total_near = 0
    for qat, intl in ((model[1], int_model[1]), (model[2], int_model[2])):
        must, near, fake = _check_layer(qat, intl, codes, sx, zx, lambda a: a)
        total_must, total_near = total_must + must, total_near + near
        codes = fake.astype(np.uint8)                 # next layer: the fake model's own input
        sx, zx = (qat.activation_post_process.scale[0],
                  int(qat.activation_post_process.zero_point[0]))
    assert total_must >= 0.95 * (total_must + total_near)
    # end to end, the dequantized outputs agree except where a near tie propagated
    y_int = int_model(x)
    step = float(model[2].activation_post_process.scale[0])
    assert np.abs(y_int.data - y_fake.data).max() <= 2 * step


def test_int_conv_model_equals_fake_quant_model():
    model, x = _calibrated([nn.Conv2d(3, 4, 3, stride=2, padding=1, seed=3)], (2, 3, 7, 7))
    int_model = Q.convert(copy.deepcopy(model))
    stub = model[0].activation_post_process
    codes = stub.codes(x).astype(np.uint8)                                   # (N, C, H, W)
    qat, intl = model[1], int_model[1]
    # rows of im2col: recompute the patches of the codes and of the zero-padded fake values
    n, c, h, w = codes.shape

    def as_rows(a):                                   # (N, C, H, W) -> (N·oh·ow, C·9) or outputs
        if a.shape[1] == c and a.ndim == 4:
            pad = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)))
            rows = [pad[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].reshape(n, -1)
                    for i in range(4) for j in range(4)]
            return np.stack(rows, axis=1).reshape(n * 16, -1)
        return a[..., 0].transpose(0, 2, 3, 1).reshape(n * 16, -1)[..., None]  # outputs (N,O,4,4,1)
    must, near, _ = _check_layer(qat, intl, codes, stub.scale[0], int(stub.zero_point[0]), as_rows)
    assert must >= 0.9 * (must + near)
