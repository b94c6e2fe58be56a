"""Precision contracts of mpt.functional as bit assertions (fp32 / fp16 / bf16 storage), fixed
orders, determinism across runs and Numba thread counts, and bad input.

The GEMM-based ops (matmul, linear, conv2d, attention) are checked bit for bit against
``mpt.gemm`` in ``tests/test_functional_gemm.py``.
"""
import hashlib
import math
import os
import subprocess
import sys

import ml_dtypes
import numba
import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt.testing import as_bits as bits

BF16 = ml_dtypes.bfloat16


def assert_same_bits(actual, expected):
    """Bit equality, except that any NaN matches any NaN."""
    a = actual.numpy() if isinstance(actual, mpt.Tensor) else np.asarray(actual)
    e = np.asarray(expected)
    assert a.dtype == e.dtype, (a.dtype, e.dtype)
    nan_a, nan_e = np.isnan(a.astype(np.float64)), np.isnan(e.astype(np.float64))
    np.testing.assert_array_equal(nan_a, nan_e)
    np.testing.assert_array_equal(bits(a)[~nan_a], bits(e)[~nan_e])


def all_patterns(dtype):
    return np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dtype)


# ---- elementwise arithmetic: one fp32 operation, one rounding ------------------------------------


@pytest.mark.parametrize("fmt,dtype", [("fp16", np.float16), ("bf16", BF16)])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_arithmetic_is_one_fp32_op_rounded_once(fmt, dtype, op):
    rng = np.random.default_rng(1)
    a = all_patterns(dtype)  # every pattern, paired with random patterns
    b = rng.permutation(a)
    fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op]
    with np.errstate(all="ignore"):
        expected = fn(a.astype(np.float32), b.astype(np.float32)).astype(dtype)
        got = getattr(F, op)(mpt.Tensor(a, fmt), mpt.Tensor(b, fmt))
    assert got.format.name == fmt
    assert_same_bits(got, expected)


def test_python_numbers_are_rounded_to_fp32_first():
    x = mpt.tensor([3.0], "fp16")
    # 0.1 enters as f32(0.1); 3·f32(0.1) rounded to fp16
    expected = (np.float32(3.0) * np.float32(0.1)).astype(np.float16)
    assert_same_bits(x * 0.1, np.array([expected]))
    assert_same_bits(0.1 * x, np.array([expected]))
    y = mpt.tensor([1.0], "fp64")
    assert (y * 0.1).item() == 0.1  # fp64 mode keeps the double


def test_sqrt_is_correctly_rounded():
    x = np.random.default_rng(2).uniform(0, 1e6, 10000).astype(np.float32)
    # a float64 sqrt of a float32 rounds correctly to float32 (53 ≥ 2·24 + 2: no double-rounding
    # error), so it is the oracle for IEEE's correctly rounded float32 sqrt
    assert_same_bits(F.sqrt(mpt.Tensor(x)), np.sqrt(x.astype(np.float64)).astype(np.float32))


# ---- transcendentals: float64 evaluation, rounded to fp32 then to the format (exhaustive) --------


def _exp(v):
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def _sig(v):
    return 0.5 * math.tanh(0.5 * v) + 0.5


ORACLES = {  # the float64 formulas of the docstrings, with Python's math (the same libm)
    "exp": (F.exp, _exp),
    "log": (F.log, lambda v: math.log(v) if v > 0 else (-math.inf if v == 0 else math.nan)),
    "tanh": (F.tanh, math.tanh),
    "sigmoid": (F.sigmoid, _sig),
    "gelu": (F.gelu, lambda v: 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))),
    "gelu_tanh": (lambda t: F.gelu(t, approximate="tanh"), lambda v: 0.5 * v * (1.0 + math.tanh(
        0.7978845608028654 * (v + 0.044715 * v * v * v)))),
    "silu": (F.silu, lambda v: v * _sig(v)),
}


@pytest.mark.parametrize("fmt,dtype", [("fp16", np.float16), ("bf16", BF16)])
@pytest.mark.parametrize("name", sorted(ORACLES))
def test_transcendental_on_every_16_bit_pattern(fmt, dtype, name):
    op, f64 = ORACLES[name]
    x = all_patterns(dtype)
    with np.errstate(all="ignore"):
        values = x.astype(np.float64)
        wide = np.array([f64(v) if not math.isnan(v) else math.nan for v in values])
        expected = wide.astype(np.float32).astype(dtype)
    got = op(mpt.Tensor(x, fmt))
    assert got.format.name == fmt
    assert_same_bits(got, expected)


def test_transcendentals_of_fp32_are_float64_rounded_once():
    x = np.random.default_rng(3).uniform(-10, 10, 5000).astype(np.float32)
    expected = np.array([math.tanh(float(v)) for v in x]).astype(np.float32)
    assert_same_bits(F.tanh(mpt.Tensor(x)), expected)


# ---- reductions: fixed sequential order in fp32 --------------------------------------------------


def test_sum_is_sequential_in_fp32():
    # [1, 2^-24 × 4096]: sequential fp32 sums never move off 1 (each 2^-24 is half an ulp, a tie
    # to even); a pairwise or SIMD tree would add the small terms first and reach 1 + 2^-12.
    x = np.concatenate([[1.0], np.full(4096, 2.0**-24)]).astype(np.float32)
    assert F.sum(mpt.Tensor(x)).item() == 1.0
    assert F.sum(mpt.Tensor(x[::-1].copy())).item() == 1 + 2.0**-12
    rng = np.random.default_rng(4)
    y = rng.standard_normal((3, 50, 4)).astype(np.float16)
    got = F.sum(mpt.Tensor(y), dim=1)
    expected = np.cumsum(y.astype(np.float32), axis=1, dtype=np.float32)[:, -1].astype(np.float16)
    assert got.format.name == "fp16"
    assert_same_bits(got, expected)
    # several axes: row-major order of the reduced axes
    got = F.sum(mpt.Tensor(y), dim=(0, 2), keepdim=True)
    seq = np.cumsum(np.moveaxis(y.astype(np.float32), 1, 0).reshape(50, -1), axis=1,
                    dtype=np.float32)[:, -1]
    assert got.shape == (1, 50, 1)
    assert_same_bits(got.numpy().reshape(-1), seq.astype(np.float16))


def test_mean_and_var_contracts():
    rng = np.random.default_rng(5)
    y = rng.standard_normal((7, 30)).astype(np.float32)
    s = np.cumsum(y, axis=1, dtype=np.float32)[:, -1]
    factor = np.float32(1) / np.float32(30)
    assert_same_bits(F.mean(mpt.Tensor(y), 1), s * factor)
    mean = (s * factor)[:, None]
    d = y - mean
    v = np.cumsum(d * d, axis=1, dtype=np.float32)[:, -1] / np.float32(29)
    assert_same_bits(F.var(mpt.Tensor(y), 1), v)
    assert_same_bits(F.max(mpt.Tensor(y), 1), y.max(axis=1))


# ---- softmax / log-softmax / cross-entropy -------------------------------------------------------


def _softmax_documented(x):
    """Softmax rows in the order of the docstring, with Python's math for exp (float32)."""
    m = x.max(axis=-1, keepdims=True)
    d = x - m
    e = np.vectorize(lambda v: math.exp(float(v)))(d).astype(np.float32)
    s = np.cumsum(e, axis=-1, dtype=np.float32)[..., -1:]
    return e / s, d, s


def test_softmax_bits_follow_the_documented_order():
    x = np.random.default_rng(6).uniform(-8, 8, (5, 33)).astype(np.float32)
    y, d, s = _softmax_documented(x)
    assert_same_bits(F.softmax(mpt.Tensor(x), -1), y)
    logs = np.vectorize(lambda v: math.log(float(v)))(s).astype(np.float32)
    assert_same_bits(F.log_softmax(mpt.Tensor(x), -1), d - logs)
    # along another axis: the same numbers, transposed
    assert_same_bits(F.softmax(mpt.Tensor(x.T.copy()), 0), y.T)
    h = F.softmax(mpt.Tensor(x.astype(np.float16)), -1)  # outside autocast: fp16 in, fp16 out
    assert h.format.name == "fp16"


def test_softmax_backward_documented_order():
    rng = np.random.default_rng(7)
    x = rng.uniform(-4, 4, (3, 9)).astype(np.float32)
    g = rng.uniform(-1, 1, (3, 9)).astype(np.float32)
    t = mpt.Tensor(x, requires_grad=True)
    y = F.softmax(t, -1)
    y.backward(g)
    yn = y.numpy()
    s = np.cumsum(g * yn, axis=-1, dtype=np.float32)[:, -1:]
    assert_same_bits(t.grad, yn * (g - s))


@pytest.mark.parametrize("fmt", ["fp32", "fp64"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_equals_nll_of_log_softmax_bit_for_bit(fmt, reduction):
    rng = np.random.default_rng(8)
    x = rng.uniform(-5, 5, (2, 7, 3))
    target = np.array([[0, 6, -100], [3, 3, 1]])
    w = mpt.tensor(rng.uniform(0.5, 2, 7), fmt)
    g = rng.uniform(-1, 1, (2, 3)) if reduction == "none" else None
    results = []
    for fused in (True, False):
        t = mpt.tensor(x, fmt, requires_grad=True)
        loss = F.cross_entropy(t, target, weight=w, reduction=reduction) if fused else \
            F.nll_loss(F.log_softmax(t, 1), target, weight=w, reduction=reduction)
        loss.backward(g)
        results.append((loss.numpy(), t.grad.numpy()))
    for a, b in zip(*results):
        np.testing.assert_array_equal(bits(a), bits(b))


def test_cross_entropy_mean_ignores_rows_and_all_ignored_is_nan():
    x = mpt.tensor([[1.0, 2.0], [3.0, 0.0], [0.5, 0.5]])
    loss = F.cross_entropy(x, np.array([1, -100, 0]))
    lp = np.log(np.exp([1, 2]) / np.exp([1, 2]).sum())[1]
    lp2 = np.log(0.5)
    assert abs(loss.item() - (-(lp + lp2) / 2)) <= 2.0**-21  # a few fp32 ulps of ~0.5
    with np.errstate(invalid="ignore"):
        assert math.isnan(F.cross_entropy(x, np.array([-100, -100, -100])).item())
    assert math.isnan(F.cross_entropy(x, np.array([5, 5, 5]), ignore_index=5).item())


# ---- norms ---------------------------------------------------------------------------------------


def test_layer_norm_bits_follow_the_documented_order():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 24)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 24).astype(np.float32)
    b = rng.uniform(-1, 1, 24).astype(np.float32)
    inv_n = np.float32(1) / np.float32(24)
    mean = np.cumsum(x, axis=1, dtype=np.float32)[:, -1:] * inv_n
    d = x - mean
    var = np.cumsum(d * d, axis=1, dtype=np.float32)[:, -1:] * inv_n
    rstd = (1.0 / np.sqrt((var + np.float32(1e-5)).astype(np.float64))).astype(np.float32)
    expected = ((d * rstd) * w) + b
    got = F.layer_norm(mpt.Tensor(x), 24, mpt.Tensor(w), mpt.Tensor(b))
    assert_same_bits(got, expected)
    ms = np.cumsum(x * x, axis=1, dtype=np.float32)[:, -1:] * inv_n
    r = (1.0 / np.sqrt((ms + np.float32(2.0**-23)).astype(np.float64))).astype(np.float32)
    assert_same_bits(F.rms_norm(mpt.Tensor(x), 24, mpt.Tensor(w)), (x * r) * w)


# ---- embedding, dropout, indexing ----------------------------------------------------------------


def test_embedding_gathers_exactly_and_accumulates_in_index_order():
    w = mpt.tensor(np.arange(12.0).reshape(4, 3), "bf16", requires_grad=True)
    idx = np.array([[1, 1], [3, 1]])
    out = F.embedding(idx, w, padding_idx=3)
    np.testing.assert_array_equal(out.numpy().astype(np.float32), w.numpy()[idx].astype(np.float32))
    g = np.array([[[1.0, 2**-8, 0], [2**-8, 1, 0]], [[5, 5, 5], [2**-8, 0, 0]]])
    out.backward(g)
    # row 1 receives 1, 2^-8, 2^-8 (first column) in that order, fp32 then one bf16 rounding
    col = np.float32(1.0) + np.float32(2**-8) + np.float32(2**-8)
    assert w.grad.numpy()[1, 0] == col.astype(BF16)
    np.testing.assert_array_equal(w.grad.numpy()[3].astype(np.float32), 0)  # padding row
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        F.embedding(np.array([4]), w)
    with pytest.raises(TypeError, match="integers"):
        F.embedding(np.array([0.5]), w)


def test_dropout_is_reproducible_and_keyed_by_seed_and_counter():
    x = mpt.tensor(np.full((64, 64), -1.5), "fp16")
    mpt.manual_seed(123)
    a, b = F.dropout(x, 0.25), F.dropout(x, 0.25)
    mpt.manual_seed(123)
    a2 = F.dropout(x, 0.25)
    assert_same_bits(a, a2.numpy())
    assert not np.array_equal(bits(a), bits(b))  # the per-call counter moved on
    state = mpt.get_rng_state()
    c = F.dropout(x, 0.25)
    mpt.set_rng_state(state)
    assert_same_bits(F.dropout(x, 0.25), c.numpy())
    kept = a.numpy() != 0
    # exact contract: kept iff the Philox word >= round(0.25·2^32); scale f32(1/0.75) then fp16
    mask = F.dropout_mask((64, 64), 0.25, 123, 0)
    np.testing.assert_array_equal(kept, mask)
    scaled = (np.float32(-1.5) * np.float32(1 / 0.75)).astype(np.float16)
    assert np.all(a.numpy()[kept] == scaled)
    assert np.all(bits(a)[~kept] == 0x8000)  # −x·0 = −0, as x·mask·scale
    assert 0.2 < 1 - kept.mean() < 0.3
    assert F.dropout(x, 0.5, training=False) is x and F.dropout(x, 0.0) is x
    assert np.all(F.dropout(x, 1.0).numpy() == 0)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        F.dropout(x, 1.5)


def test_repeated_advanced_indices_accumulate():
    x = mpt.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x[np.array([0, 0, 2, 0])].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 0.0, 1.0])


def test_pooling_contracts():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    got = F.avg_pool2d(mpt.Tensor(x), 2)
    win = (x[:, :, :6, :4].reshape(2, 3, 3, 2, 2, 2).transpose(0, 1, 2, 4, 3, 5)
           .reshape(2, 3, 3, 2, 4))
    s = np.cumsum(win, axis=-1, dtype=np.float32)[..., -1]
    assert_same_bits(got, s / np.float32(4))
    assert_same_bits(F.max_pool2d(mpt.Tensor(x), 2), win.max(axis=-1))


# ---- attention masks (fp64, no GEMM model involved) ----------------------------------------------


def test_attention_causal_is_bottom_right_and_empty_rows_give_zero():
    np.testing.assert_array_equal(F.causal_mask(2, 4), [[1, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(F.causal_mask(4, 2), [[0, 0], [0, 0], [1, 0], [1, 1]])
    rng = np.random.default_rng(11)
    q = mpt.tensor(rng.standard_normal((4, 3)), "fp64", requires_grad=True)
    k = mpt.tensor(rng.standard_normal((2, 3)), "fp64", requires_grad=True)
    v = mpt.tensor(rng.standard_normal((2, 3)), "fp64", requires_grad=True)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    same = F.scaled_dot_product_attention(q, k, v, attn_mask=F.causal_mask(4, 2))
    np.testing.assert_array_equal(out.numpy(), same.numpy())
    np.testing.assert_array_equal(out.numpy()[:2], 0)  # queries 0 and 1 see no key
    out.backward(np.ones((4, 3)))
    np.testing.assert_array_equal(q.grad.numpy()[:2], 0)
    additive = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mpt.tensor(np.where(F.causal_mask(4, 2), 0.0, -np.inf), "fp64"))
    np.testing.assert_array_equal(additive.numpy()[2:], out.numpy()[2:])


# ---- bad input -----------------------------------------------------------------------------------


def test_format_mismatch_outside_autocast_names_both_formats():
    a, b = mpt.tensor([1.0], "fp16"), mpt.tensor([1.0], "fp32")
    with pytest.raises(TypeError, match=r"input is fp16, other is fp32.*cast explicitly"):
        a + b
    with pytest.raises(TypeError, match="input is fp32, weight is bf16"):
        F.linear(mpt.tensor([[1.0]]), mpt.tensor([[1.0]], "bf16"))
    with pytest.raises(TypeError, match=r"tensors\[0\] is fp16, tensors\[1\] is fp32"):
        F.cat([a, b])


def test_shape_and_argument_errors():
    x = mpt.tensor(np.ones((2, 3)), "fp32")
    cases = [
        (ValueError, r"shapes \(2, 3\) and \(4,\) do not broadcast",
         lambda: x + mpt.tensor(np.ones(4), "fp32")),
        (ValueError, "inner sizes 3 and 2", lambda: F.matmul(x, x)),
        (ValueError, r"input \(2, 3\) and weight \(3, 2\) do not match",
         lambda: F.linear(x, mpt.tensor(np.ones((3, 2)), "fp32"))),
        (ValueError, "normalized_shape", lambda: F.layer_norm(x, 2)),
        (ValueError, r"target must have shape \(2,\)",
         lambda: F.cross_entropy(x, np.zeros(3, int))),
        (IndexError, "outside", lambda: F.cross_entropy(x, np.array([0, 3]))),
        (ValueError, "reduction must be one of", lambda: F.mse_loss(x, x, reduction="avg")),
        (ValueError, "cannot reshape", lambda: x.reshape(4, 2)),
        (ValueError, "dim 2 is out of range", lambda: F.softmax(x, 2)),
        (TypeError, "must be a Tensor", lambda: F.relu(np.ones(3))),
        (TypeError, "real number", lambda: x + np.ones(3)),
        (ValueError, "groups=2", lambda: F.conv2d(mpt.tensor(np.ones((1, 3, 4, 4)), "fp32"),
                                                  mpt.tensor(np.ones((2, 3, 2, 2)), "fp32"),
                                                  groups=2)),
        (ValueError, "approximate", lambda: F.gelu(x, approximate="fast")),
        (ValueError, "not both", lambda: F.scaled_dot_product_attention(
            x, x, x, attn_mask=np.ones((2, 2), bool), is_causal=True)),
    ]
    for error, message, call in cases:
        with pytest.raises(error, match=message):
            call()


# ---- determinism ---------------------------------------------------------------------------------


def _fingerprint() -> str:
    """Hash of the bits of many ops' outputs and gradients (fp32, and fp16 under autocast with
    the hopper model for the GEMMs)."""
    rng = np.random.default_rng(12)
    h = hashlib.sha256()
    x32 = rng.standard_normal((64, 300)).astype(np.float32)
    for fmt in ("fp32", "fp16"):
        x = mpt.tensor(x32, fmt, requires_grad=True)
        mpt.manual_seed(99)
        y = F.dropout(F.gelu(F.layer_norm(x, 300)), 0.1)
        z = F.softmax(y, -1) * F.log_softmax(y, 0)
        loss = F.cross_entropy(z.float() if fmt == "fp16" else z, rng.integers(0, 300, 64)) \
            + F.sum(F.exp(F.tanh(x))).float() * 1e-3
        loss.backward()
        for t in (y, z, loss, x.grad):
            h.update(bits(t).tobytes())
    w = mpt.tensor(rng.standard_normal((96, 300)) * 0.05, "fp32", requires_grad=True)
    x = mpt.tensor(x32.reshape(4, 16, 300), requires_grad=True)
    with mpt.autocast("fp16", model="hopper"):
        qkv = F.linear(x, w).reshape(4, 16, 3, 2, 16).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True, dropout_p=0.1)
        conv = F.conv2d(x.reshape(4, 3, 40, 40)[:, :, :8, :8],
                        w.reshape(96, 3, 10, 10)[:4, :, :3, :3])
    (o.float().sum() + conv.float().sum()).backward()
    for t in (o, conv, x.grad, w.grad):
        h.update(bits(t).tobytes())
    return h.hexdigest()


_SCRIPT = ("import sys; sys.path.insert(0, {root!r}); import test_functional as t; "
           "print(t._fingerprint())")


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 Numba threads")
def test_bits_do_not_depend_on_thread_count_or_run():
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _fingerprint()
        numba.set_num_threads(2)
        two = _fingerprint()
    finally:
        numba.set_num_threads(before)
    assert one == two
    here = os.path.dirname(__file__)
    env = dict(os.environ, NUMBA_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
    other_run = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=here)], env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
    assert other_run == one


def _kernel_signatures():
    """{kernel: number of compiled signatures} over every jitted function of mpt.kernels."""
    counts = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("mpt.kernels"):
            for attr, value in vars(module).items():
                if isinstance(value, numba.core.registry.CPUDispatcher):
                    counts[f"{name}.{attr}"] = len(value.signatures)
    return counts


def _ops_forward_backward(view):
    """Cross-entropy, layer/RMS norm, fp32/bf16/fp64 matmuls and naive attention, forward and
    backward, on inputs that are fresh writable arrays or (``view``) read-only tensor views."""
    rng = np.random.default_rng(3)

    def leaf(shape, fmt="fp32"):
        t = mpt.tensor(mpt.round(rng.standard_normal(shape), fmt), fmt, requires_grad=True)
        return t, (F.reshape(t, shape) if view else t)

    for fmt in ("fp32", "bf16", "fp64"):
        (a, av), (b, bv) = leaf((2, 8, 16), fmt), leaf((16, 8), fmt)
        F.sum(F.matmul(av, bv)).backward()
    (x, xv), (w, wv) = leaf((6, 16)), leaf((16,))
    F.sum(F.layer_norm(xv, (16,), wv) + F.rms_norm(xv, (16,), wv)).backward()
    F.cross_entropy(xv, np.arange(6) % 16).backward()
    q, qv = leaf((1, 2, 8, 16))
    F.sum(F.scaled_dot_product_attention(qv, qv, qv)).backward()


def test_read_only_views_compile_no_kernel_again():
    """Tensor views are read-only and Numba types read-only arrays apart: the drivers hand each
    kernel one kind, so inputs that are views compile nothing the fresh arrays did not."""
    _ops_forward_backward(view=False)
    before = _kernel_signatures()
    _ops_forward_backward(view=True)
    grown = {k: n - before.get(k, 0) for k, n in _kernel_signatures().items()
             if n != before.get(k, 0)}
    assert not grown, grown
