"""``mpt characterize``: the probing method recovers every registered MMA model — every kind,
instruction variant and assumed-rule choice — catches a fault, and its JSON runs in ``mpt.mma``
bit for bit.

The registry is read when the tests are collected, so models registered later are covered
without a change here. For an adapter ``mpt:<model>`` (default variants and choices; each other
variant; each assumed-rule choice; every combination under ``-m exhaustive``) the
characterization must

* probe every pair the adapter computes (block-scaled variants with unit scales, software
  configurations through ``mpt.gemm``), and list the variants it did not offer;
* name the source configuration among the candidates that reproduce every probe, and every
  candidate it names must compute the same bits on fresh random inputs (K = 64 and 256, moderate
  values and uniformly random bit patterns) — which also tests each statement that two
  assumed-rule choices are "indistinguishable by the outputs of the probed pairs";
* settle the source's choice of each assumed rule or keep it among the consistent ones;
* for a block configuration, fit the preset's L, F and output rounding, and its e_zero wherever
  the formats can show it (else a bound the preset's value meets);
* write JSON that ``mpt.engines.load_model`` turns into a model computing the same bits as the
  source on fresh random inputs.

One bit of alignment less is reported as a difference for every block model and for Gaudi 2.
Oracles: the source model itself (through ``mpt.mma``/``mpt.gemm``), the published test vectors
and zero-rule answers of docs/tensor_cores.md and docs/accelerators.md.
"""
import functools
import json
import sys
from fractions import Fraction
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

import mpt
from mpt.characterize import MptAdapter, characterize, get_adapter, with_fraction_bits
from mpt.characterize.adapters import c_prefix
from mpt.characterize.match import Candidate, choice_sets
from mpt.characterize.probes import ProbeSet, exact_in, factor, nan_patterns
from mpt.characterize.runner import compute, run_model
from mpt.cli import main
from mpt.engines import MMAModel, load_model
from mpt.formats import UNSIGNED, get_format

REGISTRY = mpt.mma_models()


def _default_variants(model) -> set:
    return {model.config(f, f).variant for cfg in model.configs for f in cfg.inputs}


def _variant_cases():
    for model in REGISTRY.values():
        for variant in model.variants:
            if variant not in _default_variants(model):
                yield pytest.param(model.name, variant, id=f"{model.name}[{variant}]")


def _choice_cases():
    for model in REGISTRY.values():
        for choices in choice_sets(model):
            if choices:
                yield pytest.param(model.name, choices, id=model.name + "".join(
                    f",{k}={v}" for k, v in choices.items()))


def _every_case():
    for model in REGISTRY.values():
        for variant in model.variants:
            for choices in choice_sets(model):
                yield pytest.param(model.name, variant, choices, id=f"{model.name}[{variant}]"
                                   + "".join(f",{k}={v}" for k, v in choices.items()))


def _fresh_inputs(fin: str, fout: str, seed: int, k: int, rows: int) -> ProbeSet:
    """Random probes the battery never saw, K = k: ``rows`` rows of moderate values (exponents
    in [-6, 6]) and ``rows`` of uniformly random bit patterns (any exponent, subnormals, zeros,
    Inf, NaN; a custom format stored in float32: values over its whole range)."""
    rng = np.random.default_rng(seed)
    f_in, f_out = get_format(fin), get_format(fout)

    def moderate(fmt, shape):
        m = fmt.mantissa_bits
        lo, hi = max(fmt.emin, -6), min(fmt.emax, 6)
        vals = rng.choice((-1.0, 1.0), shape) * np.ldexp(
            rng.integers(1 << m, 1 << (m + 1), shape).astype(np.float64),
            rng.integers(lo, hi + 1, shape) - m)
        vals = np.clip(vals, -fmt.max, fmt.max)
        vals[rng.random(shape) < 0.1] = 0.0
        return mpt.round(vals, fmt.name)

    def bits(fmt, shape):
        if fmt.custom:
            exps = rng.uniform(fmt.emin - fmt.mantissa_bits - 1, fmt.emax + 1, shape)
            return mpt.round(rng.choice((-1.0, 1.0), shape) * np.exp2(exps), fmt.name)
        store = np.dtype(fmt.dtype)
        width = 32 if fmt.name == "tf32" else fmt.bits
        raw = rng.integers(0, 1 << width, shape, dtype=np.uint64).astype(UNSIGNED[store.itemsize])
        return raw.view(store)

    a = np.concatenate([moderate(f_in, (rows, k)), bits(f_in, (rows, k))])          # (2R, K)
    b = np.concatenate([moderate(f_in, (rows, k)), bits(f_in, (rows, k))])          # (2R, K)
    c = np.concatenate([moderate(f_out, (rows,)), bits(f_out, (rows,))])            # (2R,)
    n = 2 * rows
    return ProbeSet(f_in.name, f_out.name, a, b, c, np.full(n, k), ["fresh"] * n,
                    [("fresh", i) for i in range(n)], [""] * n)


@functools.lru_cache(maxsize=None)
def _fresh_bits(model, variant, fin, fout, seed=7):
    """The bits of ``model`` on 192 fresh rows of K = 64 and 32 of K = 256 (kept: the models are
    immutable and several tests compare the same ones)."""
    return np.concatenate([run_model(model, _fresh_inputs(fin, fout, seed + k, k, rows), variant)
                           for k, rows in ((64, 96), (256, 16))])


def _same_bits(model_a, variant_a, model_b, variant_b, fin, fout, seed=7):
    return np.array_equal(_fresh_bits(model_a, variant_a, fin, fout, seed),
                          _fresh_bits(model_b, variant_b, fin, fout, seed))


def _check_recovered(model, variant, ch, tmp_path):
    """Everything a characterization of ``model`` (instruction ``variant``) must say (module
    docstring)."""
    assert ch.pairs and all(p.probed for p in ch.pairs), [p.error for p in ch.pairs]
    for p in ch.pairs:
        cfg = model.config(p.in_format, p.in_format, variant)
        source = Candidate(model, cfg.variant)
        labels = [c.candidate.label for c in p.matches]
        assert source.label in labels, (p.label, labels, p.nearest[:1])
        for c in p.matches:       # every model it names computes what the source computes
            assert _same_bits(model, cfg.variant, c.candidate.model, c.candidate.variant,
                              p.in_format, p.out_format), (p.label, c.candidate.label)
        if model.kind_of(cfg) == "block":
            rounding, e_zero = cfg.output(p.out_format)
            fit = p.fit.params
            assert p.fit.verified, (p.label, p.fit.reason, p.fit.mismatches[:5])
            assert (fit["block"], fit["fraction_bits"], fit["rounding"]) == \
                (cfg.block, cfg.fraction_bits, rounding), p.label
            if fit["e_zero_seen"] == "measured":
                assert fit["e_zero"] == e_zero, p.label
            elif fit["e_zero_seen"] == "bound":
                assert e_zero <= fit["e_zero"], p.label
    assert ch.matches(model) and Candidate(model, "default").model_label in ch.recognised
    own = {s.assumption: s for s in ch.settlements if s.model == model.name}
    for a in model.assumptions:
        assert model.choice(a.name) in own[a.name].consistent, own[a.name]
        if not own[a.name].settled:
            assert "indistinguishable by the outputs of the probed pairs" in own[a.name].text
    assert ch.model is not None
    if all(model.kind_of(model.config(p.in_format, p.in_format, variant)) == "block"
           for p in ch.pairs):
        assert ch.source.startswith("block model")
    path = tmp_path / "characterization.json"
    ch.write(path)
    loaded = load_model(path)
    assert loaded.describe() == ch.model.describe()
    for p in ch.pairs:
        source = model.config(p.in_format, p.in_format, variant).variant
        assert _same_bits(model, source, loaded, ch.variant(p), p.in_format, p.out_format,
                          seed=11), p.label


@pytest.mark.parametrize("name", list(REGISTRY))
def test_recovers_every_registered_model(name, tmp_path):
    model = REGISTRY[name]
    adapter = get_adapter(f"mpt:{name}")
    ch = characterize(adapter)
    assert [(p.in_format, p.out_format) for p in ch.pairs] == list(adapter.pairs())
    _check_recovered(model, None, ch, tmp_path)
    others = [v for v in model.variants if v not in _default_variants(model)]
    text = ch.text()
    assert bool(ch.not_probed) == bool(others) and all(v in text for v in others)


@pytest.mark.parametrize("name, variant", list(_variant_cases()))
def test_recovers_every_instruction_variant(name, variant, tmp_path):
    model = REGISTRY[name]
    ch = characterize(MptAdapter(model, variant))
    _check_recovered(model, variant, ch, tmp_path)
    cfg = model.config(ch.pairs[0].in_format, ch.pairs[0].in_format, variant)
    if model.scaled(cfg):
        assert all("probed with unit scales" in p.note for p in ch.pairs)


#: (model, assumed rule) -> whether the default adapter's probes settle it
SETTLED = {**{(f"cdna{i}", "several_nans"): True for i in range(1, 5)},
           ("cdna4", "accumulation"): True, ("trainium", "pass_order"): True,
           ("trainium_autocast", "pass_order"): True,
           ("trainium_autocast", "auto_cast_result"): True,
           # the zero rule of the block-scaled kinds: none of the default pairs is block-scaled
           ("blackwell", "zero_rule"): False, ("rtx_blackwell", "zero_rule"): False}


@pytest.mark.parametrize("name, choices", list(_choice_cases()))
def test_every_assumed_choice_is_settled_or_reported(name, choices, tmp_path):
    model = REGISTRY[name].configure(**choices)
    ch = characterize(get_adapter(f"mpt:{name}", assume=choices))
    _check_recovered(model, None, ch, tmp_path)
    for s in ch.settlements:
        if s.model == name and (name, s.assumption) in SETTLED:
            assert s.settled == SETTLED[(name, s.assumption)], s.text


@pytest.mark.exhaustive
@pytest.mark.parametrize("name, variant, choices", list(_every_case()))
def test_recovers_every_variant_and_choice_combination(name, variant, choices, tmp_path):
    model = REGISTRY[name].configure(**choices) if choices else REGISTRY[name]
    _check_recovered(model, variant, characterize(MptAdapter(model, variant)), tmp_path)


def test_several_nans_are_told_apart_by_their_payloads():
    """AMD's several_nans: the NaN probes with distinct payloads read "first" or "last"; NVIDIA
    writes one canonical NaN whatever the payloads."""
    found = {}
    for choice in ("first", "last"):
        ch = characterize(get_adapter("mpt:cdna3", assume={"several_nans": choice}),
                          [("fp16", "fp32")])
        found[choice] = ch.pairs[0].findings["nans"]
        assert [s.consistent for s in ch.settlements if s.model == "cdna3"] == [(choice,)]
    assert set(found["first"].value.values()) == {"first"}
    assert set(found["last"].value.values()) == {"last"}
    ch = characterize(get_adapter("mpt:hopper"), [("fp16", "fp32")])
    assert set(ch.pairs[0].findings["nans"].value.values()) == {"same"}
    assert nan_patterns("fp8_e4m3fnuz") == [0x80] and nan_patterns("fp4_e2m1fn") == []


def test_choices_that_no_output_shows_are_reported_as_such():
    """Blackwell's zero rule applies to block-scaled instructions only, and with unit scales no
    zero term reaches the alignment: both choices give the same bits (on fresh inputs too)."""
    for variant in (None, "mxf8f6f4"):
        ch = characterize(MptAdapter(REGISTRY["blackwell"], variant))
        (rule,) = [s for s in ch.settlements if s.model == "blackwell"]
        assert rule.consistent == ("mpt", "mma_sim") and not rule.settled
        assert "zero_rule: mpt or mma_sim - indistinguishable by the outputs of the probed " \
               "pairs" in ch.text()
        for p in ch.pairs:
            v = REGISTRY["blackwell"].config(p.in_format, p.in_format, variant).variant
            assert _same_bits(REGISTRY["blackwell"].configure(zero_rule="mpt"), v,
                              REGISTRY["blackwell"].configure(zero_rule="mma_sim"), v,
                              p.in_format, p.out_format)


def test_long_probes_show_passes_longer_than_the_short_rows():
    ch = characterize(get_adapter("mpt:trainium"), [("bf16", "fp32")])
    assert ch.pairs[0].findings["passes"].value["size"] == 128
    ch = characterize(get_adapter("mpt:hopper"), [("bf16", "fp32")])
    assert ch.pairs[0].findings["passes"].value["size"] == 16


def test_software_configurations_are_probed_through_gemm():
    for name in ("tpu", "trainium_autocast"):
        adapter = get_adapter(f"mpt:{name}")
        ch = characterize(adapter, [("fp32", "fp32")])
        p = ch.pairs[0]
        assert "probed through mpt.gemm" in p.note
        a, b, c = p.probes.a[:64, :64], p.probes.b[:64, :64], p.probes.c[:64]
        want = mpt.gemm(a[:, None, :], b[:, :, None], c[:, None, None], model=name,
                        in_format="fp32").reshape(-1)
        assert np.array_equal(compute(name, a, b, c, "fp32", "fp32").view(np.uint32),
                              want.view(np.uint32))


# ---- faults ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [m.name for m in REGISTRY.values() if m.kind == "block"])
def test_one_bit_of_alignment_less_is_caught_and_named(name, tmp_path):
    model = REGISTRY[name]
    faulty = with_fraction_bits(model, -1)
    ch = characterize(get_adapter(f"mpt:{name}", fault=-1), expect=name)
    assert not ch.matches(name)
    text = ch.text()
    for p in ch.pairs:
        f = model.config(p.in_format, p.in_format).fraction_bits
        if f is None:                     # an FP64 instruction: no alignment, no fault
            assert name in [c.candidate.model.name for c in p.matches]
            continue
        assert p.fit.verified and p.fit.params["fraction_bits"] == f - 1, p.label
        comparison = ch.comparison(p, name)
        assert comparison.mismatches.size > 0
        assert f"fraction_bits: measured {f - 1}, {comparison.candidate.label} has {f}" in \
            p.parameter_differences(comparison)
        for d in p.differences(comparison):
            assert d.adapter != d.model and d.probe in text
    assert "fraction_bits: measured" in text
    _check_fault_model(faulty, ch, tmp_path)


def test_one_bit_of_alignment_less_is_caught_on_gaudi2(tmp_path):
    """A non-NVIDIA unit: Gaudi 2's MME adds C exactly (no block model), so the difference is
    named by the nearest registered configuration with F changed."""
    faulty = with_fraction_bits("gaudi2", -1)
    ch = characterize(MptAdapter(faulty), expect="gaudi2")
    assert not ch.matches("gaudi2") and "reproduced by gaudi2 with fraction_bits" in ch.verdict
    for p in ch.pairs:
        f = REGISTRY["gaudi2"].config(p.in_format, p.in_format).fraction_bits
        comparison = ch.comparison(p, "gaudi2")
        assert comparison.mismatches.size > 0 and p.family is not None
        assert p.parameter_differences(comparison) == \
            [f"fraction_bits: measured {f - 1}, gaudi2 has {f}"]
    assert "fraction_bits: measured 45, gaudi2 has 46" in ch.text()
    _check_fault_model(faulty, ch, tmp_path)


def _check_fault_model(faulty, ch, tmp_path):
    """The model composed for a faulty unit computes what the faulty unit computes."""
    assert ch.model is not None
    path = tmp_path / "fault.json"
    ch.write(path)
    loaded = load_model(path)
    for p in ch.pairs:
        assert _same_bits(faulty, None, loaded, ch.variant(p), p.in_format, p.out_format), \
            p.label


# ---- the published vectors -------------------------------------------------------------------

DOCUMENTED = [   # (model, input, output, vector, result bits): docs/tensor_cores.md §3, D1–D5
    ("volta", "fp16", "fp32", "V1", "38ff8000"), ("ampere", "fp16", "fp32", "V1", "38ffc000"),
    ("hopper", "fp16", "fp32", "V1", "38ffe000"), ("volta", "fp16", "fp32", "V2", "00000000"),
    ("ampere", "fp16", "fp32", "V2", "bf000000"), ("hopper", "fp16", "fp32", "V2", "bf400000"),
    ("volta", "fp16", "fp32", "V3", "38400000"), ("ampere", "fp16", "fp32", "V3", "38000000"),
    ("hopper", "fp16", "fp32", "V3", "00000000"), ("ada", "fp8_e4m3fn", "fp32", "V4", "3f800000"),
    ("blackwell", "fp8_e4m3fn", "fp32", "V4", "3f800008"),
    ("hopper", "fp8_e4m3fn", "fp32", "V4b", "3a800000"),
    ("blackwell", "fp8_e4m3fn", "fp32", "V4b", "3a802000"),
    ("volta", "fp16", "fp16", "V5", "3c01"), ("ampere", "fp16", "fp16", "V6b", "6402"),
    ("ampere", "fp16", "fp16", "V6c", "7c00"), ("hopper", "bf16", "fp32", "V7b", "7f7fffff"),
    ("ampere", "tf32", "fp32", "V9", "3f800000"), ("ampere", "tf32", "fp32", "V9n", "7f800000"),
    ("volta", "fp16", "fp32", "F10", "34000000"), ("ampere", "fp16", "fp32", "F10", "33800000"),
    ("volta", "fp16", "fp32", "F11", "3f800001"), ("turing", "fp16", "fp32", "F11t", "3f800001"),
    ("volta", "fp16", "fp32", "F12", "34000000"), ("ampere", "fp16", "fp32", "F12", "00000000"),
    ("hopper", "bf16", "fp32", "D1", "03800000"), ("hopper", "bf16", "fp32", "D2", "00000002"),
    ("ampere", "fp16", "fp32", "D3", "00800001"), ("hopper", "fp16", "fp16", "D4", "8000"),
    ("ampere", "fp16", "fp16", "D5", "0000"),
]


@pytest.mark.parametrize("model, fin, fout, vector, want", DOCUMENTED,
                         ids=[f"{m}-{v}-{i}-{o}" for m, i, o, v, _ in DOCUMENTED])
def test_spec_vectors_give_the_documented_answers(model, fin, fout, vector, want):
    ch = characterize(get_adapter(f"mpt:{model}"), [(fin, fout)])
    got = {name: bits for name, bits, _ in ch.pairs[0].spec_results()}
    assert got[vector] == want


def test_zero_rule_vectors_are_read_as_mpts_rule():
    ch = characterize(get_adapter("mpt:hopper"), [("bf16", "fp32"), ("fp16", "fp16")])
    meanings = {n: m for p in ch.pairs for n, _, m in p.spec_results() if n.startswith("D")}
    assert meanings == {"D1": "as mpt's zero rule on Hopper (e_zero, signed zeros kept)",
                        "D2": "as mpt's zero rule on Hopper (e_zero, signed zeros kept)",
                        "D4": "as mpt's zero rule on Hopper (e_zero, signed zeros kept)",
                        "D5": "as mpt's zero rule on Ampere (e_zero, signed zeros kept)"}
    assert ch.pairs[0].findings["zeros"].value["e_zero"] == -133


# ---- the probes and the adapters ---------------------------------------------------------------

INPUT_FORMATS = sorted({f for m in mpt.mma_models().values() for c in m.configs
                        for f in c.inputs})


@pytest.mark.parametrize("fmt", INPUT_FORMATS)
def test_products_are_factored_exactly(fmt):
    """Every product a probe asks for comes back as two values of the format whose product is
    exactly m·2^e, or as None when no two values of the format make it."""
    lo, hi = get_format(fmt).emin - get_format(fmt).mantissa_bits, get_format(fmt).emax
    found = 0
    for m in (1, -1, 3, -3, 5, 9, 15):
        for e in range(2 * lo - 4, 2 * hi + 5):
            pair = factor(m, e, fmt)
            if pair is None:
                continue
            found += 1
            a, b = pair
            assert exact_in(a, fmt) and exact_in(b, fmt)
            assert Fraction(a) * Fraction(b) == m * Fraction(2) ** e
    assert found >= 8
    assert factor(1, 2 * hi + 1, fmt) is None and factor(1, 2 * lo - 1, fmt) is None


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8_e4m3fn", "fp4_e2m1fn"])
def test_c_prefix_sums_to_c_exactly(fmt):
    rng = np.random.default_rng(3)
    formed = 0
    for c in [2.0**-13 - 2.0**-24, 1 + 2.0**-20, -3.0, 0.75, 6.0, 2.0**23] + \
            list(rng.standard_normal(40).astype(np.float32).astype(float)):
        prefix = c_prefix(c, fmt)
        if prefix is None:
            continue
        formed += 1
        assert sum(Fraction(a) * Fraction(b) for a, b in zip(*prefix)) == Fraction(c)
        assert all(exact_in(x, fmt) for x in prefix[0] + prefix[1])
    assert formed >= 2
    assert c_prefix(0.0, fmt) == ([], []) and c_prefix(-0.0, fmt) is None
    assert c_prefix(float("nan"), fmt) is None


def test_torch_adapter_refuses_clearly_without_a_gpu():
    with pytest.raises((ImportError, ValueError), match="torch|GPU"):
        get_adapter("torch:cuda")
    with pytest.raises(ValueError, match="adapter must be"):
        get_adapter("cuda")
    with pytest.raises(ValueError, match="unknown MMA model"):
        get_adapter("mpt:no-such-gpu")


class _FakeTensor:
    """Just enough of a torch tensor for the torch adapter, over a numpy array."""

    def __init__(self, array):
        self.array = np.asarray(array)

    @property
    def shape(self):
        return self.array.shape

    def to(self, device):
        return self

    def contiguous(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.array

    def view(self, dtype):
        return _FakeTensor(self.array.view(dtype))

    def t(self):
        return _FakeTensor(self.array.T)

    def __getitem__(self, index):
        return _FakeTensor(self.array[index])


def _fake_torch(model):
    """A stand-in for PyTorch on a GPU whose matrix unit is ``model``: bmm and _scaled_mm
    compute D[0, 0] of each tile with mpt.mma (the only element the adapter reads)."""
    flags = SimpleNamespace(allow_tf32=False, allow_fp16_reduced_precision_reduction=True,
                            allow_bf16_reduced_precision_reduction=True)

    def fmt(x):
        if x.array.dtype == np.float32:
            assert flags.allow_tf32, "an fp32 GEMM must be routed to TF32"
            return "tf32"
        return get_format(x.array.dtype).name

    def bmm(a, b, out_dtype=None):
        assert fmt(a) == "tf32" or out_dtype == np.float32
        assert not flags.allow_fp16_reduced_precision_reduction
        return _FakeTensor(mpt.mma(a.array[:, :1, :], b.array[:, :, :1], model=model,
                                   in_format=fmt(a)))

    def scaled_mm(a, b, scale_a, scale_b, out_dtype, use_fast_accum):
        assert scale_a == scale_b == 1 and out_dtype == np.float32 and use_fast_accum
        return _FakeTensor(mpt.mma(a.array[:1, :], b.array[:, :1], model=model,
                                   in_format=fmt(a)))

    props = SimpleNamespace(name="fake GPU", major=9, minor=0)
    cuda = SimpleNamespace(is_available=lambda: True, get_device_properties=lambda d: props,
                           get_device_capability=lambda d: (9, 0), synchronize=lambda d: None)
    return SimpleNamespace(
        cuda=cuda, version=SimpleNamespace(hip=None), device=lambda d: d,
        backends=SimpleNamespace(cuda=SimpleNamespace(matmul=flags)),
        from_numpy=_FakeTensor, bmm=bmm, _scaled_mm=scaled_mm,
        stack=lambda xs: _FakeTensor(np.stack([x.array for x in xs])),
        ones=lambda shape, dtype, device: 1.0,
        float16=np.dtype(np.float16), bfloat16=np.dtype(ml_dtypes.bfloat16),
        float32=np.dtype(np.float32), float8_e4m3fn=np.dtype(ml_dtypes.float8_e4m3fn),
        float8_e5m2=np.dtype(ml_dtypes.float8_e5m2)), flags


def test_torch_adapter_recovers_the_matrix_unit_behind_a_fake_torch(monkeypatch):
    """The torch adapter's plumbing — tiles, the 64-product prefix that carries c, the device
    check of each prefix, the flags — on a stand-in torch whose 'GPU' is mpt's Hopper model.
    (It is not a test of PyTorch, which has never run this adapter.)"""
    fake, flags = _fake_torch("hopper")
    monkeypatch.setitem(sys.modules, "torch", fake)
    adapter = get_adapter("torch:cuda")
    assert adapter.pairs() == (("fp16", "fp32"), ("bf16", "fp32"), ("tf32", "fp32"),
                               ("fp8_e4m3fn", "fp32"), ("fp8_e5m2", "fp32"))
    ch = characterize(adapter)
    assert ch.matches("hopper") and ch.source.startswith("block model")
    bf16 = ch.pairs[1]
    assert bf16.fit.params == {"block": 16, "fraction_bits": 25, "rounding": "rz_fp32",
                               "e_zero": -133, "e_zero_seen": "measured"}
    assert "sign[cancel_neg_c]" in bf16.not_run          # c = -0 cannot come from a prefix
    assert {c.evidence for c in ch.model.configs} == {"hardware-verified"}
    assert (flags.allow_tf32, flags.allow_fp16_reduced_precision_reduction) == (False, True)


class _Refuses(MptAdapter):
    """An adapter that cannot compute one pair, and rejects probes with a non-zero c."""

    def run(self, a, b, c, in_format, out_format):
        if out_format == "fp16":
            raise NotImplementedError("no FP16 output on this device")
        return super().run(a, b, c, in_format, out_format)

    def accepts(self, a, b, c, in_format, out_format):
        return np.asarray(c, np.float64) == 0


def test_unprobed_pairs_and_rejected_rows_are_reported():
    ch = characterize(_Refuses(mpt.get_mma_model("ampere")), [("fp16", "fp32"), ("fp16", "fp16")])
    kept, refused = ch.pairs
    assert refused.error == "not probed: no FP16 output on this device"
    assert kept.not_run and all(n in kept.probes.names for n in ["align_p[1]"])
    assert "ampere" in [c.candidate.label for c in kept.matches]
    text = ch.text()
    assert "fp16 -> fp16: not probed" in text and "more the adapter cannot run" in text


class _Backwards(MptAdapter):
    """A matrix unit that chains its blocks from the last k to the first."""

    def run(self, a, b, c, in_format, out_format):
        return super().run(a[:, ::-1], b[:, ::-1], c, in_format, out_format)


def test_block_order_is_read_from_the_fprev_probes():
    ch = characterize(_Backwards(mpt.get_mma_model("hopper")), [("bf16", "fp32")])
    (p,) = ch.pairs
    assert p.findings["summation"].value == {"tree": "chain_down", "size": 16,
                                             "source": "fprev", "c_first": True}
    assert not p.matches and p.fit.reason.endswith("in increasing k")
    assert ch.model is None and "no model reproduces every probe" in ch.verdict


def _assumed_model(n_assumptions=1):
    """Ampere's fp16 configuration with assumed rules that change nothing (the block kind reads
    no choices): every combination must match, each under its own label."""
    return MMAModel("assumed", "block", "test model", mpt.get_mma_model("ampere").configs[:1],
                    assumptions=tuple(mpt.Assumption(f"rule{i}", ("x", "y", "z"), "no effect")
                                      for i in range(n_assumptions)))


def test_assumed_rules_are_candidates_under_their_choices(monkeypatch):
    from mpt.engines import model as registry
    model = _assumed_model()
    monkeypatch.setitem(registry._MODELS._items, "assumed", model)
    monkeypatch.setitem(registry._MODELS._keys, "assumed", model)
    ch = characterize(MptAdapter(model.configure(rule0="y")), [("fp16", "fp32")])
    labels = [c.candidate.label for c in ch.pairs[0].matches]
    assert {"assumed{rule0=x}", "assumed{rule0=y}", "assumed{rule0=z}"} <= set(labels)
    assert ch.recognised[-3:] == ["assumed{rule0=x}", "assumed{rule0=y}", "assumed{rule0=z}"]
    assert [dict(c) for c in choice_sets(_assumed_model(3))] == \
        [{}, {"rule0": "y"}, {"rule0": "z"}, {"rule1": "y"}, {"rule1": "z"}, {"rule2": "y"},
         {"rule2": "z"}]          # 27 combinations > MAX_COMBINATIONS: defaults, then each alone


# ---- the JSON model ------------------------------------------------------------------------------

def test_model_descriptions_round_trip():
    """Every model and choice of its assumed rules comes back from JSON with the same
    configurations and the same choices in effect (a default choice is not stored as set)."""
    for model in mpt.mma_models().values():
        for choices in choice_sets(model):
            configured = model.configure(**choices) if choices else model
            back = MMAModel.from_dict(json.loads(json.dumps(configured.describe())))
            assert back.configs == configured.configs and back.describe() == configured.describe()
            assert Candidate(back, "default").choices == Candidate(configured, "default").choices


def test_load_model_reads_descriptions_and_refuses_bad_files(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(mpt.get_mma_model("volta").describe()))
    assert load_model(path) == mpt.get_mma_model("volta")
    path.write_text(json.dumps({"schema": "mpt-characterization/1", "model": None,
                                "verdict": "no model reproduces every probe"}))
    with pytest.raises(ValueError, match="found no MMA model"):
        load_model(path)
    bad = mpt.get_mma_model("volta").describe()
    del bad["configs"][0]["block"]
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"configs\[0\]\.block is missing"):
        load_model(path)


# ---- the command ---------------------------------------------------------------------------------

def test_cli_characterizes_and_writes_a_loadable_model(tmp_path, capsys):
    out = tmp_path / "ampere.json"
    assert main(["characterize", "--adapter", "mpt:a100", "--pair", "tf32:fp32", "--out",
                 str(out), "--expect", "ampere"]) == 0
    text = capsys.readouterr().out
    assert "L = 4, F = 24, rz_fp32, e_zero = -132: reproduces every probe" in text
    assert "matches       ampere, ada" in text
    doc = json.loads(out.read_text())
    assert doc["model"]["configs"][0]["block"] == 4 and doc["recognised"] == ["ampere", "ada"]
    assert doc["pairs"][0]["results"]["V1"] == "38ffc000"
    a = mpt.round(np.array([[1.0, 2.0**-12, 3.0, -1.0]]), "tf32")
    b = mpt.round(np.array([[1.0], [1.0], [2.0**-11], [1.0]]), "tf32")
    assert np.array_equal(mpt.mma(a, b, model=load_model(out), in_format="tf32").view(np.uint32),
                          mpt.mma(a, b, model="ampere", in_format="tf32").view(np.uint32))


def test_cli_names_the_fault(capsys):
    assert main(["characterize", "--adapter", "mpt:hopper", "--fault", "F-1", "--pair",
                 "bf16:fp32", "--expect", "hopper", "--max-differences", "3"]) == 1
    text = capsys.readouterr().out
    assert "fraction_bits: measured 24, hopper has 25" in text
    assert "more (all in the JSON)" in text


def test_cli_bad_input_is_one_line(capsys):
    assert main(["characterize", "--adapter", "mpt:hopper", "--pair", "fp16"]) == 2
    assert main(["characterize", "--adapter", "mpt:hopper", "--pair", "fp64:fp32"]) == 2
    assert main(["characterize", "--adapter", "mpt:ieee_fma", "--fault", "F-1"]) == 2
    assert main(["characterize", "--adapter", "torch:cuda"]) == 2     # no PyTorch / no GPU here
    assert main(["characterize", "--adapter", "mpt:cdna3", "--variant", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all(line.startswith("mpt characterize: error:") for line in err)
    assert "variant must be one of 'v_mfma_f32_32x32x8_f16'" in err[-1]
