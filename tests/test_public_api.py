"""Every name of mpt 0.1's ``__all__`` lists still imports, from its 0.1 module path.

tests/data/public_api_v0.json lists them (read off mpt 0.1 before the package was regrouped).
Four 0.1 modules had the names of functions of the package (``mpt.tensor``, ``mpt.mma``,
``mpt.checkpoint``, ``mpt.autocast``): their names are checked at their new homes, and the
package attribute is the function. Names renamed on purpose (one meaning per word) are mapped.
"""
import importlib
import json
import pathlib

import pytest

import mpt

API = json.loads((pathlib.Path(__file__).parent / "data" / "public_api_v0.json").read_text())

#: 0.1 modules whose names are functions of the package -> the module their names moved to
SHADOWED = {"mpt.tensor": "mpt.autograd.tensor", "mpt.mma": "mpt.engines",
            "mpt.checkpoint": "mpt.nn.checkpoint", "mpt.autocast": "mpt.functional.autocast"}
#: (module, 0.1 name) -> the name now: "policy" means the jmp Policy only; an autocast rule is a
#: cast category
RENAMED = {("mpt.autocast", "POLICIES"): "CATEGORIES",
           ("mpt.autocast", "autocast_policy"): "autocast_categories",
           ("mpt.autocast", "cast_for_policy"): "cast_for_category",
           ("mpt.functional.nn_ops", "get_rng_state"): None,   # moved to mpt.functional.rng
           ("mpt.functional.nn_ops", "set_rng_state"): None,
           ("mpt.functional.nn_ops", "manual_seed"): None}
RNG_HOME = "mpt.functional.rng"


@pytest.mark.parametrize("module", sorted(API))
def test_every_0_1_name_imports(module):
    home = importlib.import_module(SHADOWED.get(module, module))
    for name in API[module]:
        key = (module, name)
        if key in RENAMED and RENAMED[key] is None:
            assert hasattr(importlib.import_module(RNG_HOME), name), (module, name)
            continue
        assert hasattr(home, RENAMED.get(key, name)), f"{module}.{name} is gone"


def test_shadowing_names_are_the_functions():
    for name in ("tensor", "mma", "checkpoint", "autocast", "round"):
        assert callable(getattr(mpt, name)) and not isinstance(getattr(mpt, name), type(mpt))


def test_old_module_paths_are_the_new_modules():
    import mpt.training
    from mpt.recipes import get_recipe
    assert mpt.training is mpt.train.trainer is importlib.import_module("mpt.training")
    assert get_recipe is mpt.amp.recipes.get_recipe
    assert mpt.autocast_policy is mpt.autocast_categories
