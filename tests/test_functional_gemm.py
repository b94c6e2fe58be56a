"""The GEMM ops (matmul, linear, conv2d, attention): every product is ``mpt.gemm`` with the active
model — forward, dgrad and wgrad — checked bit for bit against direct ``mpt.gemm`` calls."""
import math

import ml_dtypes
import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt.engines import gemm
from mpt.testing import as_bits as bits

BF16 = ml_dtypes.bfloat16


def same(actual, expected):
    np.testing.assert_array_equal(bits(actual), bits(expected))


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("fmt,dtype,model", [("fp32", np.float32, "ieee_fma"),
                                             ("fp16", np.float16, "hopper"),
                                             ("bf16", BF16, "ampere"),
                                             ("fp16", np.float16, "ieee_mul_add")])
def test_linear_forward_dgrad_wgrad_are_gemm_calls(fmt, dtype, model):
    rng = np.random.default_rng(0)
    x, w, b = rand(rng, (2, 5, 24), dtype), rand(rng, (7, 24), dtype), rand(rng, (7,), dtype)
    g = rand(rng, (2, 5, 7), dtype)
    tx, tw, tb = (mpt.Tensor(a.copy(), fmt, requires_grad=True) for a in (x, w, b))
    with mpt.matmul_model(model):
        y = F.linear(tx, tw, tb)
        y.backward(g)
    acc = gemm(x.reshape(10, 24), np.ascontiguousarray(w.T), model=model)
    same(y, (acc + b.astype(np.float32)).astype(dtype).reshape(2, 5, 7))  # FP32 bias epilogue
    g2 = g.reshape(10, 7)
    same(tx.grad, gemm(g2, w, model=model).astype(dtype).reshape(2, 5, 24))
    same(tw.grad, gemm(np.ascontiguousarray(g2.T), x.reshape(10, 24), model=model).astype(dtype))
    same(tb.grad, np.cumsum(g2.astype(np.float32), axis=0, dtype=np.float32)[-1].astype(dtype))


def test_fp16_autocast_linear_is_gemm_on_rounded_inputs():
    # the example: under fp16 autocast with model="hopper", a linear's output bits are
    # mpt.gemm on the fp16-rounded inputs (plus the FP32 bias epilogue, rounded once to fp16)
    rng = np.random.default_rng(1)
    x, w, b = rand(rng, (16, 64)), rand(rng, (32, 64)), rand(rng, (32,))
    tw = mpt.Tensor(w.copy(), requires_grad=True)
    tb = mpt.Tensor(b.copy(), requires_grad=True)
    with mpt.autocast("fp16", model="hopper"):
        y = F.linear(mpt.Tensor(x), tw, tb)
    x16, w16, b16 = x.astype(np.float16), w.astype(np.float16), b.astype(np.float16)
    acc = gemm(x16, np.ascontiguousarray(w16.T), model="hopper")
    assert y.format.name == "fp16"
    same(y, (acc + b16.astype(np.float32)).astype(np.float16))
    g = rand(rng, (16, 32), np.float16)
    y.backward(g)
    # wgrad in fp16 (the cast copy's format), then the cast's backward widens it exactly
    wg16 = gemm(np.ascontiguousarray(g.T), x16, model="hopper").astype(np.float16)
    assert tw.grad.format.name == "fp32"
    same(tw.grad, wg16.astype(np.float32))


def test_fp32_operands_on_a_tensor_core_model_run_ieee_fma_and_tf32_runs_tensor_cores():
    rng = np.random.default_rng(2)
    a, b = rand(rng, (8, 40)), rand(rng, (40, 6))
    with mpt.matmul_model("hopper"):
        y = F.matmul(mpt.Tensor(a), mpt.Tensor(b))
        t = F.matmul(mpt.Tensor(a).to("tf32"), mpt.Tensor(b).to("tf32"))
    same(y, gemm(a, b, model="ieee_fma"))
    assert t.format.name == "tf32"
    tf = t.numpy()
    expected = gemm(mpt.tensor(a, "tf32").numpy(), mpt.tensor(b, "tf32").numpy(), model="hopper",
                    in_format="tf32")
    same(tf, mpt.tensor(expected, "tf32").numpy())


def test_matmul_batched_broadcast_and_fold():
    rng = np.random.default_rng(3)
    a, b, b3 = rand(rng, (2, 3, 5, 8), BF16), rand(rng, (8, 4), BF16), rand(rng, (3, 8, 4), BF16)
    ta = mpt.Tensor(a.copy(), requires_grad=True)
    tb = mpt.Tensor(b.copy(), requires_grad=True)
    tb3 = mpt.Tensor(b3.copy(), requires_grad=True)
    with mpt.matmul_model("ampere"):
        y = ta @ tb  # N-D @ 2-D: one GEMM over the 30 flattened rows
        y.backward(np.ones(y.shape))
        z = F.matmul(ta, tb3)  # batch (2, 3) broadcast against (3,)
        gz = rand(rng, z.shape, BF16)
        ta.grad = None
        z.backward(gz)
    same(y, gemm(a.reshape(30, 8), b, model="ampere").astype(BF16).reshape(2, 3, 5, 4))
    ones = np.ones((30, 4), BF16)
    same(tb.grad, gemm(np.ascontiguousarray(a.reshape(30, 8).T), ones, model="ampere").astype(BF16))
    same(z, gemm(a, b3, model="ampere").astype(BF16))
    same(ta.grad,
         gemm(gz, np.ascontiguousarray(np.swapaxes(b3, -1, -2)), model="ampere").astype(BF16))
    per_batch = gemm(np.ascontiguousarray(np.swapaxes(a, -1, -2)), gz,
                     model="ampere")  # (2, 3, 8, 4)
    summed = np.cumsum(per_batch, axis=0, dtype=np.float32)[-1]  # broadcast dim summed in FP32
    same(tb3.grad, summed.astype(BF16))


def _im2col_oracle(x, kh, kw, stride, pad):
    """(N, L, C·kh·kw) columns by numpy slicing (k index (c, i, j) row-major)."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, w = xp.shape
    ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
    cols = np.empty((n, ho, wo, c, kh, kw), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, :, :, i, j] = xp[:, :, i:i + stride * ho:stride,
                                        j:j + stride * wo:stride].transpose(0, 2, 3, 1)
    return cols.reshape(n, ho * wo, c * kh * kw), ho, wo


def test_conv2d_is_im2col_onto_gemm():
    rng = np.random.default_rng(4)
    x, w, b = rand(rng, (2, 3, 7, 6), np.float16), rand(rng, (5, 3, 3, 3), np.float16), \
        rand(rng, (5,), np.float16)
    tx, tw = mpt.Tensor(x.copy(), requires_grad=True), mpt.Tensor(w.copy(), requires_grad=True)
    with mpt.matmul_model("hopper"):
        y = F.conv2d(tx, tw, mpt.Tensor(b), stride=2, padding=1)
        g = rand(rng, y.shape, np.float16)
        y.backward(g)
    cols, ho, wo = _im2col_oracle(x, 3, 3, 2, 1)
    acc = gemm(cols, np.ascontiguousarray(w.reshape(5, 27).T), model="hopper")  # (2, L, 5)
    ref = (acc.transpose(0, 2, 1).reshape(2, 5, ho, wo) + b.astype(np.float32).reshape(1, 5, 1, 1))
    same(y, ref.astype(np.float16))
    gk = np.ascontiguousarray(g.reshape(2, 5, -1).transpose(1, 0, 2).reshape(5, -1))  # (5, N·L)
    dw = gemm(gk, cols.reshape(-1, 27), model="hopper").astype(np.float16).reshape(w.shape)
    same(tw.grad, dw)
    # dgrad: the adjoint of im2col applied to the dgrad GEMM, summed in FP32 in (oh, ow, i, j) order
    dcols = gemm(np.ascontiguousarray(g.reshape(2, 5, -1).transpose(0, 2, 1)), w.reshape(5, 27),
                 model="hopper").reshape(2, ho, wo, 3, 3, 3)
    dx = np.zeros((2, 3, 9, 8), np.float32)
    for oh in range(ho):
        for ow in range(wo):
            for i in range(3):
                for j in range(3):
                    dx[:, :, 2 * oh + i, 2 * ow + j] += dcols[:, oh, ow, :, i, j]
    same(tx.grad, dx[:, :, 1:8, 1:7].astype(np.float16))


def test_attention_rounding_points_fp16_hopper():
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, (2, 6, 16), np.float16), rand(rng, (2, 9, 16), np.float16), \
        rand(rng, (2, 9, 8), np.float16)
    with mpt.matmul_model("hopper"):
        out = F.scaled_dot_product_attention(mpt.Tensor(q), mpt.Tensor(k), mpt.Tensor(v),
                                             is_causal=True)
    s = gemm(q, np.ascontiguousarray(np.swapaxes(k, 1, 2)), model="hopper") * np.float32(0.25)
    s = np.where(F.causal_mask(6, 9), s, np.float32(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    e = np.vectorize(lambda t: math.exp(float(t)))(s - m).astype(np.float32)
    p = e / np.cumsum(e, axis=-1, dtype=np.float32)[..., -1:]
    expected = gemm(p.astype(np.float16), v, model="hopper").astype(np.float16)
    same(out, expected)
