"""The teaching notebooks (notebooks/*.ipynb): each runs top to bottom in a fresh namespace (its
``assert`` cells check the effect it narrates), and none is committed with outputs. All eight run
in about 8 s here, so they are not marked slow."""
import ast
import importlib.util
import json
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))
GENERATOR = FOLDER / "make_notebooks.py"


def code_cells(path):
    return [("".join(c["source"]), i) for i, c in enumerate(json.loads(path.read_text())["cells"])
            if c["cell_type"] == "code"]


@pytest.fixture
def agg_backend(monkeypatch):
    """matplotlib (when installed) draws off-screen; ``plt.show()`` (a warning under Agg) is a
    no-op and figures are closed afterwards."""
    try:
        import matplotlib
    except ImportError:
        yield
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    monkeypatch.setattr(plt, "show", lambda *args, **kwargs: None)
    yield
    plt.close("all")


def test_notebooks_exist():
    assert len(NOTEBOOKS) == 8, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_clean_nbformat4(path):
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4 and isinstance(nb["nbformat_minor"], int)
    assert isinstance(nb["metadata"], dict) and nb["cells"]
    for cell in nb["cells"]:
        assert cell["cell_type"] in ("markdown", "code")
        assert isinstance(cell["source"], list) and isinstance(cell["metadata"], dict)
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, path.name
    assert any(c["cell_type"] == "markdown" for c in nb["cells"])
    assert any("assert" in src for src, _ in code_cells(path))   # each checks what it narrates
    imported = set()
    for src, _ in code_cells(path):
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module.split(".")[0])
    assert imported <= {"mpt", "numpy", "matplotlib", "math"}, imported  # math: exact fsum


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch, agg_backend):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    for source, index in code_cells(path):
        try:
            exec(compile(source, f"{path.name}[cell {index}]", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{path.name} cell {index} failed: {exc!r}") from exc


def test_notebooks_match_their_generator():
    """The committed files are what notebooks/make_notebooks.py writes (no hand edits drift)."""
    spec = importlib.util.spec_from_file_location("make_notebooks", GENERATOR)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert sorted(gen.NOTEBOOKS) == [p.stem for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        assert path.read_text() == gen.render(path.stem), path.name
