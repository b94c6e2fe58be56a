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
# # Loss curves per precision recipe
#
# A *recipe* (`mpt.recipes`) names every precision choice of a training run: the format of the
# weights and gradients, whether an FP32 master copy is kept, what the GEMMs compute in, loss
# scaling, FP8 layers, how updates are rounded. Here we train the same small GPT under six
# recipes — **from the same initial weights, on the same batches** — so that any difference
# between two loss curves is the recipes' alone, not noise from data order or initialisation:
#
# | recipe | weights / grads | master | GEMMs | loss scaling |
# |---|---|---|---|---|
# | `fp32` | fp32 | – | fp32 (IEEE FMA) | – |
# | `fp16-o2` | fp16 | fp32 | fp16 Tensor Core (Hopper model) | dynamic |
# | `fp16-noscale` | fp16 | fp32 | fp16 Tensor Core | none |
# | `bf16-pure` | bf16 | – (updates rounded to nearest) | bf16 Tensor Core | – |
# | `bf16-pure-sr` | bf16 | – (updates rounded stochastically) | bf16 Tensor Core | – |
# | `fp8-hybrid` | fp32 | – | FP8: E4M3 forward, E5M2 backward, delayed scaling | – |
#
# `mpt.study.run_recipe` builds the network (`mpt.nn.GPT`), the `Trainer` for the recipe and the
# data (a Markov chain whose entropy rate is the best achievable loss), trains, and evaluates on
# held-out batches. `mpt study` on the command line runs the full version (400 steps, every
# recipe, a Markdown report, a GPT of two blocks with d_model 64); this notebook runs 100 steps
# of a smaller one (one block of two heads, d_model 32) so that it finishes in seconds.

# %%
import numpy as np
import matplotlib.pyplot as plt
import mpt
from mpt.study import StudyConfig, run_recipe

plt.rcParams.update({"figure.dpi": 72, "font.size": 8})
RECIPES = ("fp32", "fp16-o2", "fp16-noscale", "bf16-pure", "bf16-pure-sr", "fp8-hybrid")
config = StudyConfig(recipes=RECIPES, steps=100, quant=False,
                     d_model=32, n_layers=1, n_heads=2)
print(f"steps {config.steps}, batch {config.batch} x {config.seq_len} tokens, "
      f"lr {config.lr:g} (warm-up {config.warmup_steps}, cosine to {config.min_lr:g}), "
      f"loss multiplier 2^{int(np.log2(config.loss_multiplier))}, target {config.target}")
runs = {name: run_recipe(config, name) for name in config.recipes}

# %% [markdown]
# ## The curves
#
# Each step's training loss is the mean cross-entropy of that step's batch. Because every recipe
# sees the same batch at the same step, the *difference* of two recipes' losses at one step is
# not noisy, even though each curve is: the right panel draws each recipe's loss minus fp32's.

# %%
loss = {name: np.array([m.loss for m in run.history]) for name, run in runs.items()}
steps = np.arange(1, config.steps + 1)
fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
for name, curve in loss.items():
    left.plot(steps, curve, lw=1, label=name)
    right.plot(steps, curve - loss["fp32"], lw=1, label=name)
left.set_xlabel("step")
left.set_ylabel("training loss (nats/token)")
left.legend()
right.axhline(0, color="black", lw=0.5)
right.set_xlabel("step")
right.set_ylabel("loss − fp32 loss, same batch")
plt.show()

# %% [markdown]
# ## The numbers behind the curves
#
# `RecipeRun.totals()` sums what the trainer measured at every step: the final held-out loss,
# skipped steps and the final loss scale, the share of non-zero gradient values flushed to zero
# at the first rounding of the backward pass (the logits gradient cast to the backward format, and
# the E5M2 gradients of the FP8 layers), parameter-gradient elements that are exactly zero, and
# the share of updates lost in the copy-down to a low-precision weight.

# %%
print(f"{'recipe':13s} {'held-out':>8s} {'gap fp32':>8s} {'skipped':>7s} {'scale':>7s} "
      f"{'underflow %':>11s} {'zero grads %':>12s} {'lost upd %':>10s} {'B/param':>7s}")
for name, run in runs.items():
    t = run.totals()
    print(f"{name:13s} {run.final_loss:8.4f} {run.final_loss - runs['fp32'].final_loss:+8.4f} "
          f"{t['skipped']:7d} {t['final_scale']:7g} {100 * t['underflow']:11.2f} "
          f"{100 * t['grad_zeros']:12.2f} {100 * t['lost_updates']:10.1f} "
          f"{run.bytes_per_parameter:7g}")
gap = {name: run.final_loss - runs["fp32"].final_loss for name, run in runs.items()}
assert gap["fp16-noscale"] > 0.02 and gap["bf16-pure"] > 0.02       # the two failures
assert abs(gap["fp16-o2"]) < 0.005 and abs(gap["bf16-pure-sr"]) < 0.005  # and their cures

# %% [markdown]
# **What the curves and the table show:**
#
# * `fp16-o2` lies on top of fp32: with its loss scale of 2^16 the gradients sit in fp16's normal
#   range, and the FP32 master keeps every update. (Its `lost upd %` counts fp16 copies that did
#   not change in a step although the master did: those updates are kept in the master and show
#   up in a later step, so nothing is lost.)
# * `fp16-noscale` falls behind within the first 20 steps: many of its logits-gradient values
#   flush to zero (`underflow %`) and so do many parameter gradients (`zero grads %`; notebook 02
#   shows where they fall), so some weights learn slowly or not at all.
# * `bf16-pure` falls behind more slowly, and for another reason: its gradients are fine (bf16
#   has fp32's range), but a large share of the updates is *lost* (`lost upd %`) — smaller than
#   half an ulp of the bf16 weight, they round back to the old weight. The gap grows as the
#   learning rate decays and the updates get smaller. Notebook 04 shows which weights lose them.
# * `bf16-pure-sr` rounds the same updates stochastically and tracks fp32: in a given step it
#   loses about as many updates (a stochastic round down), but without bias — on average each
#   update is applied.
# * `fp8-hybrid` pays a small, steady price for its 3-bit (E4M3) forward and 2-bit (E5M2) backward
#   GEMM inputs; delayed scaling keeps them in range (notebook 06).
#
# ## When a loss scale is too large
#
# `fp16-o2`'s scaler never skipped a step here: 2^16 was safe (notebook 02 found room up to
# 2^29). Dynamic loss scaling handles the other case too: if any scaled gradient overflows fp16,
# the scaler skips `optimizer.step()` and halves the scale, and after `growth_interval` clean
# steps it doubles it. A single fp16 Linear layer whose loss is `1e-3·sum(output)` in fp16
# shows it: the gradient entering its backward pass is the scale itself, so every scale above
# fp16's 65504 overflows, whatever the data.

# %%
from mpt import nn

rng = np.random.default_rng(0)
x = mpt.tensor(rng.normal(size=(8, 16)), "fp16")
layer = nn.Linear(16, 4, format="fp16")
opt = mpt.optim.SGD(layer.parameters(), lr=0.1, master_weights=True)
scaler = mpt.GradScaler(init_scale=2.0**24, growth_interval=3, record=True)
for step in range(20):
    opt.zero_grad()
    scaler.scale((layer(x) * mpt.tensor(1e-3, "fp16")).sum()).backward()
    scaler.step(opt)
    scaler.update()
trajectory = mpt.diagnostics.scale_trajectory(scaler)
print(" ".join(f"2^{int(np.log2(r['scale']))}{'(skip)' if r['skipped'] else ''}"
               for r in trajectory))
skipped = [r["skipped"] for r in trajectory]
assert all(skipped[:9]) and not skipped[9] and trajectory[9]["scale"] == 2.0**15

# %%
fig, ax = plt.subplots(figsize=(7.5, 2.6))
scales = np.array([r["scale"] for r in trajectory])
ax.step(range(1, 21), np.log2(scales), where="mid", color="tab:blue")
ax.scatter(np.flatnonzero(skipped) + 1, np.log2(scales[skipped]), color="tab:red", zorder=3,
           label="step skipped (overflow)")
ax.axhline(np.log2(65504), color="grey", ls="--", lw=0.8, label="log2(65504): fp16 max")
ax.set_xlabel("step")
ax.set_ylabel("log2(loss scale)")
ax.legend()
plt.show()

# %% [markdown]
# The scale starts at 2^24, overflows and halves nine times down to 2^15, the first scale below
# 65504; every third clean step it tries 2^16 again, overflows, skips that step and returns to
# 2^15. Each skipped step costs a step of training but never corrupts the weights.
