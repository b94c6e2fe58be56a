"""``mpt characterize``: the probing method recovers every registered MMA model, catches a fault,
and its JSON runs in ``mpt.mma`` bit for bit.

The registry is read when the tests are collected, so models that other modules register later
(AMD, Gaudi, TPU, Trainium, block-scaled variants) are covered without a change here: each model
× instruction variant × combination of its assumed rules' choices becomes an adapter
(``mpt:<model>``), and its characterization must

* name that exact configuration among the registered models that reproduce every probe, and
  every other model it names must compute the same bits on fresh random inputs (the battery
  tells apart whatever random inputs tell apart);
* for a block model, fit the block model with the preset's L, F and output rounding, and its
  e_zero wherever the formats can show it (else a bound the preset's value meets);
* write JSON that ``mpt.engines.load_model`` turns into a model computing the same bits as the
  source on fresh random inputs.

A pair that the adapter cannot probe is allowed only for kinds whose instructions take inputs the
adapter protocol does not carry (block scales, keyword options), and it must be reported.
Oracles: the source model itself (through ``mpt.mma``), the published test vectors and zero-rule
answers of docs/tensor_cores.md and docs/accelerators.md.
"""
import json
import sys
from fractions import Fraction
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

import mpt
from mpt.characterize import (MptAdapter, characterize, get_adapter, with_fraction_bits)
from mpt.characterize.adapters import c_prefix
from mpt.characterize.fit import run_model
from mpt.characterize.match import Candidate, choice_sets
from mpt.characterize.probes import ProbeSet, exact_in, factor
from mpt.cli import main
from mpt.engines import MMAModel, load_model
from mpt.engines.operands import operands_class
from mpt.formats import UNSIGNED, get_format


def _registry_cases():
    for model in mpt.mma_models().values():
        for variant in model.variants:
            for choices in choice_sets(model):
                label = model.name + ("" if variant == "default" else f"[{variant}]") + \
                    "".join(f",{k}={v}" for k, v in choices.items())
                yield pytest.param(model.name, variant, choices, id=label)


def _block_cases():
    for model in mpt.mma_models().values():
        if model.kind == "block":
            for variant in model.variants:
                yield pytest.param(model.name, variant, id=f"{model.name}[{variant}]")


def _fresh_inputs(fin: str, fout: str, seed: int) -> ProbeSet:
    """Random probes the battery never saw: 96 rows of moderate values (exponents in [-6, 6])
    and 96 of uniformly random bit patterns (any exponent, subnormals, zeros, Inf, NaN), K = 64."""
    rng = np.random.default_rng(seed)
    k, rows = 64, 96
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


def _same_bits(model_a, variant_a, model_b, variant_b, fin, fout, seed=7):
    fresh = _fresh_inputs(fin, fout, seed)
    return np.array_equal(run_model(model_a, fresh, variant_a),
                          run_model(model_b, fresh, variant_b))


@pytest.mark.parametrize("name, variant, choices", list(_registry_cases()))
def test_recovers_every_registered_model(name, variant, choices, tmp_path):
    model = mpt.get_mma_model(name)
    model = model.configure(**choices) if choices else model
    adapter = MptAdapter(model, variant)
    ch = characterize(adapter)
    assert [(p.in_format, p.out_format) for p in ch.pairs] == list(adapter.pairs())
    source = Candidate(model, variant)
    for p in ch.pairs:
        if not p.probed:
            kind = operands_class(model.kind_of(model.config(p.in_format, p.in_format, variant)))
            assert kind.SCALES or kind.OPTIONS, f"{p.label} not probed: {p.error}"
            assert p.error in ch.text()
            continue
        labels = [c.candidate.label for c in p.matches]
        assert source.label in labels, (p.label, labels, p.nearest[:1])
        for c in p.matches:       # every model it names computes what the source computes
            assert _same_bits(model, variant, c.candidate.model, c.candidate.variant,
                              p.in_format, p.out_format), (p.label, c.candidate.label)
        cfg = model.config(p.in_format, p.in_format, variant)
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
    probed = [p for p in ch.pairs if p.probed]
    if not probed:
        return
    assert ch.matches(model) and ch.model is not None
    if all(model.kind_of(model.config(p.in_format, p.in_format, variant)) == "block"
           for p in probed):        # (a Tensor Core model with FP64 instructions is not one)
        assert ch.source.startswith("block model")
    path = tmp_path / "characterization.json"
    ch.write(path)
    loaded = load_model(path)
    assert loaded.describe() == ch.model.describe()
    loaded_variant = None if ch.source.startswith("block model") else variant
    for p in probed:
        assert _same_bits(model, variant, loaded, loaded_variant, p.in_format, p.out_format,
                          seed=11), p.label


@pytest.mark.parametrize("name, variant", list(_block_cases()))
def test_one_bit_of_alignment_less_is_caught_and_named(name, variant):
    model = mpt.get_mma_model(name)
    faulty = with_fraction_bits(model, -1)
    ch = characterize(MptAdapter(faulty, variant), expect=name)
    assert not ch.matches(name)
    text = ch.text()
    for p in ch.pairs:
        f = model.config(p.in_format, p.in_format, variant).fraction_bits
        assert p.fit.verified and p.fit.params["fraction_bits"] == f - 1, p.label
        comparison = ch.comparison(p, name)
        assert comparison.mismatches.size > 0
        assert f"fraction_bits: measured {f - 1}, {comparison.candidate.label} has {f}" in \
            p.parameter_differences(comparison)
        for d in p.differences(comparison):
            assert d.adapter != d.model and d.probe in text
    assert "fraction_bits: measured" in text


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
    for model in mpt.mma_models().values():
        for choices in choice_sets(model):
            configured = model.configure(**choices) if choices else model
            assert MMAModel.from_dict(json.loads(json.dumps(configured.describe()))) == configured


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
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("mpt characterize: error:") for line in err)
