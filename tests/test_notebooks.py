"""The teaching notebooks (notebooks/NN_*.py and their executed .ipynb twins).

* Each ``.py`` source (jupytext percent format) and its ``.ipynb`` hold the same cells, and the
  ``.ipynb`` declares the pairing: neither has drifted from the other.
* Each ``.ipynb`` is committed executed: every code cell ran, nothing failed or wrote to stderr,
  and it shows at least one figure, in a file small enough to keep in the repository.
* Each ``.ipynb`` is executed again in a real Jupyter kernel (nbclient, ipykernel) and its fresh
  outputs must equal the committed ones beyond timings: text outputs exactly (the notebooks print
  no times or addresses, and every number they show is computed with fixed seeds), figures by
  presence (PNG bytes differ across matplotlib versions). A difference means the notebook's story
  changed: re-run ``python notebooks/execute.py`` and read the diff.

The kernel tests need the ``test`` extra (nbclient, nbformat, ipykernel, matplotlib); without
them they are skipped with that reason.
"""
import importlib.util
import json
import os
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[1] / "notebooks"
_spec = importlib.util.spec_from_file_location("notebooks_execute", FOLDER / "execute.py")
execute = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute)

SOURCES = execute.sources()
MAX_BYTES = 160_000      # an executed notebook with its PNGs (modest dpi) stays below this


def _ipynb(source: Path) -> dict:
    return json.loads(source.with_suffix(".ipynb").read_text())


def _text(source) -> str:
    return source if isinstance(source, str) else "".join(source)


def test_every_notebook_is_a_pair():
    pys = {p.stem for p in SOURCES}
    ipynbs = {p.stem for p in FOLDER.glob("*.ipynb")}
    assert pys == ipynbs, f"unpaired: {sorted(pys ^ ipynbs)}"
    assert len(SOURCES) >= 9, [p.name for p in SOURCES]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_source_and_notebook_hold_the_same_cells(source):
    nb = _ipynb(source)
    assert nb["nbformat"] == 4
    assert nb["metadata"]["jupytext"]["formats"] == execute.PAIRING
    assert "formats: " + execute.PAIRING in source.read_text().split("# ---")[1]
    cells = [(c["cell_type"], _text(c["source"])) for c in nb["cells"]]
    assert cells == execute.read_percent(source.read_text()), \
        f"{source.name} and its .ipynb differ: run python notebooks/execute.py {source.stem}"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_is_committed_executed(source):
    path = source.with_suffix(".ipynb")
    assert path.stat().st_size < MAX_BYTES, f"{path.name}: {path.stat().st_size} bytes"
    nb = _ipynb(source)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), \
        f"{path.name} is not executed top to bottom: run python notebooks/execute.py"
    kinds = [out for c in code for out in _normalized(c["outputs"])]
    assert not [k for k in kinds if k[0] in ("error", "stderr")], kinds
    assert ("image/png",) in kinds, f"{path.name} shows no figure"
    assert sum(c["cell_type"] == "markdown" for c in nb["cells"]) >= 3


def _normalized(outputs) -> list[tuple]:
    """What must not change between runs: stream text (adjacent chunks merged), the text of
    results, the presence of PNG figures, errors; not execution counts, metadata or PNG bytes."""
    out = []
    for o in execute.merge_streams([dict(o) for o in outputs]):
        kind = o["output_type"]
        if kind == "stream":
            out.append(("stderr",) if o["name"] == "stderr" else ("stdout", _text(o["text"])))
        elif kind == "error":
            out.append(("error", o["ename"], o["evalue"]))
        elif "image/png" in o["data"]:
            out.append(("image/png",))
        else:
            out.append((kind, {k: _text(v) for k, v in o["data"].items()}))
    return out


@pytest.fixture(scope="module")
def kernel():
    """nbclient and a python3 kernel (ipykernel, matplotlib's inline backend), or a skip.

    The kernels import the mpt this process imported (its folder goes first on their
    PYTHONPATH): ``python -m pytest`` in a checkout tests the checkout, not an installed copy,
    and the kernels reuse its compiled Numba kernels instead of compiling an installed copy's."""
    for module in ("nbformat", "nbclient", "ipykernel", "matplotlib"):
        pytest.importorskip(module, reason=f"{module} is not installed: pip install '.[test]'")
    import mpt

    root = str(Path(mpt.__file__).resolve().parents[1])
    with pytest.MonkeyPatch.context() as env:
        # jupyter_core's future path layout (no DeprecationWarning about platformdirs)
        env.setenv("JUPYTER_PLATFORM_DIRS", "1")
        env.setenv("PYTHONPATH", os.pathsep.join([root] + [p for p in os.environ.get(
            "PYTHONPATH", "").split(os.pathsep) if p]))
        yield execute


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_reproduces_its_outputs(source, kernel):
    import nbformat

    path = source.with_suffix(".ipynb")
    committed = nbformat.read(path, as_version=4)
    fresh = kernel.execute(nbformat.read(path, as_version=4))
    for index, (old, new) in enumerate(zip(committed.cells, fresh.cells)):
        if old.cell_type == "code":
            assert _normalized(new.outputs) == _normalized(old.outputs), \
                f"{source.stem} cell {index} changed its outputs:\n{old.source}"


def test_kernels_import_the_mpt_under_test(kernel):
    import nbformat

    import mpt

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import pathlib, mpt; print(pathlib.Path(mpt.__file__).resolve())")])
    out = kernel.execute(nb).cells[0].outputs
    assert [o.get("text", "").strip() for o in out] == [str(Path(mpt.__file__).resolve())]
