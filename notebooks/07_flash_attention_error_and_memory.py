# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # FlashAttention: its error against naive attention, and its memory
#
# Naive attention computes the whole T×T score matrix `S = q·kᵀ·τ`, its softmax `P`, and `O = P·v`.
# FlashAttention-2 never materialises `S`: it walks over tiles of keys, keeps a running maximum and
# a running sum per query row (the *online softmax*), rescales its partial output whenever the
# maximum grows, and divides by the sum at the end. That is a different order of roundings — is it
# less accurate? And how much memory does it save for the backward pass?
#
# `mpt.functional.scaled_dot_product_attention(q, k, v, backend="naive" | "flash")` implements both
# with the rounding points of the real kernels (fp32 scores and accumulation through the matmul
# model, `P` rounded to the input format before `P·v`, the output rounded once); the oracle
# `mpt.reference.attention.attention` computes exact attention in float64 from the same inputs.

# %%
import numpy as np
import numba
import matplotlib.pyplot as plt
import mpt
import mpt.functional as F
from mpt.reference import attention as reference

numba.set_num_threads(1)   # small tensors: one thread is faster, and the bits never depend on it
plt.rcParams.update({"figure.dpi": 72, "font.size": 8})

# %% [markdown]
# ## Error by sequence length
#
# For each sequence length T, two heads of dimension 32 with standard normal q, k, v rounded to
# fp16 (or bf16), causal attention on the Hopper Tensor Core model. We compare each backend's
# output with the float64 reference: the largest and the mean absolute error, and the normwise
# relative error `‖O − O_ref‖ / ‖O_ref‖` (sums of squares exactly rounded with `math.fsum`) in
# units of the format's unit roundoff `u = eps/2` — the error of rounding the exact answer once.

# %%
import math

rng = np.random.default_rng(0)
Ts = (32, 64, 128, 256, 512, 1024)
H, D = 2, 32


def normwise(err, ref):
    return math.sqrt(math.fsum((err * err).ravel().tolist()) /
                     math.fsum((ref * ref).ravel().tolist()))


results, differ = {}, {}
for fmt in ("fp16", "bf16"):
    u = mpt.get_format(fmt).eps / 2
    for T in Ts:
        x = [mpt.round(rng.standard_normal((1, H, T, D)), fmt) for _ in range(3)]   # q, k, v
        exact = reference.attention(*(a.astype(np.float64).reshape(H, T, D) for a in x),
                                    np.arange(H), scale=1 / np.sqrt(D), causal=True)
        exact = exact.reshape(1, H, T, D)
        out = {}
        with mpt.matmul_model("hopper"):
            for backend in ("naive", "flash"):
                out[backend] = F.scaled_dot_product_attention(
                    *(mpt.tensor(a) for a in x), is_causal=True, backend=backend).data
        for backend, o in out.items():
            err = o.astype(np.float64) - exact
            results.setdefault((fmt, backend), []).append(
                (np.abs(err).max(), np.abs(err).mean(), normwise(err, exact) / u))
        best = mpt.round(exact, fmt).astype(np.float64)        # the correctly rounded output
        results.setdefault((fmt, "rounded once"), []).append(
            (0.0, 0.0, normwise(best - exact, exact) / u))
        differ[fmt, T] = float((out["naive"] != out["flash"]).mean())
print(f"{'format':6s} {'T':>5s}  {'naive: max |err|':>16s} {'mean |err|':>10s} {'norm/u':>6s}"
      f"   {'flash: max |err|':>16s} {'mean |err|':>10s} {'norm/u':>6s}  {'differ %':>8s}"
      f"  {'rounded once: norm/u':>20s}")
for fmt in ("fp16", "bf16"):
    for i, T in enumerate(Ts):
        n, f = results[fmt, "naive"][i], results[fmt, "flash"][i]
        print(f"{fmt:6s} {T:5d}  {n[0]:16.3e} {n[1]:10.3e} {n[2]:6.2f}   {f[0]:16.3e} "
              f"{f[1]:10.3e} {f[2]:6.2f}  {100 * differ[fmt, T]:8.1f}  "
              f"{results[fmt, 'rounded once'][i][2]:20.2f}")

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
for (fmt, backend), rs in results.items():
    style = dict(marker="o", ms=3, ls={"naive": "-", "flash": "--", "rounded once": ":"}[backend],
                 color="tab:blue" if fmt == "fp16" else "tab:orange", label=f"{fmt} {backend}")
    if backend != "rounded once":
        left.loglog(Ts, [r[1] for r in rs], **style)
    right.semilogx(Ts, [r[2] for r in rs], **style)
for ax in (left, right):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length T")
left.set_ylabel("mean |output − float64 reference|")
right.set_ylabel("‖error‖ / ‖reference‖ in units of u")
right.set_ylim(bottom=0)
right.legend()
plt.show()

# %% [markdown]
# **What the plot shows:** the absolute error *falls* with T, because the outputs themselves get
# smaller (each is an average over more values of v); relative to the output's size the error
# stays flat, a little above the error of the best possible answer — the exact output rounded once
# to the format (dotted). The two backends round differently — their outputs differ in almost
# half the elements — but flash is not less accurate: its online rescaling costs nothing
# measurable here, and its errors are a little smaller than naive's. bf16 errs about 8× more than
# fp16 in absolute terms (3 fewer mantissa bits), the same in units of u.

# %%
for fmt in ("fp16", "bf16"):
    for n, f in zip(results[fmt, "naive"], results[fmt, "flash"]):
        assert f[2] <= n[2] * 1.05 and n[2] < 2     # flash at least as accurate; under 2 u

# ## Memory saved for the backward pass
#
# Naive attention keeps `P` (T×T per head, fp32) for its backward pass; FlashAttention keeps only
# q, k, v, the output and one log-sum-exp per query row, and recomputes the scores tile by tile in
# the backward. `mpt.MemoryLedger` counts the bytes each op saves for backward.

# %%
def saved_bytes(T, backend, B=1, H=2, hd=16):
    q, k, v = (mpt.tensor(rng.normal(size=(B, H, T, hd)).astype(np.float32), requires_grad=True)
               for _ in range(3))
    with mpt.MemoryLedger() as ledger:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
        saved = ledger.live("activations")     # while `out` (and the graph behind it) lives
    return saved


memory_Ts = (64, 128, 256, 512, 1024)
saved = {b: [saved_bytes(T, b) for T in memory_Ts] for b in ("naive", "flash")}
for T, n, f in zip(memory_Ts, saved["naive"], saved["flash"]):
    print(f"T {T:5d}: naive {n:9d} B   flash {f:7d} B   ratio {n / f:5.1f}")
B, Hm, hd = 1, 2, 16
for T, n, f in zip(memory_Ts, saved["naive"], saved["flash"]):
    assert f == 4 * B * Hm * T * (4 * hd + 1)                    # q, k, v, O and lse, fp32
    assert n == 4 * B * Hm * T * 3 * hd + 4 * B * Hm * T * T     # q, k, v and P, fp32

# %%
fig, ax = plt.subplots(figsize=(7.5, 2.8))
for backend, values in saved.items():
    ax.loglog(memory_Ts, values, "o-", label=backend)
ax.set_xscale("log", base=2)
ax.set_xlabel("sequence length T")
ax.set_ylabel("bytes saved for backward")
ax.legend()
plt.show()

# %% [markdown]
# Flash's bytes grow linearly in T, naive's quadratically: at T = 1024 with
# head dimension 16 the score matrix is already most of the memory.
#
# ## Gradient checkpointing
#
# `nn.GPT(checkpoint=k)` keeps only the input of each of k segments of blocks and recomputes the
# segment during the backward pass: the gradients are bit-identical, the activation peak drops.
# `mpt.planning.training_memory` predicts both peaks from the network's shape.

# %%
from mpt import nn, planning

V, d, L, heads, T, batch = 64, 32, 4, 4, 64, 2
idx, tgt = (rng.integers(0, V, (batch, T)) for _ in range(2))


def step(checkpoint):
    network = nn.GPT(V, d, L, heads, T, checkpoint=checkpoint)
    with mpt.MemoryLedger() as ledger:
        ledger.track_module(network)
        network.loss(idx, tgt).backward()
    return ledger.peak_by_role["activations"], [p.grad.data for p in network.parameters()]


plain, g_plain = step(False)
ckpt, g_ckpt = step(2)
print(f"activation peak: plain {plain} B, checkpointed in 2 segments {ckpt} B "
      f"({100 * ckpt / plain:.0f} %)")
assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(g_plain, g_ckpt))
shape = planning.GPTShape(V, d, L, heads, T)
for ck, measured in ((False, plain), (2, ckpt)):
    estimate = planning.training_memory(shape, "fp32", batch, checkpoint=ck).by_role["activations"]
    print(f"checkpoint={ck}: planner's estimate {estimate} B, ledger {measured} B")
    assert abs(estimate / measured - 1) < 0.10
