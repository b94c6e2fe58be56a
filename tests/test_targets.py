"""mpt.targets: hardware targets as data, and recipes that take a target."""
import numpy as np
import pytest

import mpt
from mpt.amp.recipes import Recipe, get_recipe
from mpt.targets import Conversions, Target, get_target, targets


def test_every_target_maps_formats_to_registered_models():
    models = mpt.mma_models()
    for target in targets().values():
        for fmt, model in target.mma:
            assert mpt.get_mma_model(model).name in models
        if target.vendor in ("NVIDIA", "any"):
            assert target.mma_model("fp32") == "ieee_fma"   # FP32 GEMMs: CUDA cores / a CPU loop
        if target.vendor == "AMD":                          # the f32 MFMA instructions
            assert target.mma_model("fp32") == target.mma[1][1]


@pytest.mark.parametrize("name, fmt, model", [
    ("v100", "fp16", "volta"), ("a100", "bf16", "ampere"), ("A30", "tf32", "ampere"),
    ("h100", "fp8_e5m2", "hopper"), ("h200", "e4m3", "hopper"), ("b200", "bf16", "blackwell"),
    ("rtx4090", "fp8_e4m3fn", "ada"), ("cpu", "bf16", "ieee_fma"),
    ("mi250x", "bf16", "cdna2"), ("mi210", "fp64", "cdna2"), ("mi300x", "tf32", "cdna3"),
    ("mi325x", "fp8_e4m3fnuz", "cdna3"), ("mi300x", "fp32", "cdna3"), ("mi355x", "e4m3", "cdna4"),
])
def test_mma_model_per_format(name, fmt, model):
    assert get_target(name).mma_model(fmt) == model


def test_unknown_formats_and_targets_are_refused_by_name():
    with pytest.raises(ValueError, match="target 'v100' has no MMA model for bf16 inputs"):
        get_target("v100").mma_model("bf16")
    with pytest.raises(ValueError, match="unknown target 'h300'; valid targets: cpu, v100"):
        get_target("h300")
    with pytest.raises(TypeError, match="target must be a target name or a Target"):
        get_target(3)
    with pytest.raises(ValueError, match="unknown MMA model 'nope'"):
        Target("x", "y", "z", (("bf16", "nope"),))
    with pytest.raises(ValueError, match="evidence must be one of"):
        Conversions(evidence="rumour")


def test_evidence_labels():
    # V100 and A100 configs reproduce the real-GPU samples; H100's FP8 path is MMA-Sim's model.
    assert get_target("v100").evidence == "hardware-verified"
    assert get_target("a100").evidence == "hardware-verified"
    h100 = get_target("h100")
    assert h100.evidence == "reference model"
    assert h100.evidence_by_format() == {"fp32": "documented", "fp16": "hardware-verified",
                                         "bf16": "hardware-verified",
                                         "tf32": "hardware-verified", "fp8": "reference model"}
    assert get_target("cpu").evidence == "documented"
    assert h100.describe()["evidence_by_format"]["fp8"] == "reference model"


def test_recipes_take_their_models_from_the_target():
    assert get_recipe("bf16-amp").matmul_model == "hopper"            # the default target: h100
    assert get_recipe("bf16-amp", target="b200").matmul_model == "blackwell"
    assert get_recipe("fp32", target="a100").matmul_model == "ieee_fma"
    fp8 = get_recipe("fp8-hybrid", target="l40s")
    assert (fp8.target, fp8.matmul_model, fp8.fp8.model) == ("l40s", "ada", "ada")
    assert fp8.fp8.scaling.format_for("forward").name == "fp8_e4m3fn"
    with pytest.raises(ValueError, match="uses FP8 GEMMs, which target 'a100' does not have"):
        get_recipe("fp8-hybrid", target="a100")
    # an explicit model overrides the target; for_target replaces it by the new target's
    custom = Recipe("c", "d", compute_format="bf16", autocast=True, matmul_model="ampere")
    assert custom.matmul_model == "ampere" and custom.for_target("b200").matmul_model == \
        "blackwell"
    assert get_recipe("bf16-amp").describe()["target"] == "h100"


def test_a_recipe_on_a_target_trains_as_the_explicit_model():
    def trained(recipe):
        """The parameter bits after two steps."""
        model = mpt.nn.GPT(vocab=16, d_model=32, n_layers=1, n_heads=2, seq_len=8, seed=1)
        trainer = mpt.Trainer(model, recipe, mpt.TrainConfig(lr=1e-2))
        idx = np.random.default_rng(0).integers(0, 16, (4, 8))
        for _ in range(2):
            trainer.train_step([(idx, idx)])
        return np.concatenate([p.data.view(np.uint32).ravel() for p in model.parameters()])

    on_target = trained(get_recipe("bf16-amp", target="a100"))
    assert np.array_equal(on_target, trained(get_recipe("bf16-amp").replace(matmul_model="ampere")))
    # the check can fail: hopper's blocks of 16 (F=25) round differently from ampere's 8 (F=24)
    assert not np.array_equal(on_target, trained(get_recipe("bf16-amp")))


def test_docs_tables_match_the_registries():
    """docs/targets.md shows `mpt targets --markdown` and `mpt models --markdown` verbatim."""
    import pathlib

    from mpt._tables import markdown_table
    from mpt.engines import models_table_rows
    from mpt.targets import targets_table_rows

    page = (pathlib.Path(__file__).parents[1] / "docs" / "targets.md").read_text()
    for rows in (targets_table_rows(), models_table_rows()):
        assert markdown_table(rows) in page, "regenerate docs/targets.md (mpt targets --markdown)"


def test_cli_lists_models_and_targets(capsys):
    from mpt.cli import main

    assert main(["targets"]) == 0 and "h100" in capsys.readouterr().out
    assert main(["models", "--json"]) == 0
    import json
    models = json.loads(capsys.readouterr().out)
    assert {m["name"]: m["evidence"] for m in models}["volta"] == "hardware-verified"


# ---- AMD --------------------------------------------------------------------------------------

def test_amd_targets_fp8_flavours_and_evidence():
    assert get_target("mi250x").fp8 is None
    assert get_target("mi300x").fp8 == ("fp8_e4m3fnuz", "fp8_e5m2fnuz")
    assert get_target("mi355x").fp8 == ("fp8_e4m3fn", "fp8_e5m2")
    assert get_target("mi300x").evidence == "reference model"
    assert get_target("mi355x").evidence == "assumption"        # CDNA4's arithmetic is assumed
    with pytest.raises(ValueError, match="target 'mi250x' has no MMA model for tf32 inputs"):
        get_target("mi250x").mma_model("tf32")                   # no xf32 before CDNA3
    with pytest.raises(ValueError, match="uses FP8 GEMMs, which target 'mi250x' does not have"):
        get_recipe("fp8-hybrid", target="mi250x")


def test_fp8_recipe_on_mi300x_uses_fnuz_formats_and_cdna3():
    """Transformer Engine on MI300: E4M3FNUZ forward (max 240), E5M2FNUZ backward (max 57344),
    delayed scaling to those maxima, the FP8 GEMMs on CDNA3's fp8 instructions with promotion
    every 128 products (a multiple of their K); the rest under bf16 autocast on CDNA3."""
    recipe = get_recipe("fp8-hybrid", target="mi300x")
    assert (recipe.matmul_model, recipe.fp8.model, recipe.fp8.scaling.flavour) == \
        ("cdna3", "cdna3", "fnuz")
    forward, backward = (recipe.fp8.scaling.format_for(r) for r in ("forward", "backward"))
    assert (forward.name, forward.max, backward.name, backward.max) == \
        ("fp8_e4m3fnuz", 240.0, "fp8_e5m2fnuz", 57344.0)
    state = recipe.fp8.scaling.state("forward")
    state.observe(np.array([-3.0, 1.0], np.float32))
    assert state.update() == np.float32(80.0)                   # f32(240 / 3)
    assert get_recipe("bf16-amp", target="mi300x").matmul_model == "cdna3"
    ocp = get_recipe("fp8-hybrid", target="mi355x")
    assert (ocp.fp8.model, ocp.fp8.scaling.format_for("forward").max) == ("cdna4", 448.0)


def _gpt(backend):
    return mpt.nn.GPT(vocab=16, d_model=32, n_layers=1, n_heads=2, seq_len=8, seed=1,
                      backend=backend)


def _train(recipe, backend="naive", steps=2):
    network = _gpt(backend)
    trainer = mpt.Trainer(network, recipe, mpt.TrainConfig(lr=1e-2))
    idx = np.random.default_rng(0).integers(0, 16, (4, 8))
    for _ in range(steps):
        trainer.train_step([(idx, idx)])
    return trainer, np.concatenate([p.data.view(np.uint32).ravel()
                                    for p in network.parameters()])


def test_recipes_train_on_mi300x():
    """bf16-amp on MI300X trains exactly as the recipe with matmul_model="cdna3" and differs from
    H100's; fp8-hybrid's FP8 layers quantize to FNUZ E4M3 with scales from max 240. The flash
    kernels do not run MFMA models: the GPT uses the naive backend (a flash one is refused by
    name)."""
    _, on_target = _train(get_recipe("bf16-amp", target="mi300x"))
    _, explicit = _train(get_recipe("bf16-amp").replace(matmul_model="cdna3"))
    _, on_h100 = _train(get_recipe("bf16-amp"))
    assert np.array_equal(on_target, explicit) and not np.array_equal(on_target, on_h100)
    trainer = mpt.Trainer(_gpt("naive"), get_recipe("fp8-hybrid", target="mi300x"),
                          mpt.TrainConfig(lr=1e-2))
    layer = next(iter(trainer.fp8_layers.values()))
    state = layer.fp8_states["weight"]
    assert state.format.name == "fp8_e4m3fnuz" and layer.model == "cdna3"
    amax = np.max(np.abs(layer.weight.data.astype(np.float32)))     # what the forward records
    idx = np.random.default_rng(0).integers(0, 16, (4, 8))
    trainer.train_step([(idx, idx)])
    assert state.scale == np.float32(240.0) / amax                  # the delayed update: f32
    with pytest.raises(ValueError, match="backend='flash' runs the block, ieee_fma and "
                                         "ieee_mul_add models; the matmul model is 'cdna3'"):
        _train(get_recipe("bf16-amp", target="mi300x"), backend="flash", steps=1)


def test_study_runs_on_mi300x(tmp_path):
    """``mpt study --target mi300x`` on a tiny configuration: every recipe MI300X runs, with the
    naive attention for all of them."""
    from mpt.cli import main
    from mpt.study import StudyConfig

    config = StudyConfig(target="mi300x", steps=2, recipes=("bf16-amp", "fp8-hybrid"), quant=False)
    assert config.attention == "naive"
    assert StudyConfig(target="h100", steps=2, recipes=("bf16-amp",)).attention == "flash"
    assert main(["study", "--target", "mi300x", "--steps", "1", "--recipes", "bf16-amp",
                 "fp8-hybrid", "--no-quant", "--no-plots", "--quiet", "--out",
                 str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "mi300x" in report and "fp8-hybrid" in report
