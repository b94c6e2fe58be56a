"""Execute the teaching notebooks in a real Jupyter kernel and write each ``.ipynb`` with its
outputs.

Every notebook is a pair: ``NN_name.py`` is its source in jupytext's *percent* format (``# %%``
opens a code cell, ``# %% [markdown]`` a Markdown cell whose lines are ``#`` comments; a
``# ---`` header carries jupytext's pairing metadata), and ``NN_name.ipynb`` holds the same cells
executed, committed with their outputs so that a reader sees the numbers and figures on GitHub.
Edit the ``.py`` (or the notebook in Jupyter with jupytext installed, which keeps the pair in
sync), then run::

    python notebooks/execute.py                 # every notebook
    python notebooks/execute.py 03 10_same      # those whose names start with these prefixes

Each notebook is rebuilt from its ``.py``, run top to bottom in a fresh ``python3`` kernel (the
interpreter running this script; its working folder is ``notebooks/``), and written atomically
(a temporary file renamed over the old one). Outputs are kept deterministic: adjacent stream
outputs are merged, no timings are recorded, and the notebook metadata is fixed, so re-running an
unchanged notebook changes no text (only PNG bytes may differ across matplotlib versions).
tests/test_notebooks.py re-executes every notebook and compares its outputs with the committed
ones. Needs nbformat, nbclient, ipykernel and matplotlib (``pip install '.[test]'``).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
PAIRING = "ipynb,py:percent"
METADATA = {
    "jupytext": {"formats": PAIRING},
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}
_MARKER = re.compile(r"^# %%(.*)$")
_KINDS = {"": "code", "[markdown]": "markdown"}


def sources() -> list[Path]:
    """The notebook sources: ``NN_*.py`` files of this folder, in order."""
    return sorted(FOLDER.glob("[0-9][0-9]_*.py"))


def read_percent(text: str) -> list[tuple[str, str]]:
    """The cells of a percent-format source as ``(cell_type, source)`` pairs ("code" or
    "markdown"), as jupytext reads them: the ``# ---`` header is skipped, blank lines around a
    cell are dropped, and a Markdown line loses its ``# `` (a lone ``#`` is an empty line).
    ValueError for text before the first cell, an unknown cell marker or a Markdown line that is
    not a comment."""
    lines = text.splitlines()
    if lines and lines[0] == "# ---":
        lines = lines[lines.index("# ---", 1) + 1:]
    cells: list[tuple[str, list[str]]] = []
    for number, line in enumerate(lines, 1):
        marker = _MARKER.match(line)
        if marker:
            kind = _KINDS.get(marker.group(1).strip())
            if kind is None:
                raise ValueError(f"line {number}: unknown cell marker {line!r}; use '# %%' or "
                                 "'# %% [markdown]'")
            cells.append((kind, []))
        elif cells:
            cells[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"line {number}: text before the first '# %%' cell marker")
    out = []
    for kind, body in cells:
        while body and not body[-1].strip():
            body.pop()
        while body and not body[0].strip():
            body.pop(0)
        if kind == "markdown":
            if any(not (line == "#" or line.startswith("# ")) for line in body):
                raise ValueError(f"markdown cell {len(out)}: every line must start with '# '")
            body = [line[2:] for line in body]
        out.append((kind, "\n".join(body)))
    return out


def notebook_from_source(path: Path):
    """An unexecuted nbformat-4 notebook with the cells of ``path`` (stable cell ids)."""
    import nbformat

    new = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell}
    cells = [new[kind](source, id=f"cell-{i:02d}")
             for i, (kind, source) in enumerate(read_percent(path.read_text()))]
    return nbformat.v4.new_notebook(cells=cells, metadata=dict(METADATA))


def merge_streams(outputs: list) -> list:
    """``outputs`` with adjacent stream outputs of the same name (stdout, stderr) joined: how a
    kernel splits a cell's printing into messages depends on timing, not on the notebook."""
    merged = []
    for out in outputs:
        if (out.get("output_type") == "stream" and merged
                and merged[-1].get("output_type") == "stream"
                and merged[-1]["name"] == out["name"]):
            merged[-1]["text"] += out["text"]
        else:
            merged.append(out)
    return merged


def execute(nb, timeout: int = 600):
    """Run every cell of ``nb`` in a fresh python3 kernel whose working folder is this one;
    returns ``nb`` with its outputs (streams merged, no timing metadata). Raises nbclient's
    ``CellExecutionError`` on the first failing cell."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(FOLDER)}})
    client.execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)
    nb.metadata = dict(METADATA)
    return nb


def write(nb, path: Path) -> None:
    """Write ``nb`` to ``path`` atomically (``mpt._io.atomic_write_bytes``)."""
    import nbformat

    from mpt._io import atomic_write_bytes

    text = nbformat.writes(nb) + "\n"
    atomic_write_bytes(path, lambda fh: fh.write(text.encode()))


def main(argv: list[str]) -> int:
    chosen = [p for p in sources() if not argv or any(p.name.startswith(a) for a in argv)]
    if not chosen:
        print(f"no notebook source in {FOLDER} starts with {' or '.join(argv)}", file=sys.stderr)
        return 2
    for path in chosen:
        print(f"executing {path.name}", flush=True)
        write(execute(notebook_from_source(path)), path.with_suffix(".ipynb"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
