"""The module paths of mpt 0.1, kept importable: ``import mpt.training`` still works.

mpt 0.1 kept 33 modules flat in ``mpt/``; 0.2 groups them by area (``docs/design.md``). Each old
path below is an alias of its new module (the same module object), registered as an import hook
when ``mpt`` is imported. Four old modules are not aliased, because their names are functions of
the package: ``mpt.tensor``, ``mpt.mma``, ``mpt.checkpoint`` and ``mpt.autocast`` (import their
contents from ``mpt`` itself, or from ``mpt.autograd.tensor``, ``mpt.engines``,
``mpt.nn.checkpoint`` and ``mpt.functional.autocast``).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: old module path -> its new home
MOVED = {
    "mpt.function": "mpt.autograd.function", "mpt.memory": "mpt.autograd.memory",
    "mpt.policy": "mpt.nn.policy", "mpt.fp8": "mpt.amp.fp8", "mpt.linears": "mpt.amp.linear",
    "mpt.recipes": "mpt.amp.recipes", "mpt.lora": "mpt.quant.lora",
    "mpt.training": "mpt.train.trainer", "mpt.train_state": "mpt.train.state",
    "mpt.corpus": "mpt.train.corpus", "mpt.diagnostics": "mpt.train.diagnostics",
    "mpt.study_quant": "mpt.study.quant", "mpt.golden_cases": "mpt.golden.cases",
    "mpt.golden_torch": "mpt.golden.torch", "mpt.pytest_plugin": "mpt.golden.pytest_plugin",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module object of its new home."""

    def find_spec(self, name, path=None, target=None):
        if name in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        """The new module is already executed."""


def install() -> None:
    """Register the aliases (once)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
