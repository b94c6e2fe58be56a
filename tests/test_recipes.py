"""mpt.recipes: the named recipes as data, their validation and lookup."""
import dataclasses
import json

import pytest

from mpt.amp.recipes import RECIPES, Fp8Config, LossScaling, Recipe, get_recipe, recipe_names
from mpt.fp8 import DelayedScaling

# name: (param, master, compute, autocast, matmul model, loss scaling, fp8, copy-down rounding)
TABLE = {
    "fp32": ("fp32", None, "fp32", False, "ieee_fma", "none", False, "nearest_even"),
    "tf32": ("fp32", None, "tf32", False, "hopper", "none", False, "nearest_even"),
    "fp16-amp": ("fp32", None, "fp16", True, "hopper", "dynamic", False, "nearest_even"),
    "fp16-o2": ("fp16", "fp32", "fp16", False, "hopper", "dynamic", False, "nearest_even"),
    "bf16-amp": ("fp32", None, "bf16", True, "hopper", "none", False, "nearest_even"),
    "bf16-o2": ("bf16", "fp32", "bf16", False, "hopper", "none", False, "nearest_even"),
    "bf16-pure": ("bf16", None, "bf16", False, "hopper", "none", False, "nearest_even"),
    "bf16-pure-sr": ("bf16", None, "bf16", False, "hopper", "none", False, "stochastic"),
    "fp16-noscale": ("fp16", "fp32", "fp16", False, "hopper", "none", False, "nearest_even"),
    "fp8-hybrid": ("fp32", None, "bf16", True, "hopper", "none", True, "nearest_even"),
    **{name: ("fp32", None, "bf16", True, "blackwell", "none", False, "nearest_even")
       for name in ("mxfp8", "nvfp4", "nvfp4-no-rht", "nvfp4-no-sr", "nvfp4-no-2d", "mxfp4")},
    # the recipes of other vendors' chips (their targets: tpu, gaudi2, gaudi3, trn2)
    "tpu-bf16": ("bf16", "fp32", "bf16", False, "tpu", "none", False, "nearest_even"),
    "gaudi2-fp8": ("fp32", None, "bf16", True, "gaudi2", "none", False, "nearest_even"),
    "gaudi3-fp8": ("fp32", None, "bf16", True, "gaudi3", "none", False, "nearest_even"),
    "trn-bf16-autocast": ("fp32", None, "fp32", False, "trainium_autocast", "none", False,
                          "nearest_even"),
    "trn-bf16-sr": ("bf16", None, "bf16", False, "trainium", "none", False, "stochastic"),
}


def test_the_recipe_table():
    assert recipe_names() == list(TABLE)
    for name, row in TABLE.items():
        r = get_recipe(name)
        assert (r.param_format, r.master_format, r.compute_format, r.autocast, r.matmul_model,
                r.loss_scaling.kind, r.fp8 is not None, r.rounding) == row, name
        assert r.name == name and r.grad_format == r.param_format
        assert r.state_format == "fp32" and r.output_format == "fp32"


def test_dynamic_scaling_is_pytorchs_default():
    kwargs = get_recipe("fp16-amp").loss_scaling.scaler_kwargs()
    assert kwargs == {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5,
                      "growth_interval": 2000, "min_scale": None, "max_scale": None}
    assert LossScaling("static", init_scale=8.0).scaler_kwargs() == {"scale": 8.0}
    assert LossScaling().scaler_kwargs() == {}


def test_fp8_config_is_transformer_engines_hybrid():
    fp8 = get_recipe("fp8-hybrid").fp8
    assert fp8.scaling == DelayedScaling(margin=0, fp8_format="HYBRID", amax_history_len=1024,
                                         amax_compute_algo="max")
    assert (fp8.model, fp8.promote_every, fp8.split_accumulator) == ("hopper", 128,
                                                                      (False, True, True))
    assert fp8.scaling.format_for("forward").name == "fp8_e4m3fn"
    assert fp8.scaling.format_for("backward").name == "fp8_e5m2"


def test_backward_format():
    assert get_recipe("tf32").backward_format == "fp32"
    assert get_recipe("fp16-amp").backward_format == "fp16"
    assert get_recipe("fp8-hybrid").backward_format == "bf16"


def test_get_recipe_errors_list_the_valid_names():
    with pytest.raises(ValueError) as err:
        get_recipe("fp16-amp-o3")
    for name in TABLE:
        assert name in str(err.value)
    with pytest.raises(TypeError, match="name or a Recipe"):
        get_recipe(3)
    r = RECIPES["bf16-o2"]
    assert get_recipe(r) is r


@pytest.mark.parametrize("changes, match", [
    ({"param_format": "fp16", "compute_format": "bf16"}, "autocast=True"),
    ({"param_format": "fp32", "master_format": "fp32"}, "master_format"),
    ({"param_format": "fp8_e4m3fn", "compute_format": "fp8_e4m3fn"}, "param_format"),
    ({"compute_format": "fp16", "autocast": True, "param_format": "fp16"}, "autocast"),
    ({"compute_format": "tf32", "param_format": "bf16"}, "tf32"),
    ({"state_format": "bf16"}, "state_format"),
    ({"rounding": "toward_zero"}, "rounding"),
    ({"matmul_model": "pentium"}, "unknown MMA model"),
    ({"param_format": "fp17"}, "fp17"),
])
def test_invalid_recipes_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        Recipe("x", "bad", **changes)


def test_invalid_parts_are_refused():
    with pytest.raises(ValueError, match="kind"):
        LossScaling("adaptive")
    with pytest.raises(ValueError, match="promote_every"):
        Fp8Config(promote_every=0)
    with pytest.raises(ValueError, match="split_accumulator"):
        Fp8Config(split_accumulator=(True, True))
    with pytest.raises(TypeError, match="DelayedScaling"):
        Fp8Config(scaling={"margin": 0})
    with pytest.raises(TypeError, match="LossScaling"):
        Recipe("x", "bad", loss_scaling="dynamic")


def test_recipes_are_frozen_data():
    r = get_recipe("bf16-pure")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.rounding = "stochastic"
    sr = r.replace(name="mine", rounding="stochastic")
    assert sr.rounding == "stochastic" and r.rounding == "nearest_even"
    assert sr == dataclasses.replace(RECIPES["bf16-pure-sr"], name="mine",
                                     description=r.description)
    for recipe in RECIPES.values():
        described = json.loads(json.dumps(recipe.describe()))
        assert described["name"] == recipe.name
        assert described["grad_format"] == recipe.param_format
    assert get_recipe("fp8-hybrid").describe()["fp8"]["split_accumulator"] == {
        "fprop": False, "dgrad": True, "wgrad": True}
