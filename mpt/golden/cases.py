"""L5: the case kinds of the golden suites beyond rounding, and the cases of the default suite.

Each kind is ``compute(inputs, params) -> outputs`` with mpt's public operations; every contract
is bit-exact (mpt is deterministic: its results do not depend on the thread count). Kinds:

- ``mma``: :func:`mpt.mma` for one preset and input format (``in_format``), c of the output's
  dtype (float32, float16, or float64 for FP64 instructions); an instruction ``variant``, the
  block-scaled ones with the instruction's ``scale_a``/``scale_b`` (E8M0 or UE4M3 codes), and
  ``choices`` of the model's assumed rules (``MMAModel.configure``); outputs ``d``.
- ``gemm``: :func:`mpt.gemm` with split-K, FP8 promotion, float32 software scales and the
  instruction's block scales (E8M0/UE4M3 codes), and the model's keyword options (``options``: a
  TPU f32 dot's pass algorithm, Trainium's auto-cast); outputs ``d``.
- ``microscaling``: :func:`mpt.microscaling.quantize_mx` / ``quantize_nvfp4`` (every element
  format, scale rule, block shape and rounding mode) and ``hadamard_transform``; outputs the
  element ``codes``, block ``scales``, NVFP4's ``tensor_scale`` and ``amax``, or ``y``.
- ``fake_quant``: PyTorch's ``fake_quantize_per_{tensor,channel}_affine`` (mpt.kernels.quant);
  outputs ``y`` and the straight-through ``mask``.
- ``optim``: a few SGD/AdamW steps from stored params and per-step grads under one fma profile;
  outputs ``p`` (params after each step) and the final optimizer state.
- ``grad_scaler``: :class:`mpt.amp.GradScaler` driven by a stored found_inf sequence; outputs the
  scale and growth tracker after each ``update``.
- ``attention``: :func:`mpt.functional.scaled_dot_product_attention` forward and backward (given
  dO) for one backend; outputs ``out``, ``dq``, ``dk``, ``dv``.
- ``train_steps``: a few :class:`mpt.train.Trainer` steps of a tiny GPT under one recipe, from
  stored weights and batches, attention on ``backend`` (default "flash"); outputs the losses and
  every parameter after the last step.

``default_cases(rng)`` returns ``(name, kind, params, inputs)`` tuples for the default suite.
"""
from __future__ import annotations

import numpy as np

from mpt import microscaling as _ms
from mpt.amp.recipes import get_recipe, recipe_names
from mpt.engines import mma_models
from mpt.formats import get_format
from mpt.golden.kinds import COMPUTE
from mpt.nn import GPT
from mpt.rounding import round as round_format

__all__ = ["COMPUTE", "default_cases"]


# ---- inputs --------------------------------------------------------------------------------------
def _in_format(fmt: str, x) -> np.ndarray:
    """float64 values rounded (RNE, saturating where the format allows) into ``fmt``'s storage."""
    f = get_format(fmt)
    saturate = not f.has_inf
    with np.errstate(over="ignore"):
        return round_format(np.asarray(x, np.float64).astype(np.float32), fmt, saturate=saturate)


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
    fmt = out_format if out_format in ("fp16", "fp64") else "fp32"
    x = _edge(rng, fmt, shape) if edge else _random(rng, fmt, shape)
    return x.astype(get_format(fmt).dtype)


def _fp64(rng, shape, edge):
    """float64 normal values spread over 2^[-60, 60]; edge: also ±0, subnormals, ±max, ±Inf and
    NaN in the first row."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-60, 61, shape))
    if edge:
        specials = np.array([0.0, -0.0, 5e-324, -2.0**-1022, 1.7976931348623157e308, 1.0])
        x = np.where(rng.random(shape) < 0.25, rng.choice(specials, shape), x)
        x[0, :3] = [np.inf, -np.inf, np.nan]
    return x


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


def _model_cases(rng, model, k=32, skip=()):
    """An edge, a random and a test-vector case (m = n = 4) per input format (but ``skip``) and
    output of ``model`` (its default variant; the configurations only mpt.gemm runs excluded)."""
    cases = []
    fmts = dict.fromkeys(f for cfg in model.configs if not cfg.param("software")
                         for f in cfg.inputs if f not in skip)
    for fmt in fmts:
        outs = [o for o, _, _ in model.config(fmt, fmt).outputs]
        for out in outs:
            params = {"model": model.name, "in_format": fmt, "out_format": out}
            tag = f"mma-{model.name}-{fmt}-{out}"
            m, n = 4, 4
            b_t = _edge(rng, fmt, (n, k))                                   # (n, k)
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
                    c = c.astype(get_format(out).dtype)
                cases.append((f"{tag}-spec", "mma", params, {"a": a, "b": b, "c": c}))
    return cases


def _k4096_cases(rng, pairs):
    """(2, 4096) x (4096, 2) from +0 for each (model, format): long chains."""
    cases = []
    for model, fmt in pairs:
        params = {"model": model, "in_format": fmt, "out_format": "fp32"}
        cases.append((f"mma-{model}-{fmt}-fp32-k4096", "mma", params, {
            "a": _random(rng, fmt, (2, 4096)), "b": _random(rng, fmt, (4096, 2)),
            "c": np.zeros((2, 2), np.float32)}))
    return cases


def _mma_cases(rng):
    """Every NVIDIA and reference model (AMD's: ``_mfma_cases``; TPU, Gaudi, Trainium:
    ``_other_vendor_cases``) per format and output, the instruction variants,
    the block-scaled instructions, FP64 and K = 4096 chains."""
    cases = [c for model in mma_models().values()
             if model.kind != "mfma" and model.kind not in _OTHER_VENDOR_KINDS
             for c in _model_cases(rng, model, skip=("fp64",))]
    cases += _variant_cases(rng) + _block_scaled_cases(rng)
    for model in ("ampere", "hopper"):
        for edge in (True, False):
            cases.append((f"mma-{model}-fp64-fp64-{'edge' if edge else 'random'}", "mma",
                          {"model": model, "in_format": "fp64", "out_format": "fp64"},
                          {"a": _fp64(rng, (4, 32), edge), "b": _fp64(rng, (4, 32), edge).T.copy(),
                           "c": _fp64(rng, (4, 4), edge)}))
    return cases + _k4096_cases(rng, (("hopper", "fp16"), ("ampere", "bf16"),
                                      ("hopper", "fp8_e4m3fn"), ("volta", "fp16")))


def _variant_cases(rng):
    """One edge case per instruction variant of the block model (mma.sync shapes), per output."""
    cases = []
    for model in mma_models().values():
        for cfg in model.configs:
            if cfg.variant == "default" or model.kind_of(cfg) != "block":
                continue
            fmt = cfg.inputs[0]
            for out, _, _ in cfg.outputs:
                b_t = _edge(rng, fmt, (4, 32))
                params = {"model": model.name, "in_format": fmt, "out_format": out,
                          "variant": cfg.variant}
                cases.append((f"mma-{model.name}-{cfg.variant}-{fmt}-{out}-edge", "mma", params, {
                    "a": _edge(rng, fmt, (4, 32)), "b": np.ascontiguousarray(b_t.T),
                    "c": _c(rng, out, (4, 4), edge=True)}))
    return cases


def _scale_codes(rng, sfmt, shape):
    """Block-scale codes: near 2^0 mostly; E8M0 also the extremes 0x00/0x01/0xFD/0xFE and NaN;
    UE4M3 every pattern (sign bits, zeros, subnormals, NaN)."""
    if sfmt == "ue8m0":
        s = (127 + rng.integers(-12, 13, shape)).astype(np.uint8)
        pick = rng.random(shape) < 0.15
        s[pick] = rng.choice(np.array([0x00, 0x01, 0xFD, 0xFE, 0xFF], np.uint8), pick.sum())
        return s.view(get_format("e8m0").dtype)
    s = rng.integers(0, 256, shape).astype(np.uint8)
    s[((s & 0x7F) == 0x7F) & (rng.random(shape) < 0.7)] = 0x38
    return s.view(get_format("fp8_e4m3fn").dtype)


def _block_scaled_cases(rng):
    """Every block-scaled variant and scale format of the presets: random element codes (NaN,
    Inf, zero and subnormal blocks included) with edge scale codes, K = two instructions; and
    one case of the MMA-Sim zero rule."""
    cases, seen = [], set()
    for model in mma_models().values():
        for cfg in model.configs:
            if not cfg.param("scales"):   # (AMD CDNA4's E8M0 scales: _mfma_cases)
                continue
            for sfmt, block in cfg.param("scales"):
                key = (model.name, cfg.variant, sfmt, block)
                if key in seen:
                    continue
                seen.add(key)
                fa, fb = cfg.inputs[0], cfg.inputs[-1]
                k = 2 * cfg.block
                a = _codes(rng, fa, (4, k), block)
                b = _codes(rng, fb, (4, k), block).T.copy()
                params = {"model": model.name, "in_format": None, "out_format": "fp32",
                          "variant": cfg.variant}              # in_format: a's and b's dtypes
                inputs = {"a": a, "b": b, "c": _c(rng, "fp32", (4, 4), edge=True),
                          "scale_a": _scale_codes(rng, sfmt, (4, k // block)),
                          "scale_b": _scale_codes(rng, sfmt, (k // block, 4))}
                cases.append((f"mma-{model.name}-{cfg.variant}-{sfmt}-block{block}", "mma",
                              params, inputs))
                if key == ("blackwell", "mxf4nvf4", "ue4m3", 16):
                    cases.append(("mma-blackwell-mxf4nvf4-ue4m3-block16-mma_sim_zero_rule",
                                  "mma", {**params, "choices": {"zero_rule": "mma_sim"}},
                                  dict(inputs)))
    return cases


def _codes(rng, fmt, shape, block):
    """Random element codes of ``fmt`` (every pattern), with a zero block and an all-subnormal
    block (8-bit formats) in the first row."""
    f = get_format(fmt)
    codes = rng.integers(0, 1 << f.bits, shape).astype(np.uint8)
    codes[0, :block] = 0
    if f.bits == 8:
        codes[0, block:2 * block] &= 0x83 if f.exponent_bits == 4 else 0x81
    return codes.view(f.dtype)


def _gemm_cases(rng, m=4, k=512, n=256, specs=None):
    g = 128
    cases = []
    specs = specs or (  # name, model, format, split_k, promote_every, scales, out_format
        ("hopper-fp8-promote128", "hopper", "fp8_e4m3fn", 1, g, None, "fp32"),
        ("hopper-fp8-fast-accum", "hopper", "fp8_e4m3fn", 1, None, None, "fp32"),
        ("hopper-fp8-promote128-block-scales", "hopper", "fp8_e4m3fn", 1, g, "block", "bf16"),
        ("ada-fp8-e5m2-promote128-tensor-scales", "ada", "fp8_e5m2", 2, g, "tensor", "fp32"),
        ("ampere-bf16-splitk4", "ampere", "bf16", 4, None, None, "bf16"),
        ("hopper-fp16-splitk3-fp16-out", "hopper", "fp16", 3, None, None, "fp16"),
    )
    for name, model, fmt, split_k, promote, scales, out in specs:
        acc = "fp64" if out == "fp64" else "fp32"
        inputs = {"a": _random(rng, fmt, (m, k)), "b": _random(rng, fmt, (k, n)),
                  "c": _random(rng, acc, (m, n)).astype(get_format(acc).dtype)}
        if scales == "tensor":
            inputs["scale_a"] = np.float32(rng.uniform(0.01, 4)).reshape(())
            inputs["scale_b"] = np.float32(rng.uniform(0.01, 4)).reshape(())
        elif scales == "block":
            inputs["scale_a"] = rng.uniform(2**-8, 4, (m, k // g)).astype(np.float32)
            inputs["scale_b"] = rng.uniform(2**-8, 4, (k // g, n // g)).astype(np.float32)
        elif scales == "e8m0":                     # the instruction's scales, one per 32 k
            e8m0 = get_format("e8m0").dtype
            inputs["block_scale_a"] = (127 + rng.integers(-4, 5, (m, k // 32))).astype(
                np.uint8).view(e8m0)
            inputs["block_scale_b"] = (127 + rng.integers(-4, 5, (k // 32, n))).astype(
                np.uint8).view(e8m0)
        params = {"model": model, "in_format": fmt, "split_k": split_k, "promote_every": promote,
                  "out_format": out}
        cases.append((f"gemm-{name}", "gemm", params, inputs))
    return cases if specs is not None else cases + _nvfp4_gemm_case(rng)


def _nvfp4_gemm_case(rng):
    """NVFP4 as Transformer Engine runs it: UE4M3 block scales in the instruction, TE's alpha as
    the per-tensor scale after it, split-K, a bf16 epilogue."""


    x = (rng.standard_normal((4, 256)) * np.exp2(rng.integers(-4, 5, (4, 256)))).astype(np.float32)
    w = rng.standard_normal((256, 32)).astype(np.float32)
    qa, qb = _ms.quantize_nvfp4(x), _ms.quantize_nvfp4(w, axis=0)
    return [("gemm-blackwell-nvfp4-splitk2-alpha", "gemm", {
        "model": "blackwell", "in_format": "fp4_e2m1fn", "split_k": 2, "promote_every": None,
        "out_format": "bf16", "variant": "mxf4nvf4"}, {
        "a": qa.codes, "b": qb.codes, "block_scale_a": qa.scales, "block_scale_b": qb.scales,
        "scale_a": _ms.nvfp4_gemm_alpha(qa.amax, qb.amax).reshape(())})]




def _mfma_cases(rng):
    """The AMD models (mpt.engines.amd): per format and output (K = 40), K = 4096 chains, and
    GEMMs — split-K in whole instructions, FNUZ FP8 as Transformer Engine runs it on MI300,
    FP64, and CDNA4's E8M0 block scales."""
    models = [m for m in mma_models().values() if m.kind == "mfma"]
    g = 128
    gemms = (
        ("cdna3-fp16-splitk3", "cdna3", "fp16", 3, None, None, "fp32"),
        ("cdna3-fp8-e4m3fnuz-promote128-tensor-scales", "cdna3", "fp8_e4m3fnuz", 1, g, "tensor",
         "bf16"),
        ("cdna2-fp64-splitk2", "cdna2", "fp64", 2, None, None, "fp64"),
        ("cdna4-fp4-e8m0-block-scales-splitk2", "cdna4", "fp4_e2m1fn", 2, None, "e8m0", "fp32"),
    )
    return [c for model in models for c in _model_cases(rng, model, k=40)] + _k4096_cases(
        rng, (("cdna1", "fp16"), ("cdna2", "bf16"), ("cdna3", "fp16"), ("cdna3", "fp8_e4m3fnuz"),
              ("cdna4", "fp8_e4m3fn"))) + _gemm_cases(rng, n=16, specs=gemms)


def _microscaling_cases(rng):
    """The quantizers: every MX element format under every scale rule (1x32 along the last
    axis), the other blocks and axes, both stochastic modes; NVFP4 under each scale rule, 1x16
    and 16x16, stochastic; inputs with zeros, subnormals, Inf and NaN; the Hadamard transform."""
    def data(shape):
        x = rng.standard_normal(shape) * np.exp2(rng.integers(-20, 21, (shape[0], 1)))
        x = x * np.exp2(rng.integers(-3, 4, shape))
        x = x.astype(np.float32)
        x[0, :4] = [np.inf, np.nan, -0.0, 2.0**-140]
        x[1, :32] = 0.0                                           # a zero block
        return x
    cases = []
    for fmt in _ms.MX_ELEMENT_FORMATS:
        for rule in _ms.SCALE_RULES:
            cases.append((f"microscaling-mx-{fmt}-{rule}", "microscaling",
                          {"quantizer": "mx", "format": fmt, "scale_rule": rule},
                          {"x": data((4, 64))}))
    for fmt, block, axis, mode in (("fp4_e2m1fn", [1, 16], 0, "stochastic"),
                                   ("fp8_e4m3fn", [16, 16], -1, "stochastic_8bit"),
                                   ("fp6_e3m2fn", [32, 32], -2, "nearest_even")):
        x = data((32, 64))
        inputs = {"x": x}
        if mode != "nearest_even":
            inputs["random_bits"] = rng.integers(0, 2**32, x.shape, dtype=np.uint64) \
                .astype(np.uint32)
        cases.append((f"microscaling-mx-{fmt}-{'x'.join(map(str, block))}-axis{axis}-{mode}",
                      "microscaling", {"quantizer": "mx", "format": fmt, "block": block,
                                       "axis": axis, "scale_rule": "te", "mode": mode}, inputs))
    for rule in _ms.NVFP4_SCALE_RULES:
        for block in ([1, 16], [16, 16]):
            cases.append((f"microscaling-nvfp4-{rule}-{'x'.join(map(str, block))}",
                          "microscaling", {"quantizer": "nvfp4", "block": block,
                                           "scale_rule": rule}, {"x": data((32, 64))}))
    for mode in ("stochastic", "stochastic_8bit"):
        x = data((16, 64))
        cases.append((f"microscaling-nvfp4-te-1x16-{mode}", "microscaling",
                      {"quantizer": "nvfp4", "mode": mode, "axis": 0}, {
                          "x": x, "random_bits": rng.integers(0, 2**32, x.shape, dtype=np.uint64)
                          .astype(np.uint32)}))
    y = _in_format("bf16", rng.standard_normal((32, 16)) * np.exp2(rng.integers(-8, 9, (32, 16))))
    cases.append(("microscaling-hadamard-bf16-axis0", "microscaling",
                  {"quantizer": "hadamard", "axis": 0}, {"x": y}))
    return cases


#: Arithmetic kinds of the TPU, Gaudi and Trainium models, whose cases come after all others (so
#: that adding them left the earlier cases' inputs unchanged).
_OTHER_VENDOR_KINDS = ("xla_dot", "mme", "psum")


def _other_vendor_cases(rng):
    """Per TPU, Gaudi and Trainium model an edge, a random and a test-vector case per input
    format mpt.mma runs (K = 32; FP32 output, their only one)."""
    return [c for model in mma_models().values() if model.kind in _OTHER_VENDOR_KINDS
            for c in _model_cases(rng, model)]


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
    from stored fp32 weights and token batches; attention on the flash backend where it runs
    the recipe's GEMM model, else the naive one."""
    shape, steps, batch = [16, 16, 1, 2, 8], 2, 4
    init = {f"init.{k}": v for k, v in GPT(*shape, seed=int(rng.integers(2**31))).state_dict()
            .items()}
    idx = rng.integers(0, 16, (steps, batch, 9))                            # (steps, B, T+1)
    tokens = {"idx": idx[..., :-1].copy(), "targets": idx[..., 1:].copy()}  # (steps, B, T)
    recipes = [get_recipe(r) for r in recipe_names()]
    return [(f"train_steps-{r.name}", "train_steps",
             {"recipe": r.name, "gpt": shape, "lr": 1e-2,
              "backend": "flash" if r.flash_attention else "naive"}, {**init, **tokens})
            for r in recipes if r.block_scaled is None]    # (their GEMMs: mma/gemm cases)


def default_cases(rng: np.random.Generator) -> list[tuple]:
    """The non-rounding cases of the default suite, as (name, kind, params, inputs). Cases are
    appended in the order they were added to mpt, each group drawing from ``rng`` after the
    earlier ones, so that new groups leave the earlier cases' inputs unchanged."""
    cases = [c for build in (_mma_cases, _gemm_cases, _fake_quant_cases, _optim_cases,
                             _grad_scaler_cases, _attention_cases, _train_cases, _mfma_cases)
             for c in build(rng)]
    cases += _microscaling_cases(np.random.default_rng(rng.integers(2**32)))
    return cases + _other_vendor_cases(rng) + _software_gemm_cases(rng)
