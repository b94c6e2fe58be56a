"""The TPU, Gaudi and Trainium targets, their recipes, their conversion rules and training on
them.

The engines are tested against their oracles in test_engines_tpu.py, test_mme.py and
test_engines_trainium.py; here: each target's data and labels, which recipes a target runs and
how they resolve, the conversion rules of op results (the TPU's flush, Trainium's stochastic
rounding), the Linear layers of the Gaudi FP8 and Trainium auto-cast recipes against the same
``mpt.gemm`` calls composed by hand, and ``mpt study`` on every new target.
"""
import math

import ml_dtypes
import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt.amp.inc import inc_quantize
from mpt.amp.linear import PlanLinear
from mpt.amp.recipes import get_recipe, recipes_for
from mpt.autograd.context import replay, snapshot
from mpt.autograd.conversion import ConversionRules, conversion_rules
from mpt.autograd.tensor import round_to
from mpt.cli import main
from mpt.nn import GPT, Linear
from mpt.targets import get_target
from mpt.train.trainer import TrainConfig, Trainer

NEW = ("tpu", "gaudi2", "gaudi3", "trn1", "trn2")
BF16 = mpt.get_format("bf16")


def _u(x):
    x = np.asarray(x)
    return x.view({2: np.uint16, 4: np.uint32}[x.itemsize])


# ---- targets --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, fmt, model", [
    ("tpu", "bf16", "tpu"), ("tpu-v5e", "fp32", "tpu"),
    ("gaudi2", "fp32", "gaudi2"), ("gaudi2", "tf32", "gaudi2"), ("gaudi2", "fp16", "gaudi2"),
    ("gaudi2", "gaudi_e4m3_b11_full", "gaudi2"), ("gaudi3", "fp8_e4m3fn", "gaudi3"),
    ("gaudi3", "gaudi_e5m2_b20_none", "gaudi3"), ("trn1", "fp32", "trainium"),
    ("trn2", "cfp8_e3m4", "trainium"), ("trn2", "bf16", "trainium"),
])
def test_mma_model_per_format(name, fmt, model):
    """Every GEMM format of a chip runs on its engine (fp32 included: the MME, the PE array, a
    TPU f32 dot); every 8-bit float counts as fp8."""
    assert get_target(name).mma_model(fmt) == model


def test_tpu_has_no_fp16_or_fp8_path():
    with pytest.raises(ValueError, match="target 'tpu' has no MMA model for fp16"):
        get_target("tpu").mma_model("fp16")
    assert get_target("tpu").fp8 is None


def test_labels_formats_and_conversion_rules():
    tpu, g2, g3, trn = (get_target(t) for t in ("tpu", "gaudi2", "gaudi3", "trn2"))
    assert tpu.evidence_by_format() == {"fp32": "reference model", "bf16": "assumption"}
    assert (tpu.evidence, g2.evidence, g3.evidence, trn.evidence) == (
        "assumption", "reference model", "reference model", "documented")
    assert tpu.conversions.flush_subnormals == ("bf16",)
    assert [a.name for a in tpu.conversions.assumptions] == ["bf16_flush"]
    assert g2.fp8 == ("gaudi_e4m3_b7_full", "gaudi_e4m3_b7_full")
    assert g3.fp8 == ("fp8_e4m3fn", "fp8_e5m2")
    assert g3.conversions.stochastic_rounding == "lfsr" and len(g3.conversions.modes) == 7
    assert [a.name for a in g3.conversions.assumptions] == ["lfsr_polynomial", "lfsr_seeds"]
    assert trn.fp8 == ("cfp8_e4m3", "cfp8_e5m2") and trn.software_models == ("trainium_autocast",)
    assert trn.conversions.stochastic_rounding == "philox"
    assert [a.name for a in trn.conversions.assumptions] == ["sr_source", "cfp8_specials"]


def test_every_label_comes_from_the_model_registry_and_is_listed(capsys):
    """A target's label per format is the weakest label of the registered configurations that
    run it; `mpt targets` prints each target with them, and `mpt models` each model's
    assumptions."""
    models = mpt.mma_models()
    for name in NEW:
        target = get_target(name)
        for fmt, label in target.evidence_by_format().items():
            model = models[dict(target.mma)[fmt]]
            assert label in {c.evidence for c in model.configs}
    assert main(["targets"]) == 0
    printed = capsys.readouterr().out
    for name in NEW:
        target = get_target(name)
        line = next(row for row in printed.splitlines() if row.startswith(name + " "))
        assert all(label in line for label in target.evidence_by_format().values())
    assert main(["models"]) == 0
    printed = capsys.readouterr().out
    for rule in ("inner (", "decomposition (xla or triton)", "pass_order (sequential_fma",
                 "auto_cast_result (fp32 or cast)"):
        assert rule in printed


# ---- recipes --------------------------------------------------------------------------------

def test_recipes_each_target_runs():
    """The portable recipes whose formats and FP8 path a chip has, then its own."""
    generic = ["fp32", "tf32", "fp16-amp", "fp16-o2", "bf16-amp", "bf16-o2", "bf16-pure",
               "bf16-pure-sr", "fp16-noscale"]
    assert recipes_for("tpu") == ["fp32", "bf16-amp", "bf16-o2", "bf16-pure", "bf16-pure-sr",
                                  "tpu-bf16"]
    assert recipes_for("gaudi2") == generic + ["gaudi2-fp8"]           # no OCP FP8 on Gaudi 2
    assert recipes_for("gaudi3") == generic + ["fp8-hybrid", "gaudi3-fp8"]
    for trn in ("trn1", "trn2"):
        assert recipes_for(trn) == generic + ["trn-bf16-autocast", "trn-bf16-sr"]
    assert "tpu-bf16" not in recipes_for("h100") and "gaudi3-fp8" not in recipes_for("h100")


def test_recipes_resolve_on_their_targets():
    g3 = get_recipe("gaudi3-fp8")
    assert (g3.inc.chip, g3.inc.model, g3.inc.formats) == ("gaudi3", "gaudi3",
                                                           ("fp8_e4m3fn", "fp8_e5m2"))
    on_g2 = get_recipe("gaudi3-fp8", "gaudi2")
    assert (on_g2.inc.chip, on_g2.inc.formats) == ("gaudi2", ("gaudi_e4m3_b7_full",) * 2)
    assert get_recipe("fp8-hybrid", "gaudi3").fp8.model == "gaudi3"   # TE's formats on the MME
    # an explicit compiler mode survives a move to a chip that offers it, not to another
    assert get_recipe("trn-bf16-autocast", "trn1").matmul_model == "trainium_autocast"
    assert get_recipe("trn-bf16-autocast", "h100").matmul_model == "ieee_fma"
    assert get_recipe("tpu-bf16").matmul_model == "tpu"
    with pytest.raises(ValueError, match="Intel Neural Compressor's Gaudi FP8 scales"):
        get_recipe("gaudi2-fp8", "h100")
    with pytest.raises(ValueError, match="cast_rounding='stochastic' needs a target"):
        get_recipe("trn-bf16-sr", "h100")
    with pytest.raises(ValueError, match="does not take inputs"):
        get_recipe("fp8-hybrid", "gaudi2")
    with pytest.raises(ValueError, match="does not take inputs"):
        get_recipe("fp8-hybrid", "trn2")
    with pytest.raises(ValueError, match="got fp8 and inc"):
        get_recipe("gaudi3-fp8").replace(fp8=get_recipe("fp8-hybrid").fp8)


# ---- conversion rules -----------------------------------------------------------------------

def test_tpu_flush_applies_to_op_results():
    """Under the TPU's rule a subnormal bf16 result is flushed (sign kept); RNE otherwise."""
    x = np.array([2.0**-130, -2.0**-131, 1 + 2.0**-9, 3.0], np.float32)
    plain = _u(round_to(x, BF16))
    with conversion_rules(ConversionRules(flush_subnormals=("bf16",))):
        flushed = _u(round_to(x, BF16))
        t = mpt.tensor(np.array([2.0**-65], np.float32), "bf16")
        product = _u((t * t).data)                                   # 2^-130: subnormal
    assert plain.tolist()[:2] != [0x0000, 0x8000]
    assert flushed.tolist() == [0x0000, 0x8000] + plain.tolist()[2:]
    assert product.tolist() == [0x0000]


def test_stochastic_rounding_streams():
    """Conversion n of step s uses Philox stream 2^63 | s·2^32 | n with the rules' seed; the
    count is replayed by a context snapshot (what checkpointing recomputes with)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4096).astype(np.float32)
    rules = ConversionRules(stochastic=("bf16",), seed=11, step=3)

    def want(n):
        return _u(mpt.round(x, "bf16", "stochastic", seed=11, stream=(1 << 63) | (3 << 32) | n))
    with conversion_rules(rules):
        first = _u(round_to(x, BF16))
        snap = snapshot()
        second = _u(round_to(x, BF16))
        with replay(snap):
            again = _u(round_to(x, BF16))
        third = _u(round_to(x, BF16))
        away = _u(round_to(x, BF16, "nearest_away"))                 # other modes are kept
    for got, n in ((first, 0), (second, 1), (again, 1), (third, 2)):
        np.testing.assert_array_equal(got, want(n))
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(away, _u(mpt.round(x, "bf16", "nearest_away")))


# ---- the Linear layers of the recipes ------------------------------------------------------

def _linear(seed=0, n_in=40, n_out=24):
    lin = Linear(n_in, n_out, format="fp32", seed=seed)
    x = mpt.tensor(np.random.default_rng(seed).standard_normal((6, n_in)) * 3, "fp32")
    return lin, x


@pytest.mark.parametrize("recipe", ["gaudi2-fp8", "gaudi3-fp8"])
def test_inc_linear_is_the_composed_gemms(recipe):
    """PlanLinear under the recipe's plan: the input cast to bf16 (autocast), input and weight
    quantized per tensor by INC's maxabs_hw, the GEMM on the MME with the scales, bias in FP32,
    one rounding to bf16 — equal to the same calls composed by hand; and the dgrad/wgrad use
    the output gradient quantized with maxabs_pow2 in the backward format."""
    r = get_recipe(recipe)
    lin, x = _linear()
    layer = PlanLinear(lin, r.inc.plan())
    fwd, bwd = r.inc.formats
    x.requires_grad = True
    with mpt.autocast(dtype="bf16", model=r.matmul_model):
        y = layer(x)
    xb = mpt.decode(round_to(x.data, BF16))
    qx, sx = inc_quantize(xb, fwd, chip=r.inc.chip, role="activation")
    qw, sw = inc_quantize(lin.weight.data, fwd, chip=r.inc.chip, role="weight")
    acc = mpt.gemm(qx, qw.T, model=r.inc.model, in_format=fwd, scale_a=sx, scale_b=sw)
    want = round_to(acc + lin.bias.data, BF16)
    np.testing.assert_array_equal(_u(y.data), _u(want))
    g = np.random.default_rng(1).standard_normal(y.shape).astype(ml_dtypes.bfloat16)
    y.backward(mpt.Tensor(g))
    qg, sg = inc_quantize(mpt.decode(g), bwd, chip=r.inc.chip, method="maxabs_pow2",
                          role="activation")
    dw = mpt.gemm(qg.T, qx, model=r.inc.model, in_format=(bwd, fwd), scale_a=sg, scale_b=sx)
    np.testing.assert_array_equal(_u(lin.weight.grad.data), _u(dw))


def test_trainium_autocast_linear_and_matmul():
    """Under trn-bf16-autocast every fp32 GEMM (a Linear's, a matmul's) runs trainium_autocast:
    operands RNE to bf16, FP32 PSUM result."""
    r = get_recipe("trn-bf16-autocast")
    lin, x = _linear(2)
    with mpt.matmul_model(r.matmul_model):
        y = lin(x)
        z = F.matmul(x, x.T)
    want = mpt.gemm(x.data, lin.weight.data.T, model="trainium_autocast") + lin.bias.data
    np.testing.assert_array_equal(_u(y.data), _u(want))
    np.testing.assert_array_equal(_u(z.data), _u(mpt.gemm(x.data, x.data.T,
                                                          model="trainium_autocast")))
    bf16 = mpt.gemm(mpt.round(x.data, "bf16"), mpt.round(x.data.T, "bf16"), model="trainium")
    np.testing.assert_array_equal(_u(z.data), _u(bf16))


# ---- training -------------------------------------------------------------------------------

def _train(recipe, seed=0, steps=2):
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 16, (steps, 4, 9))
    backend = "flash" if get_recipe(recipe).flash_attention else "naive"
    net = GPT(16, 16, 1, 2, 8, seed=0, backend=backend)
    trainer = Trainer(net, recipe, TrainConfig(lr=1e-2, seed=seed))
    losses = [trainer.train_step([(idx[s, :, :-1], idx[s, :, 1:])]).loss for s in range(steps)]
    return trainer, losses


@pytest.mark.parametrize("recipe", ["tpu-bf16", "gaudi2-fp8", "gaudi3-fp8", "trn-bf16-autocast",
                                    "trn-bf16-sr"])
def test_recipes_train(recipe):
    """Each recipe trains (finite, falling loss on a repeated batch pair); the Gaudi recipes' Linear
    layers are INC plans; the flash-attention kernels do not run these chips' models."""
    trainer, losses = _train(recipe)
    assert all(math.isfinite(v) for v in losses)
    modules = list(trainer.network.modules())
    plans = [m for m in modules if isinstance(m, PlanLinear)]
    assert bool(plans) == recipe.startswith("gaudi")
    assert not get_recipe(recipe).flash_attention and get_recipe("bf16-amp").flash_attention
    with pytest.raises(ValueError, match="use backend='naive'"):
        Trainer(GPT(16, 16, 1, 2, 8), recipe).train_step([(np.zeros((1, 8), np.int64),) * 2])


def test_trn_sr_is_keyed_by_the_seed():
    """trn-bf16-sr: the same seed gives the same bits, another seed other bits; bf16-pure-sr
    (stochastic updates, RNE ops) differs from it."""
    a, _ = _train("trn-bf16-sr", seed=1)
    b, _ = _train("trn-bf16-sr", seed=1)
    c, _ = _train("trn-bf16-sr", seed=2)
    d, _ = _train(get_recipe("bf16-pure-sr", "trn2"), seed=1)

    def bits(t):
        return np.concatenate([_u(v).ravel().astype(np.uint32)
                               for v in t.network.state_dict().values()])
    assert np.array_equal(bits(a), bits(b))
    assert not np.array_equal(bits(a), bits(c))
    assert not np.array_equal(bits(a), bits(d))


def test_tpu_bf16_is_bf16_o2_on_the_tpu():
    """The TPU's flush is a target rule: tpu-bf16 and bf16-o2 on the tpu target compute the same
    bits (tpu-bf16 is that layout, named for TPU users)."""
    a, la = _train("tpu-bf16", steps=1)
    b, lb = _train(get_recipe("bf16-o2", "tpu"), steps=1)
    assert la == lb
    for k, v in a.network.state_dict().items():
        np.testing.assert_array_equal(_u(v), _u(b.network.state_dict()[k]))


# ---- the study ------------------------------------------------------------------------------

def test_study_configures_every_target():
    """`mpt study --target T` accepts every registered target: its recipes are recipes_for(T)."""
    from mpt.study import StudyConfig
    for name in mpt.targets.targets():
        config = StudyConfig(target=name, quant=False)
        assert config.recipes == tuple(recipes_for(name)) and "fp32" in config.recipes


@pytest.mark.parametrize("target", NEW)
def test_study_runs_on_every_new_target(target):
    """`mpt study --target T` on a tiny configuration: every recipe the target runs."""
    from mpt.study import StudyConfig, run_study
    config = StudyConfig(target=target, steps=2, d_model=16, seq_len=8, batch=4, eval_batches=1,
                         quant=False)
    result = run_study(config)
    assert list(result.runs) == recipes_for(target)
    assert all(math.isfinite(r.final_loss) for r in result.runs.values())


def test_cross_chip_section(tmp_path):
    """`mpt study --compare-targets`: bf16-amp and each chip's own recipes, side by side, in the
    printed table and the report."""
    out = tmp_path / "study"
    assert main(["study", "--recipes", "fp32", "--steps", "2", "--no-quant", "--quiet",
                         "--no-plots", "--out", str(out), "--compare-targets", "h100", "tpu",
                         "gaudi3", "trn2"]) == 0
    report = (out / "report.md").read_text()
    for target, recipe in (("h100", "bf16-amp"), ("tpu", "tpu-bf16"), ("gaudi3", "gaudi3-fp8"),
                           ("trn2", "trn-bf16-autocast"), ("trn2", "trn-bf16-sr")):
        assert any(row.startswith(f"| {target} |") and f"| {recipe} |" in row
                   for row in report.splitlines()), (target, recipe)
