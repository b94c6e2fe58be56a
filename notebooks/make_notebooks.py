"""Writes the teaching notebooks of this folder (nbformat 4, no outputs) from the cells below.

Run ``python notebooks/make_notebooks.py`` after editing a notebook here; tests/test_notebooks.py
executes every notebook and checks that none stores outputs. Cells are ``("md", text)`` or
``("code", text)``; each notebook imports only mpt, numpy and (guarded) matplotlib.
"""
import json
from pathlib import Path

PLOT = '''try:
    import matplotlib.pyplot as plt
except ImportError:  # the notebook runs without matplotlib; only the figure is skipped
    plt = None'''

NOTEBOOKS = {}

NOTEBOOKS["01_formats_and_rounding"] = [
    ("md", "# Formats and rounding\n\nEvery number a GPU trains with is a float of some "
           "format: fp32, tf32, bf16, fp16, or one of the FP8 formats. `mpt.FORMATS` is the "
           "table; `mpt.round` rounds float64 values into any of them, bit-exactly."),
    ("code", "import numpy as np\nimport mpt\n\n"
             "for name in ('fp32', 'tf32', 'bf16', 'fp16', 'fp8_e4m3fn', 'fp8_e5m2'):\n"
             "    f = mpt.get_format(name)\n"
             "    print(f'{name:11s} e={f.exponent_bits} m={f.mantissa_bits:2d} max={f.max:<12.6g}"
             " eps={f.eps:.3g}  min subnormal={f.min_subnormal:.3g}')"),
    ("md", "**What to see:** the mantissa bits set the precision (`eps` = 2^-m) and the exponent "
           "bits the range. bf16 keeps fp32's range with 8 bits of precision; fp16 has 3 more "
           "bits of precision but overflows above 65504."),
    ("code", "assert mpt.get_format('fp16').max == 65504.0\n"
             "assert mpt.get_format('bf16').eps == 2.0**-7 and mpt.get_format('fp16').eps == 2.0**-10\n"
             "assert mpt.get_format('fp8_e4m3fn').max == 448.0 and mpt.get_format('fp8_e5m2').max == 57344.0"),
    ("md", "## Round to nearest, ties to even\n\n0.1 is not representable in any binary format; "
           "each format returns its nearest value. The relative error is at most half an ulp, "
           "`eps/2`."),
    ("code", "x = np.array([0.1, 1/3, 300.0, 1e-8])\n"
             "for name in ('bf16', 'fp16', 'fp8_e4m3fn'):\n"
             "    y = mpt.decode(mpt.round(x, name), np.float64)\n"
             "    print(name, y, 'rel. err', np.abs(y - x) / x)\n"
             "f16 = mpt.decode(mpt.round(x, 'fp16'), np.float64)\n"
             "assert abs(f16[0] - 0.1) / 0.1 <= 2.0**-11          # half an ulp of fp16\n"
             "assert f16[3] == 0                 # 1e-8 < 2^-25, half fp16's smallest subnormal ...\n"
             "assert mpt.decode(mpt.round(x, 'bf16'), np.float64)[3] > 0  # ... a normal in bf16"),
    ("md", "**What to see:** bf16's error is about 8× fp16's on 0.1 and 1/3 (3 fewer mantissa "
           "bits), but only bf16 keeps 1e-8: fp16 flushes it to zero and E4M3 too.\n\n"
           "Ties go to the even neighbour: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 in "
           "fp16 and rounds down to 1; 1 + 3·2^-11 rounds up."),
    ("code", "ties = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11])\n"
             "r = mpt.decode(mpt.round(ties, 'fp16'), np.float64)\n"
             "print(r)\n"
             "assert r[0] == 1.0 and r[1] == 1 + 2 * 2.0**-10"),
    ("md", "## Stochastic rounding\n\nRounding up with probability equal to the distance to "
           "the lower neighbour makes the rounding unbiased on average: the mean of many "
           "stochastic roundings of 1 + 2^-12 in fp16 is close to 1 + 2^-12, while RNE always "
           "gives 1."),
    ("code", "v = np.full(100_000, 1 + 2.0**-12)\n"
             "sr = mpt.decode(mpt.round(v, 'fp16', 'stochastic', seed=0), np.float64)\n"
             "rne = mpt.decode(mpt.round(v, 'fp16'), np.float64)\n"
             "print('RNE mean - 1:', rne.mean() - 1, '  SR mean - 1:', sr.mean() - 1)\n"
             "assert rne.mean() == 1.0\n"
             "# SR rounds up w.p. 1/4; the mean's std is 2^-10·sqrt(3/16/1e5) ~ 1.3e-6: 5 sigma\n"
             "assert abs(sr.mean() - (1 + 2.0**-12)) < 7e-6"),
]

NOTEBOOKS["02_tensor_core_dot_products"] = [
    ("md", "# Anatomy of a Tensor Core dot product\n\nA Tensor Core does not add products one "
           "by one in IEEE fp32. It multiplies a block of products exactly, aligns them to the "
           "largest exponent, truncates the aligned significands to a fixed number of bits and "
           "adds them in fixed point. How many bits it keeps differs by generation: Volta "
           "keeps fewer than Ampere, Hopper more again, and Hopper's FP8 path keeps about 14 "
           "(which is why DeepSeek-V3 promotes the partial sum to fp32 every 128 products). "
           "`mpt.gemm(a, b, model=...)` runs these models bit-exactly; the reference below is the "
           "exact sum (`math.fsum` of the exact products)."),
    ("code", "import math\nimport numpy as np\nimport mpt\n" + PLOT + "\n\n"
             "def exact_dot(a, b):\n"
             "    \"\"\"The exact dot product rounded once to float64 (products of fp16/fp8 values are exact).\"\"\"\n"
             "    return math.fsum((mpt.decode(a, np.float64).ravel() * mpt.decode(b, np.float64).ravel()).tolist())"),
    ("code", "rng = np.random.default_rng(0)\n"
             "Ks = [64, 256, 1024, 4096]\n"
             "presets = {'volta': 'fp16', 'ampere': 'fp16', 'hopper': 'fp16', 'hopper fp8': 'fp8_e4m3fn'}\n"
             "def rel_err(K, model, fmt, trials=4):\n"
             "    errs = []\n"
             "    for t in range(trials):\n"
             "        a = mpt.round(rng.uniform(0, 1, (1, K)), fmt)          # positive: no cancellation\n"
             "        b = mpt.round(rng.uniform(0, 1, (K, 1)), fmt)\n"
             "        got = mpt.gemm(a, b, model=model, in_format=fmt).astype(np.float64)\n"
             "        ref = exact_dot(a, b)\n"
             "        errs.append(abs(got.item() - ref) / ref)\n"
             "    return float(np.mean(errs))\n"
             "table = {name: [rel_err(K, name.split()[0], fmt) for K in Ks] for name, fmt in presets.items()}\n"
             "table['ieee fp32 fma'] = [rel_err(K, 'ieee_fma', 'fp16') for K in Ks]\n"
             "for name, errs in table.items():\n"
             "    print(f'{name:14s}', '  '.join(f'{e:.2e}' for e in errs))"),
    ("md", "**What to see:** the error grows with K for every accumulator. Volta's truncating "
           "adder loses the most, Ampere less, Hopper less again; all of them lose more than a "
           "sequential IEEE fp32 FMA chain, because truncation always errs in the same "
           "direction (the products here are positive) while round-to-nearest errors cancel. "
           "Hopper's FP8 path (about 14 bits kept) is three orders of magnitude worse at "
           "K = 4096."),
    ("code", "v, a_, h, f8 = (table[k][-1] for k in ('volta', 'ampere', 'hopper', 'hopper fp8'))\n"
             "assert f8 > 10 * h, (f8, h)         # FP8 fast accumulation: far worse at K = 4096\n"
             "assert v >= a_ >= h, (v, a_, h)     # more kept bits, less error, by generation\n"
             "assert h > table['ieee fp32 fma'][-1]  # truncation's one-sided error accumulates\n"
             "assert table['hopper fp8'][-1] > table['hopper fp8'][0]  # and it grows with K"),
    ("md", "## Promotion every 128 products\n\nWith `promote_every=128` the FP8 partial sum is "
           "added into an fp32 register every 128 products (DeepSeek-V3): the K = 4096 error "
           "drops back to fp32-chain levels."),
    ("code", "a = mpt.round(rng.uniform(0, 1, (1, 4096)), 'fp8_e4m3fn')\n"
             "b = mpt.round(rng.uniform(0, 1, (4096, 1)), 'fp8_e4m3fn')\n"
             "ref = exact_dot(a, b)\n"
             "fast = mpt.gemm(a, b, model='hopper', in_format='fp8_e4m3fn').item()\n"
             "promoted = mpt.gemm(a, b, model='hopper', in_format='fp8_e4m3fn', promote_every=128).item()\n"
             "print('fast accumulation', abs(fast - ref) / ref, ' promoted', abs(promoted - ref) / ref)\n"
             "assert abs(promoted - ref) < abs(fast - ref) / 10"),
    ("code", "if plt is not None:\n"
             "    for name, errs in table.items():\n"
             "        plt.loglog(Ks, errs, 'o-', label=name)\n"
             "    plt.xlabel('K'); plt.ylabel('mean relative error'); plt.legend(); plt.show()"),
    ("md", "## The same GEMM on H100 and MI300\n\nAMD's Matrix Cores follow other rules "
           "(docs/amd.md): MI300 (`cdna3`) truncates fp16 products to 24 bits in groups of 8, "
           "re-aligns the group sum and C rounding toward −∞, and rounds to nearest after every "
           "group; H100 truncates a block of 16 to 25 bits and rounds toward zero. One product "
           "1·1 with C = −2^-30 shows it: H100 drops C, MI300 keeps −2^-24 of it."),
    ("code", "a1, b1 = np.ones((1, 1), np.float16), np.ones((1, 1), np.float16)\n"
             "c1 = np.array([[-2.0**-30]], np.float32)\n"
             "bits = {m: hex(mpt.mma(a1, b1, c1, model=m).view(np.uint32)[0, 0]) "
             "for m in ('h100', 'mi300x')}\n"
             "print(bits)\n"
             "assert bits == {'h100': '0x3f800000', 'mi300x': '0x3f7fffff'}"),
    ("md", "On a whole GEMM almost every output differs, and not at random: H100's errors point "
           "toward zero, MI300's fall on both sides."),
    ("code", "from mpt.testing import ulp_distance\n"
             "a = rng.standard_normal((32, 512)).astype(np.float16)\n"
             "b = rng.standard_normal((512, 32)).astype(np.float16)\n"
             "h100, mi300, exact = (mpt.gemm(a, b, model=m) for m in ('h100', 'mi300x', 'exact'))\n"
             "differ = float((h100 != mi300).mean())\n"
             "med = {m: float(np.median(ulp_distance(d, exact))) for m, d in "
             "(('h100', h100), ('mi300x', mi300))}\n"
             "err = lambda d: (d.astype(np.float64) - exact) * np.sign(exact)\n"
             "toward_zero = {m: float((err(d) < 0).mean()) for m, d in "
             "(('h100', h100), ('mi300x', mi300))}\n"
             "print(f'outputs that differ: {differ:.0%}; median ULPs from exact: {med}; '\n"
             "      f'share of errors toward zero: {toward_zero}')\n"
             "assert differ > 0.9 and med['mi300x'] < med['h100']\n"
             "assert toward_zero['h100'] > 0.7 and toward_zero['mi300x'] < 0.6"),
]

NOTEBOOKS["03_loss_scaling_and_underflow"] = [
    ("md", "# Loss scaling and underflow\n\nfp16 has 5 exponent bits: below 2^-24 (6e-8) every "
           "value flushes to zero. Small gradients of a large model live there. Loss scaling "
           "multiplies the loss (hence every gradient) by S before backward and divides the "
           "update by S; `mpt.amp.GradScaler` reproduces PyTorch's dynamic scaler."),
    ("code", "import numpy as np\nimport mpt\nfrom mpt import nn\n\n"
             "g = np.geomspace(1e-10, 1e-3, 8)\n"
             "plain = mpt.decode(mpt.round(g, 'fp16'), np.float64)\n"
             "scaled = mpt.decode(mpt.round(g * 2.0**16, 'fp16'), np.float64) / 2.0**16\n"
             "for x, p, s in zip(g, plain, scaled):\n"
             "    print(f'{x:9.2e}  fp16 {p:9.2e}   scaled by 2^16 {s:9.2e}')\n"
             "assert plain[0] == 0 and plain[1] == 0 and scaled[1] != 0"),
    ("md", "**What to see:** 1e-10 and 1e-9 are lost in fp16; scaled by 2^16 they survive "
           "(relative error below 2^-11) and are unscaled in fp32 by the optimizer.\n\n"
           "## A training step with tiny gradients\n\nAn fp16 Linear layer whose fp32 loss is "
           "multiplied by 1e-9 (a tiny per-micro-batch loss): the gradient reaching the fp16 "
           "output rounds to zero, so every weight gradient is zero; with `GradScaler` "
           "(2^16) none is."),
    ("code", "rng = np.random.default_rng(0)\n"
             "x = mpt.tensor(rng.normal(size=(8, 16)), 'fp16')\n"
             "def zero_fraction(scaler):\n"
             "    layer = nn.Linear(16, 4, format='fp16')\n"
             "    loss = (layer(x).to('fp32') * mpt.tensor(1e-9)).sum()\n"
             "    (scaler.scale(loss) if scaler else loss).backward()\n"
             "    return float(np.mean(layer.weight.grad.data.astype(np.float32) == 0))\n"
             "unscaled, scaled = zero_fraction(None), zero_fraction(mpt.GradScaler())\n"
             "print('zero gradients without scaling:', unscaled, ' with GradScaler:', scaled)\n"
             "assert unscaled == 1.0 and scaled == 0.0"),
    ("md", "## Overflow: skip the step, back off\n\nToo large a scale overflows fp16: the "
           "scaler finds an Inf, skips `optimizer.step()` and halves the scale; after "
           "`growth_interval` clean steps it doubles it again. Here the loss itself is fp16, so "
           "the gradient entering the backward pass is S: every S above fp16's 65504 "
           "overflows, whatever the data."),
    ("code", "layer = nn.Linear(16, 4, format='fp16')\n"
             "opt = mpt.optim.SGD(layer.parameters(), lr=0.1, master_weights=True)\n"
             "scaler = mpt.GradScaler(init_scale=2.0**24, growth_interval=2, record=True)\n"
             "for step in range(14):\n"
             "    opt.zero_grad()\n"
             "    scaler.scale((layer(x) * mpt.tensor(1e-3, 'fp16')).sum()).backward()\n"
             "    scaler.step(opt)\n"
             "    scaler.update()\n"
             "for r in scaler.records:\n"
             "    print(r.scale, 'skipped' if r.skipped else 'applied')\n"
             "skips = [r.skipped for r in scaler.records]\n"
             "assert all(skips[:9]) and not skips[9] and scaler.records[9].scale == 2.0**15\n"
             "assert any(r.new_scale > r.scale for r in scaler.records)  # and the scale grows back"),
]

NOTEBOOKS["04_master_weights_and_stochastic_rounding"] = [
    ("md", "# Master weights, lost updates and stochastic rounding\n\nA bf16 weight near 1 has "
           "an ulp of 2^-7: an update smaller than half of it (2^-8) rounds back to the same "
           "weight — the update is *lost*. Three cures: keep an fp32 master copy "
           "(`master_weights=True`), or round the update stochastically "
           "(`rounding='stochastic'`), which is unbiased on average."),
    ("code", "import numpy as np\nimport mpt\nfrom mpt import nn\n\n"
             "x = mpt.tensor(np.ones((1, 4)), 'bf16')\n"
             "def train(steps=200, **options):\n"
             "    layer = nn.Linear(4, 1, bias=False, format='bf16')\n"
             "    mpt.nn.init_constant_(layer.weight, 1.0)\n"
             "    opt = mpt.optim.SGD(layer.parameters(), lr=2.0**-10, **options)\n"
             "    for _ in range(steps):\n"
             "        opt.zero_grad()\n"
             "        layer(x).sum().backward()   # d/dw = 1: each step subtracts lr = 2^-10\n"
             "        opt.step()\n"
             "    return layer.weight.data.astype(np.float64)\n"
             "pure = train()\n"
             "master = train(master_weights=True)\n"
             "sr = train(rounding='stochastic', seed=1)\n"
             "print('ideal', 1 - 200 * 2.0**-10)\n"
             "print('bf16 RNE', pure.ravel(), '\\nfp32 master', master.ravel(), '\\nstochastic', sr.ravel())"),
    ("md", "**What to see:** pure bf16 with round-to-nearest never moves (every update of 2^-10 "
           "is below half an ulp); the master copy accumulates the updates in fp32 and lands "
           "on the bf16 value nearest to 1 − 200·2^-10; stochastic rounding gets there on "
           "average, each weight within a few ulps."),
    ("code", "ideal = 1 - 200 * 2.0**-10\n"
             "assert np.all(pure == 1.0)\n"
             "assert np.all(np.abs(master - ideal) <= 2.0**-8)       # half an ulp of bf16 below 1\n"
             "assert abs(sr.mean() - ideal) < 4 * 2.0**-8 and np.all(sr < 1.0)"),
]

NOTEBOOKS["05_fp8_delayed_scaling"] = [
    ("md", "# FP8 delayed scaling\n\nE4M3 spans 2^-9 .. 448. A tensor is multiplied by a scale "
           "before the cast so that its largest magnitude lands near 448. Transformer Engine's "
           "*delayed* scaling uses the scale computed from the amax **history** of previous "
           "steps (`mpt.fp8.DelayedScalingState`): no extra pass over the data, but a sudden "
           "spike saturates."),
    ("code", "import numpy as np\nimport mpt\nfrom mpt import fp8\n\n"
             "rng = np.random.default_rng(0)\n"
             "state = fp8.DelayedScaling(amax_history_len=4).state('forward')\n"
             "amaxes = [1.0, 1.0, 1.0, 10.0, 10.0]\n"
             "saturated = []\n"
             "for step, amax in enumerate(amaxes):\n"
             "    x = rng.uniform(-1, 1, 4096).astype(np.float32) * np.float32(amax)\n"
             "    x[0] = amax\n"
             "    q = state.quantize(x)\n"
             "    saturated.append(int(np.sum(np.abs(x * state.scale) > 448)))\n"
             "    print(f'step {step}: scale {float(state.scale):8.2f}  saturated {saturated[-1]:5d}'\n"
             "          f'  max |err| {np.max(np.abs(q.dequantize() - x)):.3g}')\n"
             "    state.update()"),
    ("md", "**What to see:** step 0 casts with the initial scale 1 (values use only the lower "
           "part of E4M3's range); from step 1 the scale is 448/amax = 448. At step 3 the "
           "tensor is 10× larger but the scale is still the old one: a large share of it "
           "saturates at ±448/scale. One step later the history holds the spike and the scale "
           "drops to 44.8."),
    ("code", "assert saturated[:3] == [0, 0, 0] and saturated[3] > 1000 and saturated[4] == 0\n"
             "assert float(state.scale) == np.float32(448 / 10)"),
    ("md", "*Current* scaling computes the scale from this tensor's own amax (an extra pass): "
           "no saturation, at any step."),
    ("code", "x = rng.uniform(-10, 10, 4096).astype(np.float32)\n"
             "q = fp8.quantize_current(x, 'fp8_e4m3fn')\n"
             "err = np.max(np.abs(q.dequantize() - x) / np.abs(x))\n"
             "print('current scaling: max relative error', err)\n"
             "assert err <= 2.0**-4 + 2.0**-20   # half an ulp of E4M3 (3 mantissa bits), normal range"),
]

NOTEBOOKS["06_flash_attention_and_checkpointing"] = [
    ("md", "# FlashAttention and checkpointing memory\n\nNaive attention materialises the "
           "T×T score matrix and keeps it for backward; FlashAttention-2 (`backend='flash'`) "
           "keeps only q, k, v, the output and one log-sum-exp per query, and recomputes the "
           "scores tile by tile in the backward pass. `mpt.MemoryLedger` counts the bytes each "
           "op saves for backward."),
    ("code", "import numpy as np\nimport mpt\nimport mpt.functional as F\nfrom mpt import nn, planning\n\n"
             "rng = np.random.default_rng(0)\n"
             "def saved_bytes(T, backend, B=1, H=2, hd=16):\n"
             "    q, k, v = (mpt.tensor(rng.normal(size=(B, H, T, hd)), 'fp32',\n"
             "                          requires_grad=True) for _ in range(3))\n"
             "    with mpt.MemoryLedger() as ledger:\n"
             "        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)\n"
             "        saved = ledger.live('activations')\n"
             "    return saved, out\n"
             "rows = {}\n"
             "for T in (64, 128, 256):\n"
             "    rows[T] = {b: saved_bytes(T, b)[0] for b in ('naive', 'flash')}\n"
             "    print(T, rows[T], 'ratio', round(rows[T]['naive'] / rows[T]['flash'], 2))"),
    ("md", "**What to see:** flash's saved bytes grow linearly in T — q, k, v, O (4·T·hd) and the "
           "log-sum-exp (T) per head, in fp32 — while naive's add the fp32 T×T scores: doubling T "
           "doubles the flash bytes and roughly quadruples the naive ones' score part."),
    ("code", "B, H, hd = 1, 2, 16\n"
             "for T, r in rows.items():\n"
             "    assert r['flash'] == 4 * B * H * T * (4 * hd + 1)                  # q, k, v, O, lse\n"
             "    assert r['naive'] == 4 * B * H * T * 3 * hd + 4 * B * H * T * T    # q, k, v, scores\n"
             "assert rows[256]['naive'] / rows[256]['flash'] > rows[64]['naive'] / rows[64]['flash']"),
    ("md", "Both backends compute the same attention up to rounding (flash rescales its running "
           "sums per tile):"),
    ("code", "q, k, v = (mpt.tensor(rng.normal(size=(1, 2, 128, 16)), 'fp32') for _ in range(3))\n"
             "a = F.scaled_dot_product_attention(q, k, v, is_causal=True, backend='naive').data\n"
             "b = F.scaled_dot_product_attention(q, k, v, is_causal=True, backend='flash').data\n"
             "print('max |naive - flash|', np.max(np.abs(a - b)))\n"
             "assert np.max(np.abs(a - b)) < 1e-5   # a few fp32 ulps of values of size ~1"),
    ("md", "## Gradient checkpointing\n\n`GPT(checkpoint=k)` keeps only the input of each of k "
           "segments and recomputes the segment in the backward pass: gradients are "
           "bit-identical, the activation peak drops. The estimate of `mpt.planning` "
           "(written for this layer) predicts both peaks."),
    ("code", "V, d, L, Hh, T, Bt = 64, 32, 4, 4, 64, 2\n"
             "idx, tgt = (rng.integers(0, V, (Bt, T)) for _ in range(2))\n"
             "def step(checkpoint):\n"
             "    model = nn.GPT(V, d, L, Hh, T, checkpoint=checkpoint)\n"
             "    with mpt.MemoryLedger() as ledger:\n"
             "        ledger.track_module(model)\n"
             "        model.loss(idx, tgt).backward()\n"
             "    return ledger.peak_by_role['activations'], [p.grad.data for p in model.parameters()]\n"
             "plain, g_plain = step(False)\n"
             "ckpt, g_ckpt = step(2)\n"
             "print('activation peak: plain', plain, ' checkpointed (2 segments)', ckpt)\n"
             "assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(g_plain, g_ckpt))\n"
             "assert ckpt < 0.75 * plain"),
    ("code", "shape = planning.GPTShape(V, d, L, Hh, T)\n"
             "for ck, measured in ((False, plain), (2, ckpt)):\n"
             "    est = planning.training_memory(shape, 'fp32', Bt, checkpoint=ck).by_role['activations']\n"
             "    print(f'checkpoint={ck}: estimate {est}, ledger {measured}')\n"
             "    assert abs(est / measured - 1) < 0.10"),
]

NOTEBOOKS["07_qat_and_lora"] = [
    ("md", "# Quantization-aware training and LoRA\n\n`mpt.fake_quantize_per_tensor_affine` "
           "rounds to an int8 grid and back in the forward pass; its backward is the "
           "straight-through estimator (gradient 1 inside the grid's range, 0 outside)."),
    ("code", "import numpy as np\nimport mpt\nfrom mpt import nn\n\n"
             "x = mpt.tensor(np.linspace(-2, 2, 9), 'fp32', requires_grad=True)\n"
             "scale = 1 / 64\n"
             "y = mpt.fake_quantize_per_tensor_affine(x, scale, 0, -128, 127)\n"
             "y.sum().backward()\n"
             "print('x   ', x.data)\nprint('fq(x)', y.data)\nprint('grad', x.grad.data)\n"
             "inside = (x.data >= -128 * scale) & (x.data <= 127 * scale)   # the int8 grid's range\n"
             "assert np.all(np.abs(y.data - x.data)[inside] <= scale / 2)\n"
             "assert np.array_equal(x.grad.data, inside.astype(np.float32))"),
    ("md", "**What to see:** inside [-2, 127/64] the error is at most half a step (1/128); "
           "-2 is clipped to -128/64 = -2 exactly and 2 saturates at 127/64, where the STE "
           "gradient is 0.\n\n## LoRA\n\n`mpt.lora.apply` freezes a model and adds a low-rank "
           "adapter `B·A` (B = 0 at init) to its Linear layers: the output is unchanged at "
           "first and only r·(in + out) parameters per layer train."),
    ("code", "model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))\n"
             "x = mpt.tensor(np.random.default_rng(0).normal(size=(4, 64)), 'fp32')\n"
             "before = model(x).data.copy()\n"
             "mpt.lora.apply(model, r=4, alpha=8)\n"
             "trainable = sum(p.data.size for p in model.parameters() if p.requires_grad)\n"
             "total = sum(p.data.size for p in model.parameters())\n"
             "print(f'trainable {trainable} of {total}')\n"
             "assert np.array_equal(model(x).data, before)\n"
             "assert trainable == 2 * 4 * (64 + 64)"),
    ("md", "A few SGD steps on the adapters only reduce a regression loss; the frozen weights "
           "do not move."),
    ("code", "target = mpt.tensor(np.random.default_rng(1).normal(size=(4, 64)), 'fp32')\n"
             "frozen = model[0].weight.data.copy()\n"
             "opt = mpt.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)\n"
             "losses = []\n"
             "for _ in range(20):\n"
             "    opt.zero_grad()\n"
             "    loss = ((model(x) - target) ** 2).mean()\n"
             "    loss.backward(); opt.step(); losses.append(float(loss.data))\n"
             "print('loss', losses[0], '->', losses[-1])\n"
             "assert losses[-1] < 0.5 * losses[0]\n"
             "assert np.array_equal(model[0].weight.data, frozen)"),
]

NOTEBOOKS["08_scaling_laws_and_memory_planning"] = [
    ("md", "# Scaling laws and memory planning\n\n`mpt.planning` holds the Chinchilla loss "
           "law L(N, D) = E + A/N^α + B/D^β (Hoffmann et al. 2022, Approach 3, and the Epoch "
           "AI refit) and a memory estimate of a training step of mpt's GPT per recipe."),
    ("code", "import numpy as np\nimport mpt\nfrom mpt import planning\n\n"
             "C = 5.76e23   # Gopher's budget\n"
             "for law in (planning.CHINCHILLA, planning.EPOCH_AI):\n"
             "    n, d = law.compute_optimal(C)\n"
             "    print(f'{law.name:10s} N_opt {n:.3g}  D_opt {d:.3g}  tokens/param {d / n:.1f}'\n"
             "          f'  loss {law.optimal_loss(C):.4f}')\n"
             "n, d = planning.CHINCHILLA.compute_optimal(C)\n"
             "assert round(n / 1e10, 1) == 3.2 and abs(6 * n * d / C - 1) < 1e-12\n"
             "assert round(planning.CHINCHILLA.loss(70e9, 1.4e12), 4) == 1.9366"),
    ("md", "**What to see:** at Gopher's budget Approach 3 puts N_opt near 3.2e10 (the published "
           "constants are rounded), the Epoch AI refit near 7.2e10 with ~18 tokens per "
           "parameter. `budget_for_loss` inverts the frontier."),
    ("code", "target = 2.0\n"
             "flops = planning.CHINCHILLA.budget_for_loss(target)\n"
             "print(f'compute for loss {target}: {flops:.3g} FLOPs')\n"
             "assert abs(planning.CHINCHILLA.optimal_loss(flops) - target) < 1e-9"),
    ("md", "## Bytes per parameter\n\nfp16 weights and grads, an fp32 master and Adam's two fp32 "
           "moments: 2 + 2 + 4 + 4 + 4 = 16 bytes per parameter (ZeRO)."),
    ("code", "p = planning.state_bytes_per_parameter('fp16', master_format='fp32', optimizer='adam')\n"
             "print(p)\nassert p['total'] == 16"),
    ("md", "## A training step of mpt's GPT\n\n`training_memory` counts what mpt's own ops keep "
           "for backward (the table in `mpt.planning`'s docstring) — validated against the "
           "memory ledger in tests/test_planning.py. Checkpointing trades the layers' "
           "activations for one block input per segment.\n\n**What to see:** with a 50k "
           "vocabulary the fp32 logits kept by the cross-entropy (s·b·V·4 = 1.5 GiB) and the "
           "logits' gradient dominate; checkpointing removes most of the 12 layers' 2.7 GiB, "
           "not the head's share."),
    ("code", "shape = planning.GPTShape(vocab=50304, d_model=768, n_layers=12, n_heads=12, seq_len=1024)\n"
             "plain = planning.training_memory(shape, 'bf16-o2', batch=8)\n"
             "ckpt = planning.training_memory(shape, 'bf16-o2', batch=8, checkpoint=True)\n"
             "print(planning.format_memory_table(plain))\n"
             "print('activations with checkpointing:', f\"{ckpt.by_role['activations'] / 2**30:.2f} GiB\",\n"
             "      'vs', f\"{plain.by_role['activations'] / 2**30:.2f} GiB\")\n"
             "assert ckpt.by_role['activations'] < 0.6 * plain.by_role['activations']\n"
             "assert plain.activations_detail['head/cross-entropy'] > 2**30   # fp32 logits: 1.5 GiB\n"
             "assert plain.per_parameter()['master'] == 4"),
    ("md", "Korthikanti et al.'s per-layer formula assumes Megatron's layer (16-bit everything, "
           "1-byte dropout masks): 34·s·b·h + 5·a·s²·b. mpt's layer with flash attention keeps "
           "s·b·h·(8 + 15·c) plus small statistics — 38·s·b·h in 16 bits (fp32 LayerNorm "
           "inputs, the GELU input) and no s² term."),
    ("code", "s, b, h, a = 1024, 8, 768, 12\n"
             "megatron = planning.activation_bytes_per_layer(s, b, h, a)\n"
             "layer = sum(v for k, v in plain.activations_detail.items() if k.startswith('layer/'))\n"
             "print(f'Korthikanti {megatron / 2**20:.0f} MiB, mpt {layer / 2**20:.0f} MiB per layer')\n"
             "assert abs(layer / (s * b * h) - 38) < 0.1"),
]


def notebook(cells) -> dict:
    def cell(kind, text):
        lines = text.splitlines(keepends=True)
        base = {"cell_type": "markdown" if kind == "md" else "code", "metadata": {},
                "source": lines}
        if kind == "code":
            base.update(execution_count=None, outputs=[])
        return base
    return {"cells": [cell(k, t) for k, t in cells],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                        "name": "python3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def render(name: str) -> str:
    """The JSON text of notebook ``name`` (cell ids are stable: ``<number>-<cell index>``)."""
    nb = notebook(NOTEBOOKS[name])
    for i, c in enumerate(nb["cells"]):
        c["id"] = f"{name[:2]}-{i:02d}"
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def main() -> None:
    here = Path(__file__).resolve().parent
    for name in NOTEBOOKS:
        (here / f"{name}.ipynb").write_text(render(name))


if __name__ == "__main__":
    main()
