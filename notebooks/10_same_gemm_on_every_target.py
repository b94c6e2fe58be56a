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
# # The same GEMM on every target
#
# The same matrix product, with the same bf16 inputs, gives different fp32 bits on an A100, an
# H100, an MI300X, a TPU, a Gaudi 3 or a Trainium chip: each matrix engine multiplies, aligns,
# truncates or rounds, and accumulates in its own way. mpt describes every chip it knows as a
# *target* (`mpt.targets.targets()`): for each input format, the MMA model that runs its GEMMs
# (`Target.mma_model(fmt)`), and the evidence behind that model:
#
# * **hardware-verified**: reproduces real measurements bit for bit;
# * **reference model**: follows a vendor's or a paper's bit-accurate model, checked on hardware by
#   its authors;
# * **documented**: follows documentation that fixes the arithmetic (IEEE operations);
# * **assumption**: a stated model where the vendor says nothing — every assumed rule is a named,
#   selectable parameter.
#
# This notebook runs one GEMM on every target, measures each result against the exact answer, and
# finds which targets agree bit for bit.

# %%
import math

import numpy as np
import numba
import matplotlib.pyplot as plt
import mpt

numba.set_num_threads(1)   # small tensors: one thread is faster, and the bits never depend on it
plt.rcParams.update({"figure.dpi": 72, "font.size": 8})
TARGETS = mpt.targets.targets()
print(f"{'target':8s} {'vendor':7s} {'bf16 model':14s} {'evidence (bf16)':18s} "
      f"{'fp16 model':14s} {'evidence (fp16)':18s}")
for name, t in TARGETS.items():
    evidence = t.evidence_by_format()
    cells = []
    for fmt in ("bf16", "fp16"):
        model = dict(t.mma).get(fmt)
        cells.append(f"{model or '-':14s} {evidence.get(fmt, '-'):18s}")
    print(f"{name:8s} {t.vendor:7s} " + " ".join(cells))

# %% [markdown]
# ## One GEMM, every chip
#
# `A` (16×256) and `B` (256×16) hold standard normal values rounded to bf16; every target with a
# bf16 model computes `D = A·B` with fp32 output through `mpt.gemm(a, b, model=t.mma_model("bf16"))`
# (V100 and T4 have no bf16 Tensor Cores; they run the fp16 GEMM further below). The reference is
# exact: a product of two bf16 numbers is exact in float64, and `math.fsum` adds the 256 products
# of each output with one rounding to float64.

# %%
rng = np.random.default_rng(0)
M, K, N = 16, 256, 16
a = mpt.round(rng.standard_normal((M, K)), "bf16")                                 # (M, K)
b = mpt.round(rng.standard_normal((K, N)), "bf16")                                 # (K, N)
A, B = a.astype(np.float64), b.astype(np.float64)
exact = np.array([[math.fsum((A[i] * B[:, j]).tolist()) for j in range(N)]
                  for i in range(M)])                                              # (M, N)
best = mpt.round(exact, "fp32")                       # the correctly rounded fp32 answer
assert np.array_equal(best.view(np.uint32), mpt.gemm(a, b, model="exact").view(np.uint32))


def run_all(a, b, fmt):
    """{target: D} for every target with an MMA model for fmt."""
    out = {}
    for name, t in TARGETS.items():
        if fmt in dict(t.mma):
            out[name] = mpt.gemm(a, b, model=t.mma_model(fmt))
    return out


bf16 = run_all(a, b, "bf16")
print(f"{len(bf16)} targets ran the bf16 GEMM: {', '.join(bf16)}")

# %% [markdown]
# ## How far from the exact answer
#
# We measure each output's error in units of the fp32 ulp of the exact value: `(D − exact)/ulp`,
# signed. 0.5 is the best any fp32 result can guarantee (the correctly rounded answer is within
# half an ulp); "toward zero" is the share of the erring outputs whose error points toward zero,
# the signature of truncation.

# %%
def ulp_errors(d, exact):
    """Signed (d − exact) in fp32 ulps of exact (ulp = 2^(floor(log2|exact|) − 23))."""
    ulp = np.ldexp(1.0, np.frexp(np.abs(exact))[1] - 1 - 23)
    return (d.astype(np.float64) - exact) / ulp


def summary(results, exact, best):
    rows = {}
    for name, d in results.items():
        e = ulp_errors(d, exact)
        wrong = d != best
        toward_zero = float((np.sign(e[wrong]) == -np.sign(exact[wrong])).mean()) \
            if wrong.any() else float("nan")
        rows[name] = (float(np.median(np.abs(e))), float(np.abs(e).max()),
                      float((~wrong).mean()), toward_zero)
    return rows


stats = summary(bf16, exact, best)
print(f"{'target':8s} {'model':14s} {'median |ulp|':>12s} {'max |ulp|':>10s} "
      f"{'correctly rounded %':>19s} {'toward zero %':>13s}")
for name, (med, worst, correct, tz) in stats.items():
    print(f"{name:8s} {TARGETS[name].mma_model('bf16'):14s} {med:12.3f} {worst:10.1f} "
          f"{100 * correct:19.1f} {100 * tz:13.1f}")

# %%
names = list(bf16)
evidence = [TARGETS[n].evidence_by_format()["bf16"] for n in names]
colors = {"hardware-verified": "tab:green", "reference model": "tab:blue",
          "documented": "tab:grey", "assumption": "tab:orange"}
fig, ax = plt.subplots(figsize=(8, 3.8), layout="constrained")
for row, (n, ev) in enumerate(zip(names, evidence)):
    away = ulp_errors(bf16[n], exact) * np.sign(exact)      # > 0: away from zero, < 0: toward
    p5, p25, p50, p75, p95 = np.percentile(away, [5, 25, 50, 75, 95])
    ax.plot([p5, p95], [row, row], color=colors[ev], lw=1)                  # 5-95 %
    ax.plot([p25, p75], [row, row], color=colors[ev], lw=7, solid_capstyle="butt")
    ax.plot([p50], [row], "k|", ms=9)                                         # median
ax.set_yticks(range(len(names)), [f"{n} ({TARGETS[n].mma_model('bf16')})" for n in names])
ax.invert_yaxis()
ax.axvline(0, color="black", lw=0.5)
ax.set_xlabel("error in fp32 ulps of the exact value, signed: < 0 toward zero, > 0 away "
              "(thick: quartiles, thin: 5-95 %, tick: median)")
for ev, c in colors.items():
    ax.barh([0], [0], color=c, label=ev)
ax.legend(title="evidence", fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
plt.show()

# %% [markdown]
# **What the plot shows:** the IEEE fp32 FMA chain (`cpu`: `ieee_fma`, one rounding to nearest per
# product) errs to both sides of 0 by less than an ulp. The NVIDIA Tensor Cores truncate every
# product below the block's largest exponent and round each block's sum toward zero: their
# errors are larger and lean toward zero (`toward zero %`). AMD's Matrix Cores, Gaudi 2 and
# Trainium round differently again, near the FMA chain's accuracy here. The colours are the
# evidence: how sure mpt is that the model is the chip.
#
# ## Which targets agree bit for bit
#
# Two targets that run the same model give the same bits; different models may still agree on
# most outputs. The matrix shows, for every pair of targets, the share of the 256 outputs whose
# fp32 bits differ.

# %%
bits = {n: bf16[n].view(np.uint32) for n in names}
differ = np.array([[float((bits[p] != bits[q]).mean()) for q in names] for p in names])
groups = {}
for n in names:
    groups.setdefault(bits[n].tobytes(), []).append(n)
print("bit-identical groups:")
for members in groups.values():
    models = sorted({TARGETS[m].mma_model("bf16") for m in members})
    print(f"  {', '.join(members):32s} model {', '.join(models)}")

# %%
fig, ax = plt.subplots(figsize=(6.4, 5.4), layout="constrained")
image = ax.imshow(100 * differ, cmap="viridis", vmin=0, vmax=100)
ax.set_xticks(range(len(names)), names, rotation=90)
ax.set_yticks(range(len(names)), names)
fig.colorbar(image, ax=ax, label="% of outputs whose bits differ")
ax.set_title("the same bf16 GEMM: bit differences between targets")
plt.show()

# %% [markdown]
# **What the matrix shows:** the chips fall into groups that agree on every bit (dark blocks),
# and between groups almost every output differs in its last bits — even where both are within an
# ulp or two of the exact answer: a GEMM's bits identify the arithmetic that computed it. Some
# groups share a model family (H100, B200 and the RTX 5090 run Hopper-class blocks of 16; trn1
# and trn2 the same Trainium model). Others agree because their rules coincide for bf16, and the
# labels say how far to trust that: Gaudi 3's bf16 path (blocks of 8 products, 24 bits kept,
# toward zero; a reference model) is Ampere's rule; mpt's TPU model assumes an fp32 FMA chain
# inside the MXU (its `inner` parameter, an *assumption*), hence the CPU's bits; and MI355X's
# accumulation is assumed to be MI300X's.

# %%
for p, q in (("h100", "b200"), ("trn1", "trn2"), ("a100", "l40s")):
    assert np.array_equal(bits[p], bits[q]), (p, q)
assert differ[names.index("h100"), names.index("mi300x")] > 0.5
assert stats["cpu"][0] < stats["h100"][0]          # one rounding per product beats truncation
assert stats["h100"][3] > 0.7 > 0.6 > stats["cpu"][3]  # truncation errs toward zero

# %% [markdown]
# ## The fp16 GEMM, including Volta and Turing
#
# The same experiment with fp16 inputs (the TPU has no fp16 matrix unit in mpt's description, so
# it drops out; V100 and T4 join). With products of both signs the generations do not line up as
# they do for one-signed sums (notebook 05): cancellation moves the largest exponent of a block,
# and with it which bits are cut.

# %%
a16 = mpt.round(a.astype(np.float64), "fp16")          # the same values: bf16 fits in fp16 here
b16 = mpt.round(b.astype(np.float64), "fp16")
assert np.array_equal(a16.astype(np.float64), A) and np.array_equal(b16.astype(np.float64), B)
fp16 = run_all(a16, b16, "fp16")
stats16 = summary(fp16, exact, best)
print(f"{'target':8s} {'model':14s} {'median |ulp|':>12s} {'correctly rounded %':>19s}")
for name, (med, worst, correct, tz) in stats16.items():
    print(f"{name:8s} {TARGETS[name].mma_model('fp16'):14s} {med:12.3f} {100 * correct:19.1f}")
assert all(fp16[n].dtype == np.float32 for n in fp16) and len(fp16) == len(TARGETS) - 1
