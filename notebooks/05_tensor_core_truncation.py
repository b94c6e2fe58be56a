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
# # The Tensor Core truncation, drawn bit by bit
#
# A Tensor Core does not add products one by one in IEEE fp32. For one output element of one
# instruction it takes a *block* of L products, multiplies them **exactly**, aligns all of them to
# the **largest exponent** among them, **truncates** every aligned product to F bits below that
# exponent (toward zero: no guard, round or sticky bit), adds the truncated terms exactly and
# rounds the sum once (toward zero, for an fp32 output). On an H100 (`hopper`), fp16 inputs: L = 16,
# F = 25. An IEEE fp32 loop (`ieee_fma`: one fused multiply-add per product) instead rounds the
# running sum to nearest after every product, keeping 24 significant bits *of the sum*.
#
# This notebook builds one block of 16 fp16 products by hand, computes the Tensor Core's result
# from the rule above with exact fractions, checks it against `mpt.mma(model="hopper")` bit for
# bit, and draws which bits fall off — for `hopper` and for `ieee_fma`. Then it measures what
# this does to long dot products, per GPU generation.

# %%
from fractions import Fraction
import math

import numpy as np
import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
import mpt

plt.rcParams.update({"figure.dpi": 72, "font.size": 8})
hopper = mpt.get_mma_model("hopper").config("fp16", "fp16")
L, F = hopper.block, hopper.fraction_bits
print(f"hopper, fp16 inputs: {hopper.instruction}; block L = {L}, kept fraction bits F = {F}, "
      f"fp32 output rounding {hopper.output('fp32')[0]}; evidence: {hopper.evidence}")

# %% [markdown]
# ## One block, built by hand
#
# Sixteen positive products whose exponents fall from 2^0 to 2^-28, each `a_k·b_k` with random
# 11-bit significands (so every product has up to 22 significant bits). The exponents are split
# between `a` and `b` so that both stay normal fp16 numbers, and `mpt.round` confirms that the
# values are exactly representable.

# %%
rng = np.random.default_rng(3)
exps = np.array([0, -1, -3, -6, -9, -12, -14, -16, -18, -20, -22, -24, -25, -26, -27, -28])
ea = -(-exps // 2)                                        # ceil(e/2) >= -14: a normal fp16
eb = exps - ea
sig_a = 1 + rng.integers(0, 1024, L) / 1024               # 1.xxxxxxxxxx, 10 fraction bits
sig_b = 1 + rng.integers(0, 1024, L) / 1024
a = mpt.round(np.ldexp(sig_a, ea), "fp16").reshape(1, L)                       # (1, L)
b = mpt.round(np.ldexp(sig_b, eb), "fp16").reshape(L, 1)                       # (L, 1)
assert np.array_equal(a.astype(np.float64).ravel(), np.ldexp(sig_a, ea))      # exact
products = [Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a.ravel(), b.ravel())]
exact = sum(products)
print(f"exact sum of the 16 products: {float(exact)!r} (as float64)")

# %% [markdown]
# ## The hopper rule, by hand
#
# A product keeps the exponent `e_a + e_b` and the significand `s_a·s_b ∈ [1, 4)` (it is not
# renormalised). The anchor is the largest of these exponents; every product is cut at
# `2^(anchor − F)`; the cut terms are summed exactly; the sum is truncated to fp32's 24
# significant bits.

# %%
anchor = int((ea + eb).max())
cut = Fraction(2) ** (anchor - F)
kept = [math.floor(p / cut) * cut for p in products]            # toward zero: all positive
total = sum(kept)                                                # exact, a multiple of 2^-25


def truncate_to_fp32(x: Fraction) -> float:
    """Round a positive multiple of 2^(anchor - F) toward zero to 24 significant bits."""
    n = int(x / cut)                                             # an integer: x = n * cut
    drop = max(0, n.bit_length() - 24)
    return float(Fraction((n >> drop) << drop) * cut)


by_hand = np.float32(truncate_to_fp32(total))
d_hopper = mpt.mma(a, b, model="hopper")[0, 0]
print(f"by hand : {float(by_hand)!r}  bits 0x{by_hand.view(np.uint32):08x}")
print(f"mpt.mma : {float(d_hopper)!r}  bits 0x{d_hopper.view(np.uint32):08x}")
assert by_hand.view(np.uint32) == d_hopper.view(np.uint32)      # the model, bit for bit

# %% [markdown]
# ## The same products through an fp32 FMA chain
#
# `ieee_fma` computes `d = fma(a_k, b_k, d)` for k = 1..16, rounding to nearest fp32 each time. A
# K-prefix of the chain is the chain with fewer products, so `mpt.mma` on the first k products
# gives the running sum after step k. At step k the product's bits below the last bit of the new
# running sum (`ulp(d_k)`) are rounded into it.

# %%
running = [mpt.mma(a[:, :k], b[:k, :], model="ieee_fma")[0, 0] for k in range(1, L + 1)]
d_ieee = running[-1]
assert d_ieee.view(np.uint32) == mpt.mma(a, b, model="ieee_fma")[0, 0].view(np.uint32)
ieee_cut = [math.frexp(float(d))[1] - 1 - 23 for d in running]    # log2 ulp(d_k)
print("log2 ulp of the running sum, step by step:", ieee_cut)

# %% [markdown]
# ## The picture
#
# Each row is one product, each column one bit position (2^1 on the left, 2^-49 on the right).
# Blue: a 1-bit that enters the sum. Red: a 1-bit that falls off — for hopper, everything right
# of the single cut at 2^-25 is **truncated**; for ieee_fma, everything right of that row's cut
# (black tick: the last bit of the running sum after that step) is **rounded** into the sum.

# %%
HI, LO = anchor + 1, anchor - F - 24                             # bit positions shown
columns = np.arange(HI, LO - 1, -1)                              # (51,)


def bit_grid(cuts):
    """(L, columns) codes: 0 no bit, 1 a kept 1-bit, 2 a 1-bit right of that row's cut."""
    grid = np.zeros((L, columns.size), np.int64)
    for k, p in enumerate(products):
        n = p / Fraction(2) ** LO
        assert n.denominator == 1                                # every bit lies in the window
        bits = np.array([(int(n) >> int(c - LO)) & 1 for c in columns])
        grid[k] = np.where(columns > cuts[k], bits, 2 * bits)
    return grid


panels = {"hopper: one cut at 2^(anchor − F), truncated": [anchor - F] * L,
          "ieee_fma: the running sum's last bit, rounded": ieee_cut}
fig, axes = plt.subplots(2, 1, figsize=(8, 6.2), layout="constrained")
colors = ListedColormap(["#f2f2f2", "tab:blue", "tab:red"])
for ax, (title, cuts) in zip(axes, panels.items()):
    ax.imshow(bit_grid(cuts), cmap=colors, vmin=0, vmax=2, aspect="auto", interpolation="none")
    for k, c in enumerate(cuts):
        x = HI - c + 0.5                                         # right edge of the kept bit
        ax.plot([x, x], [k - 0.5, k + 0.5], color="black", lw=2)
    ticks = [c for c in columns if c % 5 == 0]
    ax.set_xticks([HI - c for c in ticks], [f"$2^{{{c}}}$" for c in ticks])
    ax.set_yticks(range(L), [f"{p.numerator / p.denominator:.2e}" for p in products])
    ax.set_ylabel("product a_k·b_k")
    ax.set_title(title)
plt.show()

# %% [markdown]
# **What the picture shows:** hopper keeps every bit down to 2^(anchor − F) = 2^-25, finer than
# the last bit of the fp32 result (the running sum's ulp printed above), and drops everything
# below — the products whose leading bit lies under the cut vanish entirely (all-red rows). The
# FMA chain's cut moves with the running sum, so it drops *more* bits of every product; but it
# rounds them to nearest, while the Tensor Core truncates them and then truncates the sum once
# more. Truncation always errs toward zero, so with products of one sign its errors add up;
# rounding errors have both signs and partly cancel.
# Here, on one block:

# %%
def ulps_from_exact(d):
    """(d − exact) in units of the fp32 ulp of the exact sum."""
    ulp = Fraction(2) ** (math.frexp(float(exact))[1] - 1 - 23)
    return float((Fraction(float(d)) - exact) / ulp)


assert Fraction(float(exact)) == exact           # float64 holds this exact sum exactly, so
correct = mpt.round(float(exact), "fp32")        # this is the correctly rounded fp32 sum
for name, d in (("hopper", d_hopper), ("ieee_fma", d_ieee), ("exact, rounded", correct)):
    print(f"{name:15s} 0x{np.float32(d).view(np.uint32):08x}  {ulps_from_exact(d):+.3f} ulp")
assert ulps_from_exact(d_hopper) < 0                       # truncation: always toward zero

# %% [markdown]
# ## Long dot products, per generation
#
# A GEMM chains its blocks: each block's fp32 result is the next block's C. The truncation error
# therefore grows with K. Below, the mean relative error of K-long dot products of positive
# uniform values (no cancellation: the hardest case for truncation) against the exact sum
# (`math.fsum` of the exact products), for Volta (L = 4, F = 23), Ampere (L = 8, F = 24), Hopper
# (L = 16, F = 25), Hopper's FP8 path (L = 32, F = 13: its partial sums keep about 14 bits), and
# the IEEE fp32 FMA chain.

# %%
def exact_dot(a, b):
    """The exact dot product rounded once to float64 (products of fp16/fp8 values are exact)."""
    return math.fsum((mpt.decode(a, np.float64).ravel() * mpt.decode(b, np.float64).ravel()).tolist())


Ks = [64, 256, 1024, 4096]
cases = {"volta": ("volta", "fp16"), "ampere": ("ampere", "fp16"), "hopper": ("hopper", "fp16"),
         "hopper fp8": ("hopper", "fp8_e4m3fn"), "ieee fp32 fma": ("ieee_fma", "fp16")}
rng = np.random.default_rng(0)


def rel_err(K, model, fmt, trials=4):
    errs = []
    for _ in range(trials):
        a = mpt.round(rng.uniform(0, 1, (1, K)), fmt)
        b = mpt.round(rng.uniform(0, 1, (K, 1)), fmt)
        got = mpt.gemm(a, b, model=model, in_format=fmt)[0, 0]
        ref = exact_dot(a, b)
        errs.append(abs(float(got) - ref) / ref)
    return math.fsum(errs) / trials


table = {name: [rel_err(K, *case) for K in Ks] for name, case in cases.items()}
print(f"{'K':14s}" + "".join(f"{K:>10d}" for K in Ks))
for name, errs in table.items():
    print(f"{name:14s}" + "".join(f"{e:10.2e}" for e in errs))
v, a_, h, f8 = (table[k][-1] for k in ("volta", "ampere", "hopper", "hopper fp8"))
assert f8 > 10 * h and v >= a_ >= h > table["ieee fp32 fma"][-1]

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.2))
for name, errs in table.items():
    ax.loglog(Ks, errs, "o-", label=name)
ax.set_xscale("log", base=2)
ax.set_xlabel("K (products per dot product)")
ax.set_ylabel("mean relative error")
ax.legend()
plt.show()

# %% [markdown]
# **What the plot shows:** every accumulator's error grows with K; each generation keeps more
# bits and loses less, and all of them lose more than the IEEE FMA chain on these one-signed
# sums. Hopper's FP8 path is orders of magnitude worse. DeepSeek-V3's fix is to **promote**: every
# 128 products, add the FP8 partial sum into an fp32 register (`mpt.gemm(..., promote_every=128)`).

# %%
a = mpt.round(rng.uniform(0, 1, (1, 4096)), "fp8_e4m3fn")
b = mpt.round(rng.uniform(0, 1, (4096, 1)), "fp8_e4m3fn")
ref = exact_dot(a, b)
fast = float(mpt.gemm(a, b, model="hopper")[0, 0])
promoted = float(mpt.gemm(a, b, model="hopper", promote_every=128)[0, 0])
print(f"K = 4096, fp8 inputs: relative error {abs(fast - ref) / ref:.2e} with fast accumulation, "
      f"{abs(promoted - ref) / ref:.2e} promoted every 128 products")
assert abs(promoted - ref) < abs(fast - ref) / 10
