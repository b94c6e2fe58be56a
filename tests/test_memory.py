"""The memory ledger (``mpt.memory``): bytes by role and format, buffers counted once and released
when freed, the peak, the autograd hooks, and what attention and checkpointing save."""
import gc

import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt import nn, optim
from mpt.autograd.memory import MemoryLedger, active_ledger


def test_roles_formats_views_and_release():
    led = MemoryLedger()
    w = mpt.tensor(np.ones((4, 8)), "bf16")
    a = np.zeros((3, 5), np.float32)
    assert led.track(w, "weights") == 64
    assert led.track(a[1:], "activations") == 60          # a view: its whole base is held
    assert led.track(a.T, "grads") == 0                    # the same buffer: counted once
    assert led.by_format() == {("activations", "fp32"): 60, ("weights", "bf16"): 64}
    assert led.live() == led.peak == 124
    del a
    gc.collect()
    assert led.live("activations") == 0 and led.peak_by_role["activations"] == 60
    led.reset_peak()
    assert led.peak == 64
    assert "weights" in led.report() and "weights/bf16: 64" in led.report()
    with pytest.raises(ValueError, match="role must be one of"):
        led.track(w, "cache")
    with pytest.raises(TypeError, match="Tensor or an ndarray"):
        led.track([1.0], "weights")


def test_hooks_count_saved_activations_and_grads_of_one_step():
    model = nn.MLP(16, 64, seed=1)
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    x = mpt.tensor(np.random.default_rng(0).standard_normal((8, 16)), "fp32", requires_grad=True)
    with MemoryLedger() as led:
        assert active_ledger() is led
        led.track_module(model)
        weights = sum(p.data.nbytes for p in model.parameters())
        assert led.live("weights") == weights
        loss = model(x).sum()
        # fc1 saves x and its weight (already a weight), gelu its input, fc2 its input and weight
        assert led.live("activations") == (8 * 16 + 8 * 64 + 8 * 64) * 4
        loss.backward()
        assert led.live("grads") == weights + x.data.nbytes  # parameters and the input leaf
        opt.step()
        led.track_optimizer(opt)
        assert led.live("optimizer") == 2 * weights + 4 * 4  # AdamW: m, v, fp32 step, 4 params
        peak = led.peak
        del loss
        gc.collect()
        # the graph is gone; x, saved by fc1, is still held here
        assert led.live("activations") == x.data.nbytes and led.peak == peak
    assert active_ledger() is None


def test_flash_saves_o_of_n_and_naive_o_of_n_squared():
    B, H, N, d = 1, 2, 256, 32
    rng = np.random.default_rng(1)
    saved = {}
    for backend in ("naive", "flash"):
        q, k, v = (mpt.tensor(rng.standard_normal((B, H, N, d)), "fp16", requires_grad=True)
                   for _ in range(3))
        with MemoryLedger() as led:
            for t in (q, k, v):
                led.track(t, "activations")         # the inputs, already held by the caller
            base = led.live()
            with mpt.matmul_model("hopper"):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
            saved[backend] = led.live() - base - out.data.nbytes * (backend == "flash")
            del out
    # naive: P in fp32 and round_F(P) in fp16; flash: the output and the log-sum-exp (fp32)
    assert saved["naive"] == B * H * N * N * (4 + 2)
    assert saved["flash"] == B * H * N * 4


def test_checkpointing_lowers_the_peak_of_saved_activations():
    rng = np.random.default_rng(2)
    idx, tgt = rng.integers(0, 32, (4, 16)), rng.integers(0, 32, (4, 16))
    peaks = {}
    for ckpt in (False, 2):
        g = nn.GPT(32, 32, 4, 4, 16, seed=1, checkpoint=ckpt)
        with MemoryLedger() as led:
            led.track_module(g)
            led.reset_peak()
            g.loss(idx, tgt).backward()
            peaks[ckpt] = led.peak_by_role["activations"]
    # 4 blocks in 2 checkpointed segments: at most one segment (2 blocks) of activations plus the
    # segment inputs and the embedding/head activations are alive at once.
    assert peaks[2] < 0.75 * peaks[False]
