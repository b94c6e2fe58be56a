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
# # Where gradients fall against the fp16 range, layer by layer
#
# fp16 represents magnitudes from 2^-24 (its smallest subnormal) to 65504 (just under 2^16), and
# keeps full precision only from 2^-14 (its smallest normal number) up. Gradients of a large
# network are *small*: a gradient of a mean loss over a batch carries a factor 1/(tokens in the
# batch). Micikevicius et al. ("Mixed Precision Training", ICLR 2018, Fig. 3) drew the
# histogram of a network's gradient magnitudes over the fp16 range and found much of it below
# 2^-24 — it would flush to zero in fp16 — and most of the range above unused. Loss scaling is
# the cure: multiply the loss by `S`, so that every gradient is `S` times larger, and divide the
# update by `S` in fp32.
#
# This notebook redraws that figure for mpt's small GPT, per layer: we train it a few steps in
# fp32 with `mpt.Trainer`, take each parameter's gradient, and count its values per binade
# (`mpt.diagnostics.log2_histogram`: `floor(log2|g|)`, computed exactly with `frexp`) and per fate
# of an fp16 cast (`mpt.diagnostics.cast_stats`: flushed to zero, kept as a subnormal, or
# overflowed — classified exactly, element by element).

# %%
import numpy as np
import numba
import matplotlib.pyplot as plt
import mpt
from mpt import diagnostics, nn
from mpt.train import MarkovCorpus, TrainConfig, Trainer

numba.set_num_threads(1)   # small tensors: one thread is faster, and the bits never depend on it
plt.rcParams.update({"figure.dpi": 72, "font.size": 8})
FP16 = mpt.get_format("fp16")
SUB, NORMAL, TOP = -24, -14, 15          # log2 of fp16's min subnormal, min normal; max < 2^16
FLUSH = SUB - 1                          # |g| <= 2^-25, half the min subnormal, rounds to 0
assert FP16.min_subnormal == 2.0**SUB and FP16.min_normal == 2.0**NORMAL
assert 2.0**TOP <= FP16.max < 2.0**(TOP + 1)

# %% [markdown]
# ## The network and its gradients
#
# The data is a random first-order Markov chain over 32 tokens (`MarkovCorpus`: its entropy rate
# is the best loss any model can reach); the network a 2-block GPT (d_model 32, 2 heads, context
# 16), batches of 16 sequences: 256 tokens. The trainer multiplies each loss by `2^-11` before
# backward — the `mpt study` default, which gives this micro-batch of 2^8 tokens the gradient
# magnitudes of a GPT-3-sized batch of 2^19 tokens (`mpt.study`'s docstring explains it). The
# recipe is fp32: nothing is rounded to fp16 yet, so we see where the gradients *would* fall.

# %%
corpus = MarkovCorpus(vocab=32, sharpness=8, seed=0)
B, T, STEPS = 16, 16, 40
config = TrainConfig(lr=3e-3, warmup_steps=10, total_steps=STEPS, betas=(0.9, 0.95),
                     weight_decay=0.0, loss_multiplier=2.0**-11, detail_steps=(1, STEPS))


def data(step, micro):
    return corpus.batch(B, T, "train", step)


network = nn.GPT(32, 32, 2, 2, T, seed=0)
trainer = Trainer(network, "fp32", config)
history = trainer.train(data, STEPS)
print(f"entropy rate (best possible loss) {corpus.entropy_rate:.4f}; "
      f"loss at step 1 {history[0].loss:.4f}, at step {STEPS} {history[-1].loss:.4f}")

# %% [markdown]
# After the last step every parameter still holds its gradient of step 40 (the trainer zeroes
# them at the start of a step). We group the parameters by module — each Linear's weight and
# bias together — and take the histograms.

# %%
def module_of(name):
    return name.rsplit(".", 1)[0]


grads = {}
for name, p in network.named_parameters():
    grads.setdefault(module_of(name), []).append(p.grad.data.astype(np.float64).ravel())
grads = {m: np.concatenate(g) for m, g in grads.items()}
hists = {m: diagnostics.log2_histogram(g) for m, g in grads.items()}
stats = {m: diagnostics.cast_stats(g, "fp16") for m, g in grads.items()}
print(f"{'module':24s} {'values':>6s} {'flushed %':>9s} {'subnormal %':>11s} "
      f"{'largest binade':>14s}")
for m, h in hists.items():
    s = stats[m]
    top = max(e for e, c in zip(h.exponents, h.counts) if c)
    print(f"{m:24s} {s.numel:6d} {100 * s.fraction('underflow'):9.1f} "
          f"{100 * s.fraction('subnormal'):11.1f} {top:14d}")
total = sum(stats.values(), diagnostics.CastStats("fp16", 0, 0, 0, 0, 0, 0))
print(f"all: {total.numel} values, {100 * total.underflow_share:.1f} % would flush to zero, "
      f"{100 * total.fraction('subnormal'):.1f} % would be subnormal, "
      f"{total.overflow} would overflow")
assert total.overflow == 0 and total.underflow > 0

# %%
fig, axes = plt.subplots(len(hists), 1, figsize=(7.5, 0.42 * len(hists) + 0.8), sharex=True,
                         layout="constrained")
for ax, (m, h) in zip(axes, hists.items()):
    ax.axvspan(-64, FLUSH, color="tab:red", alpha=0.15)
    ax.axvspan(FLUSH, NORMAL, color="tab:orange", alpha=0.15)
    ax.axvspan(TOP + 1, 20, color="tab:red", alpha=0.15)
    ax.bar(list(h.exponents), h.counts, width=1.0, align="edge", color="tab:blue")
    ax.set_yticks([])
    ax.set_ylabel(m, rotation=0, ha="right", va="center")
axes[-1].set_xlim(-60, 18)
axes[-1].set_xlabel("binade floor(log2 |g|)   red: flushed to 0 by fp16 (left) or overflow "
                    "(right); orange: fp16 subnormal")
fig.suptitle(f"Parameter gradients at step {STEPS}, per module, against the fp16 range")
plt.show()

# %% [markdown]
# **What the plot shows:** every module's gradients sit at the bottom of fp16's range — most of
# them in the subnormal band (orange), where fp16 keeps fewer than 10 significant bits (one bit
# less per binade down), and a share below 2^-25 (left red band), half the smallest subnormal,
# which an fp16 cast flushes to zero; nothing comes within 28 binades of the top. Two modules
# stand out:
#
# * `attn.in_proj` (the fused q, k, v projection) reaches down to 2^-50 and beyond. Its bias holds
#   the key bias, whose gradient is **mathematically zero**: adding the same vector to every key
#   adds `q·b` to every score of a row, and softmax ignores a constant shift. What the float32
#   backward computes there is rounding noise around 0, which fp16 flushes harmlessly. The next
#   cell checks this.
# * The LayerNorm gains and biases (`ln1`, `ln2`, `ln_f`) have few values (32 each), so their bars
#   are short, but they fall in the same band.

# %%
qkv_bias = dict(network.named_parameters())["blocks.0.attn.in_proj.bias"].grad.data
q, k, v = (np.abs(qkv_bias[i * 32:(i + 1) * 32]).astype(np.float64) for i in range(3))
for part, g in (("query", q), ("key", k), ("value", v)):
    print(f"{part:5s} bias gradient: largest binade {np.frexp(g.max())[1] - 1:4d}")
assert k.max() < 2.0**-40 < v.min()   # the key bias's gradient is float32 noise around zero

# %% [markdown]
# ## The activation gradient: the first rounding of a backward pass
#
# The trainer also records, on its detail steps, the histogram of the gradient of the logits —
# the first tensor the backward pass produces, and the one an fp16 backward rounds first. Its
# values are `(softmax − onehot)/N` times the loss multiplier: with 32 tokens and near-uniform
# predictions at step 1, `(1/32)/256 · 2^-11 = 2^-24` exactly for the non-target tokens — right at
# fp16's smallest subnormal.

# %%
fig, ax = plt.subplots(figsize=(7.5, 2.6))
for step, color in ((1, "tab:grey"), (STEPS, "tab:blue")):
    h = history[step - 1].histograms["loss_grad"]
    ax.bar(list(h.exponents), h.counts, width=1.0, align="edge", color=color, alpha=0.6,
           label=f"step {step}")
    used = [e for e, c in zip(h.exponents, h.counts) if c]
    print(f"step {step:2d}: logits gradient binades {min(used)} .. {max(used)}; "
          f"{100 * h.share_below(FLUSH):.1f} % below 2^-25, "
          f"{100 * h.share_below(NORMAL):.1f} % below 2^-14")
ax.axvspan(-64, FLUSH, color="tab:red", alpha=0.15)
ax.axvspan(FLUSH, NORMAL, color="tab:orange", alpha=0.15)
ax.set_xlim(-34, -8)
ax.set_xlabel("binade floor(log2 |dL/dlogits|)   red: flushed to 0 by fp16; orange: subnormal")
ax.legend()
plt.show()

# %% [markdown]
# At step 1 the non-target entries fall in the binades 2^-25 and 2^-24 (probabilities a bit under
# and a bit over 1/32): an fp16 cast does not flush them, but rounds them to 2^-24 or 2·2^-24,
# the two smallest subnormals — it keeps about one significant bit. As the network learns, the
# predicted probabilities spread out, and the small ones go below 2^-25, where they flush.
#
# ## Loss scaling moves the histogram
#
# Multiplying the loss by `S = 2^16` (PyTorch's `GradScaler` starts there) shifts every gradient
# 16 binades to the right: exactly, since it is a power of two. The largest gradient sets how far
# we may go: with the top binade at `t`, any `S ≤ 2^(15 − t)` is safe from overflow.

# %%
everything = np.concatenate(list(grads.values()))
top = int(np.frexp(np.abs(everything).max())[1] - 1)
print(f"largest gradient binade {top}: scales up to 2^{TOP - top} cannot overflow fp16")
fig, ax = plt.subplots(figsize=(7.5, 2.6))
for shift, color in ((0, "tab:grey"), (16, "tab:green")):
    g = everything * 2.0**shift
    h = diagnostics.log2_histogram(g)
    s = diagnostics.cast_stats(g, "fp16")
    ax.bar(list(h.exponents), h.counts, width=1.0, align="edge", color=color, alpha=0.6,
           label=f"S = 2^{shift}")
    print(f"S = 2^{shift:<2d}: {100 * s.underflow_share:5.1f} % flushed, "
          f"{100 * s.fraction('subnormal'):5.1f} % subnormal, {s.overflow} overflow")
ax.axvspan(-64, FLUSH, color="tab:red", alpha=0.15)
ax.axvspan(FLUSH, NORMAL, color="tab:orange", alpha=0.15)
ax.axvspan(TOP + 1, 20, color="tab:red", alpha=0.15)
ax.set_xlim(-60, 18)
ax.set_xlabel("binade of the parameter gradients (all modules), as scaled")
ax.legend()
plt.show()

# %% [markdown]
# ## The same in an fp16 run
#
# So far nothing was rounded. Now we take one step with fp16 weights and gradients and FP32
# masters (`fp16-o2`, Apex's O2 layout, with PyTorch's dynamic `GradScaler`) and one without loss
# scaling (`fp16-noscale`), from the same weights on the same batch. The trainer records the fate
# of the logits gradient in fp16 (`StepMetrics.loss_grad`), and we count the exact zeros in each
# module's fp16 gradient.

# %%
zeros, first = {}, {}
for recipe in ("fp16-noscale", "fp16-o2"):
    t = Trainer(nn.GPT(32, 32, 2, 2, T, seed=0), recipe, config)
    first[recipe] = t.train_step([data(1, 0)])
    for name, p in t.network.named_parameters():       # the step-1 gradients, stored in fp16
        g = p.grad.data.astype(np.float32)
        z = zeros.setdefault(module_of(name), {}).setdefault(recipe, [0, 0])
        z[0] += int(np.count_nonzero(g == 0))
        z[1] += g.size
print(f"{'module':24s} {'zero grads % (no scaling)':>25s} {'zero grads % (GradScaler)':>25s}")
for m, by in zeros.items():
    print(f"{m:24s} {100 * by['fp16-noscale'][0] / by['fp16-noscale'][1]:25.1f} "
          f"{100 * by['fp16-o2'][0] / by['fp16-o2'][1]:25.1f}")
for recipe, m in first.items():
    print(f"{recipe:12s} loss scale {m.scale:7g}: logits gradient in fp16 "
          f"{100 * m.loss_grad.underflow_share:4.1f} % flushed, "
          f"{100 * m.loss_grad.fraction('subnormal'):5.1f} % subnormal; parameter gradients "
          f"exactly zero {100 * m.grad_zeros / m.grad_numel:.1f} %")
assert first["fp16-noscale"].grad_zeros > 10 * max(first["fp16-o2"].grad_zeros, 1)

# %% [markdown]
# **What to take away:** without loss scaling, the logits gradient enters the backward pass as
# fp16 subnormals with a bit or two of precision, the GEMMs of the backward pass then flush their
# small results, and a share of every module's parameter gradients comes out exactly zero — the
# network cannot learn through them (notebook 03 shows the loss curve that results).
# With `S = 2^16` the same gradients land in fp16's normal range, and the histogram shows the
# room above: dynamic loss scaling keeps raising `S` until a gradient overflows, then backs off.
