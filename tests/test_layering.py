"""The layering of DESIGN.md: imports inside mpt only point down (or sideways within a layer)."""
import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "mpt"

# Layer of each module (a prefix covers a package). Oracles sit beside the kernels but may use
# nothing of mpt except the format table: they must stay independent of what they check.
LAYERS = {
    "mpt.formats": 0, "mpt._version": 0,
    "mpt.kernels": 1, "mpt.reference": 1, "mpt.rounding": 1, "mpt.mma": 1, "mpt.engines": 1,
    "mpt.tensor": 2, "mpt.function": 2, "mpt.memory": 2,
    "mpt.functional": 3, "mpt.autocast": 3, "mpt.policy": 3,
    "mpt.nn": 4, "mpt.optim": 4, "mpt.amp": 4, "mpt.fp8": 4, "mpt.checkpoint": 4,
    "mpt.quant": 4, "mpt.lora": 4, "mpt.recipes": 4, "mpt.attention": 4, "mpt.linears": 4,
    "mpt.diagnostics": 5, "mpt.planning": 5, "mpt.golden": 5, "mpt.golden_cases": 5,
    "mpt.golden_torch": 5, "mpt.pytest_plugin": 5, "mpt.study": 5, "mpt.cli": 5,
    "mpt.testing": 5, "mpt._io": 5, "mpt.data": 5, "mpt.corpus": 5, "mpt.training": 5,
    "mpt.report": 5, "mpt.train_state": 5, "mpt.study_quant": 5,
    "mpt": 6,  # the package itself re-exports everything: importing it from inside is upward
}
REFERENCE_MAY_IMPORT = ("mpt.formats", "mpt.reference")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(name: str) -> int:
    best = max((k for k in LAYERS if name == k or name.startswith(k + ".")), key=len, default=None)
    if best is None:
        raise AssertionError(f"module {name} has no layer: add it to LAYERS in {__file__}")
    return LAYERS[best]


def _imports(path: pathlib.Path, module: str):
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "mpt")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.split(".")[0] != "mpt":
                continue
            for alias in node.names:  # `from mpt import nn` imports the submodule mpt.nn
                sub = f"{target}.{alias.name}"
                yield sub if (PACKAGE.parent / sub.replace(".", "/")).with_suffix(".py").exists() \
                    or (PACKAGE.parent / sub.replace(".", "/")).is_dir() else target


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_imports_point_down(path):
    module = _module_name(path)
    own = _layer(module)
    for target in _imports(path, module):
        assert _layer(target) <= own, f"{module} (L{own}) imports {target} (L{_layer(target)})"
        if module.startswith("mpt.reference"):
            assert target.startswith(REFERENCE_MAY_IMPORT), \
                f"oracle {module} imports {target}: oracles use only mpt.formats"
        if module.startswith("mpt.kernels"):
            assert not target.startswith("mpt.reference"), f"kernel {module} imports an oracle"


def test_every_module_is_classified():
    for path in MODULES:
        _layer(_module_name(path))
