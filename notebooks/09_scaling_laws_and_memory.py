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
# # The scaling-law planner: how big, how long, and how much memory
#
# Before a training run come two questions: for a compute budget, how many parameters N and how
# many tokens D (Chinchilla's question), and will one step of it fit in memory under a given
# precision recipe? `mpt.planning` answers both:
#
# * `ScalingLaw`: the loss law `L(N, D) = E + A/N^α + B/D^β` of Hoffmann et al. 2022 (Approach 3,
#   `CHINCHILLA`) and Epoch AI's refit of the same data (Besiroglu et al. 2024, `EPOCH_AI`), with
#   the compute-optimal split of a budget `C = 6·N·D` and its inverse;
# * `training_memory`: the peak bytes per role (weights, gradients, master, optimizer states,
#   activations) of one training step of mpt's GPT under a recipe, counted op by op as mpt's ops
#   save tensors for backward (checked against the memory ledger in the tests).

# %%
import numpy as np
import matplotlib.pyplot as plt
import mpt
from mpt import planning

plt.rcParams.update({"figure.dpi": 72, "font.size": 8})
LAWS = (planning.CHINCHILLA, planning.EPOCH_AI)
for law in LAWS:
    print(f"{law.name:10s} E {law.E:.4f}  A {law.A:8.2f}  B {law.B:8.2f}  "
          f"alpha {law.alpha:.4f}  beta {law.beta:.4f}")

# %% [markdown]
# ## IsoFLOP curves
#
# At a fixed budget C, a larger model sees fewer tokens (`D = C/(6N)`): the loss along that line
# has a minimum — the compute-optimal model. Each curve below is one budget under the Chinchilla
# law, the dot its minimum from `compute_optimal(C)`, found in closed form.

# %%
budgets = [1e19, 1e20, 1e21, 1e22, 1e23, 5.76e23]            # the last: Gopher's budget
N = np.logspace(7, 12, 200)
fig, ax = plt.subplots(figsize=(7.5, 3.4))
for C in budgets:
    law = planning.CHINCHILLA
    ax.semilogx(N, [law.loss(n, C / (6 * n)) for n in N], lw=1, label=f"C = {C:.3g}")
    n_opt, d_opt = law.compute_optimal(C)
    ax.plot(n_opt, law.loss(n_opt, d_opt), "ko", ms=4)
ax.set_ylim(1.8, 4.0)
ax.set_xlabel("parameters N")
ax.set_ylabel("predicted loss (nats/token)")
ax.legend(fontsize=7)
plt.show()

# %%
print(f"{'budget C':>10s}  " + "  ".join(f"{law.name + ': N_opt':>17s} {'D_opt':>9s} {'D/N':>5s}"
                                         f" {'loss':>6s}" for law in LAWS))
for C in budgets:
    cells = []
    for law in LAWS:
        n, d = law.compute_optimal(C)
        cells.append(f"{n:17.3g} {d:9.3g} {d / n:5.1f} {law.optimal_loss(C):6.4f}")
    print(f"{C:10.3g}  " + "  ".join(cells))
n, d = planning.CHINCHILLA.compute_optimal(5.76e23)
assert abs(6 * n * d / 5.76e23 - 1) < 1e-12 and round(n / 1e10, 1) == 3.2

# %% [markdown]
# **What the table shows:** Approach 3 with its published (rounded) constants puts Gopher's
# budget at N_opt ≈ 3.2e10, and its optimal tokens per parameter grow with the budget; the
# Epoch AI refit gives a larger model at that budget and about 20 tokens per parameter at every
# budget — the rule of thumb the Chinchilla paper is known for.
# The two laws agree on the shape and disagree on the split: a plan is only as good as its fit.
#
# `budget_for_loss` inverts the frontier: the smallest budget whose optimal model reaches a loss.

# %%
for target in (2.2, 2.0, 1.9):
    flops = planning.CHINCHILLA.budget_for_loss(target)
    n, d = planning.CHINCHILLA.compute_optimal(flops)
    print(f"loss {target}: {flops:.3g} FLOPs, N {n:.3g}, D {d:.3g}")
    assert abs(planning.CHINCHILLA.optimal_loss(flops) - target) < 1e-9

# %% [markdown]
# ## Bytes per parameter, per recipe
#
# The model states of mixed-precision training: weights and gradients in the recipe's formats, an
# optional FP32 master, and AdamW's two FP32 moments. fp16 weights and grads + FP32 master + Adam
# is the ZeRO paper's 2 + 2 + 4 + 4 + 4 = 16 bytes per parameter; pure bf16 (no master) saves 4.

# %%
RECIPES = ("fp32", "fp16-amp", "bf16-o2", "bf16-pure", "fp8-hybrid")
for name in RECIPES:
    r = mpt.get_recipe(name)
    b = planning.state_bytes_per_parameter(r.param_format, r.grad_format, r.master_format,
                                           "adamw", r.state_format)
    print(f"{name:11s} " + "  ".join(f"{k} {v:g}" for k, v in b.items()))
assert planning.state_bytes_per_parameter("fp16", master_format="fp32",
                                          optimizer="adam")["total"] == 16

# %% [markdown]
# ## One training step of GPT-2 small
#
# GPT-2 small's shape (vocabulary 50304, d_model 768, 12 layers of 12 heads, context 1024), batch
# 8, flash attention: the peak bytes per role under each recipe, with and without gradient
# checkpointing (√12 ≈ 3 segments).

# %%
shape = planning.GPTShape(vocab=50304, d_model=768, n_layers=12, n_heads=12, seq_len=1024)
print(f"{shape.n_params / 1e6:.1f} M parameters")
ROLES = ("weights", "grads", "master", "optimizer", "activations")
estimates = {(name, ck): planning.training_memory(shape, name, batch=8, checkpoint=ck)
             for name in RECIPES for ck in (False, True)}
print(f"{'recipe':11s} {'ckpt':5s} " + " ".join(f"{r:>11s}" for r in ROLES) + f" {'total':>8s}")
for (name, ck), est in estimates.items():
    print(f"{name:11s} {str(ck):5s} " +
          " ".join(f"{est.by_role[r] / 2**30:9.2f} G" for r in ROLES) +
          f" {est.by_role['total'] / 2**30:6.2f} G")

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.2))
labels = [f"{name}{' +ckpt' if ck else ''}" for name, ck in estimates]
bottom = np.zeros(len(estimates))
for role in ROLES:
    values = np.array([est.by_role[role] / 2**30 for est in estimates.values()])
    ax.bar(labels, values, bottom=bottom, label=role)
    bottom += values
ax.set_ylabel("GiB, peak per role (summed)")
ax.tick_params(axis="x", rotation=40)
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# **What the plot shows:** at this size the activations dominate — with a 50k vocabulary, the
# fp32 logits the cross-entropy keeps (s·b·V·4 bytes) are 1.5 GiB, and the gradients' share holds
# the logits' gradient too (the trainer keeps it for its statistics) — and checkpointing removes
# most of the 12 layers' share, not the head's (it also keeps each recomputed segment's parameter
# gradients live for a while: the gradients' bar grows). The recipes differ less than their
# bytes per parameter suggest because the model states of a 124M-parameter model are small next
# to the activations; at billions of parameters the states dominate and 16 against 12 bytes per
# parameter decides what fits.
#
# ## mpt's layer against Megatron's
#
# Korthikanti et al.'s per-layer formula `34·s·b·h + 5·a·s²·b` assumes Megatron's layer (16-bit
# everything, 1-byte dropout masks, naive attention). mpt's layer with flash attention keeps
# `s·b·h·(8 + 15·c)` plus small statistics: 38·s·b·h in 16 bits (fp32 LayerNorm inputs, the GELU
# input) and no s² term.

# %%
s, b, h, a = 1024, 8, 768, 12
megatron = planning.activation_bytes_per_layer(s, b, h, a)
plain = estimates["bf16-o2", False]
layer = sum(v for k, v in plain.activations_detail.items() if k.startswith("layer/"))
print(f"per layer: Korthikanti {megatron / 2**20:.0f} MiB, mpt (bf16-o2, flash) "
      f"{layer / 2**20:.0f} MiB = {layer / (s * b * h):.2f}·s·b·h")
assert abs(layer / (s * b * h) - 38) < 0.1
