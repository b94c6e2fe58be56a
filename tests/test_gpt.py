"""mpt.nn.GPT: seeded init, shapes, loss at init, a training step, fp64 gradient check, thread
independence, and the bf16 autocast step through the Hopper Tensor Core model."""
import hashlib
import math

import numba
import numpy as np
import pytest

import mpt
from mpt import nn
from mpt.testing import as_bits as bits

TINY = dict(vocab=7, d_model=8, n_layers=1, n_heads=2, seq_len=4)


def batch(vocab, B, T, seed=0):
    """Random token ids and independent random targets (B, T)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, (B, T)), rng.integers(0, vocab, (B, T))


def state_digest(model):
    h = hashlib.sha256()
    for name, a in model.state_dict().items():
        h.update(name.encode())
        h.update(a.tobytes())
    return h.hexdigest()


def sgd_step(model, lr):
    """p ← p − lr·g in float32, rounded once (RNE) to the parameter's format."""
    for p in model.parameters():
        update = p.data.astype(np.float32) - np.float32(lr) * p.grad.data.astype(np.float32)
        p.data = update.astype(p.format.dtype)


# ---- structure and init -------------------------------------------------------------------
def test_parameters_and_shapes():
    V, d, L, H, T = 11, 16, 2, 4, 8
    g = nn.GPT(V, d, L, H, T)
    names = [n for n, _ in g.named_parameters()]
    assert names[:2] == ["wte.weight", "wpe.weight"] and names[-2:] == ["ln_f.weight", "ln_f.bias"]
    assert not any("head" in n for n in names)  # the LM head is tied to wte
    # 2 LayerNorms, in_proj (d -> 3d), out_proj (d -> d), fc1 (d -> 4d), fc2 (4d -> d)
    per_block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert sum(p.size for p in g.parameters()) == V * d + T * d + L * per_block + 2 * d
    assert all(p.format == mpt.get_format("fp32") for p in g.parameters())
    idx, _ = batch(V, 3, 5)
    logits = g(idx)
    assert logits.shape == (3, 5, V) and logits.format.name == "fp32"
    with pytest.raises(ValueError, match="T <= 8"):
        g(np.zeros((1, 9), np.int64))
    with pytest.raises(ValueError, match=r"\(batch, T\)"):
        g(np.zeros(4, np.int64))


def test_seeded_init_is_bit_identical_and_pinned():
    a, b = nn.GPT(**TINY, seed=5), nn.GPT(**TINY, seed=5)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_array_equal(bits(p), bits(q), err_msg=n)
    c = nn.GPT(**TINY, seed=6)
    assert not np.array_equal(a.wte.weight.data, c.wte.weight.data)
    assert a.reset_parameters(6) is a and state_digest(a) == state_digest(c)
    # Pinned: the init is a function of (seed, name) through Philox and IEEE + - * / sqrt only,
    # so this digest is the same on every machine; a change here changes every seeded model.
    assert state_digest(nn.GPT(**TINY, seed=0)) == PINNED_TINY_DIGEST


PINNED_TINY_DIGEST = "f958e876770a3897c67adcf8749d6ee76953ef40af7748abceba69b57d625a13"


def test_init_follows_gpt2():
    L = 3
    g = nn.GPT(64, 64, L, 4, 32, seed=1)
    std = {n: float(np.std(p.data.astype(np.float64))) for n, p in g.named_parameters()}
    # A sample std of n normals has relative standard error 1/sqrt(2n); 5 of those as the bound.
    for name, p in g.named_parameters():
        if p.ndim == 2:
            resid = name.endswith(("attn.out_proj.weight", "mlp.fc2.weight"))
            want = 0.02 / math.sqrt(2 * L) if resid else 0.02
            assert abs(std[name] / want - 1) < 5 / math.sqrt(2 * p.size), name
            assert abs(float(np.mean(p.data))) < 5 * want / math.sqrt(p.size), name
        elif name.endswith("bias"):
            assert not np.any(p.data), name
        else:
            assert np.all(p.data == 1), name
    # Every draw is keyed by its dotted name: a Linear's weight is the gaussian stream of its key.
    w = g.blocks[1].mlp.fc1.weight
    expected = (0.02 * nn.gaussian(1, "blocks.1.mlp.fc1.weight", w.size)).astype(np.float32)
    np.testing.assert_array_equal(bits(w), bits(expected.reshape(w.shape)))


def test_init_in_another_format_rounds_once_from_float64():
    g16 = nn.GPT(**TINY, seed=2, format="bf16")
    w = g16.blocks[0].attn.in_proj.weight
    assert w.format.name == "bf16"
    draw = 0.02 * nn.gaussian(2, "blocks.0.attn.in_proj.weight", w.size)
    np.testing.assert_array_equal(bits(w).reshape(-1),
                                  bits(mpt.round(draw, "bf16")).reshape(-1))


# ---- loss at init and a training step ------------------------------------------------------
def test_loss_at_init_is_near_log_vocab():
    V = 256
    g = nn.GPT(V, 128, 2, 4, 64, seed=0)
    idx, tgt = batch(V, 4, 64)
    with mpt.no_grad():
        z = g(idx).data.astype(np.float64).reshape(-1, V)              # (N, V)
        loss = g.loss(idx, tgt).item()
    N = z.shape[0]
    # With targets drawn uniformly and independently of the logits, each token's expected loss is
    # logsumexp(z) − mean(z) = log V + (log E e^Z − E Z) for Z uniform over the row's logits,
    # which Hoeffding's lemma puts in [log V, log V + r²/8] (r = the row's logit range). The
    # realised target adds a zero-mean term of variance ≤ r²/4 (Popoviciu) per token: 5 standard
    # errors of the mean over N tokens on each side.
    r2 = (z.max(1) - z.min(1)) ** 2
    noise = 5 * math.sqrt(r2.mean() / 4 / N)
    assert math.log(V) - noise <= loss <= math.log(V) + r2.mean() / 8 + noise
    # ... and the bracket is narrow because the init keeps logits small: with |ln_f(x)|² ≈ d and
    # tied weights of std 0.02, a logit has std ≈ 0.02·sqrt(d) = 0.23; a range of 256 such draws
    # is ≈ 2·2.8·0.23 ≈ 1.3, r²/8 ≈ 0.2 (the input token's own row adds to it).
    assert r2.mean() / 8 < 0.5


def test_one_sgd_step_reduces_the_loss():
    g = nn.GPT(32, 32, 2, 4, 16, seed=0)
    idx, tgt = batch(32, 8, 16)
    loss0 = g.loss(idx, tgt)
    loss0.backward()
    assert all(p.grad is not None and p.grad.format == p.format for p in g.parameters())
    sgd_step(g, 0.5)
    g.zero_grad()
    loss1 = g.loss(idx, tgt)
    assert loss1.item() < loss0.item()


# ---- gradients against central differences in fp64 mode -----------------------------------
def _directional(g, idx, tgt, p, v, h):
    """(L(θ + h v) − L(θ − h v)) / 2h, perturbing parameter ``p`` along ``v``."""
    old = p.data.copy()
    with mpt.no_grad():
        p.data = old + h * v
        up = g.loss(idx, tgt).item()
        p.data = old - h * v
        down = g.loss(idx, tgt).item()
    p.data = old
    return (up - down) / (2 * h)


def test_gradients_match_central_differences_in_fp64():
    g = nn.GPT(**TINY, seed=3).to("fp64")
    idx, tgt = batch(7, 2, 4, seed=1)
    loss = g.loss(idx, tgt)
    assert loss.format.name == "fp64"
    loss.backward()
    rng = np.random.default_rng(2)
    h = 2.0**-17
    for name, p in g.named_parameters():
        assert p.grad.format.name == "fp64"
        v = rng.standard_normal(p.shape)
        v /= np.linalg.norm(v)                                   # unit direction
        exact = float(np.sum(p.grad.data * v))                   # <∇L, v>
        d1 = _directional(g, idx, tgt, p, v, h)
        d2 = _directional(g, idx, tgt, p, v, 2 * h)
        # Central differences: D(h) = f' + h²f'''/6 + O(h⁴) + rounding. Truncation of D(h) is
        # |D(2h) − D(h)|/3 to leading order (Richardson); we allow the whole |D(2h) − D(h)|.
        # Rounding: each loss is float64 with an absolute error δ below 2^-40 (≈ 4000 ulps of a
        # loss ≈ 2 after a few hundred roundings of unit-size values), so (up − down)/2h errs by
        # at most δ/h = 2^-23.
        tol = abs(d2 - d1) + 2.0**-40 / h
        assert abs(d1 - exact) <= tol, (name, d1, exact, tol)
        # A wrong gradient (a dropped term, a factor) is off by far more than the tolerance:
        assert tol < 1e-6
    # and element by element for the tied embedding (it gets two gradient contributions).
    e = g.wte.weight
    for i in (0, 13, 55):
        v = np.zeros(e.shape)
        v.reshape(-1)[i] = 1.0
        d1 = _directional(g, idx, tgt, e, v, h)
        d2 = _directional(g, idx, tgt, e, v, 2 * h)
        assert abs(d1 - e.grad.data.reshape(-1)[i]) <= abs(d2 - d1) + 2.0**-40 / h


# ---- determinism ----------------------------------------------------------------------------
def _step_bits(threads, region):
    numba.set_num_threads(threads)
    try:
        # 512 tokens, MLP hidden 256: the GEMMs (≥ 2^18 products), GELU and the bias-gradient
        # sums (≥ 2^17 elements) are big enough to run their parallel paths (mpt.kernels run
        # small problems on one thread).
        g = nn.GPT(64, 64, 1, 4, 32, seed=4)
        idx, tgt = batch(64, 16, 32, seed=3)
        with region():
            loss = g.loss(idx, tgt)
        loss.backward()
        return [bits(loss).copy()] + [bits(p.grad).copy() for p in g.parameters()]
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 Numba threads")
@pytest.mark.parametrize("region", [lambda: mpt.matmul_model("ieee_fma"),
                                    lambda: mpt.autocast(format="bf16", model="hopper")],
                         ids=["fp32", "bf16-hopper"])
def test_forward_backward_bits_do_not_depend_on_thread_count(region):
    one, two = _step_bits(1, region), _step_bits(2, region)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_state_dict_round_trip_gives_the_same_loss_bits():
    a = nn.GPT(**TINY, seed=7)
    b = nn.GPT(**TINY, seed=8)
    b.load_state_dict(a.state_dict())
    idx, tgt = batch(7, 3, 4)
    assert bits(a.loss(idx, tgt)) == bits(b.loss(idx, tgt))


# ---- bf16 autocast through the Hopper model -------------------------------------------------
def test_bf16_autocast_step_runs_linears_through_hopper():
    g = nn.GPT(32, 32, 1, 4, 16, seed=0)
    idx, tgt = batch(32, 2, 16)
    fc1 = g.blocks[0].mlp.fc1
    seen = {}

    def spy(module, fn):
        def forward(x):
            seen["x"] = x
            out = fn(x)
            out.retain_grad()
            seen["y"] = out
            return out
        object.__setattr__(module, "forward", forward)

    spy(fc1, fc1.forward)
    with mpt.autocast(format="bf16", model="hopper"):
        loss = g.loss(idx, tgt)
    loss.backward()
    x, y = seen["x"], seen["y"]
    assert x.format.name == "fp32" and y.format.name == "bf16"  # Linear is a "lower" op
    xb = mpt.round(x.data.reshape(-1, 32), "bf16")               # (M, 32)
    wb = mpt.round(fc1.weight.data, "bf16")                      # (128, 32)
    acc = mpt.gemm(xb, wb.T, model="hopper")                     # FP32 (M, 128)
    bias = mpt.round(fc1.bias.data, "bf16").astype(np.float32)
    expected = mpt.round(acc + bias, "bf16").reshape(y.shape)    # FP32 epilogue, one rounding
    np.testing.assert_array_equal(bits(y), bits(expected))
    # The wgrad GEMM runs through hopper too (backward outside the region, as PyTorch's recipe):
    # dW = round_bf16(Gᵀ·X) with G the bf16 output gradient, then rounded to the fp32 weight
    # (exact: a bf16 value is an fp32 value).
    gy = y.grad.data.reshape(-1, 128)                            # (M, 128) bf16
    dw = mpt.round(mpt.gemm(np.ascontiguousarray(gy.T), xb, model="hopper"), "bf16")
    np.testing.assert_array_equal(bits(fc1.weight.grad), bits(dw.astype(np.float32)))
    assert all(p.grad.format.name == "fp32" for p in g.parameters())
    sgd_step(g, 0.1)
    with mpt.autocast(format="bf16", model="hopper"):
        assert g.loss(idx, tgt).item() < loss.item()


def test_dropout_is_replayable_and_off_in_eval():
    import mpt.functional as F
    g = nn.GPT(**TINY, dropout=0.2, seed=1)
    idx, tgt = batch(7, 4, 4)
    F.manual_seed(3)
    a = g.loss(idx, tgt)
    F.manual_seed(3)
    b = g.loss(idx, tgt)
    assert bits(a) == bits(b)
    F.manual_seed(4)
    assert bits(g.loss(idx, tgt)) != bits(a)
    plain = nn.GPT(**TINY, dropout=0.0, seed=1)
    assert bits(g.eval().loss(idx, tgt)) == bits(plain.loss(idx, tgt))


def test_token_id_checks():
    g = nn.GPT(**TINY)
    idx, tgt = batch(7, 2, 4)
    assert bits(g.loss(mpt.tensor(idx, format="int8"), tgt)) == bits(g.loss(idx, tgt))
    with pytest.raises(TypeError, match="idx must hold integer token ids"):
        g(idx.astype(np.float32))
    with pytest.raises(ValueError, match=r"targets must have the shape of idx \(2, 4\)"):
        g.loss(idx, tgt[:, :3])
