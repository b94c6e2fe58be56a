"""mpt.mma: presets, the spec's Section 3 test vectors, and every model against its exact oracle.

Expectations are bit patterns: the vectors are those of docs/tensor_cores.md §3, the
property tests compare with ``mpt.reference.mma`` (exact rationals, literal spec steps) on random
bit patterns that include zeros, subnormals, Inf, NaN and the extreme exponents.
"""
import math
from fractions import Fraction

import ml_dtypes
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpt
from mpt.formats import get_format
from mpt.reference.mma import mma_reference
from mpt.testing import as_bits as _bits

NVIDIA = ["volta", "turing", "ampere", "ada", "hopper", "blackwell", "rtx_blackwell"]
FLT_MAX = float.fromhex("0x1.fffffep127")


class _Bits(int):
    """A bit pattern (of the output format, or an fp32 pattern for tf32 inputs), not a value."""


def _as_format(values, fmt):
    """An array of ``fmt`` holding exactly ``values`` (numbers, or :class:`_Bits` patterns);
    None if some value is not representable."""
    if any(isinstance(v, _Bits) for v in values):
        storage = {"fp32": np.uint32, "tf32": np.uint32, "fp16": np.uint16}.get(fmt)
        if storage is None or max(values) > np.iinfo(storage).max:
            return None
        return np.array(values, storage).view(get_format(fmt).dtype)
    x = np.array(values, np.float64)
    with np.errstate(over="ignore"):
        y = x.astype(np.float32).astype(get_format(fmt).dtype)
    if fmt == "tf32":
        ok = (y.view(np.uint32) & 0x1FFF) == 0
        return y if np.all(ok) and np.array_equal(y.astype(np.float64), x) else None
    return y if np.array_equal(y.astype(np.float64), x) else None


def _block_configs(model):
    """The block-model configurations of a preset (every instruction variant; the block-scaled
    and FP64 ones have their own tests: test_blockscaled.py, test_mma_variants.py)."""
    m = mpt.get_mma_model(model)
    return [cfg for cfg in m.configs if m.kind_of(cfg) == m.kind]


def _variant(cfg):
    """``mpt.mma``'s variant argument for a configuration (None for the default)."""
    return None if cfg.variant == "default" else cfg.variant


def _id(model, cfg):
    return model if cfg.variant == "default" else f"{model}[{cfg.variant}]"


def _model_dict(model, fa, fb, out, variant=None):
    """The oracle's description of a preset for these formats."""
    model = mpt.get_mma_model(model)
    cfg = model.config(fa, fb, variant)
    rounding, e_zero = cfg.output(out)
    return {"kind": model.kind, "block": cfg.block, "fraction_bits": cfg.fraction_bits,
            "e_zero": e_zero, "rounding": rounding}


# ---- presets ----------------------------------------------------------------------------------

def test_preset_names_and_aliases():
    models = mpt.mma_models()
    first = NVIDIA + ["ieee_fma", "ieee_mul_add", "exact", "cdna1", "cdna2", "cdna3", "cdna4"]
    assert list(models)[:len(first)] == first                   # then the other vendors'
    for alias, name in [("v100", "volta"), ("t4", "turing"), ("a100", "ampere"), ("a2", "ampere"),
                        ("l40s", "ada"), ("rtx4090", "ada"), ("h100", "hopper"), ("H200", "hopper"),
                        ("b200", "blackwell"), ("rtx5090", "rtx_blackwell"),
                        ("SM120", "rtx_blackwell")]:
        assert mpt.get_mma_model(alias) is models[name]
    assert mpt.get_mma_model(models["hopper"]) is models["hopper"]
    for m in models.values():
        assert m.describe()["name"] == m.name


_FP32_16 = {"fp32": ("rz_fp32", -133), "fp16": ("rne_fp16", -21)}


@pytest.mark.parametrize("model, fmt, variant, block, fraction_bits, outputs", [
    ("volta", "fp16", None, 4, 23, {"fp32": ("rz_fp32", -132), "fp16": ("rne_fp16", -19)}),
    ("turing", "fp16", None, 8, 24, {"fp32": ("rz_fp32", -132), "fp16": ("rne_fp16", -20)}),
    ("turing", "fp16", "m8n8k4", 4, 24, {"fp32": ("rz_fp32", -132), "fp16": ("rne_fp16", -20)}),
    ("ampere", "bf16", None, 8, 24, {"fp32": ("rz_fp32", -132), "fp16": ("rne_fp16", -20)}),
    ("ampere", "tf32", None, 4, 24, {"fp32": ("rz_fp32", -132)}),
    ("ampere", "fp64", None, 1, None, {"fp64": ("rne_fp64", None)}),
    ("ada", "fp8_e4m3fn", None, 16, 13, {"fp32": ("rz_e8m13", -132), "fp16": ("rne_fp16", -20)}),
    ("hopper", "fp16", None, 16, 25, _FP32_16),
    ("hopper", "fp16", "m16n8k8", 8, 25, _FP32_16),
    ("hopper", "bf16", "m16n8k8", 8, 25, _FP32_16),
    ("hopper", "tf32", None, 8, 25, {"fp32": ("rz_fp32", -133)}),
    ("hopper", "tf32", "m16n8k4", 4, 25, {"fp32": ("rz_fp32", -133)}),
    ("hopper", "fp8_e5m2", None, 32, 13, {"fp32": ("rz_e8m13", -133), "fp16": ("rne_fp16", -21)}),
    ("hopper", "fp64", None, 1, None, {"fp64": ("rne_fp64", None)}),
    ("blackwell", "bf16", None, 16, 25, _FP32_16),
    ("blackwell", "bf16", "m16n8k8", 8, 25, _FP32_16),
    ("blackwell", "tf32", "m16n8k4", 4, 25, {"fp32": ("rz_fp32", -133)}),
    ("blackwell", "fp4_e2m1fn", None, 32, 25, _FP32_16),
    ("blackwell", "fp8_e4m3fn", "mxf8f6f4", 32, 25, {"fp32": ("rz_fp32", -133)}),
    ("blackwell", "fp4_e2m1fn", "mxf4nvf4", 64, 35, {"fp32": ("rz_fp32", -133)}),
    ("rtx_blackwell", "fp16", None, 16, 25, _FP32_16),
    ("rtx_blackwell", "tf32", None, 8, 25, {"fp32": ("rz_fp32", -133)}),
    ("rtx_blackwell", "fp8_e4m3fn", None, 32, 25, _FP32_16),
    ("rtx_blackwell", "fp8_e5m2", "m16n8k16", 16, 25, _FP32_16),
    ("rtx_blackwell", "fp4_e2m1fn", "mxf4", 64, 35, {"fp32": ("rz_fp32", -133)}),
])
def test_spec_parameters(model, fmt, variant, block, fraction_bits, outputs):
    """The preset table of docs/tensor_cores.md §2, row by row (and the instruction variants of
    docs/blockscaled.md)."""
    cfg = mpt.get_mma_model(model).config(fmt, fmt, variant)
    assert (cfg.block, cfg.fraction_bits) == (block, fraction_bits)
    assert {o: (r, e) for o, r, e in cfg.outputs} == outputs


def test_unknown_model_and_formats():
    with pytest.raises(ValueError, match="valid models: volta"):
        mpt.get_mma_model("v200")
    with pytest.raises(TypeError, match="model must be"):
        mpt.get_mma_model(3)
    a = np.ones((2, 4), np.float16)
    with pytest.raises(ValueError, match="does not take inputs .*bf16.*takes.*fp16"):
        mpt.mma(a.astype(ml_dtypes.bfloat16), a.T.astype(ml_dtypes.bfloat16), model="volta")
    with pytest.raises(ValueError, match="does not take inputs .*fp16, bf16"):   # no fp16 x bf16
        mpt.mma(a, a.T.astype(ml_dtypes.bfloat16), model="hopper")
    with pytest.raises(ValueError, match="out_format must be one of 'fp32'"):
        mpt.mma(a.astype(np.float32), a.T.astype(np.float32), model="hopper", in_format="tf32",
                out_format="fp16")
    with pytest.raises(ValueError, match="does not take inputs .*fp32"):
        mpt.mma(a.astype(np.float32), a.T.astype(np.float32), model="ampere")


def test_bad_arguments():
    a, b = np.ones((2, 4), np.float16), np.ones((4, 3), np.float16)
    with pytest.raises(ValueError, match="disagree on K"):
        mpt.mma(a, b.T, model="hopper")
    with pytest.raises(ValueError, match=r"a must have shape \(\.\.\., M, K\)"):
        mpt.mma(a[0], b, model="hopper")
    with pytest.raises(TypeError, match="c must be float32 for fp32 output"):
        mpt.mma(a, b, np.zeros((2, 3)), model="hopper")
    with pytest.raises(TypeError, match="c must be float16 for fp16 output"):
        mpt.mma(a, b, np.zeros((2, 3), np.float32), model="hopper", out_format="fp16")
    with pytest.raises(ValueError, match="batch dimensions do not broadcast"):
        mpt.mma(np.ones((2, 2, 4), np.float16), np.ones((3, 4, 3), np.float16), model="hopper")
    with pytest.raises(TypeError, match="a must hold fp16 values as float16; got float32"):
        mpt.mma(a.astype(np.float32), b, model="hopper", in_format="fp16")
    with pytest.raises(TypeError, match="a has dtype int64"):
        mpt.mma(np.ones((2, 4), np.int64), b, model="hopper")
    with pytest.raises(TypeError, match="in_format must be"):
        mpt.mma(a, b, model="hopper", in_format=16)


# ---- docs/tensor_cores.md §3 --------------------------------------------------------------------

def _family(fmt):
    return "fp8" if fmt.startswith(("fp8", "fp6", "fp4")) else fmt


def _vector_cases(vid, a, b, c, expect, out="fp32", families=("fp16", "bf16", "tf32", "fp8"),
                  models=NVIDIA):
    """One case per (preset, input configuration) where the vector applies: its values are
    representable (first such format of the configuration) and ``expect(model, cfg)`` is given."""
    cases = []
    for model in models:
        for cfg in _block_configs(model):
            if out not in (o for o, _, _ in cfg.outputs):
                continue
            fmt = next((f for f in cfg.inputs
                        if _as_format(a, f) is not None and _as_format(b, f) is not None), None)
            if fmt is None or _family(fmt) not in families:
                continue
            e = expect(model, cfg)
            if e is not None:
                cases.append(pytest.param(model, fmt, out, a, b, c, e, _variant(cfg),
                                          id=f"{vid}-{_id(model, cfg)}-{fmt}-{out}"))
    return cases


def _by_f(table):
    return lambda model, cfg: table.get(cfg.fraction_bits)


def _by_l(table):
    return lambda model, cfg: table.get(cfg.block)


def _fp8(table):
    return lambda model, cfg: table.get(model) if _family(cfg.inputs[0]) == "fp8" else None


def _every(value):
    return lambda model, cfg: value


_V2_A, _V2_B = [-2.0**13, -0.5, -0.25, -0.125], [2.0**10, 1, 1, 1]
_F11_A, _F11_B = [0.5] * 4, [2.0**-24] * 3 + [2.0**-23 + 2.0**-24]
VECTORS = (
    _vector_cases("V1", [1, -1], [2, 2], _Bits(0x38FFE000),
                  _by_f({23: _Bits(0x38FF8000), 24: _Bits(0x38FFC000), 25: _Bits(0x38FFE000)}))
    + _vector_cases("V2", _V2_A, _V2_B, 2.0**23, _by_f({23: 0.0, 24: -0.5, 25: -0.75, 13: 0.0}))
    + _vector_cases("V3", [2.0**7] + [2.0**-9] * 15, [2.0**7] + [2.0**-9] * 15, -2.0**14,
                    _by_l({4: 1.5 * 2.0**-15, 8: 2.0**-15, 16: 0.0}), families=("fp16", "bf16"))
    + _vector_cases("V4", [0.0] * 4, [0.0] * 4, _Bits(0x3F800008),
                    _fp8({"ada": _Bits(0x3F800000), "hopper": _Bits(0x3F800000),
                          "blackwell": _Bits(0x3F800008), "rtx_blackwell": _Bits(0x3F800008)}))
    + _vector_cases("V4b", [1, -1], [1, 1], 2.0**-10 + 2.0**-20,
                    _fp8({"ada": _Bits(0x3A800000), "hopper": _Bits(0x3A800000),
                          "blackwell": _Bits(0x3A802000), "rtx_blackwell": _Bits(0x3A802000)}))
    + _vector_cases("V5", [0.5] * 4, [1, 1, 2.0**-10, 2.0**-23], 0.0, _every(_Bits(0x3C01)),
                    out="fp16")
    + _vector_cases("V6a", [0.5], [1], 1024.0, _every(1024.0), out="fp16")
    + _vector_cases("V6b", [1.5], [1], 1024.0, _every(1026.0), out="fp16")
    + _vector_cases("V6c", [16], [1], 65504.0, _every(math.inf), out="fp16")
    + _vector_cases("V6d", [8], [1], 65504.0, _every(65504.0), out="fp16")
    + _vector_cases("V7", [0.25] * 4, [1] * 4, 0.75 * 2.0**-23, _every(1.0))
    + _vector_cases("V7-neg", [-0.25] * 4, [1] * 4, -0.75 * 2.0**-23, _every(-1.0))
    + _vector_cases("V7b", [0.75, 0.75], [2.0**127] * 2, 0.25 * FLT_MAX, _every(_Bits(0x7F7FFFFF)))
    + _vector_cases("V7b-inf", [1, 1], [2.0**127] * 2, 0.0, _every(math.inf))
    + _vector_cases("V8", [-0.0] * 4, [1] * 4, -0.0, _every(_Bits(0)))
    + _vector_cases("V8", [-0.0] * 4, [1] * 4, -0.0, _every(_Bits(0)), out="fp16")
    + _vector_cases("V9", [_Bits(0x3F800600)], [1], 0.0, _every(1.0), families=("tf32",))
    + _vector_cases("V9-nan", [_Bits(0x7F800001)], [1], 0.0, _every(math.inf), families=("tf32",))
    + _vector_cases("F10", [1], [1], -(1 - 2.0**-24),
                    _by_f({23: 2.0**-23, 24: 2.0**-24, 25: 2.0**-24}),
                    families=("fp16", "bf16", "tf32"))
    + _vector_cases("F12", [1, 1], [1, -2.0**-24], -1 + 2.0**-24,
                    _by_f({23: 2.0**-23, 24: 0.0, 25: 0.0}),
                    families=("fp16",))
    + _vector_cases("F11", [1] * 4, [2.0**-24] * 4, 1 - 2.0**-24, _every(1 + 2.0**-23),
                    families=("fp16",), models=["volta"])
    + _vector_cases("F11-c1", [1] * 4, [2.0**-24] * 4, 1.0, _every(1.0),
                    families=("fp16",), models=["volta"])
    + _vector_cases("F11", _F11_A, _F11_B, 1 - 2.0**-24, _every(1 + 2.0**-23),
                    families=("fp16",), models=["turing", "ampere", "ada"])
    + _vector_cases("F11-c1", _F11_A, _F11_B, 1.0, _every(1.0),
                    families=("fp16",), models=["turing", "ampere", "ada"])
    + _vector_cases("F14", [1] * 4, [1, 1.5, 1.75, 1.875], 1.875, _every(8.0))
    + _vector_cases("F15", [1] * 4, [1] * 4, 1 + 2.0**-22 + 2.0**-23, _every(5.0))
    + _vector_cases("F15-neg", [-1] * 4, [1] * 4, -(1 + 2.0**-22 + 2.0**-23), _every(-5.0))
    + _vector_cases("F3", [1 - 2.0**-11], [1 - 2.0**-11], 0.0, _every(1 - 2.0**-10 + 2.0**-22))
    + _vector_cases("V2-exact", _V2_A, _V2_B, 2.0**23, _every(-0.875), models=["exact"],
                    families=("fp16",))
)


@pytest.mark.parametrize("model, fmt, out, a, b, c, expected, variant", VECTORS)
def test_spec_vectors(model, fmt, out, a, b, c, expected, variant):
    """Every Section 3 vector on every architecture and instruction variant it names (and those
    its parameters imply), as one output element: a (1, K), b (K, 1), c (1, 1)."""
    in_format = "tf32" if fmt == "tf32" else None
    c = _as_format([c], out)
    d = mpt.mma(_as_format(a, fmt)[None, :], _as_format(b, fmt)[:, None], c[None, :], model=model,
                in_format=in_format, out_format=out, variant=variant)
    want = int(_bits(_as_format([expected], out))[0])
    assert int(_bits(d)[0, 0]) == want, f"got {int(_bits(d)[0, 0]):#x}, want {want:#x}"


def test_vectors_cover_every_architecture():
    ids = {p.id.split("-")[0] + "-" + p.values[0] for p in VECTORS}
    for vid in ("V1", "V2", "V7", "V8", "F14", "F15"):
        assert {f"{vid}-{m}" for m in NVIDIA} <= ids, vid


# ---- e_zero, the anchor of a block whose terms are all tiny --------------------------------

def _as_product(u, fmt, e_zero):
    """(a, b) values of fmt with a·b == u exactly (Fraction) and nominal exponents summing below
    e_zero (so that the zero term's e_zero stays the anchor), or None."""
    f = get_format(fmt)
    for e_b in range(f.emax, f.emin - f.mantissa_bits - 1, -1):
        b = Fraction(2) ** e_b
        a = u / b
        a_arr = _as_format([float(a)], fmt)
        if a_arr is None or Fraction(float(a_arr[0])) != a or float(a) == 0:
            continue
        nominal = max(math.frexp(float(a))[1] - 1, f.emin) + max(e_b, f.emin)
        if nominal < e_zero:
            return float(a), float(b)
    return None


def _as_products(value, fmt, e_zero):
    """value (a Fraction) as a few exact products of fmt, chunking its bits from the top."""
    pairs, rest = [], value
    while rest:
        top = math.floor(math.log2(rest))
        for width in range(get_format(fmt).precision, 0, -1):
            quantum = Fraction(2) ** (top - width + 1)
            chunk = rest // quantum * quantum
            pair = _as_product(chunk, fmt, e_zero)
            if pair is not None:
                break
        else:
            return None
        pairs.append(pair)
        rest -= chunk
    return pairs


def _e_zero_cases():
    """Blocks with c = 0 whose exact sum is an output rounding boundary B (RZ-FP32: 2^-149, the
    step from 0 to the smallest subnormal; RNE-FP16: 1.5·2^-24, a tie) with a lowest term of
    exactly q = 2^(e_zero - F): the bits flip if the anchor moves by one binade either way."""
    cases = []
    for model in NVIDIA:
        for cfg in _block_configs(model):
            for out, rounding, e_zero in cfg.outputs:
                boundary, hit, below = {"rz_fp32": (Fraction(2) ** -149, 2.0**-149, 0.0),
                                        "rne_fp16": (Fraction(3, 2**25), 2.0**-23, 2.0**-24),
                                        "rz_e8m13": (None, None, None)}[rounding]
                fmt = cfg.inputs[0]
                for shift, expected in ((0, hit), (1, below)):
                    if boundary is None:
                        continue
                    q = Fraction(2) ** (e_zero - cfg.fraction_bits - shift)
                    pairs = _as_products(boundary - q, fmt, e_zero)
                    tail = _as_product(q, fmt, e_zero)
                    if pairs is None or tail is None or len(pairs) + 1 > cfg.block:
                        continue  # not representable: e_zero has no visible effect here
                    a, b = zip(*(pairs + [tail]))
                    cases.append(pytest.param(model, fmt, out, list(a), list(b), expected,
                                              _variant(cfg),
                                              id=f"{_id(model, cfg)}-{fmt}-{out}-q{'/2' * shift}"))
    return cases


@pytest.mark.parametrize("model, fmt, out, a, b, expected, variant", _e_zero_cases())
def test_e_zero(model, fmt, out, a, b, expected, variant):
    """The zero term's exponent: terms a·b sum to a rounding boundary with a lowest term of
    q = 2^(e_zero - F) (kept: the boundary is reached) or q/2 (truncated: it is not)."""
    in_format = "tf32" if fmt == "tf32" else None
    c = np.zeros((1, 1), get_format(out).dtype)
    d = mpt.mma(_as_format(a, fmt)[None, :], _as_format(b, fmt)[:, None], c, model=model,
                in_format=in_format, variant=variant)
    assert int(_bits(d)[0, 0]) == int(_bits(_as_format([expected], out))[0])


def test_e_zero_cases_cover_the_measured_values():
    """Every measured e_zero (spec §2) has its pair of cases: Ampere/Ada/Hopper/Blackwell with
    FP32 output, every architecture with FP16 output."""
    ids = {p.id.rsplit("-", 1)[0] for p in _e_zero_cases()}
    for model in ("ampere", "ada", "hopper", "blackwell"):
        assert f"{model}-bf16-fp32" in ids and f"{model}-tf32-fp32" in ids
    for model in NVIDIA:
        assert f"{model}-fp16-fp16" in ids


# ---- properties against the exact oracle -------------------------------------------------------

_WIDTH = {"fp32": 32, "tf32": 32, "fp16": 16, "bf16": 16, "fp8_e4m3fn": 8, "fp8_e5m2": 8,
          "fp6_e3m2fn": 6, "fp6_e2m3fn": 6, "fp4_e2m1fn": 4}


def _patterns(rng, fmt, shape, center, mix):
    """Bit patterns of ``fmt`` for an array of ``shape``: a mix (probabilities ``mix``) of
    uniformly random patterns (every exponent, subnormals, Inf, NaN), patterns whose exponent
    field lies within ±2 of a common ``center`` (so that terms cancel and truncation matters),
    and special values (±0, the smallest subnormal, the largest finite, Inf, NaNs)."""
    f = _layout(fmt)
    width, m, e = _WIDTH[fmt], f.mantissa_bits, f.exponent_bits
    top = (1 << e) - 1
    center = _center(rng, fmt) if center is None else min(max(center, 0), top)
    uniform = rng.integers(0, 1 << width, shape, dtype=np.uint64)
    field = np.clip(center + rng.integers(-2, 3, shape), 0, top).astype(np.uint64)
    near = (rng.integers(0, 2, shape, dtype=np.uint64) << np.uint64(width - 1)) \
        | (field << np.uint64(m)) | rng.integers(0, 1 << m, shape, dtype=np.uint64)
    specials = rng.choice(np.array([0, 1 << (width - 1), 1, (top << m) - 1, top << m,
                                    (top << m) | 1, (1 << width) - 1], np.uint64), shape)
    return np.choose(rng.choice(3, shape, p=mix), [uniform, near, specials])


def _view(bits, fmt):
    if fmt in ("tf32", "fp32"):
        return bits.astype(np.uint32).view(np.float32)
    storage = {16: np.uint16, 8: np.uint8, 6: np.uint8, 4: np.uint8}[_WIDTH[fmt]]
    return bits.astype(storage).view(get_format(fmt).dtype)


def _layout(fmt):
    """The Format whose bit layout the patterns of fmt use (tf32 inputs are fp32 patterns)."""
    return get_format("fp32" if fmt == "tf32" else fmt)


def _center(rng, fmt):
    """A random exponent field of fmt (the center of the "near" patterns)."""
    return int(rng.integers(0, 1 << _layout(fmt).exponent_bits))


def _configs():
    """(model, format of a, format of b, output) for every preset, input format and output, of
    the kinds mpt.reference.mma models (the other vendors' models have their own oracles:
    tests/test_mfma.py, test_mme.py, test_engines_tpu.py, test_engines_trainium.py)."""
    out = []
    for name, model in mpt.mma_models().items():
        if model.kind not in ("block", "ieee_fma", "ieee_mul_add", "exact"):
            continue
        configs = _block_configs(name) if model.kind == "block" else model.configs
        for cfg in configs:
            fmts = cfg.inputs
            if cfg.evidence == "assumption" and model.kind == "block":
                fmts = ("fp6_e3m2fn", "fp6_e2m3fn")     # the others take the first config
            if model.kind != "block":
                fmts = ("fp32", "tf32", "bf16", "fp8_e5m2")
            pairs = [(f, f) for f in fmts]
            if len(fmts) > 1:
                pairs.append((fmts[0], fmts[1]))          # mixed formats, where the model mixes
            for fa, fb in pairs:
                for o, _, _ in cfg.outputs:
                    out.append(pytest.param(name, fa, fb, o, _variant(cfg),
                                            id=f"{_id(name, cfg)}-{fa}-{fb}-{o}"))
    return out


@pytest.mark.parametrize("model, fa, fb, out, variant", _configs())
@given(data=st.data())
@settings(max_examples=100)
def test_matches_oracle(model, fa, fb, out, variant, data):
    """D bits equal the exact-rational oracle's on random bit patterns; K spans several blocks
    and a partial last one."""
    cfg = mpt.get_mma_model(model).config(fa, fb, variant)
    block = cfg.block or 8
    m, n = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
    k = data.draw(st.integers(0, 2 * block + 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    if data.draw(st.booleans()):   # tame operands: finite, moderate (the register-blocked path)
        a_center, b_center = (_layout(f).bias + int(rng.integers(-3, 4)) for f in (fa, fb))
        mix = (0.0, 1.0, 0.0)
    else:                          # anything; specials rare in most examples (one decides a block)
        a_center, b_center = _center(rng, fa), _center(rng, fb)
        mix = data.draw(st.sampled_from([(0.1, 0.9, 0.0), (0.2, 0.78, 0.02), (0.3, 0.5, 0.2)]))
    a = _patterns(rng, fa, (m, k), a_center, mix)
    b = _patterns(rng, fb, (k, n), b_center, mix)
    a[rng.random(a.shape) < 0.1] = 0
    # c near the products' magnitude half of the time, so that it cancels against them
    aligned = _layout(out).bias + a_center - _layout(fa).bias + b_center - _layout(fb).bias
    c_center = data.draw(st.sampled_from([None, aligned]))
    c = _patterns(rng, out, (m, n), c_center, (0.2, 0.7, 0.1))
    in_format = (fa, fb) if "tf32" in (fa, fb) else None
    d = mpt.mma(_view(a, fa), _view(b, fb), _view(c, out), model=model, in_format=in_format,
                out_format=out, variant=variant)
    want = mma_reference(a.tolist(), b.tolist(), c.tolist(),
                         _model_dict(model, fa, fb, out, variant), fa, fb)
    assert _bits(d).tolist() == want


# ---- layout: batches, broadcasting, determinism --------------------------------------------

@pytest.mark.parametrize("model, dtype, in_format", [
    ("hopper", np.float16, None), ("ampere", np.float32, "tf32"), ("exact", np.float32, None),
    ("ieee_fma", np.float32, None), ("ieee_mul_add", np.float32, None),
    ("hopper", ml_dtypes.float8_e4m3fn, None)])
def test_batches_broadcast_and_split(model, dtype, in_format):
    """A batched, broadcast call equals the same products computed one batch element at a time
    (so the bits do not depend on how a batch is split)."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 1, 37, 70)).astype(np.float32).astype(dtype)
    b = rng.standard_normal((2, 70, 45)).astype(np.float32).astype(dtype)
    c = rng.standard_normal((45,)).astype(np.float32)
    d = mpt.mma(a, b, c, model=model, in_format=in_format)
    assert d.shape == (3, 2, 37, 45)
    for i in range(3):
        for j in range(2):
            one = mpt.mma(a[i, 0], b[j], np.broadcast_to(c, (37, 45)), model=model,
                          in_format=in_format)
            assert np.array_equal(_bits(d[i, j]), _bits(one))


@pytest.mark.parametrize("model, dtype, in_format", [
    ("hopper", np.float16, None), ("volta", np.float16, None), ("exact", np.float32, None),
    ("ieee_fma", np.float32, None), ("ieee_mul_add", np.float32, None),
    ("hopper", ml_dtypes.float8_e5m2, None), ("blackwell", ml_dtypes.float8_e4m3fn, None)])
def test_thread_count_does_not_change_bits(model, dtype, in_format):
    """Register-blocked and general block paths (Blackwell FP8: the register path with int32
    partial sums of 16 products), the exact and the IEEE models: identical bits on 1 and 2
    threads."""
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((2, 70, 130)) * 8).astype(np.float32).astype(dtype)
    b = rng.standard_normal((130, 150)).astype(np.float32).astype(dtype)
    results = []
    for threads in (1, 2):
        numba.set_num_threads(threads)
        try:
            results.append(_bits(mpt.mma(a, b, model=model, in_format=in_format)))
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert np.array_equal(results[0], results[1])


@pytest.mark.parametrize("model, dtype", [("hopper", np.float16), ("ampere", ml_dtypes.bfloat16),
                                          ("ada", ml_dtypes.float8_e4m3fn), ("volta", np.float16)])
def test_register_blocked_path_equals_general_path(model, dtype):
    """Finite, moderate operands take the register-blocked kernel; one Inf anywhere in the call
    sends the whole call down the general path. Both give the same bits (tile edges, both
    orientations, batches)."""
    rng = np.random.default_rng(5)
    for m, k, n in [(37, 70, 45), (3, 40, 70), (17, 33, 9)]:
        a = (rng.standard_normal((2, m, k)) * 4).astype(np.float32).astype(dtype)
        b = rng.standard_normal((k, n)).astype(np.float32).astype(dtype)
        c = rng.standard_normal((2, m, n)).astype(np.float32)
        fast = mpt.mma(a, b, c, model=model)
        spoiled = np.concatenate([a, np.full((1, m, k), np.inf, np.float32).astype(dtype)])
        general = mpt.mma(spoiled, b, np.concatenate([c, c[:1]]), model=model)[:2]
        assert np.array_equal(_bits(fast), _bits(general))
        assert np.isnan(mpt.mma(spoiled, b, model=model)[2]).all()


def test_output_dtypes_and_canonical_nan():
    a = np.array([[np.nan, 1]], np.float16)
    b = np.array([[1], [1]], np.float16)
    d32 = mpt.mma(a, b, model="hopper")
    d16 = mpt.mma(a, b, np.zeros((1, 1), np.float16), model="hopper")
    assert d32.dtype == np.float32 and int(_bits(d32)[0, 0]) == 0x7FFFFFFF
    assert d16.dtype == np.float16 and int(_bits(d16)[0, 0]) == 0x7FFF
    assert int(_bits(mpt.mma(a.astype(np.float32), b.astype(np.float32), model="ieee_fma"))[0, 0]) \
        == 0x7FFFFFFF

