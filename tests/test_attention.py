"""FlashAttention (``mpt.kernels.attention``, ``F.scaled_dot_product_attention(backend="flash")``):
the oracle's own checks, bits equal to the tiled oracle for every option combination, dropout
masks, grouped-query attention, fp8, thread independence and the argument checks.

The flash-attention acceptance criterion and the fp64 gradient checks are in
``tests/test_attention_accuracy.py``.
"""
import itertools
import math
import multiprocessing
import zlib

import numba
import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt.functional.attention import flash_mma_model
from mpt.kernels.attention import LOG2E
from mpt.kernels.random import random_words
from mpt.kernels.threads import run_tasks
from mpt.reference import attention as RA
from mpt.reference import mma as RM
from mpt.reference.optim import fma32 as fma32_exact
from mpt.testing import as_bits as bits


def same(actual, expected, msg=""):
    np.testing.assert_array_equal(bits(actual), bits(expected), err_msg=msg)


def tensors(rng, shapes, fmt, scale=1.0):
    return [mpt.tensor(rng.standard_normal(s) * scale, fmt, requires_grad=True) for s in shapes]


def kv_index(B, hq, hk):
    """Flattened key/value batch of each flattened (b, h) query batch: head h reads h // (hq/hk)."""
    return np.repeat(np.arange(B * hk).reshape(B, hk), hq // hk, axis=1).ravel()


def values(t, z):
    return t.data.astype(np.float32).reshape(z, t.shape[-2], t.shape[-1])


# ---- the oracle's own pieces --------------------------------------------------------------------

def test_oracle_fma32_is_the_exact_fma():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(3000).astype(np.float32)
    b = rng.standard_normal(3000).astype(np.float32)
    c = (-a.astype(np.float64) * b * (1 + rng.integers(-4, 5, 3000) * 2.0**-24)).astype(np.float32)
    c[::3] = rng.standard_normal(1000).astype(np.float32) * 2.0 ** rng.integers(-30, 30, 1000)
    a[:50], b[:50] = np.float32(1 + 2**-12), np.float32(1 + 2**-12)     # exact ties at 2^-24
    c[:50] = np.float32(2**-24) * rng.integers(-3, 4, 50)
    got = RA.fma32(a, b, c)
    want = np.array([fma32_exact(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)],
                    np.float32)
    same(got, want)


@pytest.mark.parametrize("fmt,model", [("fp16", "hopper"), ("bf16", "ampere"), ("fp16", "volta"),
                                       ("fp8_e4m3fn", "hopper"), ("fp8_e5m2", "ada")])
def test_oracle_block_model_matches_the_exact_rational_reference(fmt, model):
    rng = np.random.default_rng(2)
    spec = flash_mma_model(fmt, model)
    a = mpt.round(rng.standard_normal((3, 40)) * 2.0 ** rng.integers(-6, 6, (3, 40)), fmt)
    b = mpt.round(rng.standard_normal((40, 4)), fmt)
    c = rng.standard_normal((3, 4)).astype(np.float32)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    got = RA.mma(c, a32, b32, spec, mpt.get_format(fmt).emin)
    for i, j in itertools.product(range(3), range(4)):
        want = RM.block_dot_reference(list(map(float, a32[i])), list(map(float, b32[:, j])),
                                      float(c[i, j]), a_format=fmt, b_format=fmt,
                                      block=spec["block"], fraction_bits=spec["fraction_bits"],
                                      e_zero=spec["e_zero"], rounding=spec["rounding"])
        same(got[i, j], np.float32(want), f"{i},{j}")


def test_oracle_mma_agrees_with_mpt_gemm_and_philox_with_the_kernel():
    rng = np.random.default_rng(3)
    for fmt, model in (("fp32", "ieee_fma"), ("fp32", "ieee_mul_add"), ("bf16", "hopper")):
        a = mpt.round(rng.standard_normal((9, 70)), fmt)
        b = mpt.round(rng.standard_normal((70, 11)), fmt)
        got = RA.mma(np.zeros((9, 11), np.float32), a.astype(np.float32), b.astype(np.float32),
                     flash_mma_model(fmt, model))
        same(got, mpt.gemm(a, b, model=model))
    idx = np.arange(1000)
    same(RA.philox_words(2**40 + 5, 7, idx).astype(np.uint32), random_words(2**40 + 5, 7, 1000))


def test_flash_model_table_follows_the_spec():
    assert flash_mma_model("fp16", "hopper") == {"kind": "block", "block": 16,
                                                 "fraction_bits": 25, "e_zero": -133,
                                                 "rounding": "rz_fp32"}
    assert flash_mma_model("bf16", "a100") == {"kind": "block", "block": 8, "fraction_bits": 24,
                                               "e_zero": -132, "rounding": "rz_fp32"}
    assert flash_mma_model("fp8_e4m3fn", "hopper")["rounding"] == "rz_e8m13"
    assert flash_mma_model("fp32", "hopper") == {"kind": "ieee_fma"}   # CUDA cores
    assert LOG2E == math.log2(math.e)


# ---- flash bits == the tiled oracle --------------------------------------------------------------

# (format, matmul model); shapes, block sizes and GQA rotate through the 8 (causal, dropout, exp2)
# combinations of each model, so that every option meets every other.
MODELS = [("fp16", "hopper"), ("bf16", "ampere"), ("fp32", "ieee_fma"), ("fp16", "ieee_mul_add"),
          ("bf16", "blackwell")]
LAYOUTS = [  # (B, Hq, Hkv, L, S, E, Ev, block_q, block_k, scale)
    (1, 2, 2, 37, 45, 16, 8, 16, 32, None),
    (2, 4, 2, 33, 20, 8, 16, 8, 8, 0.3),        # GQA; L > S: causal rows without keys
    (1, 1, 1, 50, 50, 24, 24, 64, 64, None),    # one block each way
    (1, 3, 1, 19, 41, 16, 16, 7, 13, None),     # odd blocks, multi-query attention
]
CASES = [(fmt, model, causal, p, exp2, LAYOUTS[n % len(LAYOUTS)])
         for fmt, model in MODELS
         for n, (causal, p, exp2) in enumerate(itertools.product((False, True), (0.0, 0.25),
                                                                 (True, False)))]


def _run_flash(q, k, v, g, model, *, causal, p, exp2, bq, bk, scale, seed=5):
    mpt.manual_seed(seed)
    state = mpt.get_rng_state()
    with mpt.matmul_model(model):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal, scale=scale,
                                             enable_gqa=True, backend="flash", block_q=bq,
                                             block_k=bk, exp2=exp2)
    out.backward(g)
    return out, (p, *state) if p else None


@pytest.mark.parametrize("fmt,model,causal,p,exp2,layout", CASES,
                         ids=[f"{c[0]}-{c[1]}-{'causal' if c[2] else 'full'}-p{c[3]}-"
                              f"{'exp2' if c[4] else 'exp'}-{c[5][3]}x{c[5][4]}" for c in CASES])
def test_flash_bits_equal_the_tiled_oracle(fmt, model, causal, p, exp2, layout):
    B, hq, hk, L, S, E, Ev, bq, bk, scale = layout
    rng = np.random.default_rng(zlib.crc32(f"{fmt}{model}{causal}{p}{exp2}".encode()))
    q, k, v = tensors(rng, [(B, hq, L, E), (B, hk, S, E), (B, hk, S, Ev)], fmt)
    g = mpt.round(rng.standard_normal((B, hq, L, Ev)), fmt)
    out, dropout = _run_flash(q, k, v, g, model, causal=causal, p=p, exp2=exp2, bq=bq, bk=bk,
                              scale=scale)
    zq, zk, kv = B * hq, B * hk, kv_index(B, hq, hk)
    spec = dict(scale=1 / math.sqrt(E) if scale is None else scale, causal=causal, block_q=bq,
                block_k=bk, exp2=exp2, model=flash_mma_model(fmt, model), fmt=fmt,
                dropout=dropout)
    o, lse = RA.flash_forward(values(q, zq), values(k, zk), values(v, zk), kv, **spec)
    same(out, mpt.round(o, fmt).reshape(out.shape), "O")
    dq, dk, dv = RA.flash_backward(values(q, zq), values(k, zk), values(v, zk), values(out, zq),
                                   g.astype(np.float32).reshape(zq, L, Ev), lse, kv, **spec)
    for name, t, want in (("dQ", q, dq), ("dK", k, dk), ("dV", v, dv)):
        same(t.grad, mpt.round(want, fmt).reshape(t.shape), name)
    if causal and L > S:
        assert np.all(out.data[:, :, :L - S] == 0) and np.all(lse[:, :L - S] == np.inf)


def test_fp8_forward_bits_equal_the_oracle_and_backward_is_refused():
    rng = np.random.default_rng(7)
    q, k, v = (mpt.tensor(rng.standard_normal(s), "fp8_e4m3fn", requires_grad=True)
               for s in ((1, 2, 40, 32), (1, 2, 70, 32), (1, 2, 70, 32)))
    with mpt.matmul_model("hopper"):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, backend="flash")
    assert out.format.name == "bf16"                  # FA3's FP8 forward writes bf16
    o, _ = RA.flash_forward(values(q, 2), values(k, 2), values(v, 2), np.arange(2),
                            scale=1 / math.sqrt(32), causal=True, block_q=64, block_k=64,
                            exp2=True, model=flash_mma_model("fp8_e4m3fn", "hopper"),
                            fmt="fp8_e4m3fn")
    same(out, mpt.round(o, "bf16").reshape(out.shape))
    with pytest.raises(RuntimeError, match="fp8 forward only"):
        out.float().sum().backward()


def test_gqa_forward_equals_repeated_heads():
    rng = np.random.default_rng(8)
    q, k, v = tensors(rng, [(2, 6, 30, 16), (2, 2, 30, 16), (2, 2, 30, 16)], "bf16")
    with mpt.matmul_model("hopper"):
        grouped = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                                 backend="flash", block_q=16, block_k=16)
        heads = np.repeat(np.arange(2), 3)
        repeated = F.scaled_dot_product_attention(q, k[:, heads], v[:, heads], is_causal=True,
                                                  backend="flash", block_q=16, block_k=16)
    same(grouped, repeated)


# ---- dropout -------------------------------------------------------------------------------------

def test_dropout_masks_are_identical_in_forward_backward_and_the_naive_backend():
    # With v = I (S = Ev) every output column is one key: O[i, j] ≠ 0 iff (i, j) was kept
    # (P > 0 everywhere for these small scores). With dO = I (L = Ev), dV[j, i] = r·keep·P_F ≠ 0
    # iff (i, j) was kept in the backward's recomputation.
    n, p = 24, 0.4
    rng = np.random.default_rng(9)
    q, k = tensors(rng, [(2, 1, n, 8), (2, 1, n, 8)], "fp32", scale=0.3)
    v = mpt.tensor(np.broadcast_to(np.eye(n), (2, 1, n, n)), "fp32", requires_grad=True)
    mpt.manual_seed(11)
    seed, stream = mpt.get_rng_state()
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, backend="flash", block_q=8,
                                         block_k=16)
    out.backward(np.broadcast_to(np.eye(n), out.shape))
    mask = F.dropout_mask((2, 1, n, n), p, seed, stream)
    assert 0.3 < 1 - mask.mean() < 0.5
    np.testing.assert_array_equal(out.data != 0, mask)
    np.testing.assert_array_equal(np.swapaxes(v.grad.data, -1, -2) != 0, mask)
    mpt.manual_seed(11)
    naive = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    np.testing.assert_array_equal(naive.data != 0, mask)
    assert mpt.get_rng_state() == (seed, stream + 1)   # one stream per call, as the naive one


# ---- determinism, modules, errors ----------------------------------------------------------------

@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 Numba threads")
@pytest.mark.parametrize("fmt,model", [("fp32", "ieee_fma"), ("bf16", "hopper")])
def test_bits_do_not_depend_on_the_thread_count(fmt, model):
    rng = np.random.default_rng(10)
    # 2·4·128·128·(64+64) = 2^24 products: above the one-thread threshold of the kernels
    q, k, v = tensors(rng, [(2, 4, 128, 64)] * 3, fmt)
    g = mpt.round(rng.standard_normal(q.shape), fmt)
    runs = []
    for threads in (1, 2):
        numba.set_num_threads(threads)
        try:
            for t in (q, k, v):
                t.grad = None
            out, _ = _run_flash(q, k, v, g, model, causal=True, p=0.1, exp2=True, bq=64, bk=32,
                                scale=None)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        runs.append([bits(out).copy()] + [bits(t.grad).copy() for t in (q, k, v)])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@numba.njit(nogil=True)
def _record_slots(first, step, ntasks, out):
    for t in range(first, ntasks, step):
        out[t] += first * 1000 + step * 100 + 1


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("ntasks", [0, 1, 2, 5])
def test_run_tasks_runs_every_task_once_round_robin(threads, ntasks):
    """Each task runs once, task t on slot t % n of n = min(threads, tasks) (the attention
    kernels' threads); an exception of any slot reaches the caller."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip("needs 2 Numba threads")
    out = np.zeros(ntasks, np.int64)
    numba.set_num_threads(threads)
    try:
        run_tasks(_record_slots, ntasks, out)
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    n = max(min(threads, ntasks), 1)
    np.testing.assert_array_equal(out, [(t % n) * 1000 + n * 100 + 1 for t in range(ntasks)])

    def failing(first, step, ntasks):
        if first == step - 1:
            raise ValueError(f"slot {first}")
    with pytest.raises(ValueError, match=f"slot {n - 1}"):
        run_tasks(failing, n)


def _slots_in_child(queue):
    out = np.zeros(4, np.int64)
    run_tasks(_record_slots, 4, out)
    queue.put(out.tolist())


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2 or
                    "fork" not in multiprocessing.get_all_start_methods(),
                    reason="needs 2 Numba threads and the fork start method")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_run_tasks_works_in_a_forked_child():
    """A forked child inherits the task pool but not its threads: it must start its own (it hung
    before; the join's timeout turns a hang into a failure)."""
    run_tasks(_record_slots, 4, np.zeros(4, np.int64))           # the parent's pool exists
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_slots_in_child, args=(queue,))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0
    assert queue.get(timeout=5) == [1 + 200, 1001 + 200, 1 + 200, 1001 + 200]


def test_multihead_attention_and_gpt_use_the_flash_backend():
    from mpt import nn
    assert "flash" in nn.ATTENTION_BACKENDS
    x = mpt.tensor(np.random.default_rng(12).standard_normal((2, 9, 16)), "fp32")
    flash = nn.MultiheadAttention(16, 4, causal=True, backend="flash", seed=3)
    naive = nn.MultiheadAttention(16, 4, causal=True, backend="naive", seed=3)
    y, ref = flash(x), naive(x)
    assert not np.array_equal(bits(y), bits(ref))      # different rounding orders ...
    np.testing.assert_allclose(y.data, ref.data, rtol=0, atol=1e-6)   # ... of fp32 attention
    g = nn.GPT(11, 16, 2, 4, 8, seed=1, backend="flash")
    idx = np.random.default_rng(13).integers(0, 11, (2, 8))
    g.loss(idx, idx).backward()
    assert all(p.grad is not None for p in g.parameters())


def test_argument_errors():
    x = mpt.tensor(np.ones((1, 2, 4, 8)), "fp32")
    h = mpt.tensor(np.ones((1, 2, 4, 8)), "fp16")
    sdpa = F.scaled_dot_product_attention
    cases = [
        (ValueError, "not attn_mask", lambda: sdpa(x, x, x, attn_mask=np.ones((4, 4), bool),
                                                   backend="flash")),
        (ValueError, "backend must be one of", lambda: sdpa(x, x, x, backend="fast")),
        (ValueError, "block_q must be a positive int", lambda: sdpa(x, x, x, backend="flash",
                                                                     block_q=0)),
        (TypeError, "takes fp64, fp32", lambda: sdpa(*[mpt.tensor(np.ones((2, 4)), "tf32")] * 3,
                                                     backend="flash")),
        (ValueError, "divide the query heads", lambda: sdpa(
            x, mpt.tensor(np.ones((1, 3, 4, 8)), "fp32"), mpt.tensor(np.ones((1, 3, 4, 8)), "fp32"),
            enable_gqa=True)),
        (ValueError, "broadcast to the query", lambda: sdpa(
            x, mpt.tensor(np.ones((2, 2, 4, 8)), "fp32"), mpt.tensor(np.ones((2, 2, 4, 8)), "fp32"),
            backend="flash")),
    ]
    for error, message, call in cases:
        with pytest.raises(error, match=message):
            call()
    with mpt.matmul_model("exact"), pytest.raises(ValueError, match="use backend='naive'"):
        sdpa(h, h, h, backend="flash")
