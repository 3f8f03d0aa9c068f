"""The headline's answer in Markdown and HTML: each op's sentence, then its grid
(:mod:`runner.tables.model.answers`, :mod:`runner.tables.model.sentence`).

The sentences come first, all of them, so one screen holds every op's answer; then per op a
grid of at most :data:`HTML_COLUMNS` columns a table in the page (a fixed layout at the page's
width: it never scrolls sideways) and, in Markdown, as many as fit
:data:`runner.tables.render.markdown.LINE` characters a line, columns named by letter with a
key below. Under each grid: the cell pages it sums up and, per report, why one is marked ⚠.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gate_residual_matrix.runner.tables.model.answers import GRID_LEGEND, OpGrid, ulp
from gate_residual_matrix.runner.tables.model.values import ABSENT
from gate_residual_matrix.runner.tables.render.markdown import fitted_tables, md_text

__all__ = ["answers_markdown"]


def _letter(n: int) -> str:
    return chr(ord("A") + n) if n < 26 else f"C{n}"


def _header(grid: OpGrid, n: int) -> str:
    c = grid.columns[n]
    return f"{c.gpu} · {c.stack} · {', '.join(c.modes)}"


def _md_mark(grid: OpGrid, pair: str, n: int) -> str:
    m = grid.marks.get((pair, n))
    if m is None:
        return ABSENT
    text = md_text(m.text())
    closer = m.closer()
    if closer is not None and m.mark.differ:
        a, b = (ulp(e) for e in m.errors())
        shown = [a, b]
        shown[closer] = f"**{shown[closer]}**"
        text = text.replace(f"{a} \\| {b}", " \\| ".join(shown), 1)
    return text


def _pages(grid: OpGrid, names: Mapping[int, str], prefix: str) -> list[tuple[str, str]]:
    cells = {c.index: c for col in grid.columns for c in col.cells}
    return [(cells[i].label, f"{prefix}{names[i]}") for i in sorted(cells) if i in names]


def answers_markdown(grids: Sequence[OpGrid], names: Mapping[int, str],
                     prefix: str = "cells/") -> str:
    """The sentences, then each op's grid, as Markdown (``names``: cell index -> page name
    under ``prefix``)."""
    if not grids:
        return "_No cell has comparisons yet._\n"
    parts = ["\n".join(f"- **{md_text(g.op)}** {md_text(g.sentence[len(g.op):])}"
                       for g in grids) + "\n", GRID_LEGEND + "\n"]
    for grid in grids:
        parts.append(f"### {md_text(grid.op)}\n")
        columns = [(_letter(n), [_md_mark(grid, p, n) for p in grid.pairs])
                   for n in range(len(grid.columns))]
        parts += [t + "\n" for t in fitted_tables("pair", [md_text(p) for p in grid.pairs],
                                                  columns)]
        parts.append("Columns: " + "; ".join(f"**{_letter(n)}** {md_text(_header(grid, n))}"
                                             for n in range(len(grid.columns))) + ".\n")
        parts.append("Cell pages: " + ", ".join(f"[{md_text(label)}]({link})" for label, link
                                                in _pages(grid, names, prefix)) + ".\n")
        if grid.warnings:
            parts.append("⚠ " + "; ".join(f"{md_text(label)}: {md_text(why)}"
                                          for label, why in grid.warnings) + ".\n")
    return "\n".join(parts)
