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
# # Formats and rounding
#
# Every number a GPU trains with is a binary float of some *format*: fp32, tf32, bf16, fp16, or
# one of the 8-bit formats. A format has `e` exponent bits and `m` mantissa bits; the exponent
# bits set the **range** (largest and smallest magnitudes), the mantissa bits the **precision**
# (the spacing of neighbouring values relative to their size). This notebook computes both from
# mpt's format table, draws them, and then looks at what *rounding* into a format does:
# round to nearest (ties to even), the subnormal range, and stochastic rounding.
#
# `mpt.get_format(name)` returns a format's parameters; `mpt.round(x, fmt, mode)` rounds float32 or
# float64 values into it bit-exactly, and `mpt.decode` gives the exact values back.

# %%
import numpy as np
import matplotlib.pyplot as plt
import mpt

plt.rcParams.update({"figure.dpi": 72, "figure.figsize": (7.5, 3.6), "font.size": 9})
NAMES = ("fp32", "tf32", "bf16", "fp16", "fp8_e5m2", "fp8_e4m3fn")
print(f"{'format':11s} {'bits':>4s} {'e':>2s} {'m':>3s} {'max':>10s} {'min normal':>11s} "
      f"{'min subnormal':>13s} {'eps = 2^-m':>10s}")
for name in NAMES:
    f = mpt.get_format(name)
    print(f"{name:11s} {f.bits:4d} {f.exponent_bits:2d} {f.mantissa_bits:3d} {f.max:10.4g} "
          f"{f.min_normal:11.4g} {f.min_subnormal:13.4g} {f.eps:10.4g}")

# %% [markdown]
# `eps` is the distance from 1 to the next larger value, `2^-m`: the relative precision. bf16 keeps
# fp32's 8 exponent bits (the same range, up to 3.4e38) with only 7 mantissa bits; fp16 has 3 more
# mantissa bits but only 5 exponent bits, so it overflows above 65504 and its smallest normal
# number is 2^-14 ≈ 6.1e-5. Below the smallest normal number come the *subnormals*, spaced evenly
# down to `min_subnormal` (2^-24 for fp16): they extend the range at the cost of precision. tf32
# is fp32's range with fp16's precision (a Tensor Core input format stored in 32 bits). The two
# FP8 formats split 8 bits differently: E5M2 has fp16's range with 2 mantissa bits, E4M3FN trades
# range (max 448, no infinities) for one more mantissa bit.
#
# ## Range and precision in one picture
#
# Each bar spans a format's finite positive values on a log2 axis: the dark part the normal range,
# the light part the subnormals. The number on the right is `m`, the precision every normal value
# has.

# %%
fig, ax = plt.subplots()
for row, name in enumerate(NAMES):
    f = mpt.get_format(name)
    lo, mid, hi = np.log2([f.min_subnormal, f.min_normal, f.max])
    ax.barh(row, mid - lo, left=lo, color="tab:blue", alpha=0.35)
    ax.barh(row, hi - mid, left=mid, color="tab:blue")
    ax.text(hi + 3, row, f"m = {f.mantissa_bits}", va="center")
ax.set_yticks(range(len(NAMES)), NAMES)
ax.invert_yaxis()
ax.set_xlabel("log2 |x|  (light: subnormal range, dark: normal range)")
ax.set_xlim(-160, 160)
ax.axvline(0, color="grey", lw=0.5)
ax.set_title("Range of each format")
plt.show()

# %% [markdown]
# ## Round to nearest, ties to even
#
# Rounding to nearest returns the representable neighbour closest to `x`, so in the normal range
# its relative error is at most half an ulp: `|round(x) − x| / |x| ≤ eps/2`. Let us check that on
# 20 000 values from 2^-30 to 2^20 (400 evenly spaced mantissas in every binade, built exactly) and
# draw, per quarter binade, the largest relative error each format makes: it stays under the
# `eps/2` line in the normal range, grows in the subnormal range (the absolute spacing is fixed
# there, so the relative error rises as `x` shrinks) until values flush to zero (error 1), and is
# infinite past the largest value (drawn at 1 too).

# %%
e, j = np.meshgrid(np.arange(-30, 20), np.arange(400), indexing="ij")         # (50, 400)
x = np.ldexp(1 + j / 400, e).ravel()                                # exact: j/400 is one rounding
quarter = (4 * e + j // 100).ravel()                                # the quarter binade of each x
starts = np.flatnonzero(np.r_[True, np.diff(quarter) != 0])
fig, ax = plt.subplots()
for name, color in (("bf16", "tab:orange"), ("fp16", "tab:blue"), ("fp8_e4m3fn", "tab:green")):
    f = mpt.get_format(name)
    with np.errstate(over="ignore"):
        y = mpt.decode(mpt.round(x, name), np.float64)
    rel = np.where(np.isfinite(y), np.abs(y - x) / x, 1.0)   # overflow: Inf (NaN in E4M3) -> 1
    normal = (x >= f.min_normal) & (x <= f.max)
    assert rel[normal].max() <= f.eps / 2            # the RNE bound holds in the normal range
    ax.step(x[starts], np.maximum.reduceat(rel, starts), where="post", color=color, label=name)
    ax.axhline(f.eps / 2, color=color, ls="--", lw=0.8)
    print(f"{name:11s} max relative error on normal values {rel[normal].max():.4g} "
          f"(eps/2 = {f.eps / 2:.4g}); values that become 0: {np.count_nonzero(y == 0):5d}; "
          f"that overflow: {np.count_nonzero(~np.isfinite(y)):5d}")
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set_xlabel("x")
ax.set_ylabel("largest relative error of RNE")
ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
plt.show()

# %% [markdown]
# **What the plot shows:** the dashed lines are `eps/2` for each format: bf16's (2^-8) sits 8 times
# above fp16's (2^-11), three mantissa bits apart. fp16's error leaves its bound below 2^-14 (its
# smallest normal number) and reaches 1 — the value is flushed to zero — below 2^-25, half the
# smallest subnormal; past 65520 (65504 plus half an ulp) it overflows to infinity. E4M3's error
# leaves the bound below 2^-6 and flushes below 2^-10; above 464 it overflows to NaN (E4M3FN has no
# infinity). bf16 keeps the whole interval in its normal range.
#
# A few familiar numbers: 0.1 is not representable in any binary format, each format returns its
# nearest value; 1e-8 survives only in bf16.

# %%
values = np.array([0.1, 1 / 3, 300.0, 1e-8])
for name in ("bf16", "fp16", "fp8_e4m3fn"):
    y = mpt.decode(mpt.round(values, name), np.float64)
    print(f"{name:11s}", "  ".join(f"{v:.6g} -> {r:<12.8g}" for v, r in zip(values, y)))
f16 = mpt.decode(mpt.round(values, "fp16"), np.float64)
assert abs(f16[0] - 0.1) / 0.1 <= 2.0**-11 and f16[3] == 0

# %% [markdown]
# When `x` lies exactly halfway between two neighbours, round-to-nearest-even picks the one whose
# last mantissa bit is 0. In fp16, 1 + 2^-11 is halfway between 1 and 1 + 2^-10 and rounds *down*
# to 1; 1 + 3·2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9 and rounds *up*. The bit patterns
# show the even last bit.

# %%
ties = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11])
r = mpt.round(ties, "fp16")
for t, bits, v in zip(ties, r.view(np.uint16), mpt.decode(r, np.float64)):
    print(f"{t:.17g}  ->  0x{bits:04x} = {bits:016b}  = 1 + {(v - 1) / 2.0**-10:g}·2^-10")
assert list(mpt.decode(r, np.float64)) == [1.0, 1 + 2 * 2.0**-10]

# %% [markdown]
# ## Stochastic rounding
#
# Rounding to nearest is biased for a *sum of small increments*: adding 2^-12 to 1.0 in fp16
# (whose ulp at 1 is 2^-10) rounds back to 1.0 every time, so the sum never moves — this is how a
# low-precision weight loses its updates (notebook 04). **Stochastic rounding** rounds up with
# probability equal to the distance to the lower neighbour, in ulps: the result is exact *on
# average*. `mpt.round(x, fmt, "stochastic", seed=s)` draws its random bits from a counter-based
# Philox stream (element `i` of stream `s` uses word `i`), so the run below is the same on every
# machine.
#
# We run 16 independent sums in parallel (one vector), 600 steps each, and compare them with the
# exact sum.

# %%
steps, chains, inc = 600, 16, 2.0**-12
rne = np.ones(chains)
sr = np.ones(chains)
sr_path = np.empty((steps, chains))
for step in range(steps):
    rne = mpt.decode(mpt.round(rne + inc, "fp16"), np.float64)
    sr = mpt.decode(mpt.round(sr + inc, "fp16", "stochastic", seed=7, stream=step), np.float64)
    sr_path[step] = sr
exact = 1 + inc * np.arange(1, steps + 1)
print(f"exact after {steps} steps: {exact[-1]:.6f}")
print(f"RNE:                 {rne[0]:.6f} (all chains equal: {bool(np.all(rne == rne[0]))})")
print(f"stochastic, mean:    {sr.mean():.6f}   min {sr.min():.6f}   max {sr.max():.6f}")
assert np.all(rne == 1.0)
# Each step's error has mean 0 and a standard deviation of at most half an ulp (2^-11 at 1, 2^-10
# from 2 on: here the sum stays below 2): after 600 steps the mean of 16 chains has std
# <= 2^-11·sqrt(600/16) ~ 3e-3; 2e-2 is a six-sigma bound.
assert abs(sr.mean() - exact[-1]) < 2e-2

# %%
fig, ax = plt.subplots()
ax.plot(exact, color="black", lw=1.5, label="exact sum")
ax.plot(sr_path, color="tab:green", lw=0.4, alpha=0.6)
ax.plot(sr_path.mean(axis=1), color="tab:green", lw=1.5, label=f"stochastic (mean of {chains})")
ax.plot(np.ones(steps), color="tab:red", lw=1.5, label="round to nearest")
ax.set_xlabel("step")
ax.set_ylabel("running sum in fp16")
ax.legend()
plt.show()

# %% [markdown]
# **What the plot shows:** every thin green line is one stochastic chain: each wanders within a
# few ulps (steps of 2^-10) of the exact sum, and their mean follows it. Round to nearest stays at
# 1.0 for all 600 steps. That is why stochastic rounding can replace FP32 master weights
# (notebook 04), at the price of noise.
