"""Gradient check of every op of mpt.functional in fp64 mode against central differences, and of
the composite ops against the independent float64 oracles of mpt.reference.ops.

Tolerance (derived). For L(x) = Σ f(x)·G (G fixed, random), the central difference
D = (L(x + h·e) − L(x − h·e)) / 2h differs from ∂L/∂x by
  truncation  ≤ h²/6 · max|L'''|            (Taylor, the third derivative along e), and
  rounding    ≤ 2·δ / 2h = δ/h              where δ bounds the float64 error of one L evaluation.
With inputs in ranges where the ops are smooth and |L'''| ≤ 2^6 (all ops below: exp on [−2, 2]
gives e² < 2^3 per output, log on [0.5, 2] gives 2/x³ ≤ 2^4, softmax/norm/gelu derivatives are
O(1), sums over ≤ 2^4 outputs), and δ ≤ 2^8·2^-53·S with S = Σ|f·G| + 1 (each output is a short
chain of < 2^8 correctly-rounded float64 operations), h = 2^-16 gives
  truncation ≤ 2^-32/6 · 2^6 < 2^-28,  rounding ≤ 2^-45·S·2^16 = 2^-29·S,
so |D − ∂L/∂x| ≤ 2^-27·S is a bound; the test allows 2^-24·S (8× margin for the |L'''| estimate).
The analytic gradients themselves are float64 computations with relative error ~2^-50.
Nonsmooth ops (relu, abs, max, pooling) get inputs at distance ≥ 2^-8 ≫ h from their kinks.
"""
import zlib

import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt.reference import ops as ref

H = 2.0**-16


def _away_from_zero(rng, shape, lo=2.0**-8, hi=2.0):
    """Values with |x| in [lo, hi] and random signs (no kink of relu/abs within h)."""
    return rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape)


def _distinct(rng, shape):
    """Values whose gaps are ≥ 2^-6 (max / max-pool keep their argmax under ±h)."""
    n = int(np.prod(shape))
    return (rng.permutation(n) * 2.0**-5 - n * 2.0**-6).reshape(shape) + 2.0**-7


TGT = np.array([0, 3, 1, -100, 2])
CASES = {
    # case: (the op it checks, function of the input tensors, input generators)
    "add": ("add", lambda a, b: F.add(a, b), [(3, 4), (4,)]),
    "sub": ("sub", lambda a, b: a - b, [(3, 1), (1, 4)]),
    "mul": ("mul", lambda a, b: a * b, [(2, 3, 4), (3, 1)]),
    "div": ("div", lambda a, b: a / b, [(3, 4), ("pos", (4,))]),
    "neg": ("neg", lambda a: -a, [(5,)]),
    "abs": ("abs", lambda a: F.abs(a), [("away", (6,))]),
    "exp": ("exp", lambda a: F.exp(a), [(3, 4)]),
    "log": ("log", lambda a: F.log(a), [("pos", (3, 4))]),
    "sqrt": ("sqrt", lambda a: F.sqrt(a), [("pos", (3, 4))]),
    "pow_scalar": ("pow", lambda a: a ** 3.0, [(3, 4)]),
    "pow_tensor": ("pow", lambda a, b: F.pow(a, b), [("pos", (3, 4)), (4,)]),
    "rpow": ("pow", lambda a: 2.0 ** a, [(5,)]),
    "relu": ("relu", lambda a: F.relu(a), [("away", (3, 4))]),
    "gelu": ("gelu", lambda a: F.gelu(a), [(3, 4)]),
    "gelu_tanh": ("gelu", lambda a: F.gelu(a, approximate="tanh"), [(3, 4)]),
    "silu": ("silu", lambda a: F.silu(a), [(3, 4)]),
    "tanh": ("tanh", lambda a: F.tanh(a), [(3, 4)]),
    "sigmoid": ("sigmoid", lambda a: F.sigmoid(a), [(3, 4)]),
    "clone": ("clone", lambda a: F.clone(a), [(3,)]),
    "sum": ("sum", lambda a: F.sum(a, (0, 2)), [(2, 3, 4)]),
    "sum_all": ("sum", lambda a: a.sum(), [(2, 3)]),
    "mean": ("mean", lambda a: F.mean(a, 1, keepdim=True), [(2, 3, 4)]),
    "var": ("var", lambda a: F.var(a, (0, 2), correction=1), [(2, 3, 4)]),
    "max": ("max", lambda a: F.max(a, 1), [("distinct", (3, 4))]),
    "max_all": ("max", lambda a: F.max(a), [("distinct", (3, 4))]),
    "reshape": ("reshape", lambda a: a.reshape(4, 3) * a.reshape(4, 3), [(3, 4)]),
    "transpose": ("transpose", lambda a: F.transpose(a, 0, 2), [(2, 3, 4)]),
    "permute": ("permute", lambda a: a.permute(2, 0, 1), [(2, 3, 4)]),
    "flatten": ("flatten", lambda a: F.flatten(a, 1), [(2, 3, 4)]),
    "unsqueeze": ("unsqueeze", lambda a: F.unsqueeze(a, 1), [(3, 4)]),
    "squeeze": ("squeeze", lambda a: F.squeeze(a, 1), [(3, 1, 4)]),
    "expand": ("expand", lambda a: F.expand(a, 2, 3, 4), [(3, 1)]),
    "getitem_basic": ("getitem", lambda a: a[1:, ::2], [(3, 4)]),
    "getitem_advanced": ("getitem", lambda a: a[np.array([0, 2, 0]), np.array([1, 1, 1])],
                         [(3, 4)]),
    "cat": ("cat", lambda a, b: F.cat([a, b], 1), [(3, 2), (3, 4)]),
    "stack": ("stack", lambda a, b: F.stack([a, b], -1), [(3, 4), (3, 4)]),
    "matmul": ("matmul", lambda a, b: a @ b, [(2, 3, 4), (4, 5)]),
    "matmul_batched": ("matmul", lambda a, b: F.matmul(a, b), [(2, 3, 4), (1, 4, 2)]),
    "matmul_vec": ("matmul", lambda a, b: F.matmul(a, b), [(4,), (3, 4, 2)]),
    "linear": ("linear", lambda x, w, b: F.linear(x, w, b), [(2, 3, 4), (5, 4), (5,)]),
    "softmax": ("softmax", lambda a: F.softmax(a, 0), [(3, 4)]),
    "log_softmax": ("log_softmax", lambda a: F.log_softmax(a, -1), [(3, 4)]),
    "layer_norm": ("layer_norm", lambda x, w, b: F.layer_norm(x, (4,), w, b), [(3, 4), (4,), (4,)]),
    "layer_norm_2d": ("layer_norm", lambda x: F.layer_norm(x, (3, 4)), [(2, 3, 4)]),
    "rms_norm": ("rms_norm", lambda x, w: F.rms_norm(x, 4, w), [(3, 4), (4,)]),
    "cross_entropy": ("cross_entropy", lambda x: F.cross_entropy(x, TGT), [(5, 4)]),
    "cross_entropy_weighted_sum": ("cross_entropy", lambda x: F.cross_entropy(
        x, TGT, weight=mpt.tensor([0.5, 2.0, 1.25, 0.75], "fp64"), reduction="sum"), [(5, 4)]),
    "cross_entropy_none_3d": ("cross_entropy", lambda x: F.cross_entropy(
        x, np.array([[0, 2], [1, 1]]), reduction="none"), [(2, 3, 2)]),
    "nll_loss": ("nll_loss", lambda x: F.nll_loss(x, TGT), [(5, 4)]),
    "mse_loss": ("mse_loss", lambda a, b: F.mse_loss(a, b), [(3, 4), (3, 4)]),
    "mse_loss_sum": ("mse_loss", lambda a, b: F.mse_loss(a, b, reduction="sum"), [(3, 4), (3, 4)]),
    "embedding": ("embedding", lambda w: F.embedding(np.array([[0, 2, 0], [3, 2, 1]]), w),
                  [(4, 3)]),
    "dropout": ("dropout", lambda a: F.dropout(a, 0.4, seed=7), [(4, 5)]),
    "conv2d": ("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=1, groups=2),
               [(2, 4, 5, 4), (6, 2, 3, 2), (6,)]),
    "conv2d_dilated": ("conv2d", lambda x, w: F.conv2d(x, w, dilation=2),
                       [(1, 2, 5, 5), (3, 2, 2, 2)]),
    "max_pool2d": ("max_pool2d", lambda x: F.max_pool2d(x, 2, stride=1, padding=1),
                   [("distinct", (1, 2, 3, 3))]),
    "avg_pool2d": ("avg_pool2d", lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
                   [(1, 2, 5, 4)]),
    "sdpa_causal": ("scaled_dot_product_attention",
                    lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    [(2, 3, 4), (2, 5, 4), (2, 5, 3)]),
    "sdpa_mask_dropout": ("scaled_dot_product_attention", 
        lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=np.array([[1, 0, 1], [0, 0, 0]], bool), dropout_p=0.3, scale=0.7),
        [(2, 2, 4), (1, 3, 4), (2, 3, 2)]),
}


def _make(rng, spec):
    kind, shape = spec if isinstance(spec[0], str) else ("any", spec)
    if kind == "pos":
        return rng.uniform(0.5, 2.0, shape)
    if kind == "away":
        return _away_from_zero(rng, shape)
    if kind == "distinct":
        return _distinct(rng, shape)
    return rng.uniform(-2.0, 2.0, shape)


def _run(fn, arrays, grad=False):
    mpt.set_rng_state((11, 0))  # ops that draw dropout masks draw the same ones every time
    tensors = [mpt.tensor(a, "fp64", requires_grad=grad) for a in arrays]
    return fn(*tensors), tensors


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_central_differences(name):
    _, fn, specs = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arrays = [_make(rng, s) for s in specs]
    out, tensors = _run(fn, arrays, grad=True)
    assert out.format.name == "fp64"
    G = rng.uniform(-1.0, 1.0, out.shape)
    out.backward(G)
    S = float(np.abs(out.numpy() * G).sum()) + 1.0
    for i, (a, t) in enumerate(zip(arrays, tensors)):
        assert t.grad is not None and t.grad.format.name == "fp64", (name, i)
        numeric = np.empty_like(a)
        for j in np.ndindex(a.shape):
            plus, minus = [x.copy() for x in arrays], [x.copy() for x in arrays]
            plus[i][j] += H
            minus[i][j] -= H
            with mpt.no_grad():
                lp = float((_run(fn, plus)[0].numpy() * G).sum())
                lm = float((_run(fn, minus)[0].numpy() * G).sum())
            numeric[j] = (lp - lm) / (2 * H)
        np.testing.assert_allclose(t.grad.numpy(), numeric, rtol=0, atol=2.0**-24 * S,
                                   err_msg=f"{name}: input {i}")


def test_every_functional_op_has_a_gradient_case():
    not_differentiable = {"causal_mask", "dropout_mask", "manual_seed", "get_rng_state",
                          "set_rng_state", "view"}  # view is reshape
    assert set(F.__all__) - not_differentiable == {op for op, _, _ in CASES.values()}


# ---- composite ops against the float64 oracles ---------------------------------------------------
# fp64 mode computes in float64 with a different order than the oracle; each output is a chain of
# at most ~2^5 float64 roundings over O(1) values, so 2^-45 (≈ 2^8 ulps at 1) bounds the difference.
ORACLE_TOL = 2.0**-45


def _central(f, x, G):
    """Central-difference gradient of Σ f(x)·G in float64 (on the oracle: independent of mpt)."""
    g = np.empty_like(x)
    for j in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[j] += H
        xm[j] -= H
        g[j] = ((f(xp) * G).sum() - (f(xm) * G).sum()) / (2 * H)
    return g


@pytest.mark.parametrize("case", ["softmax", "log_softmax", "layer_norm", "rms_norm",
                                  "cross_entropy", "attention"])
def test_composite_matches_float64_oracle(case):
    rng = np.random.default_rng(5)
    x = rng.uniform(-3.0, 3.0, (4, 6))
    w, b = rng.uniform(0.5, 1.5, 6), rng.uniform(-1, 1, 6)
    tgt = np.array([5, -100, 0, 2])
    mask = np.tril(np.ones((4, 6), bool), 2)  # causal, bottom-right (6 − 4 = 2)
    kv = rng.uniform(-1.0, 1.0, (2, 6, 6))
    mine = {
        "softmax": (lambda t: F.softmax(t, -1), lambda a: ref.softmax(a, -1)),
        "log_softmax": (lambda t: F.log_softmax(t, 1), lambda a: ref.log_softmax(a, 1)),
        "layer_norm": (lambda t: F.layer_norm(t, 6, mpt.tensor(w, "fp64"), mpt.tensor(b, "fp64")),
                       lambda a: ref.layer_norm(a, 1, w, b)),
        "rms_norm": (lambda t: F.rms_norm(t, 6, mpt.tensor(w, "fp64"), eps=1e-6),
                     lambda a: ref.rms_norm(a, 1, w, eps=1e-6)),
        "cross_entropy": (lambda t: F.cross_entropy(t, tgt), lambda a: ref.cross_entropy(a, tgt)),
        "attention": (lambda t: F.scaled_dot_product_attention(
            t, mpt.tensor(kv[0], "fp64"), mpt.tensor(kv[1], "fp64"), is_causal=True),
            lambda a: ref.attention(a, kv[0], kv[1], mask)),
    }[case]
    t = mpt.tensor(x, "fp64", requires_grad=True)
    out = mine[0](t)
    expected = mine[1](x)
    assert np.all(np.abs(out.numpy() - expected) <= ORACLE_TOL * (1 + np.abs(expected)))
    G = rng.uniform(-1, 1, np.shape(expected))
    out.backward(G)
    S = float(np.abs(expected * G).sum()) + 1.0
    np.testing.assert_allclose(t.grad.numpy(), _central(mine[1], x, G), rtol=0, atol=2.0**-24 * S)


# ---- fp32 results against the float64 oracles, within derived error bounds -----------------------
U = 2.0**-24  # unit roundoff of fp32 (RNE)


def test_fp32_softmax_and_log_softmax_within_rounding_bound():
    # y_j = e_j / s: d_j = x_j − m has error ≤ u|d_j|, which moves e_j by ≤ u|d_j|·e_j; exp rounds
    # (≤ u); the sequential sum of N positive terms has relative error ≤ (N − 1)u; the division
    # ≤ u. So |y − y*| ≤ y*·u·(N + 1 + |d_j|) to first order; tested with one extra u of slack.
    x = np.random.default_rng(20).uniform(-8, 8, (16, 40)).astype(np.float32)
    n = x.shape[1]
    y = F.softmax(mpt.Tensor(x), -1).numpy().astype(np.float64)
    want = ref.softmax(x.astype(np.float64), -1)
    d = np.abs(x - x.max(axis=1, keepdims=True))
    assert np.all(np.abs(y - want) <= want * U * (n + 2 + d))
    # log-softmax (d − log s): |error| ≤ u|d| + (n + 1)u·(relative error of s, through log) +
    # u|log s| + u|y| (the final subtraction)
    ly = F.log_softmax(mpt.Tensor(x), -1).numpy().astype(np.float64)
    lwant = ref.log_softmax(x.astype(np.float64), -1)
    logs = np.log(np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True)).sum(1, keepdims=True))
    assert np.all(np.abs(ly - lwant) <= U * (d + (n + 1) + np.abs(logs) + np.abs(lwant) + 1))


def test_fp32_layer_norm_within_rounding_bound():
    # mean: sequential sum of N values, |δmean| ≤ N·u·max|x|; d = x − mean: ≤ |δmean| + u|d|;
    # Σd²: relative ≤ (N + 1)u plus 2|δmean|/σ; rstd (var + eps, 1/sqrt in float64) relative
    # ≤ ½·that + 2u; y = ((d·rstd)·w) + b adds 3 roundings. So |y − y*| ≤ |w|·(|δd|·rstd +
    # |x̂|·(δrstd/rstd)) + 3u·(|y| + |b|) — evaluated below with the measured σ, max|x|.
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((8, 48)) * 3 + 1).astype(np.float32)
    w = rng.uniform(0.5, 2, 48).astype(np.float32)
    b = rng.uniform(-1, 1, 48).astype(np.float32)
    n = x.shape[1]
    got = F.layer_norm(mpt.Tensor(x), n, mpt.Tensor(w), mpt.Tensor(b)).numpy().astype(np.float64)
    x64 = x.astype(np.float64)
    want = ref.layer_norm(x64, 1, w, b)
    sigma = np.sqrt(x64.var(axis=1, keepdims=True) + 1e-5)
    xhat = (x64 - x64.mean(axis=1, keepdims=True)) / sigma
    dmean = n * U * np.abs(x64).max(axis=1, keepdims=True)
    dd = dmean + U * np.abs(xhat) * sigma
    drel = 0.5 * ((n + 1) * U + 2 * dmean / sigma) + 2 * U
    bound = w * (dd / sigma + np.abs(xhat) * drel) + 3 * U * (np.abs(want) + np.abs(b))
    assert np.all(np.abs(got - want) <= bound)


def test_fp32_cross_entropy_within_rounding_bound():
    # per row: loss = −((x_t − m) − log s) with the softmax-sum error (C + 1)u·(through log: the
    # same relative error, absolute) plus u·(|x_t − m| + |log s| + |loss|); the mean over R kept
    # rows adds (R − 1)u·Σ|loss|/R and the division u·|mean|.
    rng = np.random.default_rng(22)
    x = rng.uniform(-6, 6, (64, 30)).astype(np.float32)
    t = rng.integers(0, 30, 64)
    t[::7] = -100
    got = F.cross_entropy(mpt.Tensor(x), t).item()
    x64 = x.astype(np.float64)
    want = ref.cross_entropy(x64, t)
    keep = t != -100
    rows = np.flatnonzero(keep)
    d = np.abs(x64[rows, t[rows]] - x64[rows].max(1))
    per_row = U * ((x.shape[1] + 1) + d
                   + 2 * np.abs(ref.cross_entropy(x64, t, reduction="none")[rows]) + 8)
    r = keep.sum()
    bound = per_row.mean() + (r + 1) * U * abs(want)
    assert abs(got - want) <= bound


def test_fp32_attention_within_rounding_bound():
    # S = q·kᵀ by sequential fp32 FMA: |δS| ≤ E·u·Σ_e|q_e k_e| (then ×scale, +u|S|); a score
    # error δ changes P by ≤ 2·max|δS|·P (first order); softmax rounding ≤ (S_len + 2)u·P;
    # O = P·v by sequential FMA over S_len terms: ≤ S_len·u·Σ|P_j v_j|. So
    # |δO| ≤ max|v|·(2·max|δS| + (2·S_len + 3)u) + u|O|.
    rng = np.random.default_rng(23)
    q, k, v = (rng.uniform(-1, 1, s).astype(np.float32)
               for s in ((3, 10, 8), (3, 12, 8), (3, 12, 5)))
    got = F.scaled_dot_product_attention(mpt.Tensor(q), mpt.Tensor(k), mpt.Tensor(v),
                                         is_causal=True).numpy().astype(np.float64)
    want = ref.attention(q, k, v, F.causal_mask(10, 12))
    scale = 1 / np.sqrt(8)
    ds = scale * (8 * U * np.einsum("ble,bse->bls", np.abs(q), np.abs(k)).max() + U * 8)
    bound = np.abs(v).max() * (2 * ds + (2 * 12 + 3) * U) + U * np.abs(want)
    assert np.all(np.abs(got - want) <= bound)
