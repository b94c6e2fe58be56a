"""L5: the case kinds of the golden suites beyond rounding, and the cases of the default suite.

Each kind is ``compute(inputs, params) -> outputs`` with mpt's public operations; every contract
is bit-exact (mpt is deterministic: its results do not depend on the thread count). Kinds:

- ``mma``: :func:`mpt.mma` for one preset and input format (``in_format``), c of the output's
  dtype (float32 or float16); outputs ``d``.
- ``gemm``: :func:`mpt.gemm` with split-K, FP8 promotion and scales, and the model's keyword
  options (``options``: a TPU f32 dot's pass algorithm, Trainium's auto-cast); outputs ``d``.
- ``fake_quant``: PyTorch's ``fake_quantize_per_{tensor,channel}_affine`` (mpt.kernels.quant);
  outputs ``y`` and the straight-through ``mask``.
- ``optim``: a few SGD/AdamW steps from stored params and per-step grads under one fma profile;
  outputs ``p`` (params after each step) and the final optimizer state.
- ``grad_scaler``: :class:`mpt.amp.GradScaler` driven by a stored found_inf sequence; outputs the
  scale and growth tracker after each ``update``.
- ``attention``: :func:`mpt.functional.scaled_dot_product_attention` forward and backward (given
  dO) for one backend; outputs ``out``, ``dq``, ``dk``, ``dv``.
- ``train_steps``: a few :class:`mpt.train.Trainer` steps of a tiny GPT under one recipe, from
  stored weights and batches; outputs the losses and every parameter after the last step.

``default_cases(rng)`` returns ``(name, kind, params, inputs)`` tuples for the default suite.
"""
from __future__ import annotations

import numpy as np

from mpt.amp.scaler import GradScaler
from mpt.formats import get_format
from mpt.functional import scaled_dot_product_attention
from mpt.kernels.quant import fake_quant_per_channel, fake_quant_per_tensor
from mpt.engines import gemm, mma, mma_models
from mpt.nn import GPT, Parameter
from mpt.optim import SGD, AdamW
from mpt.rounding import round as mpt_round
from mpt.amp.recipes import recipe_names
from mpt.autograd.tensor import Tensor, tensor
from mpt.train.trainer import TrainConfig, Trainer


__all__ = ["COMPUTE", "default_cases"]


# ---- kinds -------------------------------------------------------------------------------------
def _compute_mma(inputs, params):
    return {"d": mma(inputs["a"], inputs["b"], inputs["c"], model=params["model"],
                     in_format=params["in_format"], out_format=params["out_format"])}


def _compute_gemm(inputs, params):
    return {"d": gemm(inputs["a"], inputs["b"], inputs.get("c"), model=params["model"],
                      in_format=params["in_format"], split_k=params["split_k"],
                      promote_every=params["promote_every"], scale_a=inputs.get("scale_a"),
                      scale_b=inputs.get("scale_b"), out_format=params["out_format"],
                      **params.get("options", {}))}


def _compute_fake_quant(inputs, params):
    qmin, qmax = params["quant_min"], params["quant_max"]
    if params["axis"] is None:
        y, mask, _ = fake_quant_per_tensor(inputs["x"], inputs["scale"], int(inputs["zero_point"]),
                                           qmin, qmax)
    else:
        y, mask, _ = fake_quant_per_channel(inputs["x"], inputs["scale"], inputs["zero_point"],
                                            params["axis"], qmin, qmax)
    return {"y": y, "mask": mask}


_OPTIMIZERS = {"sgd": SGD, "adamw": AdamW}


def _compute_optim(inputs, params):
    p = Parameter(inputs["p0"].copy())
    opt = _OPTIMIZERS[params["optimizer"]]([p], fma=params["fma"], **params["hyper"])
    after = []
    for g in inputs["grads"]:                                    # grads: (steps, n)
        p.grad = Tensor(g.copy())
        opt.step()
        after.append(p.data.copy())
    state = opt.state[p] if p in opt.state else next(iter(opt.state.values()))
    out = {"p": np.stack(after)}                                 # (steps, n)
    for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
        if key in state:
            out[key] = np.asarray(state[key], np.float32).copy()
    return out


def _compute_grad_scaler(inputs, params):
    scaler = GradScaler(**params)
    p = Parameter(np.zeros(1, np.float32))
    opt = SGD([p], lr=0.0)
    scales, trackers = [], []
    for found in inputs["found_inf"]:
        scaler.scale(tensor(np.float32(1.0)))
        p.grad = Tensor(np.array([np.inf if found else 1.0], np.float32))
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(scaler.get_growth_tracker())
    return {"scale": np.array(scales, np.float32), "growth_tracker": np.array(trackers, np.int32)}


def _compute_attention(inputs, params):
    fmt = params["format"]
    q, k, v = (tensor(inputs[n], fmt, requires_grad=True) for n in ("q", "k", "v"))
    out = scaled_dot_product_attention(q, k, v, is_causal=params["is_causal"],
                                       backend=params["backend"])
    out.backward(tensor(inputs["grad_out"], fmt))
    return {"out": out.data, "dq": q.grad.data, "dk": k.grad.data, "dv": v.grad.data}


def _compute_train_steps(inputs, params):
    model = GPT(*params["gpt"], seed=0)                  # shape only: the weights are loaded
    model.load_state_dict({k[len("init."):]: v for k, v in inputs.items() if k.startswith("init.")})
    trainer = Trainer(model, params["recipe"], TrainConfig(lr=params["lr"]))
    losses = [trainer.train_step([(idx, tgt)]).loss
              for idx, tgt in zip(inputs["idx"], inputs["targets"])]          # (steps, B, T)
    return {"loss": np.array(losses, np.float32),
            **{f"param.{k}": v for k, v in trainer.network.state_dict().items()}}


#: kind name -> compute function (registered by mpt.golden)
COMPUTE = {"mma": _compute_mma, "gemm": _compute_gemm, "fake_quant": _compute_fake_quant,
           "optim": _compute_optim, "grad_scaler": _compute_grad_scaler,
           "attention": _compute_attention, "train_steps": _compute_train_steps}


# ---- inputs --------------------------------------------------------------------------------------
def _in_format(fmt: str, x) -> np.ndarray:
    """float64 values rounded (RNE, saturating where the format allows) into ``fmt``'s storage."""
    f = get_format(fmt)
    saturate = not f.has_inf
    with np.errstate(over="ignore"):
        return mpt_round(np.asarray(x, np.float64).astype(np.float32), fmt, saturate=saturate)


def _specials(fmt: str) -> np.ndarray:
    """Zeros, the limits and subnormals of ``fmt``, as float64 (all finite)."""
    f = get_format(fmt)
    return np.array([0.0, -0.0, 1.0, -1.0, f.max, -f.max, f.min_normal, -f.min_normal,
                     f.min_subnormal, -f.min_subnormal, 2 * f.min_subnormal, f.max / 2])


def _random(rng, fmt, shape, spread=4):
    """Normal values times 2^[-spread, spread], rounded into ``fmt``."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
    return _in_format(fmt, x)


def _edge(rng, fmt, shape):
    """A quarter of random picks among the format's specials, the rest ordinary values spread
    over 2^[-8, 8]; then, where the format has them, an Inf, a -Inf and a NaN in the first row
    only (b is drawn transposed: its first column; the rest of a product can stay finite)."""
    pick = rng.choice(_specials(fmt), shape)
    ordinary = rng.standard_normal(shape) * np.exp2(rng.integers(-8, 9, shape))
    x = np.where(rng.random(shape) < 0.25, pick, ordinary)
    f = get_format(fmt)
    non_finite = ([np.inf, -np.inf] if f.has_inf else []) + ([np.nan] if f.nan != "none" else [])
    x[0, :len(non_finite)] = non_finite
    return _in_format(fmt, x)


def _c(rng, out_format, shape, edge):
    fmt = "fp16" if out_format == "fp16" else "fp32"
    x = _edge(rng, fmt, shape) if edge else _random(rng, fmt, shape)
    return x.astype(np.float16 if fmt == "fp16" else np.float32)


_FLT_MAX = float.fromhex("0x1.fffffep127")

# The test vectors of docs/tensor_cores.md §3: (a, b, c) with K <= 16, unlisted elements 0.
_VECTORS = (
    ([1, -1], [2, 2], 2**-13 - 2**-24), ([-2**13, -0.5, -0.25, -0.125], [2**10, 1, 1, 1], 2**23),
    ([2**7] + [2**-9] * 15, [2**7] + [2**-9] * 15, -2**14), ([0], [0], 1 + 2**-20),
    ([1, -1], [1, 1], 2**-10 + 2**-20), ([0.5] * 4, [1, 1, 2**-10, 2**-23], 0.0),
    ([0.25] * 4, [1] * 4, 0.75 * 2**-23), ([0.75, 0.75], [2**127, 2**127], 0.25 * _FLT_MAX),
    ([-0.0] * 4, [1] * 4, -0.0), ([1 + 0.75 * 2**-10], [1], 0.0), ([1], [1], -(1 - 2**-24)),
    ([1, 1], [1, -2**-24], -1 + 2**-24), ([0.5] * 4, [2**-24] * 3 + [2**-23 + 2**-24], 1 - 2**-24),
    ([1] * 4, [1, 1.5, 1.75, 1.875], 1.875), ([1] * 4, [1] * 4, 1 + 2**-22 + 2**-23),
    ([1 - 2**-11], [1 - 2**-11], 0.0),
)


def _spec_vectors(fmt: str):
    """The test vectors whose a and b are exact in ``fmt``: a (B, 1, 16), b (B, 16, 1), c."""
    rows = []
    for a, b, c in _VECTORS:
        a16, b16 = np.zeros(16), np.zeros(16)
        a16[:len(a)], b16[:len(b)] = a, b
        with np.errstate(over="ignore"):
            ra, rb = (_in_format(fmt, v) for v in (a16, b16))
        exact = all(np.array_equal(r.astype(np.float64), v) for r, v in ((ra, a16), (rb, b16)))
        if exact and float(np.float32(c)) == c:  # Python floats: exact under any numpy
            rows.append((ra, rb, c))
    if not rows:
        return None
    a = np.stack([r[0] for r in rows])[:, None, :]                          # (B, 1, 16)
    b = np.stack([r[1] for r in rows])[:, :, None]                          # (B, 16, 1)
    return a, b, np.array([r[2] for r in rows], np.float64)[:, None, None]  # (B, 1, 1)


def _mma_cases(rng):
    cases = []
    for model in mma_models().values():
        if model.kind in _OTHER_VENDOR_KINDS:     # their cases come last (_other_vendor_cases)
            continue
        fmts = dict.fromkeys(f for cfg in model.configs for f in cfg.inputs)
        for fmt in fmts:
            outs = [o for o, _, _ in model.config(fmt, fmt).outputs]
            for out in outs:
                params = {"model": model.name, "in_format": fmt, "out_format": out}
                tag = f"mma-{model.name}-{fmt}-{out}"
                m, k, n = 4, 32, 4
                b_t = _edge(rng, fmt, (n, k))                               # (n, k)
                cases.append((f"{tag}-edge", "mma", params, {
                    "a": _edge(rng, fmt, (m, k)), "b": np.ascontiguousarray(b_t.T),
                    "c": _c(rng, out, (m, n), edge=True)}))
                cases.append((f"{tag}-random", "mma", params, {
                    "a": _random(rng, fmt, (m, k)), "b": _random(rng, fmt, (k, n)),
                    "c": _c(rng, out, (m, n), edge=False)}))
                vectors = _spec_vectors(fmt)
                if vectors is not None:
                    a, b, c = vectors
                    with np.errstate(over="ignore"):
                        c = c.astype(np.float16 if out == "fp16" else np.float32)
                    cases.append((f"{tag}-spec", "mma", params, {"a": a, "b": b, "c": c}))
    for model, fmt in (("hopper", "fp16"), ("ampere", "bf16"), ("hopper", "fp8_e4m3fn"),
                       ("volta", "fp16")):
        params = {"model": model, "in_format": fmt, "out_format": "fp32"}
        cases.append((f"mma-{model}-{fmt}-fp32-k4096", "mma", params, {
            "a": _random(rng, fmt, (2, 4096)), "b": _random(rng, fmt, (4096, 2)),
            "c": np.zeros((2, 2), np.float32)}))
    return cases


def _gemm_cases(rng):
    m, k, n, g = 4, 512, 256, 128
    cases = []
    specs = (  # name, model, format, split_k, promote_every, scales, out_format
        ("hopper-fp8-promote128", "hopper", "fp8_e4m3fn", 1, g, None, "fp32"),
        ("hopper-fp8-fast-accum", "hopper", "fp8_e4m3fn", 1, None, None, "fp32"),
        ("hopper-fp8-promote128-block-scales", "hopper", "fp8_e4m3fn", 1, g, "block", "bf16"),
        ("ada-fp8-e5m2-promote128-tensor-scales", "ada", "fp8_e5m2", 2, g, "tensor", "fp32"),
        ("ampere-bf16-splitk4", "ampere", "bf16", 4, None, None, "bf16"),
        ("hopper-fp16-splitk3-fp16-out", "hopper", "fp16", 3, None, None, "fp16"),
    )
    for name, model, fmt, split_k, promote, scales, out in specs:
        inputs = {"a": _random(rng, fmt, (m, k)), "b": _random(rng, fmt, (k, n)),
                  "c": _random(rng, "fp32", (m, n)).astype(np.float32)}
        if scales == "tensor":
            inputs["scale_a"] = np.float32(rng.uniform(0.01, 4)).reshape(())
            inputs["scale_b"] = np.float32(rng.uniform(0.01, 4)).reshape(())
        elif scales == "block":
            inputs["scale_a"] = rng.uniform(2**-8, 4, (m, k // g)).astype(np.float32)
            inputs["scale_b"] = rng.uniform(2**-8, 4, (k // g, n // g)).astype(np.float32)
        params = {"model": model, "in_format": fmt, "split_k": split_k, "promote_every": promote,
                  "out_format": out}
        cases.append((f"gemm-{name}", "gemm", params, inputs))
    return cases


#: Arithmetic kinds of the TPU, Gaudi and Trainium models, whose cases come after all others (so
#: that adding them left the earlier cases' inputs unchanged).
_OTHER_VENDOR_KINDS = ("xla_dot", "mme", "psum")


def _other_vendor_cases(rng):
    """Per TPU, Gaudi and Trainium model an edge, a random and a test-vector case per input
    format mpt.mma runs (K = 32; FP32 output, their only one)."""
    cases = []
    for model in mma_models().values():
        if model.kind not in _OTHER_VENDOR_KINDS:
            continue
        fmts = dict.fromkeys(f for cfg in model.configs if not cfg.param("software")
                             for f in cfg.inputs)
        for fmt in fmts:
            params = {"model": model.name, "in_format": fmt, "out_format": "fp32"}
            tag, (m, k, n) = f"mma-{model.name}-{fmt}-fp32", (4, 32, 4)
            b_t = _edge(rng, fmt, (n, k))                                   # (n, k)
            cases.append((f"{tag}-edge", "mma", params, {
                "a": _edge(rng, fmt, (m, k)), "b": np.ascontiguousarray(b_t.T),
                "c": _c(rng, "fp32", (m, n), edge=True)}))
            cases.append((f"{tag}-random", "mma", params, {
                "a": _random(rng, fmt, (m, k)), "b": _random(rng, fmt, (k, n)),
                "c": _c(rng, "fp32", (m, n), edge=False)}))
            vectors = _spec_vectors(fmt)
            if vectors is not None:
                a, b, c = vectors
                cases.append((f"{tag}-spec", "mma", params,
                              {"a": a, "b": b, "c": c.astype(np.float32)}))
    return cases


def _software_gemm_cases(rng):
    """The configurations only mpt.gemm runs: a TPU's f32 dot under XLA's pass algorithms (both
    decompositions, Inf/NaN and subnormal operands included) and Trainium's auto-cast; and a
    Gaudi 3 GEMM split in K."""
    m, k, n = 4, 96, 8
    specs = (  # name, model, format, split_k, options
        ("tpu-bf16x3-xla", "tpu", "fp32", 1, {"algorithm": "BF16_BF16_F32_X3"}),
        ("tpu-bf16x6-triton", "tpu", "fp32", 1,
         {"algorithm": "BF16_BF16_F32_X6", "decomposition": "triton"}),
        ("tpu-bf16x9-xla-daz", "tpu", "fp32", 1,
         {"algorithm": "BF16_BF16_F32_X9", "conversion": "tpu_daz"}),
        ("tpu-tf32x3-triton-k16", "tpu", "fp32", 1,
         {"algorithm": "TF32_TF32_F32_X3", "decomposition": "triton", "block_k": 16}),
        ("tpu-default-splitk2", "tpu", "fp32", 2, {"precision": "default"}),
        ("trainium-autocast-bf16", "trainium_autocast", "fp32", 1, {}),
        ("gaudi3-bf16-splitk3", "gaudi3", "bf16", 3, {}),
    )
    cases = []
    for name, model, fmt, split_k, options in specs:
        a = _edge(rng, fmt, (m, k)) if model == "tpu" else _random(rng, fmt, (m, k))
        inputs = {"a": a, "b": _random(rng, fmt, (k, n)),
                  "c": _random(rng, "fp32", (m, n)).astype(np.float32)}
        params = {"model": model, "in_format": fmt, "split_k": split_k, "promote_every": None,
                  "out_format": "fp32", "options": options}
        cases.append((f"gemm-{name}", "gemm", params, inputs))
    return cases


def _fake_quant_cases(rng):
    x = np.concatenate([rng.standard_normal(250) * 3, [0.0, -0.0, 1e30, -1e30, 2.5, -2.5]])
    x = x.astype(np.float32)                                                # (256,)
    x2 = (rng.standard_normal((8, 16)) * np.exp2(rng.integers(-3, 4, (8, 1)))).astype(np.float32)
    cases = []
    for dtype, qmin, qmax, zp in (("quint8", 0, 255, 128), ("qint8", -128, 127, 0)):
        params = {"axis": None, "quant_min": qmin, "quant_max": qmax}
        cases.append((f"fake_quant-per_tensor-{dtype}", "fake_quant", params, {
            "x": x, "scale": np.float32(0.05).reshape(()), "zero_point": np.int64(zp).reshape(())}))
    for axis in (0, 1):
        c = x2.shape[axis]
        scale = (np.abs(x2).max(axis=1 - axis) / 127).astype(np.float32)    # (c,)
        params = {"axis": axis, "quant_min": -128, "quant_max": 127}
        cases.append((f"fake_quant-per_channel-axis{axis}", "fake_quant", params, {
            "x": x2, "scale": scale, "zero_point": rng.integers(-3, 4, c).astype(np.int64)}))
    return cases


def _optim_cases(rng):
    n, steps = 64, 3
    hypers = {"sgd": {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4, "nesterov": True},
              "adamw": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}}
    cases = []
    for opt, hyper in hypers.items():
        p0 = rng.standard_normal(n).astype(np.float32)
        grads = (rng.standard_normal((steps, n)) * np.exp2(rng.integers(-12, 3, (steps, n))))
        for fma in (True, False):
            params = {"optimizer": opt, "fma": fma, "hyper": hyper}
            cases.append((f"optim-{opt}-{'fma' if fma else 'nofma'}", "optim", params,
                          {"p0": p0, "grads": grads.astype(np.float32)}))
    return cases


def _grad_scaler_cases(rng):
    found = (rng.random(64) < 0.2).astype(np.int8)
    found[40:46] = 1                                     # a burst of overflows: repeated backoff
    params = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5,
              "growth_interval": 4}
    return [("grad_scaler-interval4", "grad_scaler", params, {"found_inf": found})]


def _attention_cases(rng):
    cases = []
    for fmt in ("fp16", "bf16"):
        for backend in ("naive", "flash"):
            shape = (1, 2, 24, 16)                                  # (batch, heads, L, E)
            inputs = {n: _random(rng, fmt, shape, spread=1) for n in ("q", "k", "v", "grad_out")}
            params = {"format": fmt, "backend": backend, "is_causal": True}
            cases.append((f"attention-{fmt}-{backend}-causal", "attention", params, inputs))
    return cases


def _train_cases(rng):
    """Two steps of a tiny GPT (vocab 16, width 16, 1 layer, 2 heads, context 8) per recipe,
    from stored fp32 weights and token batches."""
    shape, steps, batch = [16, 16, 1, 2, 8], 2, 4
    init = {f"init.{k}": v for k, v in GPT(*shape, seed=int(rng.integers(2**31))).state_dict()
            .items()}
    idx = rng.integers(0, 16, (steps, batch, 9))                            # (steps, B, T+1)
    tokens = {"idx": idx[..., :-1].copy(), "targets": idx[..., 1:].copy()}  # (steps, B, T)
    return [(f"train_steps-{recipe}", "train_steps", {"recipe": recipe, "gpt": shape, "lr": 1e-2},
             {**init, **tokens}) for recipe in recipe_names()]


def default_cases(rng: np.random.Generator) -> list[tuple]:
    """The non-rounding cases of the default suite, as (name, kind, params, inputs)."""
    return [c for build in (_mma_cases, _gemm_cases, _fake_quant_cases, _optim_cases,
                            _grad_scaler_cases, _attention_cases, _train_cases,
                            _other_vendor_cases, _software_gemm_cases)
            for c in build(rng)]
