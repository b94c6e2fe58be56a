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
# # Which weights lose their updates without master weights
#
# A bf16 weight `w` has 8 significant bits: its neighbours are `ulp(w) = 2^(floor(log2|w|) − 7)`
# away. An optimizer step computes the new weight `w + Δ` in fp32 and rounds it back to bf16; if
# `|Δ| < ulp(w)/2` the result rounds to `w` again — the update is **lost**. Three ways to train
# in bf16 handle this differently:
#
# * `bf16-pure`: bf16 weights, no master, round to nearest — lost updates are gone for good;
# * `bf16-o2`: bf16 weights plus a persistent **FP32 master** copy (Apex O2): the update goes into
#   the master, and the bf16 copy changes once the accumulated updates cross a rounding boundary;
# * `bf16-pure-sr`: bf16 weights, no master, **stochastic rounding** of the update: `w + Δ` rounds
#   up or down with probabilities that make it exact on average.
#
# We first watch the mechanism on one weight, then measure, per parameter of a small GPT, the
# share of updates each recipe loses and how far its weights actually move.

# %%
import math

import numpy as np
import numba
import matplotlib.pyplot as plt
import mpt
from mpt import nn

numba.set_num_threads(1)   # small tensors: one thread is faster, and the bits never depend on it
plt.rcParams.update({"figure.dpi": 72, "font.size": 8})

# %% [markdown]
# ## One weight, 200 tiny steps
#
# A bias-free Linear(4, 1) with all four weights at 1.0, input 1, loss = output: every gradient
# is exactly 1, so SGD with learning rate 2^-10 subtracts 2^-10 per step. bf16's ulp just below 1
# is 2^-8 (and 2^-7 at 1 itself), so each update is below half an ulp.

# %%
x = mpt.tensor(np.ones((1, 4), np.float32), "bf16")


def train(steps=200, **options):
    layer = nn.Linear(4, 1, bias=False, format="bf16")
    nn.init_constant_(layer.weight, 1.0)
    opt = mpt.optim.SGD(layer.parameters(), lr=2.0**-10, **options)
    path = []
    for _ in range(steps):
        opt.zero_grad()
        layer(x).sum().backward()     # d(loss)/dw = 1
        opt.step()
        path.append(layer.weight.data.astype(np.float64).ravel())
    return np.array(path)                                                   # (steps, 4)


toy = {"round to nearest (bf16-pure)": train(),
       "FP32 master (bf16-o2)": train(master_weights=True),
       "stochastic (bf16-pure-sr)": train(rounding="stochastic", seed=1)}
ideal = 1 - 2.0**-10 * np.arange(1, 201)
for name, path in toy.items():
    print(f"{name:29s} final weights {' '.join(f'{w:.6f}' for w in path[-1])}")
print(f"{'exact':29s} final weight  {ideal[-1]:.6f}")
assert np.all(toy["round to nearest (bf16-pure)"] == 1.0)
assert np.all(np.abs(toy["FP32 master (bf16-o2)"][-1] - ideal[-1]) <= 2.0**-9)  # half an ulp

# %%
fig, ax = plt.subplots(figsize=(7.5, 2.8))
ax.plot(ideal, color="black", lw=1.5, label="exact")
for (name, path), color in zip(toy.items(), ("tab:red", "tab:blue", "tab:green")):
    ax.plot(path[:, 0], color=color, lw=1.2, label=name)
ax.set_xlabel("step")
ax.set_ylabel("weight 0 (bf16)")
ax.legend()
plt.show()

# %% [markdown]
# Round to nearest never moves. The master accumulates 2^-10 per step in fp32 and its bf16 copy
# steps down by one ulp every 4 (then 2) steps — a staircase under the exact line. Stochastic
# rounding jumps a whole ulp at random steps, with the right probability, and follows the line on
# average.
#
# ## Per parameter, in a real training run
#
# Now a small GPT of `mpt study`'s kind (one block, d_model 32, vocabulary 32), trained with
# AdamW for 100 steps under `fp32` and the three bf16 recipes, from the same weights on the same
# batches. After every step the optimizer reports, per low-precision parameter, how many
# elements' FP32 working value changed and how many of those kept their bf16 bits
# (`optimizer.lost_updates`, a `CopyDownStats` per parameter). For `bf16-pure` those updates are
# lost; for `bf16-o2` they wait in the master; for `bf16-pure-sr` each was a stochastic round
# down.

# %%
from mpt.study import StudyConfig
from mpt.train import MarkovCorpus, Trainer

config = StudyConfig(recipes=("fp32",), steps=100, quant=False,
                     d_model=32, n_layers=1, n_heads=2)
corpus = MarkovCorpus(config.vocab, config.sharpness, seed=config.corpus_seed)
RECIPES = ("fp32", "bf16-pure", "bf16-o2", "bf16-pure-sr")


def network():
    return nn.GPT(corpus.vocab, config.d_model, config.n_layers, config.n_heads, config.seq_len,
                  seed=config.seed, backend=config.attention)


initial = {n: p.data.astype(np.float64) for n, p in network().named_parameters()}
trainers, lost = {}, {}
for recipe in RECIPES:
    trainer = trainers[recipe] = Trainer(network(), recipe, config.train_config())
    counts = lost[recipe] = {}
    for step in range(1, config.steps + 1):
        if recipe == "bf16-o2" and step == config.steps:   # keep the masters of the last step
            before = {n: trainer.optimizer.state[p]["master"].copy()
                      for n, p in trainer.network.named_parameters()}
        trainer.train_step([corpus.batch(config.batch, config.seq_len, "train", step)])
        for name, s in trainer.optimizer.lost_updates.items():
            c = counts.setdefault(name, [0, 0])
            c[0] += s.lost
            c[1] += s.changed
names = list(initial)
share = {r: np.array([lost[r][n][0] / lost[r][n][1] for n in names]) for r in RECIPES[1:]}
final = {r: {n: p.data.astype(np.float64) for n, p in trainers[r].network.named_parameters()}
         for r in RECIPES}


def norm(a):
    """The Euclidean norm, its sum of squares exactly rounded (the same bits on every machine)."""
    return math.sqrt(math.fsum((a * a).ravel()))


moved = {r: np.array([norm(final[r][n] - initial[n]) / norm(final["fp32"][n] - initial[n])
                      for n in names]) for r in RECIPES[1:]}
print(f"{'parameter':30s} {'lost updates %':^26s}  {'moved / fp32 moved':^26s}")
print(f"{'':30s} " + " ".join(f"{r[5:]:>8s}" for r in RECIPES[1:]) * 2)
for i, n in enumerate(names):
    print(f"{n:30s} " + " ".join(f"{100 * share[r][i]:8.1f}" for r in RECIPES[1:]) + "  "
          + " ".join(f"{moved[r][i]:8.3f}" for r in RECIPES[1:]))
print("final held-out loss: " + ", ".join(
    f"{r} {trainers[r].evaluate([corpus.batch(config.batch, config.seq_len, 'eval', k) for k in range(4)]):.4f}"
    for r in RECIPES))

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 4.2), sharey=True, layout="constrained")
y = np.arange(len(names))
for k, (r, color) in enumerate(zip(RECIPES[1:], ("tab:red", "tab:blue", "tab:green"))):
    left.barh(y + (k - 1) * 0.27, 100 * share[r], height=0.27, color=color, label=r)
    right.barh(y + (k - 1) * 0.27, moved[r], height=0.27, color=color, label=r)
left.set_yticks(y, names)
left.invert_yaxis()
left.set_xlabel("bf16 copy unchanged although the update was not 0 (% of updates)")
right.axvline(1, color="black", lw=0.5)
right.set_xlabel("distance moved from the initial weights / fp32's distance")
left.legend()
plt.show()

# %% [markdown]
# **What the plot shows:** the LayerNorm gains (`ln1`, `ln2`, `ln_f` `.weight`) are the weights
# that lose their updates: initialised at 1.0, they sit where bf16's ulp is 2^-7, so an update
# smaller than 2^-8 ≈ 0.0039 cannot change them — and AdamW's updates are about the learning rate
# (here at most 3e-3, decaying to 3e-4). Under `bf16-pure` they lose (nearly) every update and
# barely move, or not at all (right panel). Under `bf16-o2` the bf16 copy stays unchanged as often
# (left panel), yet the weights move as far as fp32's: the master kept the updates. Stochastic
# rounding leaves the copy unchanged as often too, but moves the weights like fp32 on average.
# The other parameters are small (initialised with standard deviation 0.02, LayerNorm biases at
# 0), so their ulps are small and most of their updates land.
#
# ## The rule, element by element
#
# The last step of the `bf16-o2` run shows the rule directly: each dot is one weight element, at
# its bf16 magnitude `|w|` and the size of its fp32 update `|Δ|` (the change of its master). Below
# the line `|Δ| = ulp(w)/2` a pure bf16 weight would not change.

# %%
w = np.concatenate([final["bf16-o2"][n].ravel() for n in names])
delta = np.concatenate([(trainers["bf16-o2"].optimizer.state[p]["master"] - before[n]).ravel()
                        for n, p in trainers["bf16-o2"].network.named_parameters()])
gain = np.concatenate([np.full(final["bf16-o2"][n].size, n.endswith(("ln1.weight", "ln2.weight",
                                                                      "ln_f.weight")))
                       for n in names])
keep = (w != 0) & (delta != 0)
half_ulp = np.ldexp(1.0, np.frexp(np.abs(w))[1] - 1 - 8)    # ulp(w)/2 = 2^(floor(log2|w|) - 8)
below = np.abs(delta) < half_ulp
print(f"last step: {keep.sum()} elements with w != 0 and an update; "
      f"{100 * below[keep].mean():.1f} % of them below half an ulp "
      f"(LayerNorm gains: {100 * below[keep & gain].mean():.1f} %)")
fig, ax = plt.subplots(figsize=(7.5, 3.2))
ax.scatter(np.abs(w[keep & ~gain]), np.abs(delta[keep & ~gain]), s=2, color="grey", alpha=0.4,
           label="other weights", rasterized=True)
ax.scatter(np.abs(w[keep & gain]), np.abs(delta[keep & gain]), s=6, color="tab:red",
           label="LayerNorm gains")
grid = np.ldexp(1.0, np.arange(-20, 2))
ax.step(grid, grid * 2.0**-8, where="post", color="black", lw=1, label="ulp(w)/2 in bf16")
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set_xlabel("|w| (bf16)")
ax.set_ylabel("|update| in fp32")
ax.legend(loc="lower right")
plt.show()

# %% [markdown]
# AdamW's update `lr·m/(√v + eps)` is at most about the learning rate (3e-4 ≈ 2^-11.7 at this last
# step), smaller where the gradient's sign keeps changing, and it does not depend on `|w|`: the
# dots form a band whose top is flat, while the staircase `ulp(w)/2` rises with `|w|`. The larger
# a weight, the larger the share of its updates under the staircase, and above about
# `|w| = 2^8·lr` every update is. That is why FP32 masters (or stochastic rounding) matter most for
# the weights that are *large* compared with the learning rate: LayerNorm gains, and in big models
# any weight that grows.
