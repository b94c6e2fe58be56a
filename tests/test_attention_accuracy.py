"""FlashAttention accuracy: the acceptance criterion of the flash-attention project against fp32
attention (docs/techniques.md §1), and gradient checks in fp64 mode.

Criterion (flash-attention's own tests): with ``ref`` = the attention of the inputs upcast to
fp32 (mpt's naive backend, sequential FP32 FMA) and ``pt`` = the naive backend in the low
precision type (same Tensor Core model as flash), ``max|out − ref| ≤ 2·max|pt − ref|`` (+1e-5
causal) and ``max|dX − dX_ref| ≤ 3·max|dX_pt − dX_ref|`` (+1e-5 causal) for X = Q, K, V.
"""
import math

import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt.reference import attention as RA

U = 2.0**-53  # float64 unit roundoff


def _attention(fmt, model, backend, q, k, v, g, causal):
    ts = [mpt.tensor(x, fmt, requires_grad=True) for x in (q, k, v)]
    with mpt.matmul_model(model):
        out = F.scaled_dot_product_attention(*ts, is_causal=causal, backend=backend)
    out.backward(mpt.tensor(g, fmt))
    return [t.data.astype(np.float64) for t in [out] + [t.grad for t in ts]]


HEAD_DIMS = (32, 64, 128)
SEQS = [(1, 1), (1, 147), (17, 17), (113, 113), (113, 203), (256, 256), (256, 97),
        pytest.param(1024, 1024, marks=pytest.mark.slow)]


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("L,S", SEQS)
@pytest.mark.parametrize("E", HEAD_DIMS)
def test_flash_attention_criterion(fmt, causal, L, S, E):
    rng = np.random.default_rng(L * 1000 + S + E)
    H = 2 if L * S <= 256 * 256 else 1
    q = mpt.round(rng.standard_normal((1, H, L, E)), fmt)   # exact in fmt: all three runs share
    k = mpt.round(rng.standard_normal((1, H, S, E)), fmt)   # the same input values
    v = mpt.round(rng.standard_normal((1, H, S, E)), fmt)
    g = mpt.round(rng.standard_normal((1, H, L, E)), fmt)
    ref = _attention("fp32", "ieee_fma", "naive", q, k, v, g, causal)
    pt = _attention(fmt, "hopper", "naive", q, k, v, g, causal)
    out = _attention(fmt, "hopper", "flash", q, k, v, g, causal)
    extra = 1e-5 if causal else 0.0
    for i, (name, factor) in enumerate((("O", 2), ("dQ", 3), ("dK", 3), ("dV", 3))):
        err, base = np.abs(out[i] - ref[i]).max(), np.abs(pt[i] - ref[i]).max()
        if L == S == 1 and name in ("dQ", "dK"):
            _check_single_key(out[i], q, k, v, g, name)
            continue
        assert err <= factor * base + extra, (name, err, base)


def _check_single_key(grad, q, k, v, g, name):
    """One query, one key: softmax is 1, so dS = P·(dP − D) is exactly 0 in both naive runs (their
    softmax backward subtracts dP from itself), while flash's dP (the MMA over Ev) and
    D = Σ dO·O (sequential FP32, O = v) each err by at most Ev·2^-23·Σ|dO·v| (block model:
    Ev/L blocks of ≤ L+1 terms truncated at 2^-25 of the anchor plus one RZ rounding at 2^-23;
    sequential FP32: γ_Ev). So |dS| ≤ 1.01·τ·2·Ev·2^-23·Σ|dO·v| and |dQ| ≤ 1.01·|dS|·|k|
    (|dK| ≤ 1.01·|dS|·|q|), the 1.01 covering the fp16/bf16 roundings of dS and of dQ/dK."""
    E = v.shape[-1]
    t = np.abs(g.astype(np.float64) * v.astype(np.float64)).sum(axis=-1, keepdims=True)
    ds = 1.01 * 2 * E * 2.0**-23 * t / math.sqrt(q.shape[-1])
    other = k if name == "dQ" else q
    assert np.all(np.abs(grad) <= 1.01 * ds * np.abs(other.astype(np.float64)))


# ---- fp64 mode -----------------------------------------------------------------------------------

def _flash64(q, k, v, *, causal, p, state):
    mpt.set_rng_state(state)       # the same dropout stream for every evaluation
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal,
                                          enable_gqa=True, backend="flash", block_q=3,
                                          block_k=4)


@pytest.mark.parametrize("causal,p", [(False, 0.0), (True, 0.0), (True, 0.3)])
def test_fp64_gradients_match_central_differences(causal, p):
    rng = np.random.default_rng(31)
    shapes = [(1, 2, 5, 4), (1, 1, 7, 4), (1, 1, 7, 3)]            # GQA: 2 query heads, 1 kv
    ts = [mpt.tensor(rng.standard_normal(s), "fp64", requires_grad=True) for s in shapes]
    state = (3, 17)
    out = _flash64(*ts, causal=causal, p=p, state=state)
    G = rng.uniform(-1, 1, out.shape)
    out.backward(G)
    h = 2.0**-17
    for i, t in enumerate(ts):
        d = rng.standard_normal(t.shape)
        d /= np.linalg.norm(d)
        exact = float(np.sum(t.grad.data * d))

        def directional(step):
            args = [mpt.tensor(x.data + (step * d if j == i else 0), "fp64")
                    for j, x in enumerate(ts)]
            up = float(np.sum(_flash64(*args, causal=causal, p=p, state=state).data * G))
            args[i] = mpt.tensor(ts[i].data - step * d, "fp64")
            down = float(np.sum(_flash64(*args, causal=causal, p=p, state=state).data * G))
            return (up - down) / (2 * step)
        d1, d2 = directional(h), directional(2 * h)
        # Truncation ≈ |D(2h) − D(h)|/3 (Richardson), allowed whole; rounding: the sum of ≤ 40
        # outputs of size ≤ 4 errs by < 2^-40, divided by 2h.
        tol = abs(d2 - d1) + 2.0**-40 / h
        assert abs(d1 - exact) <= tol and tol < 1e-6, (i, d1, exact, tol)


def test_fp64_flash_matches_exact_attention():
    rng = np.random.default_rng(32)
    q, k, v = (rng.uniform(-1, 1, s) for s in ((3, 10, 8), (3, 12, 8), (3, 12, 5)))
    out = F.scaled_dot_product_attention(*[mpt.tensor(x, "fp64") for x in (q, k, v)],
                                         is_causal=True, backend="flash", block_q=4, block_k=5)
    want = RA.attention(q, k, v, np.arange(3), scale=1 / math.sqrt(8), causal=True)
    # Scores: 8-term fma chains, |δS| ≤ τ(8u·Σ|q k| + u|S|); a score error δ moves P by ≤ 2δ·P;
    # online softmax: ≤ (2·12 + 8)u·P (exp/exp2, rescales, sequential sums, 1/l); P·V: 12-term
    # fma chains, ≤ 12u·Σ|P v|. So |δO| ≤ max|v|·(2·max|δS| + 44u).
    ds = (8 * U * np.einsum("ble,bse->bls", np.abs(q), np.abs(k)).max() + 8 * U) / math.sqrt(8)
    assert np.all(np.abs(out.data - want) <= np.abs(v).max() * (2 * ds + 44 * U))
