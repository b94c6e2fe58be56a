"""The layering of docs/design.md: imports inside mpt only point down (or sideways within a
layer), and the areas of one layer import each other without cycles.

A module's layer is its area's: the first name after ``mpt.`` — a folder (``mpt.engines.nvidia``
is in ``engines``) or a top-level module (``mpt.formats``). Oracles sit beside the kernels but may
use nothing of mpt except the format table: they must stay independent of what they check.
"""
import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "mpt"

# Layer of each area (folder or top-level module of mpt).
LAYERS = {
    "_version": 0, "_checks": 0, "_io": 0, "_tables": 0, "_compat": 0, "_registry": 0,
    "formats": 0, "tasks": 0, "runtime": 0,
    "kernels": 1, "reference": 1, "rounding": 1, "microscaling": 1, "engines": 1, "targets": 1,
    "autograd": 2,
    "functional": 3,
    "nn": 4, "optim": 4, "amp": 4, "quant": 4,
    "train": 5, "study": 5, "golden": 5, "planning": 5, "testing": 5, "cli": 5, "__main__": 5,
    "characterize": 5,
}
REFERENCE_MAY_IMPORT = ("mpt.formats", "mpt.reference")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _area(name: str) -> str:
    """The area of a module: ``mpt.engines.nvidia`` -> ``engines``; ``mpt`` -> ``mpt``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "mpt"


def _layer(name: str) -> int:
    area = _area(name)
    if area == "mpt":
        return 6  # the package itself re-exports everything: importing it from inside is upward
    if area not in LAYERS:
        raise AssertionError(f"module {name} is in area {area!r}, which has no layer: add it "
                             f"to LAYERS in {__file__}")
    return LAYERS[area]


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


def test_areas_import_each_other_without_cycles():
    edges = {}
    for path in MODULES:
        area = _area(_module_name(path))
        for target in _imports(path, _module_name(path)):
            if _area(target) not in (area, "mpt"):
                edges.setdefault(area, set()).add(_area(target))
    state = {}

    def visit(area, trail):
        if state.get(area) == "done":
            return
        assert state.get(area) != "open", f"import cycle between areas: {' -> '.join(trail)}"
        state[area] = "open"
        for nxt in sorted(edges.get(area, ())):
            visit(nxt, trail + [nxt])
        state[area] = "done"

    for area in sorted(edges):
        visit(area, [area])


def test_no_module_is_much_over_500_lines():
    long = {(_module_name(p), n) for p in MODULES if (n := len(p.read_text().splitlines())) > 550}
    assert not long, f"split these modules by job: {sorted(long)}"
