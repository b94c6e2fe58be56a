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
# # FP8 scaling: delayed, with a margin, or current
#
# E4M3 (`fp8_e4m3fn`) holds magnitudes from 2^-9 to 448 with 3 mantissa bits — a range of about
# 2^18, far narrower than the values of a tensor over a training run. So an FP8 GEMM input is
# *scaled* before the cast: `q = round(x · scale)` (saturating at ±448), and the GEMM's result is
# multiplied by `1/scale` afterwards. The best scale puts the tensor's largest magnitude (its
# *amax*) just under 448.
#
# Transformer Engine's **delayed scaling** (`mpt.fp8.DelayedScaling`) computes the scale of step
# t from the amaxes recorded in the previous steps (an *amax history*): `scale = 448 / max(history)
# / 2^margin`. It needs no extra pass over the tensor, but it is always one step late. **Current
# scaling** (`mpt.fp8.quantize_current`) takes this tensor's own amax: one more pass, never late.
# This notebook follows one tensor whose magnitude grows slowly and then spikes, and measures what
# each choice does to it.

# %%
import math

import numpy as np
import matplotlib.pyplot as plt
import mpt
from mpt import fp8

plt.rcParams.update({"figure.dpi": 72, "font.size": 8})
E4M3 = mpt.get_format("fp8_e4m3fn")
rng = np.random.default_rng(0)
STEPS = 16
sigma = np.cumprod(np.r_[1.0, np.full(STEPS - 1, 1.15)])    # grows 15 % per step ...
sigma[8] *= 10                                             # ... with a 10x spike at step 8
tensors = [(rng.standard_normal(4096) * s).astype(np.float32) for s in sigma]
print("amax per step:", " ".join(f"{np.abs(x).max():.3g}" for x in tensors))

# %% [markdown]
# ## Three ways to pick the scale
#
# For each step we quantize the tensor, then measure how full the FP8 range is (`amax·scale/448`:
# above 1 the largest values saturate), how many values lie beyond E4M3's range (a non-saturating
# cast would overflow; the saturating one clamps them to ±448: `mpt.diagnostics.cast_stats`
# classifies the cast exactly), the share of values that land in E4M3's subnormals or flush to
# zero, and the relative RMS error of the dequantized tensor, `sqrt(Σ(q/scale − x)² / Σx²)` (sums
# exactly rounded with `math.fsum`).

# %%
def measure(x, scale):
    """(range used, saturated values, % subnormal or flushed, relative RMS error) of the cast of
    ``x`` with ``scale`` (``x·scale`` rounded to float32 first, as ``fp8.quantize`` does)."""
    q = fp8.quantize(x, "fp8_e4m3fn", scale)
    scaled = x * np.float32(scale)                                            # float32
    cast = mpt.diagnostics.cast_stats(scaled, "fp8_e4m3fn")
    err = q.dequantize().astype(np.float64) - x
    rms = math.sqrt(math.fsum((err * err).tolist()) /
                    math.fsum((x.astype(np.float64) ** 2).tolist()))
    small = 100 * (cast.subnormal + cast.underflow) / cast.nonzero
    return float(np.abs(scaled).max()) / E4M3.max, cast.overflow, small, rms


results = {}
for name, margin in (("delayed, margin 0", 0), ("delayed, margin 1", 1)):
    state = fp8.DelayedScaling(margin=margin, amax_history_len=4).state("forward")
    rows = []
    for x in tensors:
        state.observe(x)                      # what state.quantize(x) records before its cast
        rows.append(measure(x, state.scale))
        state.update()                        # end of step: the next step's scale
    results[name] = rows
results["current"] = [measure(x, fp8.current_scale(x, "fp8_e4m3fn")) for x in tensors]
print(f"{'step':>4s} " + " ".join(f"{n:>30s}" for n in results))
print(f"{'':4s} " + " ".join(f"{'used':>7s} {'sat':>5s} {'sub %':>6s} {'rms err':>9s}"
                             for _ in results))
for step in range(STEPS):
    print(f"{step:4d} " + " ".join(f"{r[step][0]:7.3f} {r[step][1]:5d} {r[step][2]:6.2f} "
                                   f"{r[step][3]:9.2e}" for r in results.values()))

# %%
fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 4.6), sharex=True, layout="constrained")
for name, rows in results.items():
    top.plot(range(STEPS), [r[0] for r in rows], "o-", ms=3, label=name)
    bottom.semilogy(range(STEPS), [r[3] for r in rows], "o-", ms=3, label=name)
top.axhline(1, color="black", lw=0.5)
top.set_yscale("log", base=2)
top.set_ylabel("amax·scale / 448 (log scale)")
top.legend()
bottom.set_ylabel("relative RMS error")
bottom.set_xlabel("step")
plt.show()

# %% [markdown]
# **What the plot shows:**
#
# * With margin 0 the range is *over*-full at most steps (used > 1): the scale comes from the
#   previous steps' amax, the tensor has grown since, and its largest values saturate — a small
#   but steady error increase.
# * At the spike (step 8) the stale scale is 10× too large: a large share of the tensor saturates
#   at ±448/scale, and the error jumps by more than an order of magnitude.
# * After the spike the history (4 steps long) still holds it, so the scale is 10× too small
#   until the spike rolls out, and so is the initial scale 1 at step 0: the range is used only to
#   a tenth or less. That costs little here — E4M3's normal range spans 15 binades, and only a
#   larger share of small values drops into the subnormals (`sub %`) — but a tensor with a wider
#   spread of magnitudes (gradients) would lose more.
# * A margin of 1 (a power of two of headroom) absorbs the slow growth but not the spike.
# * Current scaling fills the range exactly at every step, at the price of a pass over the tensor
#   before the cast.

# %%
sat = {n: [r[1] for r in rows] for n, rows in results.items()}
assert sat["delayed, margin 0"][8] > 500 and sat["current"] == [0] * STEPS
assert sum(sat["delayed, margin 1"][1:8]) == 0 < sum(sat["delayed, margin 0"][1:8])

# %% [markdown]
# ## The error of one cast, against E4M3's precision
#
# With current scaling, every value in the normal range of E4M3 is rounded with a relative error
# of at most half an ulp, 2^-4 (3 mantissa bits); values that the scale maps below 2^-6 (E4M3's
# smallest normal number) land in the subnormals with larger relative errors.

# %%
x = tensors[3]
scale = fp8.current_scale(x, "fp8_e4m3fn")
q = fp8.quantize(x, "fp8_e4m3fn", scale)          # what fp8.quantize_current(x, ...) returns
scaled = np.abs(x * np.float32(scale))
rel = np.abs(q.dequantize().astype(np.float64) - x) / np.abs(x)
normal = scaled >= E4M3.min_normal
print(f"largest relative error: normal range {rel[normal].max():.4f} (bound 2^-4 = "
      f"{2.0**-4:.4f}), subnormal range {rel[~normal].max():.4f} "
      f"({np.count_nonzero(~normal)} of {x.size} values)")
assert rel[normal].max() <= 2.0**-4 * (1 + 2.0**-20)   # + the float32 rounding of x·scale
fig, ax = plt.subplots(figsize=(7.5, 2.6))
ax.scatter(scaled, rel, s=2, color="tab:blue", rasterized=True)
ax.axvline(E4M3.min_normal, color="grey", ls="--", lw=0.8, label="E4M3 min normal 2^-6")
ax.axhline(2.0**-4, color="tab:red", ls="--", lw=0.8, label="half an ulp, 2^-4")
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set_xlabel("|x|·scale")
ax.set_ylabel("relative error")
ax.legend()
plt.show()
