"""L0: one renderer for the tables mpt prints — aligned text and Markdown.

``rows`` are sequences of strings, the first one the header. ``numeric=True`` right-aligns every
column but the first (tables of numbers); otherwise every column is left-aligned.
"""
from __future__ import annotations

__all__ = ["text_table", "markdown_table"]


def text_table(rows, *, numeric: bool = False) -> str:
    """The rows as aligned text, two spaces between columns, no trailing spaces."""
    rows = [tuple(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.rjust(w) if numeric and i else c.ljust(w)
                  for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows)


def markdown_table(rows) -> str:
    """The rows as a GitHub Markdown table (a "|" inside a cell escaped)."""
    rows = [tuple(str(c).replace("|", "\\|") for c in r) for r in rows]
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)
