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


@pytest.mark.parametrize("name, fmt, model", [
    ("v100", "fp16", "volta"), ("a100", "bf16", "ampere"), ("A30", "tf32", "ampere"),
    ("h100", "fp8_e5m2", "hopper"), ("h200", "e4m3", "hopper"), ("b200", "bf16", "blackwell"),
    ("rtx4090", "fp8_e4m3fn", "ada"), ("cpu", "bf16", "ieee_fma"),
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
